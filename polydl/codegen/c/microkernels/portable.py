"""Portable C microkernels: no intrinsics, any strides, any dtype.

Takes a normalised `BrgemmSpec` oriented so that n is the better vector dimension; returns C
source whose register tile (a small array of C) gcc -O3 keeps in registers and vectorises
along n when B and C are unit-stride there.
"""

from __future__ import annotations

from dataclasses import dataclass

from polydl.codegen import postops
from polydl.codegen.c.microkernels.loops import BlockLoop, block_loops, spec_values
from polydl.codegen.c.microkernels.spec import BrgemmSpec
from polydl.codegen.templating import render

ROWS = 4
# 16 unit-stride columns are 2 AVX2 (1 AVX-512) fp32 vectors per row once gcc vectorises;
# with strided columns a 4 x 4 tile still gives 16 independent accumulators.
UNIT_STRIDE_COLUMNS = 16
STRIDED_COLUMNS = 4


@dataclass(frozen=True)
class PortableTile:
    comment: str
    n: BlockLoop
    m: BlockLoop
    rows: int
    cols: int


def portable_blocking(spec: BrgemmSpec) -> tuple[int, int]:
    unit = spec.b_n == 1 and spec.c_n == 1
    return ROWS, UNIT_STRIDE_COLUMNS if unit else STRIDED_COLUMNS


def render_portable_kernel(spec: BrgemmSpec, name: str, description: str) -> str:
    rows, cols = portable_blocking(spec)
    tiles = [
        PortableTile(f"{r} x {c} block of C", n_loop, m_loop, r, c)
        for n_loop, c in block_loops(spec.n, cols)
        for m_loop, r in block_loops(spec.m, rows)
    ]

    def value(text: str) -> str:
        return f"{name}_bf16({text})" if spec.dtype == "bfloat16" else text

    c_cell = f"cp[i * {spec.c_m}L + j * {spec.c_n}L]"
    post: list[str] = []
    post_bases: list[str] = []
    if spec.postops is not None:
        ops = spec.postops
        post_bases = postops.operand_bases(ops, spec.output_ctype)
        post = postops.scalar_lines(
            ops, "v", lambda o: f"ep{o}[i * {ops.operands[o].m}L + j * {ops.operands[o].n}L]",
            spec.output_ctype)
    values = spec_values(spec)
    b_value = f"bk[kk * {spec.b_k}L + j * {spec.b_n}L]"
    if spec.b_pairs:  # columns two apart, rows in pairs (`BrgemmSpec.b_pairs`)
        values["b_n"] = 2
        b_value = f"bk[(kk - (kk & 1)) * {spec.b_k}L + 2 * j + (kk & 1)]"
    return render(
        "c/microkernels/portable.c.j2",
        **values,
        name=name,
        description=description,
        k=spec.k,
        c_cell=c_cell,
        c_initial=c_cell if spec.beta != 0.0 else "0",
        a_value=value(f"ak[kk * {spec.a_k}L + i * {spec.a_m}L]"),
        b_value=value(b_value),
        tiles=tiles,
        post=post,
        post_bases=post_bases,
    )
