"""Candidate schedules and their ranking by the PolyDL data-reuse cost model.

Takes a `PolyModel` and a `CpuTarget`; returns candidate schedules ranked best first. For every
cache level, the outermost band level whose working set fits decides that cache's traffic:
each execution of that level brings its working set in once. The cost adds the cycles of that
traffic at each level's bandwidth to the compute cycles (at the microkernel's register-blocking
efficiency), scaled by how evenly the parallel loop splits over the cores; memory traffic is
charged more where the loops around the calls keep many streams open at once (`streams.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.errors import ScheduleError
from polydl.ir import Access
from polydl.poly.counting import count_points
from polydl.poly.model import PolyModel, StatementModel
from polydl.poly.reuse import LevelWorkingSet, working_sets
from polydl.schedules.cpu import threads
from polydl.schedules.cpu.amx_pairs import PairedB, pairable_b
from polydl.schedules.apply import (
    GroupPlan,
    apply_schedule,
    array_bytes,
    band_of,
    group_statements,
    loop_is_parallel,
    main_group,
    summed_output,
)
from polydl.schedules.microkernel import (
    bound_statement,
    candidate_bindings,
    dim_range,
    gemm_operands,
)
from polydl.schedules.cpu.register_blocking import (
    BATCH_TILE_MAX_WAYS,
    PANEL_ROWS,
    l1_ways,
    lines_per_set,
    panel_vectors,
    rows_step_cycles,
    unit_for,
)
from polydl.schedules.schedule import MicrokernelBinding, Schedule, loop_var, tile_loop
from polydl.schedules.cpu.streams import dram_slowdown, open_streams
from polydl.schedules.strides import element_stride, streams
from polydl.target.cpu import CpuTarget

# Bytes per cycle into each cache level from the one below (per core, typical x86 server core).
BANDWIDTH = {"l1": 64.0, "l2": 32.0, "l3": 8.0}
# Bytes per cycle a core reads of lines another core wrote and still holds modified (each
# line fetched by a snoop into the writer's cache, not streamed from the L3). Fitted on 16
# cores of a Sapphire Rapids-class Xeon: 33 GEMM schedules of five shapes (square 512 and
# 1024, BERT's three), measured against the model's cost; the cost times the measured speed
# varied least at a fifth of the L3's bandwidth (coefficient of variation 2-10% per shape, 9-21%
# at the L3's own), and copies of B read by the threads that did not write them ran GEMMs
# 1.3-1.4x slower than those whose threads read their own.
FROM_OTHER_CORE_BANDWIDTH = BANDWIDTH["l3"] / 5
# Cycles an OpenMP parallel loop costs per thread of the team (waking it and joining it, ~4 us
# for 16 threads): on many cores a small nest runs faster on one core than split over all.
FORK_JOIN_CYCLES_PER_THREAD = 500.0
MAX_CANDIDATES = 48
# Cycles of one fork and join of the OpenMP threads (~5 us at 2.6 GHz, barrier included)
FORK_CYCLES = 13000.0


@dataclass(frozen=True)
class RankedSchedule:
    schedule: Schedule
    cost: float
    working_sets: tuple[LevelWorkingSet, ...]
    traffic_bytes: dict[str, int]
    compute_cycles: float
    balance: float


def loop_extent(model: PolyModel, var: str) -> int:
    for s in model.statements:
        if var in s.iterators:
            d = s.iterators.index(var)
            return int(s.domain.dim_max_val(d).to_python() - s.domain.dim_min_val(d).to_python() + 1)
    return 1


def _m_tiles(extent: int, tall: bool) -> list[int]:
    """Rows per call: whole extent when small, else the five largest of the sizes that fill
    the vector registers; `tall`, also 128 rows: each block of B read by twice the rows.
    (Against 64 rows, in one process: 16 Sapphire Rapids cores 0.93-1.35x, geometric mean
    1.06 over 8 GEMMs; 2 of its cores 0.94-1.12x, 1.05; on AVX2's 16 registers 0.88-0.91x, and
    with B one vector wide 0.88-0.93x: not offered there.) The fifth, 14 rows where 64 is
    offered, is AVX-512's register tile (14 rows of two vectors); with four sizes, 257 x 131 x
    509 on the 16-core host took calls of 32 rows, 0.89-0.92x as fast as those of 16, and a
    64 x 64 x 65536 product on two Zen 5 cores 0.85-0.98x its 14-row calls with the sum split."""
    options = {t for t in (4, 6, 7, 8, 12, 14, 16, 28, 32) if t < extent}
    options.add(extent if extent <= 64 else 64)
    if extent >= 256 and tall:
        options.add(128)
    out = sorted(options, reverse=True)[:5]
    if all(extent % t for t in out if t < extent):
        # none splits the rows evenly (a 7 x 7 image's 49 positions as one loop: 16 leaves a
        # call of 1 row): also 2-4 tiles of nearly one size, units of work for the threads
        near_even = {-(-extent // k) for k in (2, 3, 4)} & set(range(4, 33))
        out += sorted(near_even - set(out), reverse=True)
    return out


def _n_tiles(extent: int, lanes: int, cores: int) -> list[int]:
    if extent <= 4 * lanes:
        return [extent]
    out = [t for t in (4 * lanes, 2 * lanes, lanes * 8) if t < extent][:2] + [extent] * (extent <= 256)
    balanced = _balanced_n_tile(extent, lanes, cores)
    return out + ([balanced] if balanced is not None and balanced not in out else [])


def _balanced_n_tile(extent: int, lanes: int, cores: int) -> int | None:
    """An n block of 2-4 vectors whose count is a multiple of the cores, on many cores: a
    packed B is then copied block by block by the threads that read it, each thread as many
    blocks (n blocks outside m blocks; 16 Sapphire Rapids cores: copies per block ran ahead of
    one copy of all of B before the nest, and 12 or 36 blocks left threads idle)."""
    if cores <= 2:
        return None
    for units in (cores, 2 * cores, 3 * cores):
        tile = lanes * -(-extent // (units * lanes))
        if 2 * lanes <= tile <= 4 * lanes and -(-extent // tile) % cores == 0:
            return tile
    return None


def microkernel_candidates(
    model: PolyModel, machine: CpuTarget, band_vars: tuple[str, ...], binding: MicrokernelBinding
) -> list[Schedule]:
    lanes = accumulator_lanes(model, machine, binding)
    m_ext, n_ext = loop_extent(model, binding.m), loop_extent(model, binding.n)
    outer_vars = [v for v in band_vars if v not in binding.loops]
    # calls over the whole k: where a copy of B pays, also over a packed B (one parallel
    # region, each thread's C tiles finished in its calls)
    bindings = [binding]
    if not binding.batch and packing_pays(model, machine, binding):
        bindings.insert(0, replace(binding, pack_b=True))
    out: list[Schedule] = []
    tall = unit_for(machine.isa).registers >= 32 and n_ext >= 4 * lanes
    for mt in _m_tiles(m_ext, tall):
        for nt in _n_tiles(n_ext, lanes, machine.cores):
            tiles = {}
            if mt < m_ext:
                tiles[binding.m] = mt
            if nt < n_ext:
                tiles[binding.n] = nt
            outer = outer_vars + [tile_loop(v) for v in (binding.m, binding.n) if v in tiles]
            inner = list(binding.batch) + [binding.m, binding.n, binding.k]
            # The first outer loop is the parallel one; keep the others in a few sensible orders.
            orders = _outer_orders(outer)
            for order in orders:
                for mk in bindings:
                    out.append(Schedule(order=tuple(order) + tuple(inner),
                                        tiles=tuple(sorted(tiles.items())), microkernel=mk))
    return out


# Register tile of the outer-product microkernel (rows of C x vectors along n): 6 x 2 on
# AVX2's 16 registers, 6 x 4 on AVX-512's 32 (see codegen/c/microkernels/blocking.py).
MICRO_ROWS = PANEL_ROWS
K_TILE = 256  # a k block of B's micro-panel (K_TILE x vectors) stays in L1


def _micro_vectors(machine: CpuTarget) -> int:
    return panel_vectors(unit_for(machine.isa))


def accumulator_lanes(model: PolyModel, machine: CpuTarget, mk: MicrokernelBinding) -> int:
    """Vector lanes of the call's accumulators: its output's dtype as products accumulate
    (float64 halves them; bfloat16 inputs accumulate in float32)."""
    target = bound_statement(model, mk).statement.target.array
    return machine.vector_lanes(DTYPES[model.nest.array(target).dtype].accumulates_in)


def _nest_dtype(model: PolyModel, plan: GroupPlan) -> str:
    """The dtype the statements of a nest accumulate in: their written arrays' widest."""
    dtypes = {DTYPES[model.nest.array(st.statement.target.array).dtype].accumulates_in
              for st in plan.statements}
    return max(dtypes, key=lambda d: DTYPES[d].bytes)


def _element_bytes(model: PolyModel, access: Access) -> int:
    return DTYPES[model.nest.array(access.array).dtype].bytes


@dataclass(frozen=True)
class _Call:
    """A microkernel schedule's call, as the variant generators below read it: its binding,
    its statement and (C, A, B), and the schedule's loops outside the call and its own."""

    mk: MicrokernelBinding
    statement: StatementModel
    c: Access
    a: Access
    b: Access
    outer: tuple[str, ...]
    inner: tuple[str, ...]


def _call_of(model: PolyModel, schedule: Schedule) -> _Call | None:
    """The call of a schedule whose microkernel binds a GEMM-shaped statement; None otherwise."""
    mk = schedule.microkernel
    operands = None if mk is None else gemm_operands(model, mk)
    if mk is None or operands is None:
        return None
    calls = len(mk.loops)
    return _Call(mk, bound_statement(model, mk), *operands,
                 schedule.order[:-calls], schedule.order[-calls:])


def packing_pays(model: PolyModel, machine: CpuTarget, binding: MicrokernelBinding) -> bool:
    """Copying B into n blocks pays when the copy changes its layout (B's n stride is not 1,
    or its k rows are longer than a block) and enough rows of C reuse every block."""
    operands = gemm_operands(model, binding)
    if operands is None:
        return False
    c, _, b = operands
    b_n, b_k = element_stride(model, b, binding.n), element_stride(model, b, binding.k)
    c_n = element_stride(model, c, binding.n)
    lanes = accumulator_lanes(model, machine, binding)
    if c_n != 1 or b_n is None or b_k is None:
        return False
    n_ext = loop_extent(model, binding.n)
    # rows of B a page or more apart: each k step of a register tile misses the TLB
    row_bytes = abs(b_k) * _element_bytes(model, b)
    long_rows = n_ext > lanes * _micro_vectors(machine) and row_bytes >= 1024
    reshaped = b_n != 1 or (long_rows and not _bf16_b(model, binding))
    # a B the caller keeps between calls is copied once for all of them: no rows of C need
    # to pay for it
    return reshaped and (loop_extent(model, binding.m) >= 4 * MICRO_ROWS
                         or kept_b(model, binding))


def kept_b(model: PolyModel, binding: MicrokernelBinding) -> bool:
    """Whether the call's B is an input the caller keeps between calls (`Array.kept`): its
    packed copy is made at the first call only."""
    operands = gemm_operands(model, binding)
    return operands is not None and operands[2].array in model.nest.kept


def _bf16_b(model: PolyModel, binding: MicrokernelBinding) -> bool:
    """Whether B is bfloat16. Its kernels need B unit-stride along n, so a strided B is copied;
    but over a unit-stride B the AMX kernel copies each block into k pairs itself, and on Zen 4
    the vdpbf16ps kernel ran GEMMs 0.89-1.09x as fast over a copy: long rows alone do not pay."""
    operands = gemm_operands(model, binding)
    return operands is not None and model.nest.array(operands[2].array).dtype == "bfloat16"


def packed_candidates(
    model: PolyModel, machine: CpuTarget, band_vars: tuple[str, ...], binding: MicrokernelBinding
) -> list[Schedule]:
    """BLIS-like blockings over a packed B: n blocks of whole register tiles, m blocks of
    whole register rows, k blocked so that a micro-panel of B stays in L1."""
    if not packing_pays(model, machine, binding):
        return []
    packed = replace(binding, pack_b=True)
    lanes = accumulator_lanes(model, machine, binding)
    nr = lanes * _micro_vectors(machine)
    m_ext, n_ext, k_ext = (loop_extent(model, v) for v in (binding.m, binding.n, binding.k))
    n_tiles = [t for t in (8 * nr, 4 * nr) if t < n_ext] + [n_ext] * (n_ext <= 16 * nr)
    # whole register rows; besides the usual sizes, ones that split m evenly over the cores
    cores = max(machine.cores, 1)
    even = {MICRO_ROWS * math.ceil(m_ext / (cores * q * MICRO_ROWS)) for q in (1, 2, 4)}
    sizes = sorted({16 * MICRO_ROWS, 8 * MICRO_ROWS} | {t for t in even if t <= 16 * MICRO_ROWS})
    m_tiles = [t for t in reversed(sizes) if t < m_ext][:3] + [m_ext] * (m_ext <= 16 * MICRO_ROWS)
    # k blocks of equal size near K_TILE: no remainder variant of the microkernel to build
    k_tile = math.ceil(k_ext / math.ceil(k_ext / K_TILE)) if k_ext > 2 * K_TILE else None
    outer_vars = [v for v in band_vars if v not in binding.loops]
    inner = list(binding.batch) + [binding.m, binding.n, binding.k]
    out = []
    for nt in n_tiles:
        for mt in m_tiles:
            tiles = {v: t for v, t in ((binding.m, mt), (binding.n, nt), (binding.k, k_tile))
                     if t is not None and t < loop_extent(model, v)}
            j, i, k = (tile_loop(v) if v in tiles else None
                       for v in (binding.n, binding.m, binding.k))
            orders = ([j, k, i], [j, i, k], [i, j, k])
            seen = []
            for order in orders:
                loops = outer_vars + [name for name in order if name is not None]
                if loops in seen:
                    continue
                seen.append(loops)
                out.append(Schedule(order=tuple(loops + inner),
                                    tiles=tuple(sorted(tiles.items())), microkernel=packed))
    return out


def micro_panel_candidates(
    model: PolyModel, machine: CpuTarget, band_vars: tuple[str, ...], binding: MicrokernelBinding
) -> list[Schedule]:
    """BLIS's loop nest over a packed B: each call is one register tile wide along n, so its
    packed B (`[n/nr][k][nr]`) is one contiguous micro-panel that stays in L1 while the call's
    register tiles walk down m; an m block of A (m tile x k tile) stays in L2 across the
    calls of the n loop inside it; k is blocked near K_TILE so that the micro-panel fits L1."""
    nr = accumulator_lanes(model, machine, binding) * _micro_vectors(machine)
    m_ext, n_ext, k_ext = (loop_extent(model, v) for v in (binding.m, binding.n, binding.k))
    if (binding.batch or n_ext <= nr or m_ext < 4 * MICRO_ROWS or _b_strides(model, binding) is None
            or _bf16_b(model, binding)):
        return []
    # A stays in place: its packed panels (`pack_a`) measured 0-11% slower in these blockings
    # on one and two threads (the copy costs more than the strided broadcasts it saves)
    packed = replace(binding, pack_b=True)
    cores = max(machine.cores, 1)
    # whole register rows, A blocks of at most 16 register tiles, and sizes that split m
    # evenly over the cores
    even = {MICRO_ROWS * math.ceil(m_ext / (cores * q * MICRO_ROWS)) for q in (1, 2, 4)}
    sizes = {16 * MICRO_ROWS, 8 * MICRO_ROWS} | {t for t in even if 4 * MICRO_ROWS <= t <= 16 * MICRO_ROWS}
    m_tiles = sorted((t for t in sizes if t < m_ext), reverse=True)[:3] or [m_ext]
    k_tile = math.ceil(k_ext / math.ceil(k_ext / K_TILE)) if k_ext > K_TILE else None
    outer_vars = [v for v in band_vars if v not in binding.loops]
    inner = [binding.m, binding.n, binding.k]
    out = []
    for mt in m_tiles:
        tiles = {v: t for v, t in ((binding.m, mt), (binding.n, nr), (binding.k, k_tile))
                 if t is not None and t < loop_extent(model, v)}
        j, i, k = (tile_loop(v) if v in tiles else None for v in (binding.n, binding.m, binding.k))
        # m blocks outermost first: one parallel loop around all the k blocks (a
        # k loop outside it forks and joins the threads once per k block)
        for order in ([i, k, j], [k, i, j]):
            loops = outer_vars + [name for name in order if name is not None]
            out.append(Schedule(order=tuple(loops + inner), tiles=tuple(sorted(tiles.items())),
                                microkernel=packed))
    return list(dict.fromkeys(out))


def _outer_orders(outer: list[str]) -> list[list[str]]:
    """The written order, and each loop moved outermost or innermost: the moves that change
    which operand stays in cache, without the factorial of all permutations."""
    orders = [outer]
    for v in outer:
        rest = [x for x in outer if x != v]
        for order in ([v] + rest, rest + [v]):
            if order not in orders:
                orders.append(order)
    return orders


def streams_along(model: PolyModel, var: str) -> bool:
    """Whether every access of the main nest moves by at most one element per step of `var`
    (a unit stride, or none): an innermost loop the compiler vectorises."""
    return all(streams(model, a.access, var)
               for s in group_statements(model)[main_group(model)] for a in s.accesses)


def loop_candidates(model: PolyModel, machine: CpuTarget, band_vars: tuple[str, ...]) -> list[Schedule]:
    """Tiled schedules without a microkernel: square-ish tiles, the original point order, and
    where the innermost loop does not stream, the order with one that does innermost, tiled
    only (the reuse model ranked syrk's untiled dot products first; they measured 226 ms
    against 34 ms in tiles of 32)."""
    orders = [band_vars]
    if band_vars and not streams_along(model, band_vars[-1]):
        orders += [tuple(v for v in band_vars if v != inner) + (inner,)
                   for inner in band_vars[:-1] if streams_along(model, inner)][:1]
    out = [Schedule()]
    for order in orders:
        big = [v for v in order if loop_extent(model, v) > 64]
        for size in (32, 64, 128):
            tiles = {v: size for v in big if loop_extent(model, v) > size}
            if not tiles:
                continue
            tile_order = [tile_loop(v) for v in order if v in tiles]
            out.append(Schedule(order=tuple(tile_order) + order, tiles=tuple(sorted(tiles.items()))))
    return out


def candidates(model: PolyModel, machine: CpuTarget) -> list[Schedule]:
    statements = group_statements(model)[main_group(model)]
    band = band_of(statements)
    band_vars = tuple(loop.var for loop in band)
    out: list[Schedule] = []
    if len(statements) == 1:
        for binding in candidate_bindings(model, statements[0], band_vars)[:1]:
            out += micro_panel_candidates(model, machine, band_vars, binding)
            out += packed_candidates(model, machine, band_vars, binding)
            out += microkernel_candidates(model, machine, band_vars, binding)
    return out + loop_candidates(model, machine, band_vars)


# Per ranking: what candidates that share a loop order and tiles share (the plan without a
# microkernel, its working sets), so that variants of one blocking are analysed once.
_Memo = dict[tuple[object, ...], object]


def _plan_of(model: PolyModel, schedule: Schedule, memo: _Memo | None) -> GroupPlan | None:
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


def _with_parallel(
    model: PolyModel, schedule: Schedule, machine: CpuTarget, memo: _Memo | None = None
) -> tuple[Schedule, GroupPlan] | None:
    """Parallelise the outermost dependence-free loop, collapsing a second one when the first
    alone has too few iterations for the cores."""
    plan = _plan_of(model, schedule, memo)
    if plan is None:
        return None
    free = _free_loops(model, schedule, plan)
    if schedule.parallel:  # chosen by the caller (the tuner's search space): legal or nothing
        if not schedule.private_sums and not set(schedule.parallel) <= set(free):
            return None
        try:
            applied = apply_schedule(model, schedule).main
        except ScheduleError:
            return None
        return _as_run(schedule, applied), plan
    # the loops chosen here carry nothing: no sum to split among the threads
    if not free:
        return replace(schedule, parallel=(), private_sums=False), plan
    first = plan.order.index(free[0])
    chosen = [free[0]]
    nxt = plan.order[first + 1] if first + 1 < len(plan.order) else None
    trips = trip_count(model, schedule, free[0])
    if trips < 4 * machine.cores and trips % machine.cores and nxt in free:
        # (a first loop that splits evenly gives every thread the same units collapsed or not,
        # and alone it leaves room inside for a copy that feeds them, `feeds.py`)
        chosen.append(nxt)
    final = replace(schedule, parallel=tuple(chosen), private_sums=False)
    try:
        applied = apply_schedule(model, final).main  # binds the microkernel: may still refuse it
    except ScheduleError:
        return None
    return _as_run(final, applied), plan  # the parallel loops do not change the time map the reuse model reads


def _as_run(schedule: Schedule, applied: GroupPlan) -> Schedule:
    """`schedule` with the parallel loops its code runs in parallel: a packed operand's copy
    between two of them leaves only the outer one (`apply._parallel_around_copies`)."""
    running = tuple(applied.order[d] for d in applied.parallel_dims)
    return schedule if running == schedule.parallel else replace(schedule, parallel=running)


def _free_loops(model: PolyModel, schedule: Schedule, plan: GroupPlan) -> list[str]:
    """The loops of `plan` outside the microkernel call that carry no dependence."""
    inside_call = set(schedule.microkernel.loops) if schedule.microkernel else set()
    return [name for d, name in enumerate(plan.order)
            if name not in inside_call and loop_is_parallel(model, plan, d)]


def parallel_choices(model: PolyModel, schedule: Schedule, memo: _Memo | None = None) -> list[tuple[str, ...]]:
    """Every legal choice of parallel loops for `schedule`: one dependence-free loop, or two
    adjacent ones collapsed (the search space's thread mappings)."""
    plan = _plan_of(model, schedule, memo)
    if plan is None:
        return []
    free = _free_loops(model, schedule, plan)
    choices: list[tuple[str, ...]] = [(loop,) for loop in free]
    order = list(plan.order)
    choices += [(a, b) for a, b in zip(free, free[1:], strict=False)
                if order.index(b) == order.index(a) + 1]
    return choices


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


def microkernel_efficiency(schedule: Schedule, model: PolyModel, machine: CpuTarget) -> float:
    """Fraction of peak FMA throughput the inner code reaches: the microkernel's register
    blocks over the calls' rows (a full tile and the remainder tile of m); plain loops reach
    far less."""
    mk = schedule.microkernel
    if mk is None:
        return 0.15
    lanes = accumulator_lanes(model, machine, mk)
    m_ext = loop_extent(model, mk.m)
    m = call_extent(model, schedule, mk.m)
    n = schedule.tile_sizes.get(mk.n, loop_extent(model, mk.n))
    vectors = max(1, math.ceil(n / lanes))
    lane_use = n / (vectors * lanes)
    unit = unit_for(machine.isa)
    if mk.blocks and n % lanes == 0 and _native_blocks(model, mk):
        # a register tile of whole blocks, or of part of one (`blocking.choose_outer_product`)
        total = vectors * trip_count(model, schedule, mk.blocks)
        widths = [v for v in range(1, min(total, _micro_vectors(machine)) + 1)
                  if vectors % v == 0 or v % vectors == 0]
    else:
        widths = [min(vectors, _micro_vectors(machine))]
    efficiency = 0.0
    for used in widths:
        cycles = (m_ext // m) * rows_step_cycles(unit, m, used)
        if m_ext % m:
            cycles += rows_step_cycles(unit, m_ext % m, used)
        efficiency = max(efficiency, lane_use * (m_ext * used / unit.fma_ports) / cycles)
    # each call loads and stores its C tile once, over a reduction of k times the batch
    k = schedule.tile_sizes.get(mk.k, loop_extent(model, mk.k))
    k *= math.prod(trip_count(model, schedule, b) for b in mk.batch)
    efficiency *= k / (k + 16)
    if not mk.pack_b and _strided_b(model, mk):
        # every k step of a register tile reads B from another page: TLB and prefetch misses
        efficiency *= 0.6
    if mk.batch:
        return efficiency  # convolutions: blockings measured without the micro-panel terms
    return efficiency * _micro_panel_factor(schedule, model, machine, k)


def _native_blocks(model: PolyModel, mk: MicrokernelBinding) -> bool:
    """Whether the kernel spans n blocks in one register tile: float operands (bf16 kernels
    make one call per block, `microkernels.blocks_kernel`)."""
    operands = gemm_operands(model, mk)
    return operands is not None and all(
        model.nest.array(acc.array).dtype in ("float32", "float64") for acc in operands)


def _micro_panel_factor(schedule: Schedule, model: PolyModel, machine: CpuTarget, k: int) -> float:
    """The register tiles of a call down m reuse one micro-panel of B (k x nr) from L1.
    Contiguous (packed one register tile wide, or B's rows already nr apart), it streams
    through few pages and every L1 set; rows further apart fall into fewer sets (a 512-byte
    stride into one set in eight) and pages; a panel larger than half of L1 is evicted
    before the next register tile reads it. (Measured on a 2-core AVX2 machine: 0.93 and
    0.75 of the contiguous panel's speed.)"""
    mk = schedule.microkernel
    assert mk is not None
    nr = accumulator_lanes(model, machine, mk) * _micro_vectors(machine)
    strides = _b_strides(model, mk)
    n = call_extent(model, schedule, mk.n)
    contiguous = (mk.pack_b and n <= nr) or (strides is not None and strides[:2] == (1, nr))
    if contiguous:
        return 1.0
    if k * machine.cache_line_bytes > machine.l1_bytes // 2:
        return 0.75
    return 0.93


def _b_strides(model: PolyModel, mk: MicrokernelBinding) -> tuple[int, int, int] | None:
    """(n stride, k stride, elements) of the B operand of a bound statement."""
    operands = gemm_operands(model, mk)
    if operands is None:
        return None
    _, _, b = operands
    b_n, b_k = element_stride(model, b, mk.n), element_stride(model, b, mk.k)
    if b_n is None or b_k is None:
        return None
    return b_n, b_k, math.prod(model.nest.array(b.array).concrete_shape(model.params))


def _strided_b(model: PolyModel, mk: MicrokernelBinding) -> bool:
    """Whether a call's B rows fall into few L1 sets: not unit-stride along n, or rows whose
    byte stride is a multiple of 1 KiB (4 KiB apart: one set of 64; 3 KiB: 4 sets), which
    evict each other as a register tile walks k. Rows 4000 bytes apart spread over every
    set: on a 2-core AVX2 target they ran as fast unpacked as packed, on 16 cores faster."""
    strides = _b_strides(model, mk)
    operands = gemm_operands(model, mk)
    if strides is None or operands is None:
        return False
    row_bytes = abs(strides[1]) * _element_bytes(model, operands[2])
    return strides[0] != 1 or (row_bytes >= 1024 and row_bytes % 1024 == 0)


def _a_block_lines(model: PolyModel, schedule: Schedule, line_bytes: int) -> int | None:
    """Cache lines of one call's block of A (m x k), None if A's strides are not constant."""
    mk = schedule.microkernel
    assert mk is not None
    operands = gemm_operands(model, mk)
    if operands is None:
        return None
    _, a, _ = operands
    a_m, a_k = element_stride(model, a, mk.m), element_stride(model, a, mk.k)
    if a_m is None or a_k is None:
        return None
    m, k = call_extent(model, schedule, mk.m), call_extent(model, schedule, mk.k)
    k *= math.prod(trip_count(model, schedule, b) for b in mk.batch)
    per_line = max(line_bytes // _element_bytes(model, a), 1)
    if a_k == 1:
        return m * math.ceil(k / per_line)
    if a_m == 1:
        return k * math.ceil(m / per_line)
    return m * k


def _call_traffic(model: PolyModel, machine: CpuTarget, schedule: Schedule,
                  call: LevelWorkingSet, capacity: int, traffic: int) -> int:
    """Effects of a microkernel call on the traffic into a cache of `capacity` bytes that
    the whole-level rule does not see. A block of A larger than half the cache is read once
    per register-tile column of the call (the call walks n outside m), not once. And where
    the loop right around the call is n's tile loop, the call's A block is the same in all
    its iterations: if it fits half the cache it is read once, and only B's panels and C's
    tiles stream (likewise A's rows over all of k, with k's tile loop between). And every
    register tile down m reads the strip's micro-panel of B (k x nr); one larger than half of
    L2 (or L3) is read again for each of them (a call over all of k = 32768: 8 MiB of B a
    strip, read 11 times; two Zen 4 cores ran 128 x 128 x 32768 at 42 GFLOP/s so, 136 over k
    blocks of 256)."""
    mk = schedule.microkernel
    assert mk is not None
    line = machine.cache_line_bytes
    a_lines = _a_block_lines(model, schedule, line)
    if a_lines is None:
        return traffic
    a_bytes = a_lines * line
    nr = accumulator_lanes(model, machine, mk) * _micro_vectors(machine)
    strips = math.ceil(call_extent(model, schedule, mk.n) / nr)
    if a_bytes > capacity // 2 and strips > 1:
        traffic += (strips - 1) * a_bytes * call.executions
    calls_loop = schedule.order[-len(mk.loops) - 1] if len(schedule.order) > len(mk.loops) else None
    if calls_loop == tile_loop(mk.n) and a_bytes <= capacity // 2:
        trip = trip_count(model, schedule, calls_loop)
        streamed = (call.lines - a_lines) * line * call.executions
        traffic = min(traffic, streamed + a_bytes * call.executions // max(trip, 1))
    outer = schedule.order[:len(schedule.order) - len(mk.loops)]
    if calls_loop == tile_loop(mk.k) and len(outer) > 1 and outer[-2] == tile_loop(mk.n):
        # k blocks inside n blocks: A's rows over all of k stay in the cache across n blocks
        k_blocks = trip_count(model, schedule, calls_loop)
        if a_bytes * k_blocks <= capacity // 2:
            n_blocks = trip_count(model, schedule, outer[-2])
            traffic -= a_bytes * call.executions - a_bytes * call.executions // max(n_blocks, 1)
    m = call_extent(model, schedule, mk.m)
    panel = call_extent(model, schedule, mk.k) * _panel_row_bytes(model, machine, mk, schedule)
    # (from L2 a panel streams at a fraction of L2's bandwidth: only the levels beyond count)
    if capacity > machine.l1_bytes and panel > capacity // 2 and m > MICRO_ROWS:
        traffic += (math.ceil(m / MICRO_ROWS) - 1) * panel * strips * call.executions
    return traffic


def _panel_row_bytes(model: PolyModel, machine: CpuTarget, mk: MicrokernelBinding,
                     schedule: Schedule) -> int:
    """Bytes of one k row of a call's micro-panel of B: one register tile wide (nr), or the
    call's n if narrower."""
    operands = gemm_operands(model, mk)
    assert operands is not None
    nr = accumulator_lanes(model, machine, mk) * _micro_vectors(machine)
    return min(call_extent(model, schedule, mk.n), nr) * _element_bytes(model, operands[2])


def _packed_rereads(model: PolyModel, schedule: Schedule, packed_bytes: int, cache: int) -> int:
    """Bytes of the packed B (a local array the reuse model does not see) read again from
    beyond a cache: every iteration of m's tile loop reads all of it (or one k block's part,
    one n block's part, when k's or n's tile loop is outside), and a part larger than the
    cache is evicted before the next iteration reads it."""
    mk = schedule.microkernel
    assert mk is not None
    order = list(schedule.order)
    m_tile, k_tile = tile_loop(mk.m), tile_loop(mk.k)
    if m_tile not in order:
        return 0
    part = packed_bytes
    for outside in (k_tile, tile_loop(mk.n)):  # one k block's, one n block's part
        if outside in order and order.index(outside) < order.index(m_tile):
            part //= max(trip_count(model, schedule, outside), 1)
    if part <= 0.75 * cache:
        return 0
    return (trip_count(model, schedule, m_tile) - 1) * packed_bytes


def evaluate(
    model: PolyModel, machine: CpuTarget, schedule: Schedule, memo: _Memo | None = None
) -> RankedSchedule | None:
    """The model's cost of `schedule`; without parallel loops given, of the outermost free
    ones (`_with_parallel`), or, where those leave cores idle around microkernel calls, of
    the best legal choice (the stem's backward-data scatter: its images and input channel
    blocks are 2 units for 16 cores; its filter rows 7 units, inside the output rows, ran
    2.98x as fast on 16 cores)."""
    memo = {} if memo is None else memo
    result = _evaluate(model, machine, schedule, memo)
    if (schedule.parallel or result is None or not result.schedule.parallel
            or schedule.microkernel is None or machine.cores < 2):
        return result  # (plain loop nests: measured 0.67x with a point loop in parallel)
    units = math.prod(trip_count(model, result.schedule, loop) for loop in result.schedule.parallel)
    if units >= machine.cores:
        return result
    for choice in parallel_choices(model, schedule, memo):
        other = _evaluate(model, machine, replace(schedule, parallel=choice), memo)
        if other is not None and other.cost < result.cost:
            result = other
    return result


def _evaluate(
    model: PolyModel, machine: CpuTarget, schedule: Schedule, memo: _Memo
) -> RankedSchedule | None:
    found = _with_parallel(model, schedule, machine, memo)
    if found is None:
        return None
    final, plan = found
    loops = plan.order
    if final.microkernel is not None:
        # Inside the call the microkernel blocks for registers and streams its panels; the
        # model stops at the call itself.
        loops = loops[: len(loops) - len(final.microkernel.loops) + 1]
    key = ("working sets", final.order, final.tiles, loops)
    if key not in memo:
        total = memo.get(("total lines",))
        memo[key] = working_sets(
            model, plan.statements, plan.schedule_map, loops, machine.cache_line_bytes,
            total_lines=total if isinstance(total, int) else None,
        )
    ws = memo[key]
    assert isinstance(ws, list)
    if ws:
        memo[("total lines",)] = ws[0].lines
    caches = {"l1": machine.l1_bytes, "l2": machine.l2_bytes, "l3": machine.l3_bytes // max(machine.cores, 1)}
    traffic: dict[str, int] = {}
    total_lines_once = ws[0].lines if ws else 0
    shared_levels = _shared_levels(plan.order, final.parallel)
    for name, capacity in caches.items():
        fitting = [w for w in ws if w.bytes(machine.cache_line_bytes) <= (
            machine.l3_bytes if name == "l3" and w.level < shared_levels else capacity) * 0.75]
        if fitting:
            w = fitting[0]
            traffic[name] = w.bytes(machine.cache_line_bytes) * w.executions
        else:
            inner = ws[-1] if ws else None
            traffic[name] = inner.bytes(machine.cache_line_bytes) * inner.executions if inner else 0
        if final.microkernel is not None and not final.microkernel.batch and ws:
            traffic[name] = _call_traffic(model, machine, final, ws[-1], capacity, traffic[name])
        traffic[name] = max(traffic[name], total_lines_once * machine.cache_line_bytes)
    flops = sum(s.flops for s in plan.statements)
    # 2 FMA pipes x lanes x 2 flops, lanes of the main statement's accumulation
    if final.microkernel is not None:
        lanes = accumulator_lanes(model, machine, final.microkernel)
    elif loops and not streams_along(model, loop_var(loops[-1])):
        lanes = 1  # an innermost loop with a strided access runs scalar
    else:
        lanes = machine.vector_lanes(_nest_dtype(model, plan))
    peak_per_cycle = 2 * 2 * lanes
    compute = flops / (peak_per_cycle * microkernel_efficiency(final, model, machine))
    cores = max(machine.cores, 1)
    balance = thread_balance(model, final, cores) if final.parallel else float(cores)
    trips = {loop: trip_count(model, final, loop) for loop in plan.order}
    dram = dram_slowdown(open_streams(model, final, plan.order, trips))  # the l3 traffic's
    memory = sum(traffic[c] * (dram if c == "l3" else 1.0) / BANDWIDTH[c] for c in traffic)
    if final.parallel and cores > 1:
        memory += shared_read_bytes(model, final, cores) / BANDWIDTH["l3"]
        memory += copied_elsewhere_bytes(model, final, cores) / FROM_OTHER_CORE_BANDWIDTH
    mk = final.microkernel
    # B packed in every call (a kept B is packed once for all of them)
    packs_per_call = mk is not None and mk.pack_b and not kept_b(model, mk)
    if mk is not None and packs_per_call:
        strides = _b_strides(model, mk)
        operands = gemm_operands(model, mk)
        b_bytes = (strides[2] * _element_bytes(model, operands[2])) if strides and operands else 0
        memory += 2 * b_bytes / BANDWIDTH["l3"]  # read B, write the copy
        if b_bytes and not mk.batch:
            memory += sum(_packed_rereads(model, final, b_bytes, caches[c]) for c in ("l2", "l3")) / BANDWIDTH["l3"]
        if b_bytes and cores > 1:
            memory += packed_elsewhere(model, final, cores) * b_bytes / FROM_OTHER_CORE_BANDWIDTH
    memory += amx_repacked_bytes(model, machine, final, plan.order) / BANDWIDTH["l3"]
    cost = (compute + memory) * balance / cores
    if final.parallel and cores > 1:
        cost += FORK_JOIN_CYCLES_PER_THREAD * cores
    if final.private_sums and cores > 1:
        # every thread clears its copy of the output, and OpenMP adds the copies into it one
        # thread at a time, each from the cache of the core that summed it
        summed = summed_output(model, plan.statements)[0]
        out_bytes = array_bytes(model, summed) if summed else 0
        cost += out_bytes / BANDWIDTH["l1"] + cores * 2 * out_bytes / BANDWIDTH["l3"]
    if final.parallel and cores > 1:
        # every entry into the parallel loop forks and joins the threads (and a packed copy
        # inside the loops around it is one more parallel loop): a few microseconds each
        # (convolutions' batch-reduce calls were ranked without it where they fork once)
        order = plan.order
        first = order.index(final.parallel[0]) if final.parallel[0] in order else 0
        around = math.prod(trip_count(model, final, loop) for loop in order[:first])
        if around > 1 or not (mk is not None and mk.batch):
            cost += FORK_CYCLES * around * (1 + int(packs_per_call))
    return RankedSchedule(final, cost, tuple(ws), traffic, compute, balance)


AMX_CACHED_COLUMNS = 32  # B of at most two tile columns: one block, reused by the next call


def amx_repacked_bytes(model: PolyModel, machine: CpuTarget, schedule: Schedule,
                       order: Sequence[str]) -> int:
    """Bytes of B the AMX kernel copies into k pairs over the nest. It copies B at every call,
    except that a call over the same constant B of one block as the thread's previous call
    reuses its copy (`microkernels/amx.py`): then B is copied once per change of the loops
    outside the call that move it. On the 16-core Sapphire Rapids host, bf16 1 x 1 layers
    whose output-channel blocks were the innermost loop outside the calls ran 1.25-2.2x as long
    as with the blocks outside the rows and images."""
    mk = schedule.microkernel
    if mk is None or machine.isa != "avx512amx":
        return 0
    operands = gemm_operands(model, mk)
    if operands is None:
        return 0
    _, a, b = operands
    if model.nest.array(b.array).dtype != "bfloat16":
        return 0
    if (element_stride(model, a, mk.k) != 1 or call_extent(model, schedule, mk.k) % 2
            or (element_stride(model, b, mk.n) != 1 and not mk.pack_b)):
        return 0  # not the AMX kernel's operands (a transposed view packs A, not B; odd k)
    per_call = _element_bytes(model, b) * math.prod(
        call_extent(model, schedule, v) for v in (mk.n, mk.k, *mk.batch))
    outer = [loop for loop in order if loop not in mk.loops]  # tile loops of the call's too
    trips = [trip_count(model, schedule, loop) for loop in outer]
    # the kernel keeps its copy only of a constant input, as codegen passes it (`b_constant`)
    constant = b.array in {arr.name for arr in model.nest.inputs}
    cached = not mk.pack_b and call_extent(model, schedule, mk.n) <= AMX_CACHED_COLUMNS and constant
    moving = [i for i, loop in enumerate(outer) if element_stride(model, b, loop_var(loop)) != 0]
    last = (moving[-1] + 1 if moving else 0) if cached else len(outer)
    return per_call * math.prod(trips[:last])


def pairs_b(model: PolyModel, machine: CpuTarget, schedule: Schedule) -> PairedB | None:
    """The copy of B in k pairs that the schedule's AMX calls read (`amx_pairs.py`): where
    the caller keeps B between calls, so that it is copied at the first call only. On the
    16-core Sapphire Rapids host (bf16, 16 threads, 23 ResNet-50 layers at N=2 and N=32, the
    schedules unchanged) the kept copy ran 0.98-1.24x as fast as the calls' own copies
    (res5_3x3 at N=32 1.19); a copy made at every call ran 0.88-1.11x (res5_3x3 0.90), its
    lines left modified in the caches of the threads that wrote them while every thread reads
    all of them. The ranking still charges the calls' own copies (`amx_repacked_bytes`):
    with a copy in pairs priced instead it put the weight blocks inside the rows and images,
    and those schedules ran 0.52-0.90x on five of seven N=2 layers."""
    if machine.isa != "avx512amx":
        return None
    paired = pairable_b(model, schedule)
    return paired if paired is not None and paired.kept else None


# How many ways `private_sum_splits` splits a call's k loop among the threads.
SUM_SPLITS = (2, 4, 8, 16)


def private_sum_splits(model: PolyModel, machine: CpuTarget, schedule: Schedule) -> list[Schedule]:
    """Variants of a microkernel schedule whose parallel loops leave cores idle or unevenly
    loaded, with a reduction loop of its calls run among the threads as well, each thread
    summing into a copy of the output of its own (`Schedule.private_sums`): one of the two
    outermost batch loops taken out of the call, k's tile loop, or k split into tiles, in
    front of the parallel loops. oneDNN splits the images of a small minibatch's weight
    gradient so (an output of 64 x 3 x 7 x 7 cells is 28 units of work for 16 cores)."""
    mk = schedule.microkernel
    if (mk is None or mk.pack_a or mk.pack_b or schedule.epilogues or not schedule.parallel
            or schedule.private_sums or machine.cores < 2
            or summed_output(model, group_statements(model)[main_group(model)])[0] is None):
        return []
    first = schedule.order.index(schedule.parallel[0])
    outer, inner = list(schedule.order[:first]), list(schedule.order[first:])
    out = []
    for var in mk.batch[:2]:
        order = (*outer, var, *(loop for loop in inner if loop != var))
        out.append(replace(schedule, order=order, parallel=(var, *schedule.parallel),
                           microkernel=replace(mk, batch=tuple(b for b in mk.batch if b != var)),
                           private_sums=True))
    k_tile = tile_loop(mk.k)
    if not mk.batch and k_tile in schedule.order and k_tile not in schedule.parallel:
        # k's blocks run among the threads too, in front of the parallel loops
        order = (*(loop for loop in outer if loop != k_tile), k_tile,
                 *(loop for loop in inner if loop != k_tile))
        out.append(replace(schedule, order=order, parallel=(k_tile, *schedule.parallel),
                           private_sums=True))
    extent = loop_extent(model, mk.k)
    for splits in SUM_SPLITS if not mk.batch and mk.k not in schedule.tile_sizes else ():
        tile = -(-extent // splits)
        if splits > machine.cores or tile * (splits - 1) >= extent:
            continue
        out.append(replace(schedule, order=(*outer, k_tile, *inner),
                           tiles=tuple(sorted((*schedule.tiles, (mk.k, tile)))),
                           parallel=(k_tile, *schedule.parallel), private_sums=True))
    return out


def packed_elsewhere(model: PolyModel, schedule: Schedule, cores: int) -> float:
    """The packed B's reads from a copy another thread wrote, as a fraction of its size: the
    copy's n blocks run on the threads in OpenMP's static split, and a block one thread wrote
    and another reads comes from the writer's cache, a transfer on top of the shared read
    (16 cores, GEMMs over all of k in 64 x 64 tiles: n blocks outside m blocks, each thread
    reading the blocks it copied, ran 1.0-1.35x as fast as m blocks outside n blocks)."""
    mk = schedule.microkernel
    assert mk is not None
    operands = gemm_operands(model, mk)
    statement = bound_statement(model, mk)
    if operands is None or any(element_stride(model, operands[2], var) != 0
                               for var in statement.iterators if var not in mk.loops):
        return 0.0  # B's slots follow outer loops: each thread copies the slots it reads
    n_tile = tile_loop(mk.n)
    blocks = trip_count(model, schedule, n_tile) if n_tile in schedule.order else 1
    trips = tuple(trip_count(model, schedule, loop) for loop in schedule.parallel)
    if not trips or math.prod(trips) > threads.MAX_UNITS or blocks > threads.MAX_UNITS:
        return 0.0
    along = tuple(loop == n_tile for loop in schedule.parallel)
    packers = threads.thread_runs(blocks, cores)
    elsewhere = 0
    for t, parts in enumerate(threads.thread_parts(trips, along, cores)):
        # a thread whose units do not split the n blocks reads all of them
        read = {part[0] for part in parts} if any(along) else set(range(blocks))
        first, count = packers[t] if t < len(packers) else (0, 0)
        elsewhere += len(read - set(range(first, first + count)))
    return elsewhere / blocks


def _shared_levels(order: Sequence[str], parallel: Sequence[str]) -> int:
    """How many outer levels every thread works in at once: one execution of a loop at or
    outside the first parallel loop is all threads' work, whose data shares the whole L3
    (an array all of them read is there once); inside it each thread has its share."""
    if not parallel or parallel[0] not in order:
        return 0
    return list(order).index(parallel[0]) + 1


def thread_balance(model: PolyModel, schedule: Schedule, cores: int) -> float:
    """The busiest thread's work against an even share (`threads.balance`): each parallel
    loop's iterations weighed by their rows, a tile loop's ragged last tile by fewer."""
    sizes = []
    for loop in schedule.parallel:
        trips = trip_count(model, schedule, loop)
        var = loop_var(loop)
        tile = schedule.tile_sizes.get(var) if loop != var else None
        if tile:
            sizes.append([tile] * (trips - 1) + [loop_extent(model, var) - tile * (trips - 1)])
        else:
            sizes.append([1] * trips)
    return threads.balance(sizes, cores)


def moves_along(model: PolyModel, loops: Sequence[str]) -> dict[str, tuple[bool, ...]]:
    """For each array the main group touches, whether its cells move along each of `loops`
    (a tile loop by its point variable's stride)."""
    moves: dict[str, tuple[bool, ...]] = {}
    for statement in group_statements(model)[main_group(model)]:
        for a in statement.accesses:
            along = tuple(element_stride(model, a.access, loop_var(loop)) != 0 for loop in loops)
            known = moves.get(a.access.array, (False,) * len(loops))
            moves[a.access.array] = tuple(x or y for x, y in zip(known, along, strict=True))
    return moves


def shared_read_bytes(model: PolyModel, schedule: Schedule, cores: int) -> float:
    """Bytes the threads read beyond one copy of each array: an array that does not move
    along a parallel loop is read whole by every thread that loop splits it over, each into
    its own cache (the writes move along every parallel loop, or it would not be parallel)."""
    trips = tuple(trip_count(model, schedule, loop) for loop in schedule.parallel)
    extra = 0.0
    for name, along in moves_along(model, schedule.parallel).items():
        copies = threads.readers(trips, along, cores)
        if copies > 1:
            extra += (copies - 1) * array_bytes(model, name)
    return extra


def copied_arrays(model: PolyModel) -> tuple[str, ...]:
    """Scratch arrays a nest before the main one writes and the main nest reads, each part in
    one iteration of its outermost loop: the padded or strided copy of a convolution's input
    (`feeds.py` moves it into the main band, one slice per thread, where the parallel loops
    let each thread read only what it copied). None where the main nest also reads a copy of
    its weights (backward data's transposed weights): every choice of parallel loops then
    reads one of the two copies from other cores. Measured on 16 cores, charging either
    moved backward data's res5_3x3 off the analytic choice and ran it slower: 0.80x at N=32
    (charging both, to input-channel tiles in parallel); 0.95x at N=32 and 0.91x at N=2
    (charging the padded copy only, to images in parallel)."""
    groups = group_statements(model)
    main = main_group(model)
    read = {a.access.array for s in groups[main] for a in s.accesses if not a.is_write}
    copied = {s.write.access.array for g, statements in groups.items() if g < main
              for s in statements
              if model.nest.array(s.write.access.array).local and s.write.access.array in read}
    moves = moves_along(model, (groups[main][0].iterators[0],))
    if any(not moves.get(name, (False,))[0] for name in copied):
        return ()
    return tuple(sorted(copied))


def copied_elsewhere_bytes(model: PolyModel, schedule: Schedule, cores: int) -> float:
    """Bytes of the scratch copies the threads read from lines other threads wrote. Where a
    copy's cells are read by several threads it cannot run inside their parallel loop: it is
    a pass of its own, whose lines stay modified in the cache of the core that copied them,
    and every other thread fetches them from there. (16 cores, ResNet-50's res5_proj_s2 at
    N=32: output-channel tiles in parallel, each thread reading every image of the strided
    copy, ran 0.79-0.81x as fast as images in parallel in the tuner's trials and 0.88x in 21
    interleaved rounds; res5_3x3's padded copy 0.93x. The L3 charge of `shared_read_bytes`
    alone ranked the tiles first.)"""
    copied = copied_arrays(model)
    if not copied:
        return 0.0
    trips = tuple(trip_count(model, schedule, loop) for loop in schedule.parallel)
    moves = moves_along(model, schedule.parallel)
    elsewhere = 0.0
    for name in copied:
        copies = threads.readers(trips, moves.get(name, (False,) * len(trips)), cores)
        if copies > 1:
            elsewhere += copies * array_bytes(model, name) * (1 - 1 / cores)
    return elsewhere


def outer_tilings(model: PolyModel, schedule: Schedule) -> list[Schedule]:
    """Variants of a microkernel schedule that tile one loop outside the call which A (the
    operand along m) does not depend on, such as a convolution's output-channel blocks: its
    tile loop stays in place and its point loop moves in, next to the call, so that a block of
    B (the weights) stays in cache across the loops in between. (Tiling the loops B does not
    index instead measured slower.)"""
    call = _call_of(model, schedule)
    if call is None:
        return []
    out = []
    for var in call.outer:
        if (var not in call.statement.iterators or var in schedule.tile_sizes
                or loop_extent(model, var) < 8):
            continue
        if element_stride(model, call.a, var) != 0:
            continue
        out += [tiled_next_to_call(schedule, var, size) for size in (4, 8)]
    return out


def tiled_next_to_call(schedule: Schedule, var: str, size: int) -> Schedule:
    """`schedule` with loop `var` (outside the call) tiled by `size`: its tile loop stays in
    place, its point loop moves right outside the call; the parallel loops left to the model."""
    mk = schedule.microkernel
    assert mk is not None
    calls = len(mk.loops)
    outer, inner = list(schedule.order[:-calls]), list(schedule.order[-calls:])
    order = [tile_loop(var) if v == var else v for v in outer] + [var] + inner
    tiles = tuple(sorted(schedule.tiles + ((var, size),)))
    return replace(schedule, order=tuple(order), tiles=tiles, parallel=())


def call_loop_tiled(schedule: Schedule, var: str, size: int) -> Schedule:
    """`schedule` with loop `var` of its call tiled by `size`: its tile loop right outside the
    call, so that each call runs one tile of it."""
    mk = schedule.microkernel
    assert mk is not None
    calls = len(mk.loops)
    return replace(schedule, order=(*schedule.order[:-calls], tile_loop(var), *schedule.order[-calls:]),
                   tiles=tuple(sorted((*schedule.tiles, (var, size)))))


def k_tilings(model: PolyModel, machine: CpuTarget, schedule: Schedule) -> list[Schedule]:
    """A GEMM call over all of a long k with k tiled right outside the call instead, each
    call's micro-panels of B (k tile x nr) an eighth of L2, read again by every register tile
    of the call from there rather than from L3 or memory (128 x 128 x 32768 on two Zen 4
    cores: 42 GFLOP/s over all of k, 136 in k blocks; 512 x 512 x 25088 on 16 Sapphire
    Rapids cores, tuned: 2.1x in k blocks of 1930, panels of 247 KiB). The parallel loops
    left to the model."""
    mk = schedule.microkernel
    if mk is None or mk.batch or mk.k in schedule.tile_sizes:
        return []
    if gemm_operands(model, mk) is None:
        return []
    row_bytes = _panel_row_bytes(model, machine, mk, schedule)
    k_ext = loop_extent(model, mk.k)
    if k_ext * row_bytes <= machine.l2_bytes // 2:
        return []
    per = max(K_TILE, machine.l2_bytes // 8 // row_bytes // K_TILE * K_TILE)
    k_tile = math.ceil(k_ext / math.ceil(k_ext / per))
    return [replace(call_loop_tiled(schedule, mk.k, k_tile), parallel=())]


# A call reading fewer flops per byte of A than this re-reads A from L2 for every block when
# A outgrows half of L1: 1 x 1 convolutions (8 flops per byte) gained 1.1-1.6x over their blocks
# on a 16-core Sapphire Rapids host, 3 x 3 ones (~22, A's window reused in the call) 0.96-1.02.
BLOCKS_A_INTENSITY = 16.0


def block_variants(model: PolyModel, schedule: Schedule, machine: CpuTarget,
                   gated: bool = True) -> list[Schedule]:
    """Variants of a microkernel schedule whose call also runs a loop along which C and B
    move and A does not (a convolution's output-channel blocks): the loop right outside the
    call where it is a point loop already (see `outer_tilings`), or any such loop tiled by 2
    or 4 with its point loop moved into the call. One load of A then feeds a vector of each
    block. Tried where one block's call is short of that: its register tile is latency-bound
    while A serves many flops within the call (7 rows of one 16-lane block are 7 accumulators
    for two FMA pipes of 4 cycles' latency: 66% of the peak measured, 87% over 4 blocks; 3 x 3
    windows 1.07-1.21x), or it reads A, larger than half of L1, again for every block at few
    flops per byte (1 x 1 layers 1.1-2x), or its register tile is one vector wide
    (`_one_vector`: 1 x 1 layers of 256 to 1024 channels at 14 x 14 ran at 77% of the FMA
    peak on two Zen 5 cores, 97% over 2 or 4 blocks; ResNet-50's kernels so changed 1.07x at
    N=32 there, 1.04x on the 16-core Sapphire Rapids host). Elsewhere more blocks only crowd
    L1 (a 28-row 1 x 1 call over 4 blocks ran at 0.67x on 16 cores). `gated=False` (the
    tuner's search space) offers them wherever a call can run over blocks, so that measuring
    can find what these rules leave out."""
    call = _call_of(model, schedule)
    if call is None or call.mk.blocks or call.mk.pack_a or call.mk.pack_b:
        return []
    mk, s, c, a, b = call.mk, call.statement, call.c, call.a, call.b
    if not _native_blocks(model, mk) or trip_count(model, schedule, mk.n) % accumulator_lanes(model, machine, mk):
        return []  # no register tile over blocks: whole vectors of float accumulators only
    a_bytes = _call_bytes(model, schedule, s, a)
    flops = 2 * count_points(_call_cells(model, schedule, s))
    reused = flops >= BLOCKS_A_INTENSITY * a_bytes  # A's cells serve many flops within a call
    if gated and not ((reused and _latency_bound(model, machine, schedule))
                      or (not reused and a_bytes > machine.l1_bytes // 2)
                      or _one_vector(model, machine, schedule)):
        return []

    def moves(var: str) -> bool:
        return (var in s.iterators and var not in mk.loops and element_stride(model, a, var) == 0
                and element_stride(model, c, var) not in (0, None)
                and element_stride(model, b, var) not in (0, None))

    out = []
    last = call.outer[-1] if call.outer else None
    if last is not None and moves(last) and last in schedule.tile_sizes:
        # already a point loop right outside the call: the call runs it, the order unchanged
        out.append(replace(schedule, parallel=(), microkernel=replace(mk, blocks=last)))
    for var in call.outer:
        if not moves(var) or var in schedule.tile_sizes:
            continue
        out += [replace(tiled_next_to_call(schedule, var, size), microkernel=replace(mk, blocks=var))
                for size in (2, 4) if loop_extent(model, var) > size]
    return out


def window_calls(model: PolyModel, schedule: Schedule, machine: CpuTarget) -> list[Schedule]:
    """Variants of a batch-reduce call whose B (the weights) outgrows half of L1 and so
    streams from L2 at every call, reused only by the call's rows: the outermost batch loop
    (a convolution's input-channel blocks) tiled, its tile loop right outside the loops along
    which A moves and B does not (the output rows), so that each call reduces one tile
    (a 3 x 3 window of one block) and its B stays in L1 across the rows, the partial sums in
    C (oneDNN's input-channel blocking for L2). Tiles of 1, 2 and 4 whose B fits half of L1.
    On the 16-core Sapphire Rapids host, res5_3x3 (512 channels, 7 x 7) at N=32 ran 1.16x so
    against calls that read 1.2 MiB of weights each (1.09x on 2 of its cores); its backward
    data 1.25x; backward weights at N=32, an image's output gradient kept across the filter
    taps, 1.23-1.68x."""
    call = _call_of(model, schedule)
    if (call is None or not call.mk.batch or call.mk.pack_a or call.mk.pack_b
            or call.mk.batch[0] in schedule.tile_sizes):
        return []
    s, c, a, b, outer, inner = call.statement, call.c, call.a, call.b, call.outer, call.inner
    if _call_bytes(model, schedule, s, b) <= machine.l1_bytes // 2:
        return []
    var = call.mk.batch[0]
    at, sums = len(outer), _call_bytes(model, schedule, s, c)
    while at:  # out past the rows while their partial sums stay in L1 beside B
        loop = outer[at - 1]
        if (element_stride(model, a, loop_var(loop)) in (0, None)
                or element_stride(model, b, loop_var(loop)) != 0):
            break
        sums *= trip_count(model, schedule, loop)
        if sums > machine.l1_bytes // 4:
            break
        at -= 1
    if at == len(outer):
        return []  # no rows outside the call to keep B for
    out = []
    for size in (1, 2, 4):
        if size >= loop_extent(model, var) or loop_extent(model, var) % size:
            continue
        variant = replace(schedule, order=(*outer[:at], tile_loop(var), *outer[at:], *inner),
                          tiles=tuple(sorted((*schedule.tiles, (var, size)))), parallel=())
        if size == 1 or _call_bytes(model, variant, s, b) <= machine.l1_bytes // 2:
            out.append(variant)
    return out


# Of the L2, the share one call's B (the weights) may take when its batch is tiled for it.
BATCH_TILE_B_SHARE = 8
# `BATCH_TILE_MAX_WAYS` (register_blocking): the most ways of an L1 whose calls get their batch
# tiled: measured to pay on 8 ways (32 KiB); on the 12 ways (48 KiB) and 2 MiB L2 of the
# 16-core Sapphire Rapids host the same tiles ran ResNet-50's changed layers at 0.96x (16
# threads) and 0.995x (2 threads) of whole calls. There the register tile pays for A's misses
# instead (`register_blocking.A_LINE_MISS_CYCLES`).
# A call's rows must span more register tiles than this for its B to be worth a smaller batch:
# calls over 8 rows (14 x 14 layers with their rows tiled) ran 0.93-0.97x with fewer blocks.
BATCH_TILE_MIN_ROW_TILES = 2


def batch_tiled_call(model: PolyModel, machine: CpuTarget, schedule: Schedule) -> Schedule:
    """`schedule` with its call's outermost batch loop (a 1 x 1 convolution's input-channel
    blocks, or a backward-data layer's output-channel blocks) tiled right outside the call
    where one call over all of it overflows the caches in ways the model, which stops at the
    call, does not see; else `schedule` itself. Each
    register tile of the call reads its rows of A over the whole batch again for every
    vector strip of B, and reads all of B once per row tile:
    - A's blocks a multiple of 4 KiB apart (at 56 x 56 a channel block is 49 pages) put a row's
      lines of every block into one L1 set; more blocks than its ways evict each other
      between strips. On two Zen 3 cores (8 ways), 256 to 64 and 256 to 128 at 56 x 56 ran
      1.10-1.18x over tiles of 8 blocks (of 4 alike); with the input 16 bytes past a line (two
      sets a row) they had run 1.3x as fast untiled. 128 channels (8 blocks, 8 lines a set)
      ran alike whole and in tiles of 4;
    - a B larger than an eighth of L2 streams from beyond it for each row tile: 2048 to 512
      at 7 x 7 (1 MiB a call, 49 rows) ran 1.25x over 8 blocks, 1024 to 256 at 14 x 14 1.02x,
      512 to 256 at 14 x 14 1.06x; not where the call has few row tiles to read it.
    Only where the batch is that one loop and the call reads each cell of A once per strip:
    a 3 x 3 window's call (its taps overlap) so tiled ran at 0.5-0.7x; the backward weights'
    calls over images and rows, and the bf16 and AMX kernels, were not measured so."""
    call = _call_of(model, schedule)
    if (call is None or not call.mk.batch or call.mk.pack_a or call.mk.pack_b
            or l1_ways(machine.l1_bytes) > BATCH_TILE_MAX_WAYS):
        return schedule
    mk, s = call.mk, call.statement
    var = mk.batch[0]
    stride = element_stride(model, call.a, var)
    if (var in schedule.tile_sizes or not _native_blocks(model, mk) or not stride
            or any(trip_count(model, schedule, v) > 1 for v in mk.batch[1:])):
        return schedule
    a_reads = math.prod(trip_count(model, schedule, v) for v in (mk.m, mk.k, *mk.batch))
    if _call_bytes(model, schedule, s, call.a) < a_reads * _element_bytes(model, call.a):
        return schedule  # the call reads cells of A again across its batch: a window
    extent = loop_extent(model, var)
    stride_bytes = abs(stride) * _element_bytes(model, call.a)
    ways = l1_ways(machine.l1_bytes)
    b_block = _call_bytes(model, schedule, s, call.b) // extent
    b_budget = max(machine.l2_bytes // BATCH_TILE_B_SHARE, b_block)
    if trip_count(model, schedule, mk.m) <= BATCH_TILE_MIN_ROW_TILES * MICRO_ROWS:
        b_budget = extent * b_block  # B read by few row tiles: the partial sums cost more

    def fits(size: int) -> bool:
        return lines_per_set(stride_bytes, size) <= ways and size * b_block <= b_budget

    if fits(extent):
        return schedule
    size = max(d for d in range(1, extent) if extent % d == 0 and (fits(d) or d == 1))
    why = (f"a row's lines of A over its {extent} iterations share an L1 set"
           if lines_per_set(stride_bytes, extent) > ways else
           f"a call's B ({extent * b_block // 1024} KiB) outgrows 1/{BATCH_TILE_B_SHARE} of L2")
    return replace(call_loop_tiled(schedule, var, size),
                   notes=(*schedule.notes, ("batch_tiled", f"{var} by {size}: {why}")))


def _latency_bound(model: PolyModel, machine: CpuTarget, schedule: Schedule) -> bool:
    """Whether one call's register tile has fewer accumulators than FMAs in flight."""
    mk = schedule.microkernel
    assert mk is not None
    unit = unit_for(machine.isa)
    rows = trip_count(model, schedule, mk.m)
    vectors = math.ceil(trip_count(model, schedule, mk.n) / accumulator_lanes(model, machine, mk))
    return rows * min(vectors, _micro_vectors(machine)) < unit.fma_ports * unit.fma_latency


def _one_vector(model: PolyModel, machine: CpuTarget, schedule: Schedule) -> bool:
    """Whether one call's register tile is one vector wide over a reduction of at least a
    vector's lanes: each FMA then takes a load of its own (a broadcast of A) beside the
    vector of B, and the loads, not the FMAs, set the pace (AVX-512's 16-lane blocks)."""
    mk = schedule.microkernel
    assert mk is not None
    lanes = accumulator_lanes(model, machine, mk)
    return (math.ceil(trip_count(model, schedule, mk.n) / lanes) == 1
            and trip_count(model, schedule, mk.k) >= lanes)


def _call_cells(model: PolyModel, schedule: Schedule, s: StatementModel) -> isl.Set:
    """The instances of `s` one call of `schedule` runs (its first call)."""
    mk = schedule.microkernel
    assert mk is not None
    dom = s.domain
    for d, var in enumerate(s.iterators):
        lo = dom.dim_min_val(d).to_python()
        size = trip_count(model, schedule, var) if var in mk.loops else 1
        dom = dom.intersect(dim_range(dom.get_space(), d, lo, lo + size - 1))
    return dom


def _call_bytes(model: PolyModel, schedule: Schedule, s: StatementModel, access: Access) -> int:
    """Bytes of `access`'s array one call reads (its cells, counted exactly)."""
    relation = next(acc.relation for acc in s.accesses if acc.access is access)
    cells = relation.intersect_domain(_call_cells(model, schedule, s)).range()
    return count_points(cells) * _element_bytes(model, access)


def rank(model: PolyModel, machine: CpuTarget, limit: int = MAX_CANDIDATES) -> list[RankedSchedule]:
    ranked = []
    memo: _Memo = {}
    for schedule in candidates(model, machine)[:limit]:
        result = evaluate(model, machine, schedule, memo)
        if result is not None:
            ranked.append(result)
    ranked.sort(key=lambda r: r.cost)
    # refine the winner: its outer-tiled variants (a few more evaluations, not a product)
    if ranked:
        best = ranked[0].schedule
        tiled = outer_tilings(model, best)
        variants = tiled + [v for x in (best, *tiled) for v in block_variants(model, x, machine)]
        variants += [v for x in ranked[:3] for v in k_tilings(model, machine, x.schedule)]
        windows = [v for x in ranked[:3] for v in window_calls(model, x.schedule, machine)]
        variants += windows + [v for x in windows for v in block_variants(model, x, machine)]
        for schedule in variants:
            result = evaluate(model, machine, schedule, memo)
            if result is not None:
                ranked.append(result)
        ranked.sort(key=lambda r: r.cost)
        # and, where the best ones' parallel loops leave threads idle or waiting, a reduction
        # split among the threads
        uneven = [x.schedule for x in ranked[:3] if x.balance > 1.05]
        if uneven and machine.cores > 1:
            for schedule in (v for x in uneven for v in private_sum_splits(model, machine, x)):
                result = evaluate(model, machine, schedule, memo)
                if result is not None:
                    ranked.append(result)
            ranked.sort(key=lambda r: r.cost)
    # below the model's view: every call's batch tiled where it overflows L1's sets or L2, in
    # the order of the whole calls' costs (re-sorted by the tiled ones' costs, which add the
    # partial sums' traffic and not what the tiles save, other schedules won that ran 0.93x)
    return [_with_tiled_batch(model, machine, result, memo) for result in ranked]


def _with_tiled_batch(model: PolyModel, machine: CpuTarget, result: RankedSchedule,
                      memo: _Memo) -> RankedSchedule:
    tiled = batch_tiled_call(model, machine, result.schedule)
    if tiled is result.schedule:
        return result
    return evaluate(model, machine, tiled, memo) or result
