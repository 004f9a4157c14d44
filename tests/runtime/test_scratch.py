"""A kernel's scratch arrays (here a convolution's zero-padded input) come from blocks that
earlier calls gave back: each call still sees a cleared copy, and calls running at the same
time never share a block. Checked against numpy's sum over the taps."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

import polydl

N, C, K, H = 2, 3, 4, 9


def numpy_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y[n][k][p][q] = sum x_padded[n][c][p + r][q + s] * w[k][c][r][s], padding 1."""
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = np.zeros((x.shape[0], w.shape[0], H, H))
    for r in range(3):
        for s in range(3):
            y += np.einsum("nchw,kc->nkhw", padded[:, :, r:r + H, s:s + H], w[:, :, r, s])
    return y


def test_scratch_blocks_are_cleared_again_and_never_shared() -> None:
    kernel = polydl.conv2d(N, C, K, H, H, 3, 3, padding=1, accumulate=False)
    assert "pd_release(xp)" in kernel.source  # the padded input is a scratch array
    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, C, 3, 3)).astype(np.float32)

    def call(seed: int) -> float:
        # large values one call, small the next: a border left over from another call shows
        x = (np.random.default_rng(seed).standard_normal((N, C, H, H)) * 10.0 ** (seed % 3)).astype(np.float32)
        y = kernel(x, w)
        want = numpy_conv(x, w)
        return float(np.abs(y - want).max() / np.abs(want).max())

    assert max(call(seed) for seed in range(3)) < 1e-5
    with ThreadPoolExecutor(4) as pool:
        errors = list(pool.map(call, range(3, 43)))
    assert max(errors) < 1e-5, errors
