"""Packing A: the block of A that a call's m tile x k tile reads, copied into panels of
register-tile rows (`Ap[m/mr][k][mr]`, BLIS's packed A), so that the microkernel streams it
contiguously instead of broadcasting from `mr` rows a row stride apart.

Takes the bound statement, its binding, the call's loop ranges and the loops outside it;
returns a `PackedA` (where the copy runs and the layout), or ScheduleError where the copy is
not legal (the nest writes A) or would repeat (a loop outside it that does not choose its
block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from polydl.errors import ScheduleError
from polydl.schedules.schedule import MicrokernelBinding, tile_loop
from polydl.schedules.strides import LoopRange, element_stride

if TYPE_CHECKING:
    from polydl.ir import Access
    from polydl.poly.model import PolyModel, StatementModel

# Rows of one panel: the register tile's rows (6 x 2 ymm accumulators on AVX2, 6 x 4 zmm on
# AVX-512; see codegen/c/microkernels/blocking.py).
PANEL_ROWS = 6


@dataclass(frozen=True)
class PackedA:
    """`name[p][k][rows]` holds A's rows p*rows.. (p < panels) for every k of the extent.
    The block of one (m tile, k tile) is copied just before the first call that reads it,
    inside the first `level` outer loops of the call (0: all of A before the nest)."""

    name: str
    rows: int
    panels: int
    k_extent: int
    m_tile: int | None  # rows per copy (the m tile), None: the whole m extent
    k_tile: int | None  # k steps per copy (the k tile), None: the whole k extent
    level: int
    parallel_copy: bool  # no parallel loop encloses the copy: its panels run on the threads

    @property
    def elements(self) -> int:
        return self.panels * self.k_extent * self.rows


def plan_pack_a(
    model: PolyModel,
    s: StatementModel,
    binding: MicrokernelBinding,
    a: Access,
    ranges: dict[str, LoopRange],
    outer: tuple[str, ...],
    parallel_dims: tuple[int, ...],
    written: bool,
) -> PackedA:

    if written:
        raise ScheduleError(f"cannot pack {a.array}: the nest writes it")
    if model.nest.array(a.array).dtype != model.nest.array(s.statement.target.array).dtype:
        raise ScheduleError(f"cannot pack {a.array}: only same-dtype operands are packed")
    if binding.batch:
        raise ScheduleError(f"cannot pack {a.array} in panels under a batch-reduce call")
    for var in (binding.m, binding.k):
        if ranges[var].lower != 0:
            raise ScheduleError(f"cannot pack {a.array}: loop '{var}' does not start at 0")
    for var in s.iterators:
        if var not in binding.loops and element_stride(model, a, var) != 0:
            raise ScheduleError(f"cannot pack {a.array}: it depends on the outer loop '{var}'")
    m, k = ranges[binding.m], ranges[binding.k]
    if m.tile is not None and m.tile < m.extent and m.tile % PANEL_ROWS:
        raise ScheduleError(
            f"cannot pack {a.array}: the m tile {m.tile} is no multiple of {PANEL_ROWS} rows"
        )
    slot_loops = [name for name in (tile_loop(binding.m), tile_loop(binding.k)) if name in outer]
    level = max((outer.index(name) + 1 for name in slot_loops), default=0)
    repeating = [outer[d] for d in range(level) if outer[d] not in slot_loops]
    if repeating:
        raise ScheduleError(
            f"cannot pack {a.array}: loop '{repeating[0]}' outside its copy would repeat it"
        )
    return PackedA(
        name=f"_pd_panels_{a.array}",
        rows=PANEL_ROWS,
        panels=-(-m.extent // PANEL_ROWS),
        k_extent=k.extent,
        m_tile=m.tile if tile_loop(binding.m) in outer else None,
        k_tile=k.tile if tile_loop(binding.k) in outer else None,
        level=level,
        parallel_copy=not any(d < level for d in parallel_dims),
    )
