"""Convert numpy arrays between plain (NCHW, KCRS) and blocked (NCHW16c, KCRS16c16k) layouts.

Blocked layouts put a block of channels innermost so a microkernel loads whole vectors:
activations `x[N][C/b][H][W][b]`, weights `w[K/b][C/b][R][S][b(c)][b(k)]`. Channel counts that
are not a multiple of the block are padded with zeros, which adds nothing to a convolution.
"""

from __future__ import annotations

import numpy as np

BLOCK = 16


def blocks(channels: int, block: int = BLOCK) -> int:
    return -(-channels // block)


def to_nchw16c(x: np.ndarray, block: int = BLOCK) -> np.ndarray:
    n, c, h, w = x.shape
    out = np.zeros((n, blocks(c, block) * block, h, w), dtype=x.dtype)
    out[:, :c] = x
    return np.ascontiguousarray(out.reshape(n, -1, block, h, w).transpose(0, 1, 3, 4, 2))


def from_nchw16c(x: np.ndarray, channels: int) -> np.ndarray:
    n, cb, h, w, block = x.shape
    plain = x.transpose(0, 1, 4, 2, 3).reshape(n, cb * block, h, w)
    return np.ascontiguousarray(plain[:, :channels])


def to_kcrs16c16k(w: np.ndarray, block: int = BLOCK) -> np.ndarray:
    k, c, r, s = w.shape
    out = np.zeros((blocks(k, block) * block, blocks(c, block) * block, r, s), dtype=w.dtype)
    out[:k, :c] = w
    kb, cb = out.shape[0] // block, out.shape[1] // block
    out = out.reshape(kb, block, cb, block, r, s)  # [kb][k][cb][c][r][s]
    return np.ascontiguousarray(out.transpose(0, 2, 4, 5, 3, 1))  # [kb][cb][r][s][c][k]


def from_kcrs16c16k(w: np.ndarray, k: int, c: int) -> np.ndarray:
    kb, cb, r, s, bc, bk = w.shape
    plain = w.transpose(0, 5, 1, 4, 2, 3).reshape(kb * bk, cb * bc, r, s)
    return np.ascontiguousarray(plain[:k, :c])
