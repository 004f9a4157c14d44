"""Recurrences run across vector lanes: a loop that carries nothing, strip-mined into the lanes
of a vector below an innermost loop that carries a value from one iteration to the next.

Such an innermost loop (a running maximum with a rescaled sum, a running mean) runs one
element at a time, its math calls scalar. Where a loop around it carries nothing (the rows),
the rows run side by side instead: that loop is strip-mined by the target's vector lanes for
the statements' element type, and the lane loop goes below the recurrence, where each lane
runs its own row's recurrence and the code generator declares the loop SIMD (`LANES_MARK`).
Every other part of the strip keeps the lane loop outside it (a pass that streams a row
vectorises along the row). Legal by construction: the strip-mined loop carries no dependence
(checked exactly), so no two of its iterations depend on each other, whatever runs between.

It pays where the work the lanes share outweighs what they cannot: an access that moves with
the lane loop is read or written an element at a time (a row apart, or a local's cells), and
only one that stays put is shared by the vector. A math call weighs `MATH_CALL_OPS` operations
(libm's scalar `expf` against one arithmetic instruction), and runs in vector form only where
the nest's math may (`LoopNest.exact_math` off, a target with SIMD).
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polydl.ir import math_calls
from polydl.poly.dependences import carries
from polydl.poly.isl_parts import (
    affs_of,
    depends_on,
    iterators_of,
    maps_of,
    member_text,
    out_width,
    pw_affs_of,
    sets_of,
    statement_names,
)
from polydl.poly.model import PolyModel
from polydl.poly.sums import reduction_statements
from polydl.target.cpu import CpuTarget

# the mark above a lane loop (`lanes_mark_name`): the code generator declares it SIMD
LANES_MARK = "lanes"
# a scalar libm call (expf, logf, tanhf) against one arithmetic instruction
MATH_CALL_OPS = 12
# the lanes run where they take this many times fewer cycles than one element at a time
LANES_MARGIN = 2.0


def lanes_mark_name(lanes: int) -> str:
    return f"{LANES_MARK}@{lanes}"


def read_lanes_mark(name: str) -> int | None:
    """The lanes of a lanes mark's name; None for any other mark."""
    kind, _, lanes = name.partition("@")
    return int(lanes) if kind == LANES_MARK and lanes.isdigit() else None


@dataclass(frozen=True)
class LaneStrip:
    """One loop strip-mined into vector lanes below a recurrence."""

    loop: str  # the strip-mined loop's affine function, as isl prints it for one statement
    recurrence: str  # the innermost loop that carries the recurrence
    lanes: int
    statements: tuple[str, ...]  # the statements the lanes run side by side

    def describe(self) -> str:
        return (f"lanes: loop ({self.loop}) strip-mined into {self.lanes} vector lanes below "
                f"loop ({self.recurrence}), which carries a value from one iteration to the next "
                f"({', '.join(self.statements)})")


def lane_strips(model: PolyModel, target: CpuTarget, dependences: isl.UnionMap,
                tree: isl.Schedule) -> tuple[isl.Schedule, tuple[LaneStrip, ...]]:
    """`tree` with each recurrence that pays strip-mined into lanes, and what was done."""
    strips: list[LaneStrip] = []
    relation = _vector_blocking(model, dependences)
    if relation.is_empty() or target.isa == "scalar":
        return tree, ()
    done: set[str] = set()
    while True:
        recurrence = _next_recurrence(tree.get_root(), relation, done)
        if recurrence is None:
            return tree, tuple(strips)
        names = statement_names(recurrence.get_domain())
        done |= set(names)
        strip = _strip_for(model, target, dependences, recurrence)
        if strip is None:
            continue
        around, member, lanes = strip
        tree, described = _strip_mine(around, member, lanes, recurrence.get_domain())
        strips.append(LaneStrip(described, member_text(recurrence, recurrence.band_n_member() - 1),
                                lanes, names))


def _vector_blocking(model: PolyModel, dependences: isl.UnionMap) -> isl.UnionMap:
    """The dependences of a statement on its own earlier instances (a value it carries),
    but a sum's or an extremum's on its own cell (which run in registers,
    `codegen.c.accumulators`). A loop that carries only dependences between different
    statements runs passes one after another (isl fuses them into one loop), no recurrence."""
    reductions = reduction_statements(model)
    out = isl.UnionMap.empty(dependences.get_space())
    for m in maps_of(dependences):
        source, sink = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
        if source == sink and source not in reductions:
            out = out.union(isl.UnionMap.from_map(m))
    return out


def _next_recurrence(node: isl.ScheduleNode, relation: isl.UnionMap,
                     done: set[str]) -> isl.ScheduleNode | None:
    """The first band (depth first) with no band below it whose innermost loop carries a
    dependence of `relation` among its instances, over statements not yet in `done`."""
    if (node.get_type() == isl.schedule_node_type.mark
            and read_lanes_mark(node.mark_get_id().get_name()) is not None):
        return None
    for i in range(node.n_children()):
        found = _next_recurrence(node.child(i), relation, done)
        if found is not None:
            return found
    if (node.get_type() != isl.schedule_node_type.band or _has_band_below(node)
            or set(statement_names(node.get_domain())) & done):
        return None
    domain = node.get_domain()
    inner = relation.intersect_domain(domain).intersect_range(domain)
    time = node.get_prefix_schedule_union_map().flat_range_product(
        node.band_get_partial_schedule_union_map()).intersect_domain(domain)
    return node if carries(inner, time, out_width(time) - 1) else None


def _strip_for(model: PolyModel, target: CpuTarget, dependences: isl.UnionMap,
               recurrence: isl.ScheduleNode) -> tuple[isl.ScheduleNode, int, int] | None:
    """The band and member to strip-mine for the recurrence band `recurrence` (the innermost
    member around its innermost loop that carries nothing among the recurrence's instances and
    runs at least a vector of lanes), and the lanes; None where there is none or the lanes
    would not pay."""
    domain = recurrence.get_domain()
    dtypes = {model.nest.array(model.statement(n).statement.target.array).dtype
              for n in statement_names(domain)}
    if len(dtypes) != 1:
        return None
    lanes = target.vector_lanes(dtypes.pop())
    if lanes <= 1:
        return None
    node = recurrence
    last = recurrence.band_n_member() - 2  # members of the recurrence band itself come first
    while True:
        for member in range(last, -1, -1):
            iterators = _plain_iterators(node, member, domain)
            # every instance under the band is strip-mined, the recurrence's and the others'
            if iterators is None or not _carries_nothing(node, member, dependences):
                continue
            if _values(node, member, domain) < lanes:
                return None
            if not _pays(model, target, domain, iterators, lanes):
                return None
            return node, member, lanes
        node = node.parent()
        while node.get_type() != isl.schedule_node_type.band:
            if not node.has_parent():
                return None
            node = node.parent()
        last = node.band_n_member() - 1


def _carries_nothing(band: isl.ScheduleNode, member: int, dependences: isl.UnionMap) -> bool:
    """Whether the member carries no dependence among the instances under the band."""
    domain = band.get_domain()
    deps = dependences.intersect_domain(domain).intersect_range(domain)
    prefix = band.get_prefix_schedule_union_map().intersect_domain(domain)
    partial = band.band_get_partial_schedule()
    for d in range(member + 1):
        prefix = prefix.flat_range_product(isl.UnionMap.from_union_pw_aff(
            partial.get_union_pw_aff(d)).intersect_domain(domain))
    return not carries(deps, prefix, out_width(prefix) - 1)


def _plain_iterators(band: isl.ScheduleNode, member: int,
                     domain: isl.UnionSet) -> dict[str, int] | None:
    """Each statement's iterator that the member is (coefficient 1, nothing else); None where
    it is any other function for some statement."""
    out: dict[str, int] = {}
    upa = band.band_get_partial_schedule().get_union_pw_aff(member).intersect_domain(domain)
    for piece in pw_affs_of(upa):
        name = piece.get_domain_space().get_tuple_name(isl.dim_type.set)
        for aff in affs_of(piece):
            used = iterators_of(aff)
            if (len(used) != 1 or aff.get_coefficient_val(isl.dim_type.in_, used[0]).to_python() != 1
                    or out.get(name, used[0]) != used[0]):
                return None
            out[name] = used[0]
    return out


def _values(band: isl.ScheduleNode, member: int, domain: isl.UnionSet) -> int:
    """How many values the member takes over `domain` (its bounding interval)."""
    values = isl.UnionMap.from_union_pw_aff(
        band.band_get_partial_schedule().get_union_pw_aff(member)).intersect_domain(domain).range()
    sets = sets_of(values)
    if len(sets) != 1:
        return 0
    low, high = sets[0].dim_min_val(0), sets[0].dim_max_val(0)
    if not (low.is_int() and high.is_int()):
        return 0
    return high.to_python() - low.to_python() + 1


def _pays(model: PolyModel, target: CpuTarget, domain: isl.UnionSet, iterators: dict[str, int],
          lanes: int) -> bool:
    """Whether the statements' instances run `LANES_MARGIN` times faster across lanes than one
    at a time."""
    vector_math = not model.nest.exact_math
    alone = across = 0.0
    for name in statement_names(domain):
        s = model.statement(name)
        ops = s.statement.flops - math_calls(s.statement.value)
        calls = math_calls(s.statement.value) * MATH_CALL_OPS
        alone += ops + calls + len(s.accesses)
        across += ops / lanes + (calls / lanes if vector_math else calls)
        for access in s.accesses:
            across += 1.0 if _moves(access.relation, iterators[name]) else 1.0 / lanes
    return across * LANES_MARGIN <= alone


def _moves(access: isl.Map, iterator: int) -> bool:
    """Whether an access touches other cells as `iterator` moves (a gather may: it does)."""
    if not access.is_single_valued():
        return True
    subscripts = isl.PwMultiAff.from_map(access)
    return any(depends_on(subscripts.get_pw_aff(k), iterator)
               for k in range(subscripts.dim(isl.dim_type.out)))


def _strip_mine(band: isl.ScheduleNode, member: int, lanes: int,
                recurrence: isl.UnionSet) -> tuple[isl.Schedule, str]:
    """Strip-mine `member` of `band` by `lanes`: the member becomes its strips (a multiple of
    `lanes`), and the lane (the member less its strip) goes below the innermost band of the
    recurrence's instances `recurrence` (marked `LANES_MARK`), and at the top of every other
    part under the band."""
    text = member_text(band, member)
    n = band.band_n_member()
    if member + 1 < n:  # the members after it go below the lanes' strips
        band = band.band_split(member + 1)
    partial = band.band_get_partial_schedule()
    loop = partial.get_union_pw_aff(member)
    strips = loop.scale_down_val(isl.Val.int_from_si(loop.get_ctx(), lanes)).floor().scale_val(
        isl.Val.int_from_si(loop.get_ctx(), lanes))
    lane = loop.sub(strips)
    permutable = band.band_get_permutable()
    coincident = [band.band_member_get_coincident(d) for d in range(member + 1)]
    node = band.delete().insert_partial_schedule(partial.set_union_pw_aff(member, strips))
    node = node.band_set_permutable(permutable)
    for d, flag in enumerate(coincident):
        node = node.band_member_set_coincident(d, flag)
    node = _place_lanes(node.child(0), lane, recurrence, lanes)
    return node.get_schedule(), text


def _place_lanes(node: isl.ScheduleNode, lane: isl.UnionPwAff, recurrence: isl.UnionSet,
                 lanes: int) -> isl.ScheduleNode:
    """Put the lane loop on every path from `node` to a leaf: right below the recurrence's
    innermost band, else as high as the recurrence leaves room. Returns the node at `node`'s
    position."""
    if node.get_type() == isl.schedule_node_type.filter:  # a part of a sequence: inside it
        return _place_lanes(node.child(0), lane, recurrence, lanes).parent()
    domain = node.get_domain()
    if domain.intersect(recurrence).is_empty() or node.get_type() == isl.schedule_node_type.leaf:
        return _lane_band(node, lane)
    if node.get_type() == isl.schedule_node_type.band and not _has_band_below(node):
        return _lane_band(node.child(0), lane, lanes).parent()
    for i in range(node.n_children()):
        node = _place_lanes(node.child(i), lane, recurrence, lanes).parent()
    return node


def _lane_band(node: isl.ScheduleNode, lane: isl.UnionPwAff, lanes: int = 0) -> isl.ScheduleNode:
    """A band of the lane loop (over `node`'s instances) inserted above `node`; under a lanes
    mark where `lanes` is given. Returns the node now at `node`'s position."""
    schedule = isl.MultiUnionPwAff.from_union_pw_aff(lane.intersect_domain(node.get_domain()))
    node = node.insert_partial_schedule(schedule).band_member_set_coincident(0, 1)
    if lanes:
        node = node.insert_mark(isl.Id(lanes_mark_name(lanes), context=node.get_ctx()))
    return node


def _has_band_below(node: isl.ScheduleNode) -> bool:
    for i in range(node.n_children()):
        child = node.child(i)
        if child.get_type() == isl.schedule_node_type.band or _has_band_below(child):
            return True
    return False
