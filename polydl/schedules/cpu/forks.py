"""What a parallel loop of a schedule tree costs and gains, and what a whole tree costs.

Takes a `PolyModel`, a `CpuTarget` and isl maps of a schedule tree; returns cycles. Every count
is exact (barvinok, `poly/counting.py`): how often a parallel loop starts (each start a fork
and join of the threads, or a barrier where the loops around it run inside one parallel
region), its iterations, and the instances under it at a per-instance cost. A parallel loop
pays where the busiest thread's saving exceeds its starts' cost by `FORK_MARGIN`; the general
scheduler keeps the others sequential (`affine.py`) and compares its schedule with the written
order by `tree_cycles` (`nests.py`).

Cache lines move between cores where a parallel loop's threads touch what sequential code in
the same iteration of the loops around it touches too (`moved_bytes`): the other threads' share
of those cells crosses to their cores and back once per start of the loop.

An instance costs its operations and accesses, over the vector's lanes where its innermost loop
walks every access at unit stride (or holds it in a register) and carries no dependence other
than a sum into a register, as gcc vectorises such a loop of the written order; at one lane
otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.poly.counting import count_points
from polydl.poly.dependences import carries
from polydl.poly.isl_parts import maps_of, middle_point, sets_of, single_set
from polydl.poly.model import PolyModel
from polydl.poly.sums import addend_of
from polydl.schedules.cpu.threads import balance
from polydl.target.cpu import CpuTarget

# A parallel loop runs where its saving is this many times its forks (or barriers): the saving
# is an upper bound (threads share the memory bandwidth, and a loaded machine wakes them late).
FORK_MARGIN = 2.0
# Up to this many iterations of a loop that starts once, each one's work is counted (a
# triangle's rows differ); above, they are taken as even.
COUNTED_UNITS = 256

InstanceCycles = Callable[[str], float]


@dataclass(frozen=True)
class ParallelLoop:
    """One loop of a schedule tree as its threads would run it."""

    entries: int  # how often the loop starts: one fork (or barrier) each
    units: int  # its iterations over all entries
    work_cycles: float  # the instances under it, run on one thread
    busiest_share: float  # the busiest thread's share of the work (1 / threads at best)

    @property
    def saved_cycles(self) -> float:
        """The cycles the threads save against one thread, before forks."""
        return self.work_cycles * (1.0 - self.busiest_share)

    def pays(self, overhead_cycles: float) -> bool:
        """Whether the saving exceeds `overhead_cycles` per entry by the margin."""
        return self.saved_cycles > FORK_MARGIN * self.entries * overhead_cycles


# sets of up to this many points are counted by enumerating them (`_count`)
ENUMERATED_POINTS = 4096


def instance_cycles(model: PolyModel, target: CpuTarget, statement: str,
                    vectorised: bool = True) -> float:
    """Cycles of one instance of `statement`: its operations and accesses, one a cycle, over
    the vector's lanes where `vectorised`."""
    s = model.statement(statement)
    lanes = target.vector_lanes(model.nest.array(s.statement.target.array).dtype)
    return (max(s.statement.flops, 1) + len(s.accesses)) / (lanes if vectorised else 1)


def price_loop(domain: isl.UnionSet, outer: isl.UnionMap, loop: isl.UnionMap, cores: int,
               cycles: InstanceCycles) -> ParallelLoop:
    """The loop `loop` (instances -> its value) of the instances `domain`, inside the loops
    `outer` (instances -> their values; one entry per point of its range)."""
    outer = outer.intersect_domain(domain)
    loop = loop.intersect_domain(domain)
    entries = max(_count(outer.range()), 1)
    units = max(_count(outer.flat_range_product(loop).range()), 1)
    work = _work(domain, cycles)
    if cores <= 1:
        return ParallelLoop(entries, units, work, 1.0)
    if entries == 1 and units <= COUNTED_UNITS:
        values: list[isl.Point] = []
        loop.range().foreach_point(values.append)
        sizes = [_work(loop.intersect_range(isl.UnionSet.from_point(v)).domain(), cycles)
                 for v in values]
        share = balance([sizes], cores) / cores if sum(sizes) > 0 else 1.0
    else:
        per_entry = max(units / entries, 1.0)
        share = min(1.0, math.ceil(per_entry / cores) / per_entry)
    return ParallelLoop(entries, units, work, share)


def _work(instances: isl.UnionSet, cycles: InstanceCycles) -> float:
    return sum(_count(s) * cycles(s.get_tuple_name()) for s in sets_of(instances))


def _count(points: isl.Set | isl.UnionSet) -> int:
    """The points of `points`: enumerated where there are few, else counted by barvinok. Tile
    and skew coordinates come with divisions, and barvinok can take hours on a union of such
    parts (a skewed, tiled band of seven statements at M = 7, with a few dozen points)."""
    found = 0

    def see(_: isl.Point) -> isl.stat | None:
        nonlocal found
        found += 1
        return isl.stat.error if found > ENUMERATED_POINTS else None  # stops the enumeration

    try:
        points.foreach_point(see)  # type: ignore[arg-type]  # (the stubs omit the stop value)
    except isl.Error:
        if found <= ENUMERATED_POINTS:
            raise
        return count_points(points)
    return found


def vectorised_statements(model: PolyModel, schedule: isl.UnionMap,
                          dependences: isl.UnionMap) -> frozenset[str]:
    """The statements whose innermost loop under `schedule` (instances -> time, every statement
    at one width) the C compiler vectorises: each access moves by at most one element of its
    last subscript per step (or stays put) and the loop carries no dependence, except into a
    cell that stays put along it and that the statement sums into (a register's sum)."""
    out = set()
    for smap in maps_of(schedule):
        name = smap.get_tuple_name(isl.dim_type.in_)
        width = smap.dim(isl.dim_type.out)
        d = _innermost_loop(smap, width)
        if d is None:
            continue
        step = _step(smap, d, width)
        s = model.statement(name)
        held = [a for a in s.accesses if _moves(a.relation, step) == "stays"]
        if any(_moves(a.relation, step) == "strided" for a in s.accesses):
            continue
        own = isl.UnionSet.from_set(s.domain)
        mine = dependences.intersect_domain(own).union(dependences.intersect_range(own))
        if carries(mine, schedule, d):
            # a sum into a cell that stays put runs in a register (codegen's accumulators)
            summed = addend_of(s.statement) is not None and any(a.is_write for a in held)
            self_deps = dependences.intersect_domain(own).intersect_range(own)
            if not summed or carries(mine.subtract(self_deps), schedule, d):
                continue
        out.add(name)
    return frozenset(out)


def _innermost_loop(smap: isl.Map, width: int) -> int | None:
    """The last time dimension along which the statement's instances take several values for
    one value of the dimensions before it (a loop in the code, not a position)."""
    for d in reversed(range(width)):
        before = smap.project_out(isl.dim_type.out, d, width - d)
        here = smap.project_out(isl.dim_type.out, d + 1, width - d - 1).project_out(
            isl.dim_type.out, 0, d)
        if not before.reverse().apply_range(here).is_single_valued():
            return d
    return None


def _step(smap: isl.Map, d: int, width: int) -> isl.Map:
    """Instance -> the instance one step later along time dimension `d`, the outer ones
    equal."""
    ins = ", ".join(f"t{k}" for k in range(width))
    outs = ", ".join(f"t{k}" if k < d else f"t{d} + 1" if k == d else f"u{k}" for k in range(width))
    shift = isl.Map.read_from_str(smap.get_ctx(), f"{{ [{ins}] -> [{outs}] }}")
    return smap.apply_range(shift).apply_range(smap.reverse())


def _moves(access: isl.Map, step: isl.Map) -> str:
    """"stays", "streams" (one element of the last subscript per step) or "strided"."""
    pairs = step.apply_domain(access).apply_range(access)
    if pairs.is_empty():
        return "stays"
    rank = access.dim(isl.dim_type.out)
    deltas = pairs.deltas()
    if rank == 0:
        return "stays"
    box = isl.Set.universe(deltas.get_space())
    for k in range(rank - 1):
        box = box.fix_val(isl.dim_type.set, k, isl.Val.zero(box.get_ctx()))
    if deltas.is_subset(box.fix_val(isl.dim_type.set, rank - 1, isl.Val.zero(box.get_ctx()))):
        return "stays"
    unit = box.lower_bound_val(isl.dim_type.set, rank - 1, isl.Val.int_from_si(box.get_ctx(), -1))
    unit = unit.upper_bound_val(isl.dim_type.set, rank - 1, isl.Val.one(box.get_ctx()))
    return "streams" if deltas.is_subset(unit) else "strided"


def tree_cycles(model: PolyModel, target: CpuTarget, tree: isl.Schedule,
                dependences: isl.UnionMap, parallel_marks: tuple[str, ...], region_mark: str,
                cores: int) -> float:
    """The cycles of a schedule tree on `cores` threads: every instance at its cost (vectorised
    or not, `vectorised_statements`), the work under each parallel mark split among the threads
    (the busiest one's share), one fork and join per start of a parallel loop, or one barrier
    where a region mark holds the loops around it (and one fork for the region)."""
    schedule = tree.get_map()
    fast = vectorised_statements(model, schedule, dependences)

    def cycles(name: str) -> float:
        return instance_cycles(model, target, name, vectorised=name in fast)

    total = _work(tree.get_domain(), cycles)
    if cores <= 1:  # one thread forks and waits for nobody: a call and some bookkeeping
        return total
    marked = _marked(tree.get_root(), parallel_marks, region_mark, False)
    parallel = isl.UnionSet.empty(tree.get_domain().get_space())
    for node, _ in marked:
        parallel = parallel.union(node.get_domain())
    others = 1.0 - 1.0 / cores  # the share of a loop's cells that other threads touch
    for node, in_region in marked:
        band = node.child(0)
        domain = band.get_domain()
        outer = band.get_prefix_schedule_union_map()
        first = isl.UnionMap.from_union_pw_aff(
            band.band_get_partial_schedule().get_union_pw_aff(0))
        loop = price_loop(domain, outer, first, cores, cycles)
        total -= loop.saved_cycles
        total += loop.entries * (target.barrier_cycles if in_region else target.fork_join_cycles)
        total += (moved_bytes(model, node, parallel, tree.get_domain()) * others
                  / target.core_transfer_bytes_per_cycle)
    total += sum(target.fork_join_cycles for _ in _marked(
        tree.get_root(), (region_mark,), "", False))
    return total


def moved_bytes(model: PolyModel, mark: isl.ScheduleNode, parallel: isl.UnionSet,
                domain: isl.UnionSet) -> float:
    """Bytes of the cells that the parallel loop under `mark` and the sequential instances
    (those of `domain` outside `parallel`) both touch in one iteration of the loops around it,
    twice (to the loop's threads and back) for each start of the loop; once where no loop is
    around it (one start)."""
    around = mark.parent()
    while around.get_type() not in (isl.schedule_node_type.band, isl.schedule_node_type.domain):
        around = around.parent()
    instances = mark.get_domain()
    if around.get_type() == isl.schedule_node_type.domain:
        sequential = domain.subtract(parallel)
        return 0.0 if sequential.is_empty() else _shared_bytes(model, instances, sequential)
    sequential = around.get_domain().subtract(parallel)
    if sequential.is_empty():
        return 0.0
    prefix = around.child(0).get_prefix_schedule_union_map()
    times = single_set(prefix.intersect_domain(instances).range())
    if times is None:
        return 0.0
    # the instances of one middle iteration of the loops around
    middle = prefix.intersect_range(isl.UnionSet.from_set(middle_point(times))).domain()
    shared = _shared_bytes(model, middle.intersect(instances), middle.intersect(sequential))
    return 2.0 * _count(times) * shared


def _shared_bytes(model: PolyModel, first: isl.UnionSet, second: isl.UnionSet) -> float:
    """Bytes of the cells both instance sets touch."""
    accesses = model.reads.union(model.writes)
    cells = accesses.intersect_domain(first).range().intersect(
        accesses.intersect_domain(second).range())
    return float(sum(_count(c) * DTYPES[model.nest.array(c.get_tuple_name()).dtype].bytes
                     for c in sets_of(cells)))


def _marked(node: isl.ScheduleNode, names: tuple[str, ...], region_mark: str,
            in_region: bool) -> list[tuple[isl.ScheduleNode, bool]]:
    """The mark nodes named `names` under `node` with a band below them (outermost only), and
    whether a region mark holds each."""
    if node.get_type() == isl.schedule_node_type.mark:
        name = node.mark_get_id().get_name()
        # a parallel mark's name carries its loop's dimension (`affine.parallel_mark_name`)
        if name.partition("@")[0] in names and node.child(0).get_type() == isl.schedule_node_type.band:
            return [(node, in_region)]
        if region_mark and name == region_mark:
            in_region = True
    out = []
    for i in range(node.n_children()):
        out += _marked(node.child(i), names, region_mark, in_region)
    return out
