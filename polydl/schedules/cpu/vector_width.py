"""How wide the vectors are that the C compiler makes of a kernel's loops by itself.

Takes a `ScheduledNest` and a `CpuTarget`; returns whether the kernel asks for 512-bit vectors.
gcc tuned for an AVX-512 server core vectorises with 256-bit vectors, as `-march=native` does:
loops of a few dozen iterations and triangular loops, whose every start runs a different
remainder, run faster so. Long rectangular loops run faster with 512-bit vectors (see
benchmarks/README.md: Data that moves between cores; tuning and vector width). A kernel asks
for them where every innermost loop the compiler vectorises runs the same trip count at each
start, at least `WIDE_LOOP_VECTORS` 512-bit vectors of its statement's elements, and where its
arrays fit the cores' L2 caches or its statements call math functions in vector form: a kernel
of plain arithmetic over more streams from memory, where the wider vectors gain nothing and
lost (benchmarks/README.md: Recurrences across vector lanes; separate loops). Microkernels
choose their registers themselves; a kernel that calls one asks nothing.
"""

from __future__ import annotations

import math

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.ir import math_calls
from polydl.poly.isl_parts import maps_of
from polydl.schedules.apply import ScheduledNest
from polydl.target.cpu import CpuTarget

# An innermost loop takes 512-bit vectors from this many of them per start.
WIDE_LOOP_VECTORS = 4


def wide_vectors(scheduled: ScheduledNest, target: CpuTarget) -> bool:
    """Whether the kernel's own loops should run in 512-bit vectors (see the module)."""
    if not target.has_avx512 or any(plan.calls for plan in scheduled.groups):
        return False
    model = scheduled.model
    arrays = sum(math.prod(a.concrete_shape(model.params)) * DTYPES[a.dtype].bytes
                 for a in model.nest.arrays if a not in model.nest.locals)
    computes = not model.nest.exact_math and any(
        math_calls(s.statement.value) for s in model.statements)
    if arrays > target.l2_bytes * target.cores and not computes:
        return False
    loops = 0
    for plan in scheduled.groups:
        for smap in maps_of(plan.schedule_map):
            s = scheduled.model.statement(smap.get_tuple_name(isl.dim_type.in_))
            # an AVX-512 target's vectors are the 512-bit ones
            lanes = target.vector_lanes(scheduled.model.nest.array(s.statement.target.array).dtype)
            trip = rectangular_trip(smap.intersect_domain(s.domain).range())
            if trip is None:
                continue  # one instance: no loop
            if trip < WIDE_LOOP_VECTORS * lanes:
                return False
            loops += 1
    return loops > 0


def rectangular_trip(times: isl.Set) -> int | None:
    """The span of the innermost loop over the time points `times` where it is the same at
    every start (0 where it differs or is unbounded); None where no dimension varies."""
    n = times.dim(isl.dim_type.set)
    for d in reversed(range(n)):
        upto = times.project_out(isl.dim_type.set, d + 1, n - d - 1)
        outer = upto.project_out(isl.dim_type.set, d, 1)
        inner = upto.project_out(isl.dim_type.set, 0, d)
        if inner.is_singleton():
            continue
        low, high = inner.dim_min_val(0), inner.dim_max_val(0)
        if not (low.is_int() and high.is_int()) or not upto.is_equal(outer.flat_product(inner)):
            return 0
        return high.to_python() - low.to_python() + 1
    return None
