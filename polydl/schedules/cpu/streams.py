"""How many memory streams a loop order keeps open at once, and what that costs in DRAM speed.

A hardware prefetcher follows a limited number of sequential streams. A loop order that walks
a tensor row by row across many images (`p > n`: row p of image 0, of image 1, ...) interleaves
one stream per image, where `n > p` walks each image's plane as one stream: once the tensors
no longer fit the L3, the more images the row-major order interleaves, the slower it runs,
with the same bytes moved (see decisions: Memory streams priced beyond six a thread).

An access's streams, walking the order from the innermost loop out: a loop that advances the
access by no more than the run covered so far continues the run (the loops skipped in between
were open at the same time: their trip counts are the streams); a loop that jumps past it opens
that many separate runs; loops that do not move the access are reuse and count nothing. Jumps
outside the outermost continuing loop come one after another, not at once.
"""

from __future__ import annotations

import math

from polydl.ir import Access
from polydl.poly.model import PolyModel
from polydl.schedules.apply import group_statements, main_group
from polydl.schedules.schedule import Schedule, loop_var
from polydl.schedules.strides import element_stride

# streams up to this many per thread stream at full speed; each doubling beyond costs a quarter
# of the DRAM bandwidth more, on the low side of the measured slowdowns
# (see decisions: Memory streams priced beyond six a thread)
FREE_STREAMS = 6
COST_PER_DOUBLING = 0.25


def _stride(model: PolyModel, schedule: Schedule, access: Access, loop: str) -> int | None:
    var = loop_var(loop)
    stride = element_stride(model, access, var)
    if stride is not None and loop.endswith(".t"):
        stride *= schedule.tile_sizes.get(var, 1)
    return stride


def access_streams(model: PolyModel, schedule: Schedule, order: tuple[str, ...], access: Access,
                   trips: dict[str, int]) -> int:
    """The runs of `access` that the loops of `order` (outermost first) around a microkernel
    call keep open at once. The call's own loops, taken by stride, only make the run: the call
    reads its box of the operand as a block (its rows are few and end within the call)."""
    assert schedule.microkernel is not None
    calls = len(schedule.microkernel.loops)
    outer, inner = order[: len(order) - calls], order[len(order) - calls:]
    strides = {loop: _stride(model, schedule, access, loop) for loop in order}
    run = 1
    for loop in sorted(inner, key=lambda loop: abs(strides[loop] or 0)):
        stride = strides[loop]
        if stride is None or abs(stride) > run:
            break
        run += abs(stride) * (trips[loop] - 1)
    pending, open_at_once = 1, 1
    for loop in reversed(outer):
        trip, stride = trips[loop], strides[loop]
        if trip <= 1 or stride == 0:
            continue
        if stride is not None and abs(stride) <= run:
            run += abs(stride) * (trip - 1)
            open_at_once = pending
        else:
            pending *= trip
    return open_at_once


def open_streams(model: PolyModel, schedule: Schedule, order: tuple[str, ...],
                 trips: dict[str, int]) -> int:
    """The streams of every distinct access of the main nest under `order`, summed; 0 for a
    nest without microkernel calls (not measured: its plain loops are left as they rank)."""
    if schedule.microkernel is None:
        return 0
    accesses: dict[tuple[str, str], Access] = {}
    for statement in group_statements(model)[main_group(model)]:
        for a in statement.accesses:
            accesses.setdefault((a.access.array, repr(a.access.indices)), a.access)
    return sum(access_streams(model, schedule, order, a, trips) for a in accesses.values())


def dram_slowdown(streams: int) -> float:
    """How many times longer DRAM traffic takes with `streams` open at once than with few."""
    if streams <= FREE_STREAMS:
        return 1.0
    return 1.0 + COST_PER_DOUBLING * math.log2(streams / FREE_STREAMS)
