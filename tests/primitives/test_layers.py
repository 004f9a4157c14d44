"""Fully-connected, pooling, element-wise, batch-norm and LSTM kernels against the nest's numpy
reference, independent numpy formulas, and PyTorch where it is installed."""

from __future__ import annotations

import numpy as np
import pytest

import polydl
from polydl import layouts
from polydl.errors import ArgumentError, SpecError
from polydl.frontends import load_spec
from polydl.runtime.verify import compare
from tests.kernels import run_and_check


def close(got: np.ndarray, want: np.ndarray, dtype: str = "float32") -> None:
    ok, err = compare(got, np.asarray(want), dtype)
    assert ok, f"relative error {err:.2e}"


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


# ----------------------------------------------------------------------------- linear
@pytest.mark.parametrize("n, c, k", [(1, 1, 1), (5, 7, 3), (33, 40, 18), (64, 96, 80)])
@pytest.mark.slow
def test_linear_and_its_backward_passes_match_numpy(n: int, c: int, k: int) -> None:
    run_and_check(polydl.linear(N=n, C=c, K=k), lambda x, w: x.astype(np.float64) @ w.T)
    run_and_check(polydl.linear_backward_data(N=n, C=c, K=k),
                  lambda dy, w: dy.astype(np.float64) @ w)
    run_and_check(polydl.linear_backward_weights(N=n, C=c, K=k),
                  lambda x, dy: dy.astype(np.float64).T @ x)


def test_linear_fused_epilogues_match_numpy() -> None:
    kernel = polydl.linear(N=6, C=9, K=20, fuse=("bias", "relu", "residual"))
    run_and_check(kernel, lambda x, w, b, res: np.maximum(x.astype(np.float64) @ w.T + b, 0) + res)


def test_linear_scale_shift_epilogue_takes_scale_and_shift() -> None:
    kernel = polydl.linear(N=5, C=8, K=12, fuse=("scale_shift", "relu"))
    run_and_check(kernel, lambda x, w, scale, shift: np.maximum((x.astype(np.float64) @ w.T) * scale + shift, 0))


def test_linear_binds_a_microkernel() -> None:
    for build in (polydl.linear, polydl.linear_backward_data, polydl.linear_backward_weights):
        assert build(N=32, C=64, K=48).schedule.microkernel is not None, build.__name__


def test_linear_backward_matches_torch_autograd() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (8, 12)).astype(np.float32)
    w = rng.uniform(-1, 1, (10, 12)).astype(np.float32)
    dy = rng.uniform(-1, 1, (8, 10)).astype(np.float32)
    tx = torch.from_numpy(x).double().requires_grad_()
    tw = torch.from_numpy(w).double().requires_grad_()
    y = torch.nn.functional.linear(tx, tw)
    y.backward(torch.from_numpy(dy).double())
    close(polydl.linear(N=8, C=12, K=10)(x, w), y.detach().numpy())
    close(polydl.linear_backward_data(N=8, C=12, K=10)(dy, w), tx.grad.numpy())
    close(polydl.linear_backward_weights(N=8, C=12, K=10)(x, dy), tw.grad.numpy())


# ----------------------------------------------------------------------------- pooling
def pool_numpy(x: np.ndarray, r: int, s: int, stride: int, padding: int, kind: str) -> np.ndarray:
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding,) * 2, (padding,) * 2),
                constant_values=fill)
    windows = np.lib.stride_tricks.sliding_window_view(xp, (r, s), axis=(2, 3))
    windows = windows[:, :, ::stride, ::stride]
    return windows.max(axis=(4, 5)) if kind == "max" else windows.mean(axis=(4, 5))


POOLS = [(2, 3, 7, 7, 3, 3, 2, 1), (1, 18, 6, 5, 2, 2, 2, 0), (1, 2, 5, 6, 3, 2, 1, 1)]


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("n, c, h, w, r, s, stride, padding", POOLS)
@pytest.mark.slow
def test_pool2d_matches_numpy(n: int, c: int, h: int, w: int, r: int, s: int, stride: int,
                              padding: int, kind: str) -> None:
    kernel = polydl.pool2d(N=n, C=c, H=h, W=w, R=r, S=s, stride=stride, padding=padding, kind=kind)
    run_and_check(kernel, lambda x: pool_numpy(x, r, s, stride, padding, kind))
    blocked = polydl.pool2d(N=n, C=c, H=h, W=w, R=r, S=s, stride=stride, padding=padding,
                            kind=kind, layout="nchw16c")
    x = np.random.default_rng(1).uniform(-1, 1, (n, c, h, w)).astype(np.float32)
    close(layouts.from_nchw16c(blocked(layouts.to_nchw16c(x)), c),
          pool_numpy(x, r, s, stride, padding, kind))


def test_pool2d_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(2).uniform(-1, 1, (2, 4, 9, 9)).astype(np.float32)
    tx = torch.from_numpy(x)
    want = torch.nn.functional.max_pool2d(tx, 3, 2, 1).numpy()
    close(polydl.pool2d(N=2, C=4, H=9, W=9, R=3, S=3, stride=2, padding=1)(x), want)
    want = torch.nn.functional.avg_pool2d(tx, 3, 2, 1).numpy()
    close(polydl.pool2d(N=2, C=4, H=9, W=9, R=3, S=3, stride=2, padding=1, kind="avg")(x), want)


# ----------------------------------------------------------------------------- element-wise
def test_eltwise_ops_match_numpy() -> None:
    size = {"N": 2, "C": 3, "H": 4, "W": 5}
    run_and_check(polydl.eltwise(**size, kind="relu"), lambda x: np.maximum(x, 0))
    run_and_check(polydl.eltwise(**size, kind="add"), lambda a, b: a.astype(np.float64) + b)
    run_and_check(
        polydl.eltwise(**size, kind="scale_shift"),
        lambda x, scale, shift: x * scale[None, :, None, None] + shift[None, :, None, None],
    )
    run_and_check(polydl.eltwise(N=7, C=9, kind="relu", dtype="float64"), lambda x: np.maximum(x, 0))


# ----------------------------------------------------------------------------- batch-norm
def test_batchnorm_inference_matches_torch_formula() -> None:
    rng = np.random.default_rng(4)
    x = rng.uniform(-2, 2, (2, 5, 3, 4)).astype(np.float32)
    gamma, beta, mean = (rng.uniform(-1, 1, 5).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.1, 2, 5).astype(np.float32)
    kernel = polydl.batchnorm_inference(N=2, C=5, H=3, W=4, eps=1e-3)
    got = kernel(x, gamma, beta, mean, var)
    c = (slice(None), None, None)
    want = (x - mean[c]) / np.sqrt(var[c].astype(np.float64) + 1e-3) * gamma[c] + beta[c]
    close(got, want)
    close(got, kernel.reference(x, gamma, beta, mean, var))
    torch = pytest.importorskip("torch")
    t = torch.nn.functional.batch_norm(torch.from_numpy(x), torch.from_numpy(mean),
                                       torch.from_numpy(var), torch.from_numpy(gamma),
                                       torch.from_numpy(beta), training=False, eps=1e-3)
    close(got, t.numpy())


def test_batchnorm_statistics_match_numpy() -> None:
    kernel = polydl.batchnorm_statistics(N=3, C=4, H=5, W=6)
    run_and_check(kernel, lambda x: (x.astype(np.float64).mean(axis=(0, 2, 3)),
                                     x.astype(np.float64).var(axis=(0, 2, 3))))


# ----------------------------------------------------------------------------- LSTM
def test_lstm_cell_matches_torch_lstm_cell() -> None:
    n, c, k = 5, 7, 6
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (n, c)).astype(np.float32)
    h0 = rng.uniform(-1, 1, (n, k)).astype(np.float32)
    c0 = rng.uniform(-1, 1, (n, k)).astype(np.float32)
    w_ih = rng.uniform(-1, 1, (4 * k, c)).astype(np.float32)
    w_hh = rng.uniform(-1, 1, (4 * k, k)).astype(np.float32)
    bias = rng.uniform(-1, 1, 4 * k).astype(np.float32)
    # polydl's w[g][j][k]: rows j < C multiply x, the others h
    w = np.concatenate([w_ih, w_hh], axis=1).reshape(4, k, c + k).transpose(0, 2, 1).copy()
    b = bias.reshape(4, k).copy()
    kernel = polydl.lstm_cell(N=n, C=c, K=k)
    got_c, got_h = kernel(x, h0, c0, w, b)

    gates = (x.astype(np.float64) @ w_ih.T + h0 @ w_hh.T + bias).reshape(n, 4, k)
    i, f, g, o = sigmoid(gates[:, 0]), sigmoid(gates[:, 1]), np.tanh(gates[:, 2]), sigmoid(gates[:, 3])
    want_c = f * c0 + i * g
    close(got_c, want_c)
    close(got_h, o * np.tanh(want_c))
    ref_c, ref_h = kernel.reference(x, h0, c0, w, b)
    close(got_c, ref_c)
    close(got_h, ref_h)
    # at a realistic size the gate GEMM is a microkernel call (tiny ones may rank plain loops first)
    assert polydl.lstm_cell(N=32, C=64, K=64).schedule.microkernel is not None

    torch = pytest.importorskip("torch")
    cell = torch.nn.LSTMCell(c, k)
    with torch.no_grad():
        cell.weight_ih.copy_(torch.from_numpy(w_ih))
        cell.weight_hh.copy_(torch.from_numpy(w_hh))
        cell.bias_ih.copy_(torch.from_numpy(bias))
        cell.bias_hh.zero_()
        th, tc = cell(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
    close(got_h, th.numpy())
    close(got_c, tc.numpy())


# ----------------------------------------------------------------------------- specs, errors
@pytest.mark.parametrize(
    "text",
    [
        'primitive = "linear"\nN = 4\nC = 8\nK = 4\nfuse = ["bias"]\n',
        'primitive = "conv2d_backward_data"\nN = 1\nC = 4\nK = 4\nH = 5\nW = 5\nR = 3\nS = 3\n'
        'stride = 2\npadding = 1\nlayout = "nchw16c"\n',
        'primitive = "conv2d_backward_weights"\nN = 1\nC = 4\nK = 4\nH = 5\nW = 5\nR = 3\nS = 3\n',
        'primitive = "pool2d"\nN = 1\nC = 2\nH = 4\nW = 4\nR = 2\nS = 2\nstride = 2\nkind = "avg"\n',
        'primitive = "eltwise"\nN = 2\nC = 3\nkind = "add"\n',
        'primitive = "batchnorm_inference"\nN = 1\nC = 2\nH = 3\nW = 3\neps = 0.001\n',
        'primitive = "batchnorm_statistics"\nN = 1\nC = 2\nH = 3\nW = 3\n',
        'primitive = "lstm_cell"\nN = 2\nC = 3\nK = 4\n',
        'primitive = "linear_backward_weights"\nN = 2\nC = 3\nK = 4\n',
    ],
)
def test_toml_primitives_compile_and_match_their_reference(text: str) -> None:
    kernel = polydl.compile(text)
    inputs = [np.abs(a) + 0.5 for a in  # positive: a variance among them stays valid
              (np.random.default_rng(0).uniform(-1, 1, arg.shape).astype(np.float32)
               for arg in kernel.arguments if arg.is_input)]
    got = kernel(*inputs)
    ref = kernel.reference(*inputs)
    for g, r in zip(got if isinstance(got, tuple) else (got,),
                    ref if isinstance(ref, tuple) else (ref,), strict=True):
        close(g, r)


def test_toml_bad_value_points_at_it() -> None:
    text = 'primitive = "pool2d"\nN = 1\nC = 2\nH = 4\nW = 4\nR = 2\nS = 2\nkind = "min"\n'
    with pytest.raises(SpecError) as info:
        load_spec(text)
    assert info.value.line == 8


@pytest.mark.parametrize(
    "build, arguments, name",
    [
        (polydl.linear, {"N": 0, "C": 2, "K": 2}, "N"),
        (polydl.linear, {"N": 2, "C": 2, "K": 2, "fuse": ("gelu",)}, "fuse"),
        (polydl.pool2d, {"N": 1, "C": 1, "H": 4, "W": 4, "R": 2, "S": 2, "padding": 2}, "padding"),
        (polydl.pool2d, {"N": 1, "C": 1, "H": 4, "W": 4, "R": 2, "S": 2, "kind": "min"}, "kind"),
        (polydl.eltwise, {"N": 1, "C": 1, "kind": "gelu"}, "kind"),
        (polydl.batchnorm_inference, {"N": 1, "C": 1, "H": 1, "W": 1, "eps": -1.0}, "eps"),
        (polydl.batchnorm_statistics, {"N": 1, "C": 1, "H": 1, "W": True}, "W"),
        (polydl.lstm_cell, {"N": 1, "C": 1, "K": 1, "dtype": "int8"}, "dtype"),
        (polydl.linear, {"N": 2, "C": 2, "K": 2, "dtype": "bfloat16"}, "dtype"),
        (polydl.conv2d_backward_data,
         {"N": 1, "C": 1, "K": 1, "H": 3, "W": 3, "R": 1, "S": 1, "dtype": "bfloat16"}, "dtype"),
    ],
)
def test_bad_arguments_name_the_argument(build, arguments, name) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ArgumentError) as info:
        build(**arguments)
    assert info.value.argument == name


@pytest.mark.slow
def test_mlp_example_checks_itself(capsys: pytest.CaptureFixture[str]) -> None:
    import runpy
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "mlp.py"
    runpy.run_path(str(example), run_name="__main__")
    assert "all layers match numpy" in capsys.readouterr().out
