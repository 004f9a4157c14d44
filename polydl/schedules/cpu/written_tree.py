"""The written order of a nest as an isl schedule tree.

Takes a `PolyModel`; returns an `isl.Schedule`: a sequence node wherever statements part in
the source, and one single-loop band per loop, each marked coincident. It is what the general
scheduler's band pass (tiling, parallel marks) works on where isl's scheduler gives up or finds
nothing better: that pass checks each loop against the dependences before it runs it in
parallel, so the marks claim nothing, and one-loop bands are never tiled.
"""

from __future__ import annotations

import islpy as isl

from polydl.poly.isl_parts import maps_of, out_width
from polydl.poly.model import PolyModel


def written_order_tree(model: PolyModel) -> isl.Schedule:
    times = model.original_schedule.intersect_domain(model.domains)
    width = out_width(times)
    leaf = isl.Schedule.from_domain(model.domains).get_root().child(0)
    return _build(leaf, model.domains, times, 0, width).get_schedule()


def _build(leaf: isl.ScheduleNode, domain: isl.UnionSet, times: isl.UnionMap, dim: int,
           width: int) -> isl.ScheduleNode:
    """Build the written order of `domain` from time dimension `dim` on at `leaf`; returns
    the node now at `leaf`'s position. Even dimensions are positions among siblings, odd
    ones loop iterators (constant for a statement outside that loop)."""
    if dim >= width:
        return leaf
    here = _dimension(times.intersect_domain(domain), dim, width)
    maps = maps_of(here)
    if dim % 2 == 0:
        positions: dict[int, isl.UnionSet] = {}
        for m in maps:
            value = m.range().dim_min_val(0).to_python()
            step = isl.UnionSet.from_set(m.domain())
            positions[value] = positions[value].union(step) if value in positions else step
        if len(positions) == 1:
            return _build(leaf, domain, times, dim + 1, width)
        filters = isl.UnionSetList.alloc(leaf.get_ctx(), len(positions))
        for value in sorted(positions):
            filters = filters.add(positions[value])
        node = leaf.insert_sequence(filters)
        for i, value in enumerate(sorted(positions)):
            child = _build(node.child(i).child(0), positions[value], times, dim + 1, width)
            node = child.parent().parent()
        return node
    # no loop here only where every statement holds one and the same value: statements that
    # each run once, at different iterations of one loop, still run in that loop's order
    values = {(m.range().dim_min_val(0).to_python(), m.range().dim_max_val(0).to_python()) for m in maps}
    if len(values) == 1 and len({v for pair in values for v in pair}) == 1:
        return _build(leaf, domain, times, dim + 1, width)
    band = leaf.insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(here))
    band = band.band_member_set_coincident(0, 1)
    return _build(band.child(0), domain, times, dim + 1, width).parent()


def _dimension(times: isl.UnionMap, dim: int, width: int) -> isl.UnionMap:
    out = isl.UnionMap.empty(times.get_space())
    for m in maps_of(times):
        m = m.project_out(isl.dim_type.out, dim + 1, width - dim - 1)
        out = out.union(isl.UnionMap.from_map(m.project_out(isl.dim_type.out, 0, dim)))
    return out
