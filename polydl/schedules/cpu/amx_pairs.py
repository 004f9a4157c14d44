"""A bf16 B that AMX calls read from one copy of it in k pairs, made before the nest.

AMX tiles multiply B in pair-interleaved (VNNI) order: row p of a B tile holds (B[2p][n],
B[2p+1][n]). Without such a copy the kernel copies each call's B into that order
(`microkernels/amx.py`), and keeps it only for the thread's next call on the same block: with
the images in parallel a thread copies every block of weights once per image. An input B
whose innermost dimension is the call's n and the next its k can instead be copied whole:
B's flat rows of L elements (L the innermost extent) are taken two at a time, rows 2q and 2q+1
becoming one row of L pairs. Element (row r, column c) then sits at (r - r % 2) * L + 2c + r % 2,
in a copy of B's size; a call whose first row is even finds its B at its own offset o plus
o % L, and strides along k (L per row), along rows in steps of two, and along the outer
dimensions are B's own.

This module says where the copy can be made (`pairable_b`) and where it is made (`pairs_b`: a B
the caller keeps between calls, copied at the first call only); code generation makes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from polydl.ir import eval_int, int_vars
from polydl.poly.model import PolyModel
from polydl.schedules.microkernel import bound_statement, gemm_operands
from polydl.schedules.schedule import Schedule
from polydl.schedules.strides import element_stride, linear_coefficient
from polydl.target.cpu import CpuTarget


@dataclass(frozen=True)
class PairedB:
    """The copy of input `array` in k pairs: `elements` long, rows of `row` elements paired."""

    array: str
    row: int
    elements: int
    kept: bool  # the caller keeps the input between calls: the library keeps the copy too

    @property
    def name(self) -> str:
        return f"_pd_pairs_{self.array}"


def pairable_b(model: PolyModel, schedule: Schedule) -> PairedB | None:
    """The pairs copy of the B of `schedule`'s call, where the AMX kernel can read it: a
    bfloat16 input no statement writes, unit-stride along n; its innermost subscript is n
    (plus loops outside the call), its next one k plus an even remainder, over an even
    extent; k starts even and runs in even tiles; A unit-stride along k and C along n (the
    kernel's own orientation). None where any of that fails."""
    mk = schedule.microkernel
    if mk is None or mk.pack_b or mk.pack_a or mk.backend == "libxsmm":
        return None
    operands = gemm_operands(model, mk)
    if operands is None:
        return None
    c, a, b = operands
    statement = bound_statement(model, mk)
    array = model.nest.array(b.array)
    if array.dtype != "bfloat16" or b.array not in {arr.name for arr in model.nest.inputs}:
        return None
    if any(st.write.access.array == b.array for st in model.statements):
        return None
    shape = array.concrete_shape(model.params)
    if len(shape) < 2 or shape[-2] % 2:
        return None
    row = shape[-1]
    if (element_stride(model, a, mk.k) != 1 or element_stride(model, c, mk.n) != 1
            or element_stride(model, b, mk.n) != 1 or element_stride(model, b, mk.k) != row):
        return None
    inner, rows = b.indices[-1], b.indices[-2]
    variables = (int_vars(inner) | int_vars(rows)) - set(model.params)
    within = (mk.k, *mk.batch, *((mk.blocks,) if mk.blocks else ()))
    for var in variables:
        along_row, along_rows = linear_coefficient(inner, var), linear_coefficient(rows, var)
        if along_row is None or along_rows is None:
            return None
        if var == mk.n:
            if (along_row, along_rows) != (1, 0):
                return None
        elif var == mk.k:
            if (along_row, along_rows) != (0, 1):
                return None
        elif along_rows % 2 or (var in within and along_row):
            return None  # an odd step of rows, or a step along the row inside the call
    if eval_int(rows, {**model.params, **dict.fromkeys(variables, 0)}) % 2:
        return None
    k_index = statement.iterators.index(mk.k)
    k_first = statement.domain.dim_min_val(k_index).to_python()
    k_extent = statement.domain.dim_max_val(k_index).to_python() - k_first + 1
    tile = schedule.tile_sizes.get(mk.k)
    if k_first % 2 or k_extent % 2 or (tile is not None and tile < k_extent and tile % 2):
        return None
    return PairedB(b.array, row, math.prod(shape), array.kept)


def pairs_b(model: PolyModel, target: CpuTarget, schedule: Schedule) -> PairedB | None:
    """The copy of B in k pairs that the schedule's AMX calls read: where the caller keeps B
    between calls, so that it is copied at the first call only. The ranking still charges the
    calls' own copies (`cost.amx_repacked_bytes`).
    see decisions: A kept bf16 B copied in k pairs once"""
    if target.isa != "avx512amx":
        return None
    paired = pairable_b(model, schedule)
    return paired if paired is not None and paired.kept else None
