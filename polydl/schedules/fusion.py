"""Fuse consumer loop nests into the producer's loops, while the producer's output tile is in cache.

Takes the main group's plan (its statement-level schedule map) and the loop nests that follow it;
returns a fused schedule map, or the reason a nest cannot be fused. A consumer nest (an epilogue:
bias, ReLU, residual add, scale/shift, or any statement over the producer's output) is given the
producer's outer `level` time dimensions, as functions of its own iterators through the output
cell it touches, then runs after the producer at that level:

    producer  [t0 .. t(L-1), 0, <producer's inner dims>]
    consumer  [t0 .. t(L-1), 1, <its own loops>, <its rank in the chain>]

so the consumers of one chain share one loop nest inside the producer's tile. The deepest level
is tried first; a level is used only if (1) every consumer instance belongs to exactly one
iteration of the producer's outer loops, (2) every dependence that involves a consumer still
runs source before sink (isl's exact check), and (3) no parallel loop then carries a dependence.
A consumer that reads a neighbour's output (a stencil) fails (2) at any level that splits the
neighbours across tiles. The automatic choice also asks the reuse analysis whether the fused
tile's working set fits the cache, where fusing pays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import islpy as isl

from polydl.poly.dependences import carries, dependences_of
from polydl.poly.isl_parts import maps_of, out_width
from polydl.poly.model import PolyModel, StatementModel
from polydl.poly.reuse import working_sets
from polydl.poly.sums import reduction_statements
from polydl.target.cpu import CpuTarget

# The fused tile (the consumers' data in one iteration of the fusion level) must fit in this
# share of the per-core L2, next to the producer's own panels.
L2_SHARE = 0.5


@dataclass(frozen=True)
class FusionDecision:
    """What happened to one consumer nest: fused at `level` (the producer loop `loop`), or not."""

    statements: tuple[str, ...]
    fused: bool
    level: int | None
    loop: str | None
    working_set_bytes: int | None
    reason: str

    def describe(self) -> str:
        names = ", ".join(self.statements)
        if self.fused:
            return f"{names}: fused at level {self.level} (inside loop {self.loop}); {self.reason}"
        return f"{names}: not fused; {self.reason}"


@dataclass(frozen=True, eq=False)
class FusedMaps:
    level: int
    producer: isl.UnionMap  # statement-level producer map with the sequence dimension inserted
    consumers: isl.UnionMap  # consumer instance -> time, same width
    width: int

    def producer_map(self, smap: isl.UnionMap) -> isl.UnionMap:
        """Any map of the producer (e.g. the microkernel-call map) with the same insertion."""
        return _union(_pad(_insert(m, self.level), self.width) for m in maps_of(smap))


def fusion_levels(max_level: int, parallel_dims: Sequence[int]) -> range:
    """Candidate levels, deepest first: inside every parallel loop, at least one loop deep;
    level 0 (after the whole nest) only where one microkernel call is the whole nest
    (`max_level` 0), where the epilogue can still run inside that call as post-ops."""
    if max_level == 0 and not parallel_dims:
        return range(0, -1, -1)
    lowest = max(max(parallel_dims, default=-1) + 1, 1)
    return range(max_level, lowest - 1, -1)


def level_loop(order: Sequence[str], level: int) -> str:
    """The producer loop a consumer is fused inside at `level`."""
    return order[level - 1] if level else "(the whole nest: one microkernel call)"


def fuse_at(
    model: PolyModel,
    producers: Sequence[StatementModel],
    instance_map: isl.UnionMap,
    consumers: Sequence[StatementModel],
    level: int,
    parallel_dims: Sequence[int],
    *,
    before: bool = False,
    others: isl.UnionMap | None = None,
    others_are: Sequence[StatementModel] = (),
    feeding: bool = False,
) -> FusedMaps | str:
    """The fused maps of `consumers` (in chain order) at `level`, or why that is illegal.
    `before`: they run before the producer there (a start statement, `schedules.start`), not
    after it. `others`: the schedule of `others_are` (the producers and anything already fused,
    with the dimension at `level` inserted) to use instead of `instance_map` with one inserted.
    `feeding`: the `consumers` write cells the producers read (a copy the producers read,
    `schedules.feeds`): each runs in the iteration whose producers read its cell."""
    outer: list[isl.Map] = []
    for s in consumers:
        found = (_feed_time(producers, instance_map, s, level) if feeding
                 else _outer_time(model, producers, instance_map, s, level))
        if isinstance(found, str):
            return found
        outer.append(found)
    depth = max(2 * len(s.loops) for s in consumers)
    width = max(out_width(instance_map) + 1, level + depth + 2,
                out_width(others) if others is not None else 0)
    consumer_maps = []
    for rank, (s, out) in enumerate(zip(consumers, outer, strict=True)):
        inner: list[str] = ["-1" if before else "1"]
        for d, var in enumerate(s.iterators):
            inner += [var, str(s.positions[d + 1])]
        inner += ["0"] * (depth - 2 * len(s.loops)) + [str(rank)]
        text = f"{{ {s.name}[{', '.join(s.iterators)}] -> [{', '.join(inner)}] }}"
        full = out.flat_range_product(isl.Map(text).intersect_domain(s.domain))
        consumer_maps.append(_pad(full, width))
    if others is None:
        producer = _union(_pad(_insert(m, level), width) for m in maps_of(instance_map))
    else:
        producer = _union(_pad(m, width) for m in maps_of(others))
    consumer = _union(consumer_maps)
    smap = producer.union(consumer)

    relation = dependences_between(model, consumers, [*producers, *others_are, *consumers])
    if not relation.is_empty():
        broken = relation.subtract(smap.lex_lt_union_map(smap))
        if not broken.is_empty():
            return f"a dependence would run backwards: {_sample(broken)}"
        for d in parallel_dims:
            if carries(relation, smap, d):
                return f"the parallel loop at level {d} would carry a dependence of the consumer"
    return FusedMaps(level, producer, consumer, width)


def _outer_time(
    model: PolyModel,
    producers: Sequence[StatementModel],
    instance_map: isl.UnionMap,
    s: StatementModel,
    level: int,
) -> isl.Map | str:
    """Consumer instance -> the producer's first `level` time dimensions at the cell it uses."""
    written = {acc.access.array for p in producers for acc in p.accesses if acc.is_write}
    anchor = next(
        (a for a in s.accesses if a.is_write and a.access.array in written),
        next((a for a in s.accesses if a.access.array in written), None),
    )
    if anchor is None:
        return f"{s.name} does not use the producer's output"
    array = anchor.access.array
    writes = _union(
        acc.relation for p in producers for acc in p.accesses if acc.is_write and acc.access.array == array
    )
    through = isl.UnionMap.from_map(anchor.relation).apply_range(writes.reverse())
    timed = through.apply_range(instance_map)
    if timed.is_empty():
        return f"{s.name} touches no cell of {array} that the producer writes"
    return _one_iteration(
        timed, s, level, f"{s.name} touches cells of {array} that the producer does not write",
        f"a cell of {array} that {s.name} uses is written in several iterations of these loops "
        "(a reduction loop is among them)")


def _feed_time(
    producers: Sequence[StatementModel], instance_map: isl.UnionMap, s: StatementModel, level: int,
) -> isl.Map | str:
    """Instance of `s` -> the producers' first `level` time dimensions at the instances that
    read the cell it writes: one iteration of those loops for every instance."""
    write = s.write
    array = write.access.array
    reads = _union(acc.relation for p in producers for acc in p.accesses
                   if not acc.is_write and acc.access.array == array)
    if reads.is_empty():
        return f"the main nest reads nothing {s.name} writes"
    timed = isl.UnionMap.from_map(write.relation).apply_range(reads.reverse()).apply_range(instance_map)
    if timed.is_empty():
        return f"the main nest reads no cell of {array} that {s.name} writes"
    return _one_iteration(
        timed, s, level, f"some cells of {array} that {s.name} writes are read by no instance of "
        "the main nest", f"a cell of {array} that {s.name} writes is read in several iterations "
        "of these loops")


def _one_iteration(timed: isl.UnionMap, s: StatementModel, level: int, uncovered: str,
                   several: str) -> isl.Map | str:
    """`timed` (instance of `s` -> producer times) cut to the first `level` time dimensions: a
    map defined on all of `s` (else `uncovered`) with one value per instance (else `several`)."""
    found = isl.Map.from_union_map(timed)
    found = found.project_out(isl.dim_type.out, level, found.dim(isl.dim_type.out) - level)
    if not found.domain().is_equal(s.domain):
        return uncovered
    if not found.is_single_valued():
        return several
    return found


def fused_working_set(
    model: PolyModel, consumers: Sequence[StatementModel], fused: FusedMaps, line_bytes: int
) -> int:
    """Bytes the consumers touch in one iteration of the fusion level: the fused output tile."""
    loops = tuple(f"t{d}" for d in range(fused.level + 1))
    ws = working_sets(model, tuple(consumers), fused.consumers, loops, line_bytes)
    return ws[fused.level].bytes(line_bytes)


def vector_dims(model: PolyModel, schedule_map: isl.UnionMap) -> frozenset[int]:
    """Schedule dimensions that carry no dependence of the nest: an innermost loop there may be
    declared SIMD (`codegen.c.loops` does so where the C compiler would not vectorise it alone:
    fused epilogues, and bodies of several statements)."""
    relation = dependences_of(model).all
    return frozenset(
        d for d in range(out_width(schedule_map)) if not carries(relation, schedule_map, d)
    )


def reduction_vector_dims(model: PolyModel, schedule_map: isl.UnionMap) -> frozenset[int]:
    """Schedule dimensions that carry no dependence of the nest but those of a sum or an
    extremum on its own cell (`poly.sums`): an innermost loop there may be declared SIMD once
    those reductions run in registers with a `reduction` clause (`codegen.c.accumulators`)."""
    reductions = reduction_statements(model)
    relation = _union(m for m in maps_of(dependences_of(model).all)
                      if not (m.get_tuple_name(isl.dim_type.in_) in reductions
                              and m.get_tuple_name(isl.dim_type.out) == m.get_tuple_name(isl.dim_type.in_)))
    return frozenset(
        d for d in range(out_width(schedule_map)) if not carries(relation, schedule_map, d)
    )


def fits_cache(target: CpuTarget, nbytes: int) -> bool:
    return nbytes <= target.l2_bytes * L2_SHARE


# ----------------------------------------------------------------------------- isl helpers


def widened(*maps: isl.UnionMap) -> isl.UnionMap:
    """The union of schedule maps, each padded with zeros to the widest one's time dimensions."""
    width = max(out_width(m) for m in maps)
    return _union(_pad(m, width) for union in maps for m in maps_of(union))


def _union(maps) -> isl.UnionMap:
    out = isl.UnionMap("{ }")
    for m in maps:
        out = out.union(isl.UnionMap.from_map(m))
    return out


def dependences_between(model: PolyModel, these: Sequence[StatementModel],
                        those: Sequence[StatementModel]) -> isl.UnionMap:
    """The nest's dependences from instances of `these` to instances of `those`, and back."""
    deps = dependences_of(model).all
    mine, theirs = _domains(these), _domains(those)
    return deps.intersect_domain(theirs).intersect_range(mine).union(
        deps.intersect_domain(mine).intersect_range(theirs))


def _domains(statements: Sequence[StatementModel]) -> isl.UnionSet:
    out = isl.UnionSet("{ }")
    for s in statements:
        out = out.union(isl.UnionSet.from_set(s.domain))
    return out


def insert_level(smap: isl.UnionMap, level: int) -> isl.UnionMap:
    """`smap` with a constant 0 inserted at time dimension `level` (the producer's place)."""
    return _union(_insert(m, level) for m in maps_of(smap))


def _insert(m: isl.Map, level: int) -> isl.Map:
    """A constant 0 at time dimension `level`: the producer runs before its consumers there."""
    return m.insert_dims(isl.dim_type.out, level, 1).fix_val(isl.dim_type.out, level, isl.Val.zero(m.get_ctx()))


def _pad(m: isl.Map, width: int) -> isl.Map:
    n = m.dim(isl.dim_type.out)
    if n >= width:
        return m
    m = m.add_dims(isl.dim_type.out, width - n)
    for d in range(n, width):
        m = m.fix_val(isl.dim_type.out, d, isl.Val.zero(m.get_ctx()))
    return m


def _sample(relation: isl.UnionMap) -> str:
    m = maps_of(relation)[0]
    point = m.wrap().sample_point()
    return str(isl.Set.from_point(point).unwrap()).strip("{} ")
