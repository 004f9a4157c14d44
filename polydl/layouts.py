"""Convert numpy arrays between plain (NCHW, KCRS) and blocked (NCHW16c, KCRS16c16k) layouts.

Blocked layouts put a block of channels innermost so a microkernel loads whole vectors:
activations `x[N][C/b][H][W][b]`, weights `w[K/b][C/b][R][S][b(c)][b(k)]`. Channel counts that
are not a multiple of the block are padded with zeros, which adds nothing to a convolution.

A grouped convolution's weights are PyTorch's `w[K][C/groups][R][S]`; in the blocked layout
they take one of four forms (`grouped_form` says which the conv2d builder uses, and
`to_conv_weights` converts to it):

- "dense" (groups 1) and "block_diagonal" (C/groups and K/groups multiples of the block):
  `w[K/b][C/groups/b][R][S][b(c)][b(k)]`, `to_kcrs16c16k` of the grouped weights: the block
  row `kb` of group `g` meets only that group's input blocks.
- "depthwise" (groups == C == K): `w[K/b][R][S][b(k)]` (`to_krs16k`), the channel lanes
  innermost, as the activations have them.
- "in_block" (C/groups == K/groups, a divisor of the block: ResNeXt's 4 x 4 groups):
  `w[K/b][R][S][b(c)][b(k)]` (`to_krs16c16k`): each block of outputs reads only its own block
  of inputs; the weights between groups of a block are zero, so the block is one dense
  product (the microkernel's) of b/(C/groups) times the grouped convolution's work.
- "lanes" (any other grouping): `w[K/b][C/groups][R][S][b(k)]` (`to_kcrs16k`): for each
  output lane its C/groups input channels.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

BLOCK = 16


def blocks(channels: int, block: int = BLOCK) -> int:
    return -(-channels // block)


def to_blocked_channels(v: np.ndarray, dtype: DTypeLike | None = None,
                        block: int = BLOCK) -> np.ndarray:
    """A per-channel vector (a bias, a scale, a shift) of K values as a blocked kernel takes
    it: `blocks(K) * block` values, the lanes past K zero (in `dtype`, by default v's)."""
    out = np.zeros(blocks(len(v), block) * block, dtype=v.dtype if dtype is None else dtype)
    out[:len(v)] = v
    return out


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


def to_krs16k(w: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """Depthwise weights `w[K][1][R][S]` -> `[K/b][R][S][b]` (lanes past K are zero)."""
    k, one, r, s = w.shape
    if one != 1:
        raise ValueError(f"depthwise weights have one input channel per group, not {one}")
    out = np.zeros((blocks(k, block) * block, r, s), dtype=w.dtype)
    out[:k] = w[:, 0]
    return np.ascontiguousarray(out.reshape(-1, block, r, s).transpose(0, 2, 3, 1))


def from_krs16k(w: np.ndarray, k: int) -> np.ndarray:
    kb, r, s, block = w.shape
    plain = w.transpose(0, 3, 1, 2).reshape(kb * block, 1, r, s)
    return np.ascontiguousarray(plain[:k])


def to_kcrs16k(w: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """Grouped weights `w[K][C/groups][R][S]` -> `[K/b][C/groups][R][S][b]`, output lanes
    innermost (lanes past K are zero)."""
    k, cg, r, s = w.shape
    out = np.zeros((blocks(k, block) * block, cg, r, s), dtype=w.dtype)
    out[:k] = w
    return np.ascontiguousarray(out.reshape(-1, block, cg, r, s).transpose(0, 2, 3, 4, 1))


def from_kcrs16k(w: np.ndarray, k: int) -> np.ndarray:
    kb, cg, r, s, block = w.shape
    plain = w.transpose(0, 4, 1, 2, 3).reshape(kb * block, cg, r, s)
    return np.ascontiguousarray(plain[:k])


def to_krs16c16k(w: np.ndarray, groups: int, block: int = BLOCK) -> np.ndarray:
    """Grouped weights `w[K][C/groups][R][S]` with groups of equal size inside a block ->
    `[K/b][R][S][b(c)][b(k)]`, zero between the groups (and past K)."""
    k, cg, r, s = w.shape
    if k != cg * groups or block % cg:
        raise ValueError(f"in-block groups need C/groups == K/groups dividing {block}")
    lanes = blocks(k, block) * block
    out = np.zeros((lanes, lanes, r, s), dtype=w.dtype)  # [k][c][r][s], zero off the groups
    for g in range(groups):
        out[g * cg:(g + 1) * cg, g * cg:(g + 1) * cg] = w[g * cg:(g + 1) * cg]
    out = out.reshape(-1, block, lanes // block, block, r, s)  # [kb][k][cb][c][r][s]
    diagonal = np.stack([out[i, :, i] for i in range(out.shape[0])])  # [kb][k][c][r][s]
    return np.ascontiguousarray(diagonal.transpose(0, 3, 4, 2, 1))  # [kb][r][s][c][k]


def from_krs16c16k(w: np.ndarray, k: int, groups: int) -> np.ndarray:
    kb, r, s, block, _ = w.shape
    cg = k // groups
    plain = w.transpose(0, 4, 3, 1, 2).reshape(kb * block, block, r, s)  # [k][c in block]
    lane = np.arange(k) % block // cg * cg  # the first channel of k's group, in its block
    out = np.stack([plain[o, lane[o]:lane[o] + cg] for o in range(k)])
    return np.ascontiguousarray(out)


def grouped_form(channels: int, outputs: int, groups: int, block: int = BLOCK) -> str:
    """The blocked form of a convolution of C=`channels`, K=`outputs` in `groups` groups:
    "dense", "block_diagonal", "depthwise" or "lanes" (module docstring)."""
    if groups == 1:
        return "dense"
    per_group, outputs_per_group = channels // groups, outputs // groups
    if per_group == 1 and outputs_per_group == 1:
        return "depthwise"
    if per_group % block == 0 and outputs_per_group % block == 0:
        return "block_diagonal"
    if per_group == outputs_per_group and block % per_group == 0:
        return "in_block"
    return "lanes"


def to_conv_weights(
    w: np.ndarray, groups: int = 1, layout: str = "nchw16c", block: int = BLOCK
) -> np.ndarray:
    """PyTorch's (and ONNX's) weights `w[K][C/groups][R][S]` -> the `w` a conv2d kernel of
    that layout and grouping takes (plain "nchw": the same array, contiguous)."""
    if layout == "nchw":
        return np.ascontiguousarray(w)
    k, cg = w.shape[:2]
    form = grouped_form(cg * groups, k, groups, block)
    if form == "depthwise":
        return to_krs16k(w, block)
    if form == "in_block":
        return to_krs16c16k(w, groups, block)
    if form == "lanes":
        return to_kcrs16k(w, block)
    return to_kcrs16c16k(w, block)


def from_conv_weights(
    w: np.ndarray, k: int, c: int, groups: int = 1, layout: str = "nchw16c"
) -> np.ndarray:
    """The inverse of `to_conv_weights`: PyTorch's `w[K][C/groups][R][S]` again (K=`k`,
    C=`c`)."""
    if layout == "nchw":
        return np.ascontiguousarray(w)
    form = grouped_form(c, k, groups, w.shape[-1])
    if form == "depthwise":
        return from_krs16k(w, k)
    if form == "in_block":
        return from_krs16c16k(w, k, groups)
    if form == "lanes":
        return from_kcrs16k(w, k)
    return from_kcrs16c16k(w, k, c // groups)
