"""Winograd convolution F(m x m, 3 x 3) as three polydl loop nests, for the blocked layout.

The matrices are `schedules.winograd`'s. With the weights constant, their transform `G g G^T`
happens once here, in float64; a call then runs
1. the input transform `V = B^T d B` of every tile (a stream, vectorised over the 16 lanes),
2. (m+2)^2 independent GEMMs `M[xi] = V[xi] . U[xi]` over the channels: a 1 x 1 convolution
   with (m+2)^2 "images", which the scheduler maps onto the brgemm microkernel,
3. the output transform `Y = A^T M A` with the bias, residual and activation applied before
   the store, the last row and column of tiles cut at the output's edge.
The transforms are written as explicit sums with their integer coefficients, the inner sums
textually alike so the C compiler computes each once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from polydl.frontends.spec_writing import padded_copy
from polydl.onnx import ctext
from polydl.schedules.winograd import MATRICES
from polydl.target.cpu import CpuTarget

BLOCK = ctext.BLOCK
# The transformed weights ((m+2)^2 / 9 times the direct ones) are read once per call, for T/2
# flops per byte of them (T tiles). Below ~40 tiles that is under the machine's balance (~20
# flops per byte of memory traffic) and the direct convolution, which reads fewer weight bytes,
# is faster (see decisions: Winograd on the CPU: where, which F(m), how many images).
MIN_TILES = 40
# A host's reported L3 can be its whole socket's, shared with other tenants: at most this much
# of it counts for one call's scratch.
L3_COUNTED = 32 << 20


@dataclass(frozen=True)
class WinogradShape:
    """One call's problem: `images` images of C channels, H x W, into K channels, P x Q, by
    F(m x m, 3 x 3) with `pads` (top, left) before the first row and column."""

    images: int
    C: int
    K: int
    H: int
    W: int
    P: int
    Q: int
    pads: tuple[int, int]
    m: int

    @property
    def alpha(self) -> int:
        return self.m + 2

    @property
    def tiles(self) -> tuple[int, int]:
        return -(-self.P // self.m), -(-self.Q // self.m)

    @property
    def T(self) -> int:
        th, tw = self.tiles
        return self.images * th * tw

    @property
    def CB(self) -> int:
        return -(-self.C // BLOCK)

    @property
    def KB(self) -> int:
        return -(-self.K // BLOCK)

    def scratch_bytes(self) -> int:
        """The transformed input and the GEMM's output of one call, plus the padded input."""
        th, tw = self.tiles
        padded = self.images * self.CB * (th * self.m + 2) * (tw * self.m + 2) * BLOCK
        return 4 * (self.alpha ** 2 * self.T * (self.CB + self.KB) * BLOCK + padded)


def transform_weights(weights: np.ndarray, m: int) -> np.ndarray:
    """`U[xi][kb][cb][c][k] = (G w[k][c] G^T)[xi]` in float64, channels padded to blocks:
    the GEMM operand of the (m+2)^2 products, from PyTorch's w[K][C][3][3]."""
    K, C, R, S = weights.shape
    assert (R, S) == (3, 3), (R, S)
    G = np.array(MATRICES[m][1], dtype=np.float64)
    alpha = m + 2
    KB, CB = -(-K // BLOCK), -(-C // BLOCK)
    padded = np.zeros((KB * BLOCK, CB * BLOCK, 3, 3))
    padded[:K, :C] = weights
    u = np.einsum("ar,kcrs,bs->abkc", G, padded, G).reshape(alpha * alpha, KB, BLOCK, CB, BLOCK)
    return np.ascontiguousarray(u.transpose(0, 1, 3, 4, 2))  # [xi][kb][cb][c][k]


def _combination(coefficients: Sequence[Fraction], terms: Sequence[str]) -> str:
    """`sum coefficient * term` as C text, zero coefficients left out, +-1 as a sign."""
    text = ""
    for coefficient, term in zip(coefficients, terms, strict=True):
        if coefficient == 0:
            continue
        magnitude = abs(coefficient)
        scaled = term if magnitude == 1 else f"{ctext.literal(float(magnitude))} * {term}"
        if not text:
            text = f"-{scaled}" if coefficient < 0 else scaled
        else:
            text += f" - {scaled}" if coefficient < 0 else f" + {scaled}"
    return f"({text})" if text else "0.0f"


def conv_winograd_blocked(name: str, shape: WinogradShape, residual: str | None,
                          activation: str) -> ctext.Text:
    """The C function of one call: `y[n][kb][p][q][k]` (nchw16c) from `x[n][cb][h][w][c]`, the
    transformed weights `u[xi][kb][cb][c][k]`, the bias `b[KB*16]`, with the array `residual`
    names added ("res", an input shaped like y; "y": y's own value before the call, each cell
    read right before it is written; None: nothing), then `activation` ("{0}" is the value, or
    empty)."""
    s = shape
    m, alpha = s.m, s.alpha
    BT, _, AT = MATRICES[m]
    TH, TW = s.tiles
    N, CB, KB, T = s.images, s.CB, s.KB, s.T
    top, left = s.pads
    HP, WP = TH * m + 2, TW * m + 2
    tile = f"n * {TH * TW} + th * {TW} + tw"
    # the padded input, every cell written (zeros around x and past it to the last tile's edge)
    nests = [padded_copy([("n", N), ("cb", CB), ("h", HP), ("v", WP), ("c", BLOCK)],
                         "xp[n][cb][h][v][c]", "x[n][cb][{h}][{v}][c]",
                         (("h", top, s.H), ("v", left, s.W)), "0.0f")]
    # input transform: V[a][b] = sum_j BT[b][j] (sum_i BT[a][i] d[i][j])
    d = [[f"xp[n][cb][th * {m} + {i}][tw * {m} + {j}][c]" for j in range(alpha)] for i in range(alpha)]
    statements = []
    for a in range(alpha):
        columns = [_combination([BT[a][i] for i in range(alpha)], [d[i][j] for i in range(alpha)])
                   for j in range(alpha)]
        for b in range(alpha):
            statements.append(f"vt[{a * alpha + b}][cb][{tile}][c] = "
                              f"{_combination(BT[b], columns)};")
    nests.append(ctext.loops([("n", N), ("th", TH), ("tw", TW), ("cb", CB), ("c", BLOCK)],
                             "{\n" + "\n".join(statements) + "\n}"))
    # the products: a 1 x 1 convolution of alpha^2 "images" of T positions, from zero (the
    # start the microkernel takes as its first calls' overwrite)
    nests.append(ctext.loops([("xi", alpha * alpha), ("kb", KB), ("t", T), ("k", BLOCK)],
                             "mm[xi][kb][t][k] = 0.0f;"))
    nests.append(ctext.loops([("xi", alpha * alpha), ("kb", KB), ("t", T), ("cb", CB), ("c", BLOCK),
                              ("k", BLOCK)],
                             "mm[xi][kb][t][k] += vt[xi][cb][t][c] * u[xi][kb][cb][c][k];"))
    # output transform: Y[a][b] = sum_i AT[a][i] (sum_j AT[b][j] M[i][j]), cut at the edge
    mm = [[f"mm[{i * alpha + j}][kb][{tile}][k]" for j in range(alpha)] for i in range(alpha)]
    rows = [[_combination(AT[b], mm[i]) for i in range(alpha)] for b in range(m)]
    statements = []
    for a in range(m):
        for b in range(m):
            p, q = f"th * {m} + {a}", f"tw * {m} + {b}"
            y = f"y[n][kb][{p}][{q}][k]"
            value = f"{_combination(AT[a], rows[b])} + b[kb * {BLOCK} + k]"
            if residual:
                value += f" + {residual}[n][kb][{p}][{q}][k]"
            if activation:
                value = activation.format(f"({value})")
            guards = [g for g, cut in ((f"{p} < {s.P}", s.P % m and a >= s.P % m),
                                       (f"{q} < {s.Q}", s.Q % m and b >= s.Q % m)) if cut]
            store = f"{y} = {value};"
            statements.append(f"if ({' && '.join(guards)}) {store}" if guards else store)
    nests.append(ctext.loops([("n", N), ("kb", KB), ("th", TH), ("tw", TW), ("k", BLOCK)],
                             "{\n" + "\n".join(statements) + "\n}"))
    arrays = [ctext.array("y", (N, KB, s.P, s.Q, BLOCK), False),
              ctext.array("xp", (N, CB, HP, WP, BLOCK), False),
              ctext.array("vt", (alpha * alpha, CB, T, BLOCK), False),
              ctext.array("mm", (alpha * alpha, KB, T, BLOCK), False),
              ctext.array("x", (N, CB, s.H, s.W, BLOCK), True),
              ctext.array("u", (alpha * alpha, KB, CB, BLOCK, BLOCK), True),
              ctext.array("b", (KB * BLOCK,), True)]
    if residual == "res":
        arrays.append(ctext.array("res", (N, KB, s.P, s.Q, BLOCK), True))
    return ctext.function(name, arrays, nests, local=("xp", "vt", "mm"), filled=("xp", "vt", "mm"))


def choose(N: int, C: int, K: int, H: int, W: int, P: int, Q: int, pads: tuple[int, int],
           target: CpuTarget) -> WinogradShape | None:
    """The Winograd form of a 3 x 3, stride-1 convolution where it pays, else None.

    F(4x4) where its tiles divide the output (cut at the edge, they compute 16 x 16 for
    14 x 14), else F(2x2); below 32 channels the products are too short to outweigh the
    transforms. Images go `images` per call: as many as keep one call's scratch within the
    cores' L2s, or a quarter of the L3 (at most 32 MiB of it) where that is more (the
    transformed weights are then read once for them all). See decisions: Winograd on the CPU:
    where, which F(m), how many images."""
    if min(C, K) < 32 or min(P, Q) < 2:
        return None
    m = 4 if P % 4 == 0 and Q % 4 == 0 and min(P, Q) >= 8 else 2
    one = WinogradShape(1, C, K, H, W, P, Q, pads, m)
    budget = max(target.l2_bytes * target.cores, min(target.l3_bytes, L3_COUNTED) // 4)
    images = max([d for d in range(1, N + 1) if N % d == 0 and d * one.scratch_bytes() <= budget],
                 default=1)
    if images * one.T < MIN_TILES:
        return None
    return WinogradShape(images, C, K, H, W, P, Q, pads, m)
