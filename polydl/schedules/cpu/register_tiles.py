"""Register tiles for sums without a microkernel: a row of vector sums held in registers
across the loops that sum into it.

A nest whose innermost loop runs along the vector lanes of every array it touches (a blocked
layout's 16 channels), with sums over other loops around a loop that moves the output (a
depthwise convolution: `y[n][kb][p][q][k] += x[..][q+s][k] * w[kb][r][s][k]` in the order
`.. p > r > s > q > k`, or a filter `.. i > t > l`), loads and stores its output once per tap. Tiling that output
loop outside the sums (`.. p > q.t > r > s > q > k`) gives code generation a fixed row of
outputs to keep in vector registers over every tap (`codegen/c/register_tiles.py`): one load
and one multiply-add per tap and output instead of a load, a multiply-add and a store.
see decisions: Register tiles of sums without a microkernel
"""

from __future__ import annotations

import math
from dataclasses import replace

from polydl.errors import ScheduleError
from polydl.ir import IntVar, access_vars, int_vars
from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.apply import apply_schedule, group_statements, main_group
from polydl.schedules.cpu.calls import loop_extent
from polydl.schedules.cpu.register_blocking import unit_for
from polydl.schedules.schedule import Schedule, is_tile_loop, tile_loop
from polydl.target.cpu import CpuTarget

# Vector widths (bytes) GCC's vector extension gives one lane row: 4, 8 or 16 floats.
ROW_BYTES = (16, 32, 64)
MAX_ROW = 8  # outputs per tile; edges then stay few (see decisions: Register tiles of sums without a microkernel)
SPARE_REGISTERS = 4  # the tap's input and weight vectors, and room for the compiler


def along_lanes(s: StatementModel, lane: str) -> bool:
    """Whether `s` writes its cell as a vector along `lane` (its target's last subscript is
    `lane` alone) and every access reads along `lane` by its last subscript alone or not at all
    (a broadcast): the form a row of vector sums takes (here and in code generation)."""
    target = s.statement.target
    if not target.indices or target.indices[-1] != IntVar(lane) or s.statement.is_indirect:
        return False  # gathers and scatters keep the plain path
    for a in s.accesses:
        indices = a.access.indices
        if any(lane in int_vars(i) for i in indices[:-1]):
            return False
        if indices and lane in int_vars(indices[-1]) and indices[-1] != IntVar(lane):
            return False
    return True


def lane_extent(model: PolyModel, lane: str) -> int:
    """The lane count of `lane` where the main statement, on float32 arrays only, runs
    `along_lanes` and the lanes make one vector of `ROW_BYTES`; 0 if not."""
    statements = group_statements(model)[main_group(model)]
    if len(statements) != 1:
        return 0
    s = statements[0]
    arrays = {a.access.array for a in s.accesses}
    if any(model.nest.array(name).dtype != "float32" for name in arrays) or not along_lanes(s, lane):
        return 0
    extent = loop_extent(model, lane)
    return extent if extent * 4 in ROW_BYTES else 0


def register_tiled(model: PolyModel, schedule: Schedule, target: CpuTarget) -> Schedule | None:
    """`schedule` (a band schedule without a microkernel, its order resolved) with its row,
    the output loop next to the lanes or next to the sums right outside them
    (`.. > sums > row > lanes` or `.. > row > sums > lanes`), tiled outside the sums:
    `.. > row.t > sums > row > lanes`. None where the nest has no such form, the ISA no
    vectors, or the order is not legal."""
    if schedule.microkernel is not None or not schedule.order or len(schedule.order) < 3:
        return None
    unit = unit_for(target.isa)
    if unit.vector_bytes < 16:
        return None
    order = list(schedule.order)
    lane = order[-1]
    if is_tile_loop(lane):
        return None
    lanes = lane_extent(model, lane)
    if not lanes:
        return None
    s = group_statements(model)[main_group(model)][0]
    moves = access_vars(s.statement.target)

    def sums_before(at: int) -> list[str]:
        """The loops of no output index right outside position `at`, innermost last."""
        out: list[str] = []
        while at > 0 and not is_tile_loop(order[at - 1]) and order[at - 1] not in moves:
            at -= 1
            out.insert(0, order[at])
        return out

    inner = order[:-1]
    if inner and inner[-1] in moves:  # `.. > sums > row > lanes`
        row = inner[-1]
        sums = sums_before(len(inner) - 1)
        at = len(inner) - 1 - len(sums)
    else:  # `.. > row > sums > lanes`
        sums = sums_before(len(inner))
        at = len(inner) - len(sums) - 1
        row = inner[at] if at >= 0 else ""
    if not sums or not row or is_tile_loop(row) or row not in moves or row in dict(schedule.tiles):
        return None
    vectors = math.ceil(lanes * 4 / unit.vector_bytes)
    extent = loop_extent(model, row)
    widest = min(MAX_ROW, (unit.registers - SPARE_REGISTERS) // vectors, extent)
    if widest < 2:
        return None
    # tiles of equal width: a narrower last tile would test every output on every tap
    size = -(-extent // -(-extent // widest))
    new_order = tuple(order[:at] + [tile_loop(row), *sums, row, lane])
    # a parallel row runs its tiles in parallel
    parallel = tuple(tile_loop(p) if p == row else p for p in schedule.parallel)
    tiled = replace(schedule, order=new_order, parallel=parallel,
                    tiles=tuple(sorted({**dict(schedule.tiles), row: size}.items())))
    try:
        apply_schedule(model, tiled)
    except ScheduleError:
        return None
    return tiled
