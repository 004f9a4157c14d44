"""Which cells of a scratch array the kernel must zero before its nests run, and the C that
zeroes them.

A local array of a nest starts at zero on every call (the C semantics polydl gives `float
t[N];` in a spec, and what a zero-padded copy relies on for its border). Clearing all of it
costs a pass over memory the nests then write again: a padded input of 27.5 MB at N=32 for
a 56 x 56 layer. Only the cells some statement reads before any statement writes them need
the zero; isl's flow analysis over the nest's original order (which every legal schedule
keeps for these dependences) gives them, and isl's AST generator the loops over them.
"""

from __future__ import annotations

import re

import islpy as isl

from polydl.codegen.c_expr import ArrayLayout
from polydl.dtypes import DTYPES
from polydl.poly.counting import count_points
from polydl.poly.model import PolyModel


def cells_read_unwritten(model: PolyModel, array: str) -> isl.Set | None:
    """The cells of `array` that some statement instance reads before any writes them (None
    where no statement touches it)."""
    cells = isl.UnionSet.from_set(model.extents[array])
    reads, writes = model.reads.intersect_range(cells), model.writes.intersect_range(cells)
    if reads.is_empty() and writes.is_empty():
        return None
    empty = isl.Set.empty(model.extents[array].get_space())
    if reads.is_empty():
        return empty
    # a scatter through an index array may leave any cell of its dimension unwritten
    info = (isl.UnionAccessInfo.from_sink(reads)
            .set_must_source(model.must_writes.intersect_range(cells))
            .set_may_source(model.may_writes.intersect_range(cells)))
    unsourced = info.set_schedule_map(model.original_schedule).compute_flow().get_may_no_source()
    read = unsourced.range()
    return empty if read.is_empty() else isl.Set.from_union_set(read).coalesce()


# Cleared on the threads from this many bytes (a parallel region costs microseconds)
PARALLEL_BYTES = 1 << 20
MAX_LINES = 120
_UNPRINTABLE = re.compile(r"\b(floord|min|max|intFloor|intMod)\b|[%/]")


def clearing_lines(layout: ArrayLayout, cells: isl.Set, first: str | None = None) -> list[str] | None:
    """C lines that zero `cells` of the array `layout` describes; from PARALLEL_BYTES the
    outermost loop (two, where they nest) runs on the threads: each instance writes a cell of
    its own. `first`: a C expression for the first index in place of the cells' own. None
    where the loops would call isl's helper functions or run long."""
    if cells.is_empty():
        return []
    name = f"_pd_zero_{layout.name}"
    dims = cells.dim(isl.dim_type.set)
    named = cells.set_tuple_name(name)
    schedule = isl.Map.identity(named.get_space().map_from_set()).intersect_domain(named)
    build = isl.AstBuild.from_context(isl.Set("{ : }"))
    text = build.node_from_schedule_map(isl.UnionMap.from_map(schedule)).to_C_str()
    if _UNPRINTABLE.search(text) or text.count("\n") > MAX_LINES:
        return None  # isl's own helpers (floord, min, ...) or a long case split: clear it all
    args = ", ".join(f"i{d}" for d in range(dims))
    indices = [first if d == 0 and first is not None else f"i{d}" for d in range(dims)]
    offset = " + ".join(f"(long)({i}) * {stride}L" for i, stride in zip(indices, layout.strides, strict=True)) or "0"
    lines = [f"#define {name}({args}) {layout.name}[{offset}] = 0"]
    body = text.rstrip("\n").split("\n")
    bytes_ = count_points(cells) * DTYPES[layout.dtype].bytes
    if body and body[0].startswith("for (") and bytes_ >= PARALLEL_BYTES:
        # two loops collapse only where the first holds the second alone (no braces)
        nested = len(body) > 1 and not body[0].endswith("{") and body[1].startswith("  for (")
        lines.append("#pragma omp parallel for" + (" collapse(2)" if nested else "")
                     + " schedule(static)")
    lines += body + [f"#undef {name}"]
    return lines


def clearing(model: PolyModel, layout: ArrayLayout, filled: bool) -> tuple[bool, list[str]]:
    """How the kernel starts the scratch array `layout`: (clear all of it, the lines that zero
    some cells instead). Nothing for an array written in full before it is read (`filled`,
    or no cell read unwritten); all of it where every cell is read unwritten."""
    if filled:
        return False, []
    cells = cells_read_unwritten(model, layout.name)
    if cells is None or cells.is_empty():
        return False, []
    whole = model.extents[layout.name].is_subset(cells)
    if whole:
        return True, []
    if not layout.per_thread:
        lines = clearing_lines(layout, cells)
        return (True, []) if lines is None else (False, lines)
    # a slice per thread: the cells of the first slice, in every slice the threads hold (the
    # same in every slice: `thread_scratch` holds an array so only where they are)
    first = cells.fix_val(isl.dim_type.set, 0, isl.Val.zero(cells.get_ctx()))
    lines = clearing_lines(layout, first, "_pd_slice")
    if lines is None:
        return True, []
    count = layout.shape[0]
    # each thread clears the slice it then fills (the static schedule's thread t, slice t)
    return False, ["#pragma omp parallel for schedule(static)",
                   f"for (long _pd_slice = 0; _pd_slice < _pd_slices({count}); _pd_slice++) {{",
                   *("  " + line for line in lines), "}"]
