"""Inputs copied onto a cache line at run time when the caller's array starts off one.

A microkernel reads B (a convolution's weights) in whole vectors. Where every vector of B
starts a whole number of cache lines from the array's first element, the vectors are on lines
exactly when the array is; but a large numpy array starts 16 bytes past a line (glibc hands
out its mapping after a 16-byte header), and then every 64-byte vector straddles two lines and
costs two loads (1 x 1 layers suffer most: their calls issue a load of B per few broadcasts).
Such an input is copied, once per call, into scratch that starts on a line, and the kernel
reads the copy; an input already on a line is read in place. The copy is made only where its
estimated time is within 2% of the kernel's: short layers lose more to the copy than the
aligned loads give back, and copies of megabytes gain nothing (see decisions: Inputs copied
onto cache lines).
"""

from __future__ import annotations

import math

from polydl.dtypes import DTYPES
from polydl.ir import Access, eval_int
from polydl.poly.model import PolyModel
from polydl.schedules.apply import ScheduledNest
from polydl.schedules.strides import element_stride
from polydl.target.cpu import CpuTarget

LINE_BYTES = 64  # a cache line, and an AVX-512 vector
COPY_SHARE = 0.02  # the most of a kernel's time a copy may take
# The copy's estimate, at the target's `socket_copy_bytes_per_s`. Copies from
# PARALLEL_COPY_BYTES on are made by all the threads (after a fork and join), but what a copy
# added to a kernel on the 16-core host was the same rate (the kernel over copied weights against
# the same kernel over weights on a line: forward res4_1x1b and res4_3x3, weight gradients of
# res4_3x3 and res5_1x1c at N=32): the other cores then read the copy from the caches of the
# cores that wrote it.
PARALLEL_COPY_BYTES = 512 << 10
# The clock the target's fork and join cycles are counted at (13000 cycles: 5 us).
FORK_JOIN_HZ = 2.6e9
# The kernel's estimate: 60% of two FMA pipes' peak at 2.5 GHz on every core.
CORE_HZ, KERNEL_EFFICIENCY = 2.5e9, 0.6


def line_copies(scheduled: ScheduledNest, target: CpuTarget) -> tuple[str, ...]:
    """The kernel's input arrays (names, in declaration order) to copy onto a line when the
    caller gives them off one: read in place as a call's B, every vector of them a whole number
    of lines from the array's start, and a copy short beside the kernel on `target`."""
    if target.isa == "scalar":
        return ()  # no vectors to straddle a line
    model = scheduled.model
    inputs = {a.name: a for a in model.nest.parameters if a.is_input and a.shape}
    chosen: set[str] = set()
    for plan in scheduled.groups:
        for call in plan.calls.values():
            b = call.b
            if call.pack is not None or b.array not in inputs or b.array in chosen:
                continue
            iterators = call.statement.iterators
            if _vectors_on_lines(model, b, call.binding.n, iterators) and _pays(model, target, b.array):
                chosen.add(b.array)
    return tuple(name for name in inputs if name in chosen)


def _vectors_on_lines(model: PolyModel, b: Access, n: str, iterators: tuple[str, ...]) -> bool:
    elem = DTYPES[model.nest.array(b.array).dtype].bytes
    if elem > LINE_BYTES or LINE_BYTES % elem:
        return False
    per_line = LINE_BYTES // elem
    if element_stride(model, b, n) != 1:
        return False
    for var in iterators:
        stride = element_stride(model, b, var)
        if stride is None or (var != n and stride % per_line):
            return False
    start = _offset_at_zero(model, b, iterators)
    return start is not None and start % per_line == 0


def _pays(model: PolyModel, target: CpuTarget, array: str) -> bool:
    a = model.nest.array(array)
    nbytes = math.prod(a.concrete_shape(model.params)) * DTYPES[a.dtype].bytes
    cores = max(target.cores, 1)
    forks = nbytes >= PARALLEL_COPY_BYTES and cores > 1
    fork_join_s = target.fork_join_cycles / FORK_JOIN_HZ
    copy_s = fork_join_s * forks + nbytes / target.socket_copy_bytes_per_s
    core_flops = 2 * 2 * target.vector_lanes(a.dtype) * CORE_HZ * KERNEL_EFFICIENCY
    return copy_s <= COPY_SHARE * model.flops / (cores * core_flops)


def _offset_at_zero(model: PolyModel, access: Access, iterators: tuple[str, ...]) -> int | None:
    """The flat element offset of `access` with every loop variable at 0 (sizes at their
    values); None where a subscript cannot be evaluated so."""
    shape = model.nest.array(access.array).concrete_shape(model.params)
    env = {**model.params, **dict.fromkeys(iterators, 0)}
    offset = 0
    for index, extent in zip(access.indices, shape, strict=True):
        try:
            offset = offset * extent + eval_int(index, env)
        except (KeyError, ZeroDivisionError):
            return None
    return offset
