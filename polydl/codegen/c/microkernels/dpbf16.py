"""The AVX-512 BF16 microkernel: outer products with `vdpbf16ps` (two k steps per instruction).

Takes a normalised bfloat16 `BrgemmSpec` with unit-stride B and C along n and the `Blocking`
chosen for the FMA form (rows x vectors of 16 fp32 lanes); returns C source. B is read in its
own layout, row k and row k+1 interleaved into pairs in registers, so no packed (VNNI) copy of B
is needed; A's pair is gathered from A[m][k] and A[m][k + a_k].
"""

from __future__ import annotations

from dataclasses import dataclass

from polydl.codegen.c.microkernels.blocking import Blocking
from polydl.codegen.c.microkernels.loops import (
    BlockLoop,
    Cell,
    block_loops,
    outer_cells,
    spec_values,
)
from polydl.codegen.c.microkernels.spec import BrgemmSpec
from polydl.codegen.templating import render

LANES = 16
TARGET_ATTRIBUTE = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"


@dataclass(frozen=True)
class Part:
    count: int  # iterations over k pairs
    pair: bool  # False: the last, odd k alone


@dataclass(frozen=True)
class PairTile:
    comment: str
    n: BlockLoop
    m: BlockLoop
    rows: int
    vectors: int
    masked: bool
    cells: tuple[Cell, ...]
    parts: tuple[Part, ...]


def supports(spec: BrgemmSpec) -> bool:
    return spec.dtype == "bfloat16" and spec.b_n == 1 and spec.c_n == 1


def render_dpbf16_kernel(spec: BrgemmSpec, blocking: Blocking, name: str, description: str) -> str:
    assert supports(spec) and blocking.form == "outer"
    parts = []
    if spec.k // 2:
        parts.append(Part(spec.k // 2, True))
    if spec.k % 2:
        parts.append(Part(1, False))
    tiles = []
    for n_loop, width in block_loops(spec.n, blocking.vectors * LANES):
        vectors = -(-width // LANES)
        masked = width % LANES != 0
        for m_loop, rows in block_loops(spec.m, blocking.rows):
            cells = outer_cells(spec, rows, vectors, LANES, masked)
            comment = f"{rows} x {width} block of C: {rows} rows x {vectors} vectors, k in pairs"
            tiles.append(PairTile(comment, n_loop, m_loop, rows, vectors, masked, cells, tuple(parts)))
    tail = spec.n % LANES
    return render(
        "c/microkernels/dpbf16.c.j2",
        **spec_values(spec),
        name=name,
        description=description,
        target_attribute=TARGET_ATTRIBUTE,
        tail=tail,
        tail_bits=hex((1 << tail) - 1),
        tiles=tiles,
    )
