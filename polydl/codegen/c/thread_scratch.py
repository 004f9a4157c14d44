"""Scratch arrays held once per thread instead of whole: a copy that feeds the main nest inside
its parallel loop (`schedules.feeds`) writes and reads one slice of its array per iteration,
such as one zero-padded image. Where that slice is the array's first index and equals the
parallel loop's, each thread keeps one slice and reuses it for its next iteration: 16 padded
images of 861 KiB stay in 16 L2 caches, where the whole array (27.5 MB for ResNet-50's first
3 x 3 layer at N=32) was written to memory behind the copy and read again from there.

The slice a thread uses is `_pd_thread()` (its number in the parallel loop's team; OpenMP's
static schedule runs an iteration on each of the first N threads where there are fewer than
threads, so min(N, threads) slices suffice). A slice keeps the zeroes of a padded copy's border
from one iteration to the next where no iteration writes there.
"""

from __future__ import annotations

import islpy as isl

from polydl.codegen.c.scratch_clearing import cells_read_unwritten
from polydl.poly.isl_parts import maps_of
from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.apply import GroupPlan, ScheduledNest

THREAD_HELPERS = """\
#ifdef _OPENMP
#include <omp.h>
#define _pd_thread() omp_get_thread_num()
#define _pd_threads() omp_get_max_threads()
#else
#define _pd_thread() 0
#define _pd_threads() 1
#endif
static inline long _pd_slices(long n) { long t = _pd_threads(); return t < n ? t : n; }
"""


def per_thread_arrays(scheduled: ScheduledNest) -> frozenset[str]:
    """The scratch arrays of `scheduled` that each thread may hold one first-index slice of."""
    plan = scheduled.main
    if (not plan.feeds or not plan.feed_level or plan.parallel_dims != (0,)
            or plan.instance_map is None or plan.private_sum is not None):
        return frozenset()
    model = scheduled.model
    out = set()
    for feed in plan.feeds:
        array = feed.write.access.array
        users = [s for s in model.statements if any(a.access.array == array for a in s.accesses)]
        if {s.name for s in users} - {s.name for s in (feed, *plan.statements)}:
            continue  # another nest reads or writes it too
        if any(a.is_may for s in users for a in s.accesses if a.access.array == array):
            continue  # gathered or scattered through an index array: any cell of a slice
        if model.nest.array(array).concrete_shape(model.params)[0] < 2:
            continue
        if all(_first_index_is_time(plan, s, a.relation) for s in users for a in s.accesses
               if a.access.array == array) and _zeroes_kept(model, array):
            out.add(array)
    return frozenset(out)


def _zeroes_kept(model: PolyModel, array: str) -> bool:
    """True if the cells read before any write (a padded copy's border) sit at the same places
    in every slice, and no slice writes any of those places: a slice then keeps its zeroes
    from one iteration to the next."""
    unwritten = cells_read_unwritten(model, array)
    if unwritten is None or unwritten.is_empty():
        return True
    places = unwritten.project_out(isl.dim_type.set, 0, 1)
    first = unwritten.fix_val(isl.dim_type.set, 0, isl.Val.zero(unwritten.get_ctx()))
    if not places.is_equal(first.project_out(isl.dim_type.set, 0, 1)):
        return False
    written = model.writes.intersect_range(isl.UnionSet.from_set(model.extents[array])).range()
    return isl.Set.from_union_set(written).project_out(isl.dim_type.set, 0, 1).intersect(places).is_empty()


def _first_index_is_time(plan: GroupPlan, statement: StatementModel, access: isl.Map) -> bool:
    """True if every instance of `statement` touches cells whose first index is its first time
    dimension: the iteration of the parallel loop it runs in."""
    assert plan.instance_map is not None
    source = plan.schedule_map if statement in plan.feeds else plan.instance_map
    timed = [m for m in maps_of(source) if m.get_tuple_name(isl.dim_type.in_) == statement.name]
    if len(timed) != 1:
        return False
    cells = timed[0].reverse().apply_range(access)  # time -> cell
    return cells.is_subset(cells.equate(isl.dim_type.in_, 0, isl.dim_type.out, 0))
