"""Data-reuse analysis: the working set of every loop level of a scheduled band (PolyDL).

Takes statement domains, their schedule map (instance -> time vector) and access relations;
returns, for each band level l, the number of distinct cache lines touched by one execution of
loop l and everything inside it (the loops outside l fixed at their first iteration), counted
exactly with barvinok's `card()`, and how many times that level executes.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.poly.counting import count_points
from polydl.poly.isl_parts import sets_of
from polydl.poly.model import PolyModel, StatementModel


@dataclass(frozen=True)
class LevelWorkingSet:
    level: int  # 0 = outermost band loop
    loop: str
    lines: int  # distinct cache lines one execution of this loop touches
    executions: int  # how many times the loop runs (product of the outer trip counts)

    def bytes(self, line_bytes: int) -> int:
        return self.lines * line_bytes


def line_map(model: PolyModel, array: str, line_bytes: int) -> isl.Map:
    """`A[a0, a1, ...] -> A_line[floor(flat_offset * elem_size / line_bytes)]`."""
    arr = model.nest.array(array)
    shape = arr.concrete_shape(model.params)
    elem = DTYPES[arr.dtype].bytes
    dims = [f"a{d}" for d in range(len(shape))]
    stride, terms = 1, []
    for d in reversed(range(len(shape))):
        terms.append(f"{stride}*{dims[d]}" if stride != 1 else dims[d])
        stride *= shape[d]
    per_line = max(line_bytes // elem, 1)
    flat = " + ".join(reversed(terms)) or "0"
    return isl.Map(f"{{ {array}[{', '.join(dims)}] -> {array}_line[floor(({flat})/{per_line})] }}")


def time_to_lines(
    model: PolyModel,
    statements: tuple[StatementModel, ...],
    schedule_map: isl.UnionMap,
    line_bytes: int,
) -> isl.UnionMap:
    """Time vector -> cache line, over every access of the statements."""
    lines = isl.UnionMap("{ }")
    cache: dict[str, isl.Map] = {}
    for s in statements:
        for acc in s.accesses:
            name = acc.access.array
            if name not in cache:
                cache[name] = line_map(model, name, line_bytes)
            lines = lines.union(isl.UnionMap.from_map(acc.relation.apply_range(cache[name])))
    return schedule_map.reverse().apply_range(lines)


def working_sets(
    model: PolyModel,
    statements: tuple[StatementModel, ...],
    schedule_map: isl.UnionMap,
    loops: tuple[str, ...],
    line_bytes: int = 64,
    total_lines: int | None = None,
) -> list[LevelWorkingSet]:
    """Working set of each of the first `len(loops)` time dimensions (the band).
    `total_lines`, if known, is level 0's: every line the statements touch, whatever the
    schedule (so a ranking counts it once)."""
    touched = time_to_lines(model, statements, schedule_map, line_bytes)
    time_domain = schedule_map.range()
    first = _first_time_point(time_domain)
    out: list[LevelWorkingSet] = []
    for level, loop in enumerate(loops):
        if level == 0 and total_lines is not None:
            out.append(LevelWorkingSet(level, loop, total_lines, 1))
            continue
        prefix = _fix_prefix(first, level)
        lines = count_points(touched.intersect_domain(prefix).range())
        executions = count_points(_project_prefix(time_domain, level)) if level else 1
        out.append(LevelWorkingSet(level, loop, lines, executions))
    return out


def _first_time_point(time_domain: isl.UnionSet) -> list[int]:
    sets = sets_of(time_domain)
    point = sets[0]
    for s in sets[1:]:
        point = point.union(s)
    # dimension by dimension: isl's lexmin refuses some sets with strides (existentials)
    out = []
    for d in range(point.dim(isl.dim_type.set)):
        low = point.dim_min_val(d)
        out.append(low.to_python())
        point = point.fix_val(isl.dim_type.set, d, low)
    return out


def _fix_prefix(first: list[int], level: int) -> isl.UnionSet:
    dims = [f"t{d}" for d in range(len(first))]
    cons = " and ".join(f"t{d} = {first[d]}" for d in range(level)) or "true"
    return isl.UnionSet(f"{{ [{', '.join(dims)}] : {cons} }}")


def _project_prefix(time_domain: isl.UnionSet, level: int) -> isl.Set:
    out = None
    for s in sets_of(time_domain):
        n = s.dim(isl.dim_type.set)
        p = s.project_out(isl.dim_type.set, level, n - level)
        out = p if out is None else out.union(p)
    assert out is not None
    return out
