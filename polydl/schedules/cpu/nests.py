"""Plan every loop nest of a model, not only the main one.

Takes a `PolyModel` and a `CpuTarget`; returns a `GroupPlan` per top-level loop nest (group).
Each nest is scheduled on its own (the nests run in their written order, which keeps every
dependence between them):

- a **band nest** (one statement in a perfect nest with a loop that carries no dependence,
  e.g. a GEMM that `distribution.py` isolated) is ranked by the data-reuse model like the main nest
  of a DL primitive: loop order, tiles, parallel loops and the batch-reduce microkernel;
- any other nest (several statements, imperfect, or with dependences that forbid plain
  permutation, such as stencils and solvers) goes to the general scheduler (`affine.py`).

`describe_plan` says in one line what was decided for a nest; `explain` and the kernel's
`Schedule.describe()` print that line, so they cannot disagree.
"""

from __future__ import annotations

import weakref
from dataclasses import replace

import islpy as isl

from polydl.errors import ScheduleError
from polydl.poly.ast_order import ast_schedule, keeps, tree_ast
from polydl.poly.dependences import dependences_of
from polydl.poly.model import PolyModel, StatementModel
from polydl.poly.sums import addend_of, reads_own_cell
from polydl.schedules.apply import (
    GroupPlan,
    apply_schedule,
    band_dependences,
    band_of,
    group_statements,
    main_group,
)
from polydl.schedules.cpu.affine import (
    ISL_ORIGIN,
    AffineSchedule,
    affine_schedule,
    describe_bands,
    written_order_schedule,
)
from polydl.schedules.cpu.rank import rank
from polydl.schedules.fusion import level_loop
from polydl.schedules.schedule import Schedule
from polydl.schedules.strides import element_stride, streams
from polydl.target.cpu import CpuTarget

# The general scheduler's reordering replaces the written order only where the model has it
# this much faster: the model counts work, vectorisation and forks, and the written order is
# what gcc compiles well.
TRANSFORM_MARGIN = 1.25
# isl's operations the check of the printed loops' order may take (a tiled, skewed 2-d stencil
# of 1000 x 4000 points: a few million, 2 s); beyond it the loops are printed unchecked
AST_CHECK_OPERATIONS = 20_000_000

_GROUP_MODELS: weakref.WeakKeyDictionary[PolyModel, dict[int, PolyModel]] = (
    weakref.WeakKeyDictionary()
)


def group_model(model: PolyModel, group: int) -> PolyModel:
    """The model of one loop nest alone (its dependences are those among its statements)."""
    per_model = _GROUP_MODELS.setdefault(model, {})
    if group not in per_model:
        statements = group_statements(model)[group]
        per_model[group] = replace(model, statements=statements)
    return per_model[group]


def is_band_nest(model: PolyModel, statements: tuple[StatementModel, ...]) -> bool:
    """One statement, every loop in the band, and a loop along which no dependence moves (the
    parallel loop; the ranking checks each order of the others exactly, so reductions such as
    a convolution's qualify). Otherwise only skewing finds parallelism: a wavefront."""
    if len(statements) != 1:
        return False
    band = band_of(statements)
    if len(band) != len(statements[0].loops):
        return False
    return bool(band_dependences(dependences_of(model), statements).still)


def main_is_general(model: PolyModel) -> bool:
    """Whether the main nest goes to the general scheduler rather than the ranked band
    schedules (and the `Schedule` of the kernel then says `scheduler="affine"`)."""
    return not is_band_nest(model, group_statements(model)[main_group(model)])


def plan_nests(model: PolyModel, target: CpuTarget, *, with_main: bool) -> dict[int, GroupPlan]:
    """A plan per nest (the main one only `with_main`), keyed by group. Cached per model and
    target: every schedule of a model (the tuner plans dozens) gets the same plans for the
    nests around its main one, and ranking them counts working sets, which is slow (the
    stem's padding copy). see decisions: Nest plans cached per model and target"""
    plans = _NEST_PLANS.setdefault(model, {})
    key = (target, with_main)
    if key not in plans:
        plans[key] = _plan_nests(model, target, with_main=with_main)
    return dict(plans[key])


_NEST_PLANS: weakref.WeakKeyDictionary[PolyModel, dict[tuple[CpuTarget, bool], dict[int, GroupPlan]]] = (
    weakref.WeakKeyDictionary())


def _plan_nests(model: PolyModel, target: CpuTarget, *, with_main: bool) -> dict[int, GroupPlan]:
    main = main_group(model)
    plans: dict[int, GroupPlan] = {}
    for group, statements in group_statements(model).items():
        if group == main and not with_main:
            continue
        sub = group_model(model, group)
        if is_band_nest(sub, statements):
            plans[group] = _band_plan(sub, target)
        else:
            plans[group] = affine_plan(sub, target, group)
    return plans


def affine_plan(model: PolyModel, target: CpuTarget, group: int) -> GroupPlan:
    """The general scheduler's plan; or the written order (with its outermost dependence-free
    loop parallel) where that loop holds every statement and each statement's innermost loop
    walks its accesses at unit stride (row-wise operators: LayerNorm, softmax; isl fuses their
    inner loops one after the other into a band whose tiles put guards in every inner loop),
    or where the general schedule found no parallel loop worth its forks and either skewed or
    tiled nothing (changing the order for nothing), or the written order has a parallel
    loop; or where isl's only parallelism is a wavefront of tiles and every innermost loop is
    a sum into one cell (the written order runs it as a vectorised dot product); and in any
    case where the model (`forks.tree_cycles`: work, vectorised innermost loops, forks) does
    not put isl's order ahead of the written one by `TRANSFORM_MARGIN`."""
    try:
        chosen = affine_schedule(model, target)
    except ScheduleError as exc:
        chosen = written_order_schedule(model, target, str(exc))
    if chosen.origin == ISL_ORIGIN and _streams_rows(model):
        written = written_order_schedule(
            model, target, "its outermost loop is parallel and every innermost loop streams")
        if _parallel_outermost(written, model):
            chosen = written
    if _wavefront_only(chosen) and _inner_loops_sum(model):
        chosen = written_order_schedule(
            model, target, "every innermost loop is a sum that runs in a register; the "
            "wavefront of tiles would split it")
    if not chosen.parallel and chosen.origin == ISL_ORIGIN:
        written = written_order_schedule(
            model, target, f"the {chosen.origin}'s schedule has no parallel loop worth its forks")
        # no parallelism either way: isl's order is kept only where it tiles (reuse the
        # written order lacks); an untiled interchange can lose the unit stride (trisolv's
        # column-wise solve)
        if (written.parallel or any(b.skewed for b in chosen.bands)
                or not any(b.tiles for b in chosen.bands)):
            chosen = written
    if chosen.origin == ISL_ORIGIN:
        written = written_order_schedule(model, target, "the affine scheduler's order does not "
                                         "beat it by the margin")
        if not _beats(chosen, written):
            chosen = written
    if chosen.origin == ISL_ORIGIN and not _code_keeps_order(chosen, model, unread=False):
        chosen = written_order_schedule(
            model, target, "isl's code for the affine scheduler's tree runs a dependence's sink "
            "before its source")
        if not _code_keeps_order(chosen, model):
            raise ScheduleError(f"isl's code for the written order of nest {group} runs a "
                                "dependence's sink before its source")
    smap = chosen.tree.get_map()
    if not dependences_of(model).is_respected_by(smap):  # isl keeps validity: never expected
        raise ScheduleError(f"the general schedule of nest {group} violates a dependence")
    return GroupPlan(
        group, model.statements, (), (), {}, smap, (), tree=chosen.tree, how=chosen.origin,
        bands=tuple(b.describe() for b in chosen.bands) + tuple(s.describe() for s in chosen.lanes),
    )


def _code_keeps_order(schedule: AffineSchedule, model: PolyModel, unread: bool = True) -> bool:
    """Whether the loops isl's AST generator prints for the tree run every instance and every
    dependence's source before its sink (`poly.ast_order`: the generator can break a tree's
    order). An AST the check cannot read, or cannot check within `AST_CHECK_OPERATIONS` of
    isl's operations (or where isl fails), is `unread`: taken as it is for the written order,
    refused for the affine scheduler's (seed 811804: a skewed order whose guards the check
    could not read ran two writes of a cell in the wrong order)."""
    ctx = schedule.tree.get_ctx()
    ctx.reset_operations()
    ctx.set_max_operations(AST_CHECK_OPERATIONS)
    try:
        order = ast_schedule(tree_ast(schedule.tree))
        if order is None:
            return unread
        return (order.domain().is_equal(schedule.tree.get_domain())
                and keeps(order, dependences_of(model).all))
    except isl.Error:
        return unread
    finally:
        ctx.set_max_operations(0)


def _beats(transformed: AffineSchedule, written: AffineSchedule) -> bool:
    """Whether the model puts `transformed` ahead of the written order by `TRANSFORM_MARGIN` on
    the target's cores, and no behind it on one thread (a reordering for parallelism only
    must not cost the sequential run)."""
    return (transformed.cycles * TRANSFORM_MARGIN <= written.cycles
            and transformed.sequential_cycles <= written.sequential_cycles)


def describe_plan(plan: GroupPlan) -> str:
    """What was decided for one nest, in one line: the general scheduler's bands in the words it
    chose when it made them (`plan.how`, `plan.bands`: the loops, the statements, tiles, and
    the parallel loop or wavefront of each band), or a band plan's loops, tiles, the loops its
    threads run, its microkernel and what runs inside it."""
    if plan.tree is not None:
        return describe_bands(plan.how, plan.bands)
    parts = [f"loops {' > '.join(plan.order) or '-'}"]
    if plan.tiles:
        parts.append("tiles " + ", ".join(f"{v}={t}" for v, t in plan.tiles.items()))
    parts.append("parallel " + (", ".join(parallel_loops(plan)) or "none")
                 + (" (a private sum per thread)" if plan.private_sum else ""))
    if plan.calls:
        parts.append("microkernel for " + ", ".join(plan.calls))
    if plan.epilogues:
        parts.append("fused " + ", ".join(s.name for s in plan.epilogues))
    if plan.feeds:
        parts.append(f"{', '.join(s.name for s in plan.feeds)} copied inside loop "
                     f"{level_loop(plan.order, plan.feed_level or 0)}, before the loops that read it")
    return "; ".join(parts)


def parallel_loops(plan: GroupPlan) -> tuple[str, ...]:
    """The loops of a band plan that its threads run (a general plan's are marks in its tree)."""
    return tuple(plan.order[d] for d in plan.parallel_dims if d < len(plan.order))


def _streams_rows(model: PolyModel) -> bool:
    """Whether each statement inside an inner loop moves every access of it by at most one
    element per step of its innermost loop (a unit stride, or none: a value that stays in a
    register). Statements of the outermost loop alone run once per iteration of it."""
    return all(streams(model, a.access, s.loops[-1].var)
               for s in model.statements if len(s.loops) >= 2 for a in s.accesses)


def _wavefront_only(schedule: AffineSchedule) -> bool:
    """Whether isl's schedule runs in parallel only as a wavefront of tiles."""
    kinds = {b.parallel for b in schedule.bands}
    return schedule.origin == ISL_ORIGIN and "wavefront" in kinds and kinds <= {"", "wavefront"}


def _inner_loops_sum(model: PolyModel) -> bool:
    """Whether every statement of an innermost loop (two deep or more) sums into a cell that
    stays put along it, reading the rest at unit stride or less: a row-times-vector
    product such as a triangular solve's or a Cholesky factorisation's, which the written
    order runs vectorised in a register (`codegen/c/accumulators.py`)."""
    inner = [s for s in model.statements
             if len(s.loops) >= 2 and not any(
                 len(t.loops) > len(s.loops) and t.loops[:len(s.loops)] == s.loops
                 for t in model.statements)]
    if not inner:
        return False
    for s in inner:
        form = addend_of(s.statement)
        if form is None or reads_own_cell(s, form[0]):
            return False
        var = s.loops[-1].var
        if element_stride(model, s.statement.target, var) != 0:
            return False
        if not all(streams(model, a.access, var) for a in s.accesses):
            return False
    return True


def _parallel_outermost(schedule: AffineSchedule, model: PolyModel) -> bool:
    """Whether the schedule's first band holds every statement and runs its first loop in
    parallel."""
    if not schedule.bands:
        return False
    first = schedule.bands[0]
    return first.parallel_from_first and len(first.statements) == len(model.statements)


def _band_plan(model: PolyModel, target: CpuTarget) -> GroupPlan:
    ranked = rank(model, target)
    schedule = ranked[0].schedule if ranked else Schedule()
    plan = apply_schedule(model, schedule).main
    described = replace(schedule, order=plan.order, parallel=parallel_loops(plan))
    return replace(plan, how="ranked: " + described.describe())
