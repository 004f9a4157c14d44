"""A schedule's loops and its microkernel call, as the candidates and the cost model read them.

Takes a `PolyModel` and a `Schedule` (and the `CpuTarget` where lanes or registers count);
returns numbers and small values: loop extents and trip counts, the band plan of an order and
its tiles (once per ranking, `Memo`), a call's operands, accumulator lanes, register panel and
the cells it reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.errors import ScheduleError
from polydl.ir import Access
from polydl.poly.counting import count_points
from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.apply import (
    GroupPlan,
    apply_schedule,
    group_statements,
    loop_is_parallel,
    main_group,
)
from polydl.schedules.cpu.register_blocking import PANEL_ROWS, panel_vectors, unit_for
from polydl.schedules.microkernel import bound_statement, dim_range, gemm_operands
from polydl.schedules.schedule import MicrokernelBinding, Schedule, loop_var
from polydl.schedules.strides import element_stride, streams
from polydl.target.cpu import CpuTarget

# Register tile of the outer-product microkernel (rows of C x vectors along n): 6 x 2 on
# AVX2's 16 registers, 6 x 4 on AVX-512's 32 (see codegen/c/microkernels/blocking.py).
MICRO_ROWS = PANEL_ROWS


# Per ranking: what candidates that share a loop order and tiles share (the plan without a
# microkernel, its working sets), so that variants of one blocking are analysed once.
Memo = dict[tuple[object, ...], object]


def plan_of(model: PolyModel, schedule: Schedule, memo: Memo | None) -> GroupPlan | None:
    """The band plan of `schedule`'s order and tiles (None if illegal), once per ranking."""
    memo = {} if memo is None else memo
    key = ("plan", schedule.order, schedule.tiles)
    if key not in memo:
        try:
            memo[key] = apply_schedule(model, replace(schedule, parallel=(), microkernel=None)).main
        except ScheduleError:
            memo[key] = None
    plan = memo[key]
    assert plan is None or isinstance(plan, GroupPlan)
    return plan


def free_loops(model: PolyModel, schedule: Schedule, plan: GroupPlan) -> list[str]:
    """The loops of `plan` outside the microkernel call that carry no dependence."""
    inside_call = set(schedule.microkernel.loops) if schedule.microkernel else set()
    return [name for d, name in enumerate(plan.order)
            if name not in inside_call and loop_is_parallel(model, plan, d)]


def loop_extent(model: PolyModel, var: str) -> int:
    for s in model.statements:
        if var in s.iterators:
            d = s.iterators.index(var)
            return int(s.domain.dim_max_val(d).to_python() - s.domain.dim_min_val(d).to_python() + 1)
    return 1


def trip_count(model: PolyModel, schedule: Schedule, loop: str) -> int:
    var = loop_var(loop)
    extent = loop_extent(model, var)
    tile = schedule.tile_sizes.get(var)
    if loop.endswith(".t"):
        return math.ceil(extent / tile) if tile else 1
    return min(tile, extent) if tile else extent


def call_extent(model: PolyModel, schedule: Schedule, var: str) -> int:
    """Iterations of `var` in one call: its tile size, at most its extent."""
    extent = loop_extent(model, var)
    return min(schedule.tile_sizes.get(var, extent), extent)


def micro_vectors(target: CpuTarget) -> int:
    return panel_vectors(unit_for(target.isa))


def accumulator_lanes(model: PolyModel, target: CpuTarget, mk: MicrokernelBinding) -> int:
    """Vector lanes of the call's accumulators: its output's dtype as products accumulate
    (float64 halves them; bfloat16 inputs accumulate in float32)."""
    written = bound_statement(model, mk).statement.target.array
    return target.vector_lanes(DTYPES[model.nest.array(written).dtype].accumulates_in)


def element_bytes(model: PolyModel, access: Access) -> int:
    return DTYPES[model.nest.array(access.array).dtype].bytes


def kept_b(model: PolyModel, binding: MicrokernelBinding) -> bool:
    """Whether the call's B is an input the caller keeps between calls (`Array.kept`): its
    packed copy is made at the first call only."""
    operands = gemm_operands(model, binding)
    return operands is not None and operands[2].array in model.nest.kept


def b_strides(model: PolyModel, mk: MicrokernelBinding) -> tuple[int, int, int] | None:
    """(n stride, k stride, elements) of the B operand of a bound statement."""
    operands = gemm_operands(model, mk)
    if operands is None:
        return None
    _, _, b = operands
    b_n, b_k = element_stride(model, b, mk.n), element_stride(model, b, mk.k)
    if b_n is None or b_k is None:
        return None
    return b_n, b_k, math.prod(model.nest.array(b.array).concrete_shape(model.params))


def native_blocks(model: PolyModel, mk: MicrokernelBinding) -> bool:
    """Whether the kernel spans n blocks in one register tile: float operands (bf16 kernels
    make one call per block, `microkernels.blocks_kernel`)."""
    operands = gemm_operands(model, mk)
    return operands is not None and all(
        model.nest.array(acc.array).dtype in ("float32", "float64") for acc in operands)


def panel_row_bytes(model: PolyModel, target: CpuTarget, mk: MicrokernelBinding,
                     schedule: Schedule) -> int:
    """Bytes of one k row of a call's micro-panel of B: one register tile wide (nr), or the
    call's n if narrower."""
    operands = gemm_operands(model, mk)
    assert operands is not None
    nr = accumulator_lanes(model, target, mk) * micro_vectors(target)
    return min(call_extent(model, schedule, mk.n), nr) * element_bytes(model, operands[2])


def streams_along(model: PolyModel, var: str) -> bool:
    """Whether every access of the main nest moves by at most one element per step of `var`
    (a unit stride, or none): an innermost loop the compiler vectorises."""
    return all(streams(model, a.access, var)
               for s in group_statements(model)[main_group(model)] for a in s.accesses)


@dataclass(frozen=True)
class Call:
    """A microkernel schedule's call, as the variant generators read it: its binding,
    its statement and (C, A, B), and the schedule's loops outside the call and its own."""

    mk: MicrokernelBinding
    statement: StatementModel
    c: Access
    a: Access
    b: Access
    outer: tuple[str, ...]
    inner: tuple[str, ...]


def call_of(model: PolyModel, schedule: Schedule) -> Call | None:
    """The call of a schedule whose microkernel binds a GEMM-shaped statement; None otherwise."""
    mk = schedule.microkernel
    operands = None if mk is None else gemm_operands(model, mk)
    if mk is None or operands is None:
        return None
    calls = len(mk.loops)
    return Call(mk, bound_statement(model, mk), *operands,
                 schedule.order[:-calls], schedule.order[-calls:])


def call_cells(model: PolyModel, schedule: Schedule, s: StatementModel) -> isl.Set:
    """The instances of `s` one call of `schedule` runs (its first call)."""
    mk = schedule.microkernel
    assert mk is not None
    dom = s.domain
    for d, var in enumerate(s.iterators):
        lo = dom.dim_min_val(d).to_python()
        size = trip_count(model, schedule, var) if var in mk.loops else 1
        dom = dom.intersect(dim_range(dom.get_space(), d, lo, lo + size - 1))
    return dom


def call_bytes(model: PolyModel, schedule: Schedule, s: StatementModel, access: Access) -> int:
    """Bytes of `access`'s array one call reads (its cells, counted exactly)."""
    relation = next(acc.relation for acc in s.accesses if acc.access is access)
    cells = relation.intersect_domain(call_cells(model, schedule, s)).range()
    return count_points(cells) * element_bytes(model, access)
