"""A three-layer perceptron (784 -> 512 -> 256 -> 10) built from `polydl.linear`, trained for
one step: forward with fused bias + ReLU, backward with `linear_backward_data` /
`linear_backward_weights`, every result checked against numpy.

    python3 examples/mlp.py
"""

from __future__ import annotations

import numpy as np

import polydl

BATCH = 64
WIDTHS = (784, 512, 256, 10)


def main() -> None:
    rng = np.random.default_rng(0)
    weights = [
        (rng.standard_normal((k, c)) / np.sqrt(c)).astype(np.float32)
        for c, k in zip(WIDTHS, WIDTHS[1:], strict=False)
    ]
    biases = [rng.uniform(-0.1, 0.1, k).astype(np.float32) for k in WIDTHS[1:]]
    x = rng.standard_normal((BATCH, WIDTHS[0])).astype(np.float32)

    # forward: hidden layers fuse bias and ReLU, the last one only the bias
    last = len(weights) - 1
    layers = [
        polydl.linear(N=BATCH, C=c, K=k, fuse=("bias",) if i == last else ("bias", "relu"))
        for i, (c, k) in enumerate(zip(WIDTHS, WIDTHS[1:], strict=False))
    ]
    activations = [x]
    for layer, w, b in zip(layers, weights, biases, strict=True):
        activations.append(layer(activations[-1], w, b))

    expected = x.astype(np.float64)
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        expected = expected @ w.T + b
        expected = expected if i == last else np.maximum(expected, 0)
    np.testing.assert_allclose(activations[-1], expected, rtol=1e-4, atol=1e-4)

    # backward of the loss 0.5 * |y|^2: dy = y
    dy = activations[-1]
    gradients = []
    for i in reversed(range(len(weights))):
        c, k = WIDTHS[i], WIDTHS[i + 1]
        if i != last:
            dy = dy * (activations[i + 1] > 0)  # ReLU's gradient
        dw = polydl.linear_backward_weights(N=BATCH, C=c, K=k)(activations[i], dy)
        np.testing.assert_allclose(dw, dy.T.astype(np.float64) @ activations[i], rtol=1e-3, atol=1e-3)
        gradients.append(dw)
        dx = polydl.linear_backward_data(N=BATCH, C=c, K=k)(dy, weights[i])
        np.testing.assert_allclose(dx, dy.astype(np.float64) @ weights[i], rtol=1e-3, atol=1e-3)
        dy = dx

    loss = 0.5 * float(np.sum(activations[-1].astype(np.float64) ** 2))
    norms = ", ".join(f"{np.linalg.norm(g):.3f}" for g in reversed(gradients))
    print(f"MLP {' -> '.join(map(str, WIDTHS))}, batch {BATCH}: loss {loss:.4f}; "
          f"weight-gradient norms {norms}; all layers match numpy")
    print("layer 1 schedule:", layers[0].schedule.describe())


if __name__ == "__main__":
    main()
