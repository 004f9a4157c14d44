"""How many iterations a loop of a scheduled nest can run, which the code generator states in
the C it prints. A loop of the isl AST runs the instances of some statements at one value of
the schedule dimensions before its own; its span is exact over the schedule map, per
(statements, dimension)."""

from __future__ import annotations

import islpy as isl

from polydl.poly.isl_parts import maps_of


class LoopSpans:
    def __init__(self, schedule_map: isl.UnionMap) -> None:
        self.schedule_map = schedule_map
        self._known: dict[tuple[frozenset[str], int], int | None] = {}

    def widest(self, names: frozenset[str], dim: int) -> int | None:
        """The widest range (last less first value) that dimension `dim` spans over the
        statements `names` at one value of the dimensions before it; None where the sizes are
        left to run time."""
        if (names, dim) not in self._known:
            times = isl.UnionSet("{ }")
            for m in maps_of(self.schedule_map):
                if m.get_tuple_name(isl.dim_type.in_) in names:
                    times = times.union(isl.UnionSet.from_set(m.range()))
            self._known[names, dim] = _widest(isl.Set.from_union_set(times), dim)
        return self._known[names, dim]


def _widest(times: isl.Set, dim: int) -> int | None:
    if times.dim(isl.dim_type.param):
        return None
    times = times.project_out(isl.dim_type.set, dim + 1, times.dim(isl.dim_type.set) - dim - 1)
    loop = isl.Map.from_range(times).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, dim)
    try:
        widths = isl.Map.from_pw_multi_aff(
            loop.lexmax_pw_multi_aff().sub(loop.lexmin_pw_multi_aff())).range()
    except isl.Error:  # a dimension before it unbounded (a tile loop's strip, say)
        return None
    if widths.is_empty():
        return 0
    most = widths.dim_max_val(0)
    return most.to_python() if most.is_int() else None
