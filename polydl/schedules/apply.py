"""Apply a `Schedule` to a `PolyModel`: isl schedule maps per loop nest, checked for legality.

Takes a `PolyModel` and a `Schedule`; returns a `ScheduledNest`, one `GroupPlan` per top-level
loop nest (group). The schedule transforms the band of the main group (the nest with the most
floating-point work); the other groups keep their order and run their outermost
dependence-free loop in parallel, except the nests named in `schedule.epilogues`, which join the
main band (`fusion.py`). Every plan is checked against the dependences: a schedule
that would run a sink before its source, or a parallel loop that carries a dependence, is a
`ScheduleError`, never code. With `schedule.private_sums` the main nest's parallel loops may
carry its one statement's sum into its output (`y += e`, e not reading y) and nothing else:
each thread then sums into a copy of y of its own (`GroupPlan.private_sum`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.errors import ScheduleError
from polydl.ir import Loop, expr_loads
from polydl.poly.counting import count_points
from polydl.poly.dependences import Dependences, carries, dependences_of
from polydl.poly.isl_parts import maps_of
from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.fusion import FusedMaps, fuse_at, fusion_levels
from polydl.schedules.microkernel import MicrokernelCall, bind_microkernel
from polydl.schedules.schedule import (
    AFFINE,
    MicrokernelBinding,
    Schedule,
    is_tile_loop,
    loop_var,
    tile_loop,
)


@dataclass(frozen=True, eq=False)
class GroupPlan:
    group: int
    statements: tuple[StatementModel, ...]
    band: tuple[Loop, ...]
    order: tuple[str, ...]  # loop names of the band dims, outermost first
    tiles: dict[str, int]
    schedule_map: isl.UnionMap  # statement instance -> time vector
    parallel_dims: tuple[int, ...]
    # Statements whose innermost loops became one microkernel call, by statement name. Their
    # instances in `schedule_map` are then points of the outer loops, not of the statement.
    calls: dict[str, MicrokernelCall] = field(default_factory=dict)
    # The statement-level schedule map (before any microkernel binding): what fusion reads.
    instance_map: isl.UnionMap | None = None
    # Consumer statements fused into the band (see `fusion.py`) and the level they run at.
    epilogues: tuple[StatementModel, ...] = ()
    fusion_level: int | None = None
    # The statement that sets the output, fused before the producer at `fusion_level`
    # (`start.py`).
    prologues: tuple[StatementModel, ...] = ()
    # The copy into a scratch array that the nest reads, fused before it at `feed_level`
    # (`feeds.py`).
    feeds: tuple[StatementModel, ...] = ()
    feed_level: int | None = None
    # A plan from the general scheduler (`affine.py`): the code follows this schedule tree
    # (its `parallel` marks name the parallel loops), `schedule_map` is its flat form.
    tree: isl.Schedule | None = None
    how: str = ""  # who planned the nest (and, without a tree, what it chose), for `explain`
    bands: tuple[str, ...] = ()  # each band of `tree`, described (none: no loops)
    # The output its parallel loops sum into through a private copy per thread (OpenMP's
    # array reduction), or None.
    private_sum: str | None = None

    @property
    def printed_statements(self) -> tuple[StatementModel, ...]:
        return self.feeds + self.prologues + self.statements + self.epilogues


@dataclass(frozen=True, eq=False)
class ScheduledNest:
    model: PolyModel
    schedule: Schedule
    main_group: int
    groups: tuple[GroupPlan, ...]

    @property
    def dependences(self) -> Dependences:
        return dependences_of(self.model)

    @property
    def main(self) -> GroupPlan:
        return next(g for g in self.groups if g.group == self.main_group)


def statement_work(s: StatementModel) -> int:
    return count_points(s.domain) * max(s.statement.flops, 1)  # loops without flops still cost


def group_statements(model: PolyModel) -> dict[int, tuple[StatementModel, ...]]:
    groups: dict[int, list[StatementModel]] = {}
    for s in model.statements:
        groups.setdefault(s.group, []).append(s)
    return {g: tuple(ss) for g, ss in groups.items()}


_MAIN_GROUP: weakref.WeakKeyDictionary[PolyModel, int] = weakref.WeakKeyDictionary()


def main_group(model: PolyModel) -> int:
    if model not in _MAIN_GROUP:
        groups = group_statements(model)
        _MAIN_GROUP[model] = max(
            groups, key=lambda g: (sum(statement_work(s) for s in groups[g]), -g)
        )
    return _MAIN_GROUP[model]


def band_of(statements: tuple[StatementModel, ...]) -> tuple[Loop, ...]:
    """The loops every statement of the group shares: the permutable candidate band."""
    band: list[Loop] = []
    for depth, loop in enumerate(statements[0].loops):
        if all(len(s.loops) > depth and s.loops[depth] is loop for s in statements):
            band.append(loop)
        else:
            break
    return tuple(band)


def main_band(model: PolyModel) -> tuple[Loop, ...]:
    return band_of(group_statements(model)[main_group(model)])


def _check_order(schedule: Schedule, band_vars: tuple[str, ...]) -> tuple[str, ...]:
    tiles = schedule.tile_sizes
    for var, size in tiles.items():
        if var not in band_vars:
            raise ScheduleError(f"tile on '{var}', which is not a loop of the band {band_vars}")
        if size < 1:
            raise ScheduleError(f"tile size of '{var}' must be >= 1, not {size}")
    order = schedule.order or tuple(
        [tile_loop(v) for v in band_vars if v in tiles] + list(band_vars)
    )
    expected = sorted(list(band_vars) + [tile_loop(v) for v in tiles])
    if sorted(order) != expected:
        raise ScheduleError(f"order {order} must list each of {tuple(expected)} exactly once")
    for v in tiles:
        if order.index(tile_loop(v)) > order.index(v):
            raise ScheduleError(f"tile loop '{tile_loop(v)}' must come before its point loop '{v}'")
    for p in schedule.parallel:
        if p not in order:
            raise ScheduleError(f"parallel loop '{p}' is not in the order {order}")
    return order


def _time_vector(
    s: StatementModel, band: tuple[Loop, ...], order: tuple[str, ...], tiles: dict[str, int]
) -> list[str]:
    time: list[str] = []
    for name in order:
        var = loop_var(name)
        time.append(f"{tiles[var]}*floor(({var})/{tiles[var]})" if is_tile_loop(name) else var)
    nb = len(band)
    time.append(str(s.positions[nb]))
    for depth in range(nb, len(s.loops)):
        time += [s.loops[depth].var, str(s.positions[depth + 1])]
    return time


def _group_plan(
    deps: Dependences,
    group: int,
    statements: tuple[StatementModel, ...],
    order: tuple[str, ...] | None,
    tiles: dict[str, int],
    parallel: tuple[str, ...] | None,
    microkernel: MicrokernelBinding | None = None,
    private_sums: bool = False,
) -> GroupPlan:
    band = band_of(statements)
    band_vars = tuple(loop.var for loop in band)
    if order is None:
        order = band_vars
    vectors = {s.name: _time_vector(s, band, order, tiles) for s in statements}
    width = max(len(v) for v in vectors.values())
    smap = isl.UnionMap("{ }")
    for s in statements:
        vec = vectors[s.name] + ["0"] * (width - len(vectors[s.name]))
        text = f"{{ {s.name}[{', '.join(s.iterators)}] -> [{', '.join(vec)}] }}"
        smap = smap.union(isl.UnionMap.from_map(isl.Map(text).intersect_domain(s.domain)))

    band_deps = band_dependences(deps, statements)
    # Tiling and permuting a fully permutable band is legal (every dependence moves forward
    # along every band loop); only other bands need the exact check, once per order and tiles.
    if not band_deps.permutable:
        checked = _ORDER_CHECKS.setdefault(band_deps, {})
        key = (order, tuple(sorted(tiles.items())))
        if key not in checked:
            broken = band_deps.relation.subtract(smap.lex_lt_union_map(smap))
            checked[key] = None if broken.is_empty() else _sample(broken)
        if checked[key] is not None:
            raise ScheduleError(f"order {' > '.join(order)} violates a dependence: {checked[key]}")
    summed = None
    if private_sums:
        summed, why_not = summed_output(deps.model, statements)
        if summed is None:
            raise ScheduleError(f"no private sums: {why_not}")
    summing = False  # whether a parallel loop carries the sum
    dims: tuple[int, ...]
    if parallel is None:
        first = next((d for d in range(len(order)) if _parallel_at(band_deps, smap, order, d)), None)
        dims = () if first is None else (first,)
    else:
        dims = tuple(order.index(p) for p in parallel)
        for p, d in zip(parallel, dims, strict=True):
            if _parallel_at(band_deps, smap, order, d):
                continue
            summing = True
            if summed is None:
                raise ScheduleError(f"loop '{p}' carries a dependence and cannot run in parallel")
            if carries(_without_sum(deps, band_deps, statements[0], str(summed)), smap, d):
                raise ScheduleError(f"loop '{p}' carries a dependence other than the sum into "
                                    f"{summed} and cannot run in parallel")
    calls: dict[str, MicrokernelCall] = {}
    instance_map = smap
    if microkernel is not None:
        smap, calls = _bind_call(
            deps.model, statements, smap, order, tiles, microkernel, width, dims
        )
        inner = len(order) - len(microkernel.loops)
        if any(d >= inner for d in dims):
            raise ScheduleError("a parallel loop must stay outside the microkernel call")
        dims = _parallel_around_copies(dims, calls.values())
    return GroupPlan(group, statements, band, order, tiles, smap, dims, calls, instance_map,
                     private_sum=str(summed) if summing else None)


def _parallel_around_copies(dims: tuple[int, ...], calls: Iterable[MicrokernelCall]) -> tuple[int, ...]:
    """The parallel loops that run in parallel where a packed operand's copy sits between
    them: the copy is the body of the loops outside it, before the loops inside it, so those
    no longer nest perfectly and OpenMP runs only the outer ones on the threads (n blocks
    outside m blocks with B copied per n block: the n blocks alone are the threads' units)."""
    for call in calls:
        for packed in (call.pack, call.pack_a):
            if packed is None:
                continue
            if any(d < packed.level for d in dims) and any(d >= packed.level for d in dims):
                dims = tuple(d for d in dims if d < packed.level)
    return dims


# OpenMP adds the threads' private copies into the output one thread at a time: beyond this
# size the merge (threads x size) outweighs what splitting the sum gains.
PRIVATE_SUM_MAX_BYTES = 1 << 20


def array_bytes(model: PolyModel, name: str) -> int:
    array = model.nest.array(name)
    return math.prod(array.concrete_shape(model.params)) * DTYPES[array.dtype].bytes


def summed_output(model: PolyModel,
                  statements: tuple[StatementModel, ...]) -> tuple[str | None, str]:
    """(the array a nest of one statement `y[...] += e` sums into, where each thread may sum
    into a private copy of it, ""), or (None, why not)."""
    if len(statements) != 1:
        return None, "the loop nest has more than one statement"
    s = statements[0].statement
    array = model.nest.array(s.target.array)
    if s.op != "+=":
        return None, f"{s.name} is not a sum (`{s.target.array}[...] += ...`)"
    if any(load.array == s.target.array for load in expr_loads(s.value)):
        return None, f"{s.name} reads {s.target.array} beside summing into it"
    if array.dtype not in ("float32", "float64"):
        return None, f"{s.target.array} is {array.dtype}; OpenMP sums float and double"
    size = array_bytes(model, s.target.array)
    if size > PRIVATE_SUM_MAX_BYTES:
        return None, (f"{s.target.array} is {size} bytes, over the {PRIVATE_SUM_MAX_BYTES} a "
                      "private copy per thread may take")
    return s.target.array, ""


def _without_sum(deps: Dependences, band_deps: BandDependences, statement: StatementModel,
                 array: str) -> isl.UnionMap:
    """The group's dependences other than those of `statement`'s sum into `array`."""
    return band_deps.relation.subtract(deps.through(statement.name, array))


def _bind_call(
    model: PolyModel,
    statements: tuple[StatementModel, ...],
    smap: isl.UnionMap,
    order: tuple[str, ...],
    tiles: dict[str, int],
    binding: MicrokernelBinding,
    width: int,
    parallel_dims: tuple[int, ...] = (),
) -> tuple[isl.UnionMap, dict[str, MicrokernelCall]]:
    """Replace the bound statement's instances by one call per point of the outer loops
    (and add the copy of a packed operand before the calls that read it)."""
    target = next((s for s in statements if s.name == binding.statement), None)
    if target is None:
        raise ScheduleError(f"microkernel statement {binding.statement} is not in the main nest")
    if len(statements) != 1:
        raise ScheduleError(
            f"a microkernel needs {target.name} alone in its loop nest (fuse epilogues instead)"
        )
    call = bind_microkernel(model, target, binding, order, tiles, parallel_dims)
    outer = len(call.outer)
    times = next(m for m in maps_of(smap) if m.get_tuple_name(isl.dim_type.in_) == target.name).range()
    points = times.project_out(isl.dim_type.set, outer, width - outer).set_tuple_name(target.name)
    names = [f"t{d}" for d in range(outer)]
    vec = names + ["0"] * (width - outer)
    call_map = isl.Map(
        f"{{ {target.name}[{', '.join(names)}] -> [{', '.join(vec)}] }}"
    ).intersect_domain(points)
    result = isl.UnionMap.from_map(call_map)
    if call.pack is not None:
        result = result.union(_pack_map(call.pack_statement, points, call.pack.level, outer, width))
    if call.pack_a is not None:
        result = result.union(
            _pack_map(call.pack_a_statement, points, call.pack_a.level, outer, width))
    return result, {target.name: call}


def _pack_map(name: str, points: isl.Set, level: int, outer: int, width: int) -> isl.UnionMap:
    """The copy of one packed block: at the first `level` outer loops of the calls, ordered
    before the loops inside them (one less than their smallest value)."""
    blocks = points.project_out(isl.dim_type.set, level, outer - level).set_tuple_name(name)
    first = points.dim_min_val(level).to_python() if level < outer else 0
    names = [f"t{d}" for d in range(level)]
    vec = names + [str(first - 1)] + ["0"] * (width - level - 1)
    text = f"{{ {name}[{', '.join(names)}] -> [{', '.join(vec)}] }}"
    return isl.UnionMap.from_map(isl.Map(text).intersect_domain(blocks))


@dataclass(frozen=True, eq=False)
class BandDependences:
    """The dependences among one group's statements, seen on the band they share."""

    relation: isl.UnionMap  # between instances of the group's statements
    permutable: bool  # every dependence distance is >= 0 along every band loop
    still: frozenset[str]  # band loops along which no dependence moves


# The exact legality check of each (order, tiles) already made on a band: ranking applies
# one blocking several times (with and without parallel loops and microkernel).
_ORDER_CHECKS: weakref.WeakKeyDictionary[
    BandDependences, dict[tuple[tuple[str, ...], tuple[tuple[str, int], ...]], str | None]
] = weakref.WeakKeyDictionary()


_BAND_DEPS: weakref.WeakKeyDictionary[Dependences, dict[tuple[str, ...], BandDependences]] = (
    weakref.WeakKeyDictionary()
)


def band_dependences(deps: Dependences, statements: tuple[StatementModel, ...]) -> BandDependences:
    """Computed once per group: ranking asks it of every candidate schedule."""
    per_group = _BAND_DEPS.setdefault(deps, {})
    key = tuple(s.name for s in statements)
    if key not in per_group:
        per_group[key] = _band_dependences(deps, statements)
    return per_group[key]


def _band_dependences(deps: Dependences, statements: tuple[StatementModel, ...]) -> BandDependences:
    dom = isl.UnionSet("{ }")
    for s in statements:
        dom = dom.union(isl.UnionSet.from_set(s.domain))
    relation = deps.all.intersect_domain(dom).intersect_range(dom)
    band = [loop.var for loop in band_of(statements)]
    nb = len(band)
    permutable, moving = True, set()
    for m in maps_of(relation):
        on_band = m.project_out(isl.dim_type.in_, nb, m.dim(isl.dim_type.in_) - nb)
        on_band = on_band.project_out(isl.dim_type.out, nb, on_band.dim(isl.dim_type.out) - nb)
        on_band = on_band.set_tuple_name(isl.dim_type.in_, "B").set_tuple_name(isl.dim_type.out, "B")
        deltas = on_band.deltas()
        if deltas.is_empty():
            continue
        for d, var in enumerate(band):
            low, high = deltas.dim_min_val(d), deltas.dim_max_val(d)
            if low.is_neg() or low.is_neginfty():
                permutable = False
            if not (low.is_zero() and high.is_zero()):
                moving.add(var)
    return BandDependences(relation, permutable, frozenset(band) - moving)


def _parallel_at(
    band_deps: BandDependences, smap: isl.UnionMap, order: tuple[str, ...], dim: int
) -> bool:
    """Whether the loop at `dim` carries no dependence: at once if no dependence moves along
    its variable, else by the exact test."""
    if dim < len(order) and loop_var(order[dim]) in band_deps.still:
        return True
    return not carries(band_deps.relation, smap, dim)


def loop_is_parallel(model: PolyModel, plan: GroupPlan, dim: int) -> bool:
    band_deps = band_dependences(dependences_of(model), plan.statements)
    return _parallel_at(band_deps, plan.schedule_map, plan.order, dim)


def _sample(deps: isl.UnionMap) -> str:
    point = maps_of(deps)[0].wrap().sample_point()
    return str(isl.Set.from_point(point).unwrap()).strip("{} ")


def consumer_groups(model: PolyModel) -> list[tuple[StatementModel, ...]]:
    """The loop nests after the main one, in order: the candidates for fusion."""
    groups = group_statements(model)
    main = main_group(model)
    order = list(groups)
    return [groups[g] for g in order[order.index(main) + 1:]]


def fusion_max_level(plan: GroupPlan) -> int:
    """The deepest level a consumer may join: outside the microkernel call, if any."""
    if plan.calls:
        return min(len(call.outer) for call in plan.calls.values())
    return len(plan.order)


def fuse_epilogues(model: PolyModel, plan: GroupPlan, names: tuple[str, ...]) -> GroupPlan:
    """The main plan with the named consumer statements fused at the deepest legal level."""
    chain: list[StatementModel] = []
    for group in consumer_groups(model):
        picked = [s for s in group if s.name in names]
        if not picked:
            break
        if len(picked) != len(group):
            raise ScheduleError(
                f"fusing part of a loop nest: fuse all of {', '.join(s.name for s in group)}"
            )
        chain += group
    missing = set(names) - {s.name for s in chain}
    if missing:
        raise ScheduleError(
            f"epilogue statements {', '.join(sorted(missing))} do not directly follow the main "
            "loop nest, so they cannot be fused into it"
        )
    assert plan.instance_map is not None
    reasons = []
    for level in fusion_levels(fusion_max_level(plan), plan.parallel_dims):
        fused = fuse_at(model, plan.statements, plan.instance_map, chain, level, plan.parallel_dims)
        if isinstance(fused, FusedMaps):
            smap = fused.producer_map(plan.schedule_map).union(fused.consumers)
            return replace(plan, schedule_map=smap, epilogues=tuple(chain), fusion_level=level)
        reasons.append(f"level {level}: {fused}")
    raise ScheduleError(
        f"cannot fuse {', '.join(names)} into the main loop nest: "
        + ("; ".join(reasons) or "no loop inside the parallel loops to fuse at")
    )


def apply_schedule(
    model: PolyModel, schedule: Schedule, nest_plans: Mapping[int, GroupPlan] | None = None
) -> ScheduledNest:
    """`nest_plans`: plans of other nests (by group) made by `nests.plan_nests`; the nests
    without one keep their written order. The main nest follows `schedule`, or its entry in
    `nest_plans` when the schedule leaves it to the general scheduler."""
    deps = dependences_of(model)
    groups = group_statements(model)
    main = main_group(model)
    fused = set(schedule.epilogues)
    nest_plans = nest_plans or {}
    plans = []
    for g, statements in groups.items():
        if fused and all(s.name in fused for s in statements) and g != main:
            continue  # runs inside the main nest
        if g in nest_plans and (g != main or schedule.scheduler == AFFINE):
            plans.append(nest_plans[g])
        elif g == main and schedule.scheduler == AFFINE:
            raise ScheduleError("the schedule leaves the main nest to the general scheduler, "
                                "but no general plan was made for it")
        elif g == main:
            band_vars = tuple(loop.var for loop in band_of(statements))
            order = _check_order(schedule, band_vars)
            parallel = schedule.parallel if schedule.order or schedule.parallel else None
            mk = schedule.microkernel
            if schedule.private_sums and (fused or (mk and (mk.pack_a or mk.pack_b))):
                # epilogues read the sums; a packed block's slots are shared across the sum
                raise ScheduleError("no private sums with fused epilogues or packed operands")
            plan = _group_plan(
                deps, g, statements, order, schedule.tile_sizes, parallel, schedule.microkernel,
                schedule.private_sums,
            )
            if fused:
                plan = fuse_epilogues(model, plan, schedule.epilogues)
            plans.append(plan)
        else:
            # the other nests keep their order whatever the schedule: planned once per model
            per_model = _OTHER_PLANS.setdefault(model, {})
            key = (g, schedule.epilogues)
            if key not in per_model:
                per_model[key] = _group_plan(deps, g, statements, None, {}, None)
            plans.append(per_model[key])
    return ScheduledNest(model, schedule, main, tuple(plans))


_OTHER_PLANS: weakref.WeakKeyDictionary[PolyModel, dict[tuple[int, tuple[str, ...]], GroupPlan]] = (
    weakref.WeakKeyDictionary()
)
