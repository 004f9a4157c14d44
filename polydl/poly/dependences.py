"""Dependences of a `PolyModel` and the legality questions schedules ask of them.

Takes a `PolyModel`; returns `Dependences`: value-based flow dependences from isl's flow analysis
(for explanation) and memory-based read-after-write, write-after-read and write-after-write
relations between statement instances (for legality: a schedule must keep every one of them in
order, since polydl never renames or expands arrays).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property

import islpy as isl

from polydl.poly.isl_parts import maps_of
from polydl.poly.model import PolyModel


@dataclass(frozen=True, eq=False)
class Dependences:
    model: PolyModel

    @cached_property
    def flow(self) -> isl.UnionMap:
        """Value-based flow dependences (which write produced the value each read sees). A
        scatter through an index array is a may-source: it kills no earlier write."""
        info = isl.UnionAccessInfo.from_sink(self.model.reads)
        info = info.set_must_source(self.model.must_writes)
        info = info.set_may_source(self.model.may_writes)
        info = info.set_schedule_map(self.model.original_schedule)
        return info.compute_flow().get_may_dependence()

    def _memory(self, source: isl.UnionMap, sink: isl.UnionMap) -> isl.UnionMap:
        # Per pair of statements that touch a common cell, not the order of every pair of
        # statements (quadratic: 50 statements, a Winograd convolution's, took seconds); the
        # accesses coalesced first, since a statement that reads a window has one access map
        # per cell of it.
        same_cell = source.coalesce().apply_range(sink.coalesce().reverse())
        times = {m.get_tuple_name(isl.dim_type.in_): m for m in maps_of(self.model.original_schedule)}
        out = isl.UnionMap.empty(same_cell.get_space())
        for pair in maps_of(same_cell):
            before = times[pair.get_tuple_name(isl.dim_type.in_)].lex_lt_map(
                times[pair.get_tuple_name(isl.dim_type.out)])
            out = out.union(isl.UnionMap.from_map(pair.intersect(before)))
        return out

    @cached_property
    def raw(self) -> isl.UnionMap:
        return self._memory(self.model.writes, self.model.reads)

    @cached_property
    def war(self) -> isl.UnionMap:
        return self._memory(self.model.reads, self.model.writes)

    @cached_property
    def waw(self) -> isl.UnionMap:
        return self._memory(self.model.writes, self.model.writes)

    @cached_property
    def all(self) -> isl.UnionMap:
        return self.raw.union(self.war).union(self.waw).coalesce()

    def through(self, statement: str, array: str) -> isl.UnionMap:
        """The memory dependences between instances of `statement` through cells of `array`
        (a sum's own chain)."""
        def own(accesses: isl.UnionMap) -> isl.UnionMap:
            out = isl.UnionMap.empty(accesses.get_space())
            for m in maps_of(accesses):
                if (m.get_tuple_name(isl.dim_type.in_) == statement
                        and m.get_tuple_name(isl.dim_type.out) == array):
                    out = out.union(isl.UnionMap.from_map(m))
            return out
        writes, reads = own(self.model.writes), own(self.model.reads)
        return (self._memory(writes, reads).union(self._memory(reads, writes))
                .union(self._memory(writes, writes)))

    def is_respected_by(self, schedule: isl.UnionMap) -> bool:
        """True if `schedule` runs every dependence source strictly before its sink."""
        deps = self.all
        if deps.is_empty():
            return True
        after = schedule.lex_lt_union_map(schedule)
        return deps.is_subset(after)

    def violations(self, schedule: isl.UnionMap) -> isl.UnionMap:
        """Dependences that `schedule` would break (empty for a legal schedule)."""
        return self.all.subtract(schedule.lex_lt_union_map(schedule))

    def carried_at(self, schedule: isl.UnionMap, dim: int) -> bool:
        """True if some dependence is carried by output dimension `dim` of `schedule`:
        its source and sink agree on dimensions before `dim` and differ at `dim`.

        A loop at a dimension that carries nothing may run its iterations in parallel."""
        return carries(self.all, schedule, dim)

    def is_parallel(self, schedule: isl.UnionMap, dim: int) -> bool:
        return not self.carried_at(schedule, dim)


def carries(relation: isl.UnionMap, schedule: isl.UnionMap, dim: int) -> bool:
    """True if some pair of `relation` is carried by output dimension `dim` of `schedule`."""
    if relation.is_empty():
        return False
    in_time = relation.apply_domain(schedule).apply_range(schedule)
    for m in maps_of(in_time):
        if dim >= m.dim(isl.dim_type.in_):
            continue
        for d in range(dim):
            m = m.equate(isl.dim_type.in_, d, isl.dim_type.out, d)
        if not _dim_is_zero(m.deltas(), dim):
            return True
    return False


def _dim_is_zero(deltas: isl.Set, dim: int) -> bool:
    """True if every vector of `deltas` is zero at `dim` (or the set is empty)."""
    zero = isl.Set.universe(deltas.get_space()).fix_val(
        isl.dim_type.set, dim, isl.Val.zero(deltas.get_ctx())
    )
    return deltas.is_subset(zero)


_CACHE: weakref.WeakKeyDictionary[PolyModel, Dependences] = weakref.WeakKeyDictionary()


def dependences_of(model: PolyModel) -> Dependences:
    """One `Dependences` per model, so ranking many schedules analyses the nest once."""
    deps = _CACHE.get(model)
    if deps is None:
        deps = _CACHE[model] = Dependences(model)
    return deps
