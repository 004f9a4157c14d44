"""The cost model: a candidate schedule's cycles on a CPU target, by the PolyDL data-reuse model.

Takes a `PolyModel`, a `CpuTarget` and a `Schedule`; returns a `RankedSchedule` (None where the
schedule is illegal). For every cache level, the outermost band level whose working set fits
decides that cache's traffic: each execution of that level brings its working set in once. The
cost adds the cycles of that traffic at the target's bandwidth into each level to the compute
cycles (at the microkernel's register-blocking efficiency), scaled by how evenly the parallel
loop splits over the cores, plus the target's fork and join per parallel region; memory
traffic is charged more where the loops around the calls keep many streams open at once
(`streams.py`). Every hardware figure comes from the target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from polydl.dtypes import DTYPES
from polydl.errors import ScheduleError
from polydl.poly.model import PolyModel
from polydl.poly.reuse import LevelWorkingSet, working_sets
from polydl.schedules.apply import (
    GroupPlan,
    apply_schedule,
    array_bytes,
    group_statements,
    main_group,
    summed_output,
)
from polydl.schedules.cpu import threads
from polydl.schedules.cpu.calls import (
    MICRO_ROWS,
    Memo,
    accumulator_lanes,
    b_strides,
    call_extent,
    element_bytes,
    free_loops,
    kept_b,
    loop_extent,
    micro_vectors,
    native_blocks,
    panel_row_bytes,
    plan_of,
    streams_along,
    trip_count,
)
from polydl.schedules.cpu.candidates import parallel_choices
from polydl.schedules.cpu.register_blocking import rows_step_cycles, unit_for
from polydl.schedules.cpu.streams import dram_slowdown, open_streams
from polydl.schedules.microkernel import bound_statement, gemm_operands
from polydl.schedules.schedule import MicrokernelBinding, Schedule, loop_var, tile_loop
from polydl.schedules.strides import element_stride
from polydl.target.cpu import CpuTarget

# A core reads lines another core wrote and still holds modified (each fetched by a snoop into
# the writer's cache, not streamed from the L3) at its memory bandwidth divided by this.
# see decisions: Reads of lines another core wrote
FROM_OTHER_CORE_SHARE = 5
# Waking and joining one thread of a parallel region's team costs the region's fork and join
# divided by this (500 cycles of 13000: ~4 us for a team of 16).
THREAD_WAKES_PER_FORK_JOIN = 26


@dataclass(frozen=True)
class RankedSchedule:
    schedule: Schedule
    cost: float
    working_sets: tuple[LevelWorkingSet, ...]
    traffic_bytes: dict[str, int]
    compute_cycles: float
    balance: float
    # the same loops on one thread, where the ranking chose the parallel loops (none given):
    # forks nothing and reads no line another core holds
    one_thread: RankedSchedule | None = None


def evaluate(
    model: PolyModel, target: CpuTarget, schedule: Schedule, memo: Memo | None = None
) -> RankedSchedule | None:
    """The model's cost of `schedule`; without parallel loops given, of the outermost free
    ones (`_with_parallel`), or, where those leave cores idle around microkernel calls, of
    the best legal choice (the stem's backward-data scatter: its images and input channel
    blocks are 2 units for 16 cores, its filter rows 7 units inside the output rows).
    see decisions: Parallel loops where the outermost leave cores idle"""
    memo = {} if memo is None else memo
    result = _evaluate(model, target, schedule, memo)
    if result is None:
        return None
    one_thread = result.one_thread
    # plain nests keep theirs (see decisions: Parallel loops where the outermost leave cores idle)
    if (not schedule.parallel and result.schedule.parallel and schedule.microkernel is not None
            and target.cores >= 2 and math.prod(trip_count(model, result.schedule, loop)
                                                for loop in result.schedule.parallel) < target.cores):
        for choice in parallel_choices(model, schedule, memo):
            other = _evaluate(model, target, replace(schedule, parallel=choice), memo)
            if other is not None and other.cost < result.cost:
                result = other
    # the nest on one thread where that beats the best threaded choice with its forks: a small
    # nest (PolyBench's MINI sizes) forks for microseconds of work
    return one_thread if one_thread is not None and one_thread.cost < result.cost else result


def _evaluate(
    model: PolyModel, target: CpuTarget, schedule: Schedule, memo: Memo
) -> RankedSchedule | None:
    """The cost of `schedule` with its parallel loops (`_with_parallel`), and where none were
    given, of the same loops on one thread (`RankedSchedule.one_thread`)."""
    found = _with_parallel(model, schedule, target, memo)
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
            model, plan.statements, plan.schedule_map, loops, target.cache_line_bytes,
            total_lines=total if isinstance(total, int) else None,
        )
    ws = memo[key]
    assert isinstance(ws, list)
    if ws:
        memo[("total lines",)] = ws[0].lines
    caches = {"l1": target.l1_bytes, "l2": target.l2_bytes, "l3": target.l3_bytes // max(target.cores, 1)}
    traffic: dict[str, int] = {}
    total_lines_once = ws[0].lines if ws else 0
    shared_levels = _shared_levels(plan.order, final.parallel)
    for name, capacity in caches.items():
        fitting = [w for w in ws if w.bytes(target.cache_line_bytes) <= (
            target.l3_bytes if name == "l3" and w.level < shared_levels else capacity) * 0.75]
        if fitting:
            w = fitting[0]
            traffic[name] = w.bytes(target.cache_line_bytes) * w.executions
        else:
            inner = ws[-1] if ws else None
            traffic[name] = inner.bytes(target.cache_line_bytes) * inner.executions if inner else 0
        if final.microkernel is not None and not final.microkernel.batch and ws:
            traffic[name] = _call_traffic(model, target, final, ws[-1], capacity, traffic[name])
        traffic[name] = max(traffic[name], total_lines_once * target.cache_line_bytes)
    flops = sum(s.flops for s in plan.statements)
    # 2 FMA pipes x lanes x 2 flops, lanes of the main statement's accumulation
    if final.microkernel is not None:
        lanes = accumulator_lanes(model, target, final.microkernel)
    elif loops and not streams_along(model, loop_var(loops[-1])):
        lanes = 1  # an innermost loop with a strided access runs scalar
    else:
        lanes = target.vector_lanes(_nest_dtype(model, plan))
    peak_per_cycle = 2 * 2 * lanes
    compute = flops / (peak_per_cycle * microkernel_efficiency(final, model, target))
    cores = max(target.cores, 1)
    balance = thread_balance(model, final, cores) if final.parallel else float(cores)
    trips = {loop: trip_count(model, final, loop) for loop in plan.order}
    dram = dram_slowdown(open_streams(model, final, plan.order, trips))  # the l3 traffic's
    bandwidth = {"l1": target.l1_bytes_per_cycle, "l2": target.l2_bytes_per_cycle,
                 "l3": target.memory_bytes_per_cycle}  # into each level, from the one below
    from_other_core = target.memory_bytes_per_cycle / FROM_OTHER_CORE_SHARE
    memory = sum(traffic[c] * (dram if c == "l3" else 1.0) / bandwidth[c] for c in traffic)
    threaded = final.parallel and cores > 1
    # what only the threads add: lines other cores read or wrote
    sharing = 0.0
    if threaded:
        sharing += shared_read_bytes(model, final, cores) / bandwidth["l3"]
        sharing += copied_elsewhere_bytes(model, final, cores) / from_other_core
    mk = final.microkernel
    # B packed in every call (a kept B is packed once for all of them)
    packs_per_call = mk is not None and mk.pack_b and not kept_b(model, mk)
    if mk is not None and packs_per_call:
        strides = b_strides(model, mk)
        operands = gemm_operands(model, mk)
        b_bytes = (strides[2] * element_bytes(model, operands[2])) if strides and operands else 0
        memory += 2 * b_bytes / bandwidth["l3"]  # read B, write the copy
        if b_bytes and not mk.batch:
            memory += sum(_packed_rereads(model, final, b_bytes, caches[c]) for c in ("l2", "l3")) / bandwidth["l3"]
        if b_bytes and cores > 1:
            sharing += packed_elsewhere(model, final, cores) * b_bytes / from_other_core
    memory += amx_repacked_bytes(model, target, final, plan.order) / bandwidth["l3"]
    cost = (compute + memory + sharing) * balance / cores
    if threaded:
        # waking and joining each thread of the team, once: on many cores a small nest runs
        # faster on one core than split over all
        cost += target.fork_join_cycles / THREAD_WAKES_PER_FORK_JOIN * cores
    if final.private_sums and cores > 1:
        # every thread clears its copy of the output, and OpenMP adds the copies into it one
        # thread at a time, each from the cache of the core that summed it
        summed = summed_output(model, plan.statements)[0]
        out_bytes = array_bytes(model, summed) if summed else 0
        cost += out_bytes / bandwidth["l1"] + cores * 2 * out_bytes / bandwidth["l3"]
    if threaded:
        # every entry into the parallel loop forks and joins the threads (and a packed copy
        # inside the loops around it is one more parallel loop): a few microseconds each
        # (convolutions' batch-reduce calls were ranked without it where they fork once)
        order = plan.order
        first = order.index(final.parallel[0]) if final.parallel[0] in order else 0
        around = math.prod(trip_count(model, final, loop) for loop in order[:first])
        if around > 1 or not (mk is not None and mk.batch):
            cost += target.fork_join_cycles * around * (1 + int(packs_per_call))
    one_thread = None
    if threaded and not schedule.parallel and not final.private_sums:
        # (the order spelled out: without one, no parallel loops means "choose them")
        one = replace(final, parallel=(), order=final.order or plan.order)
        one_thread = RankedSchedule(one, compute + memory, tuple(ws), traffic, compute, 1.0)
    return RankedSchedule(final, cost, tuple(ws), traffic, compute, balance, one_thread)


def _with_parallel(
    model: PolyModel, schedule: Schedule, target: CpuTarget, memo: Memo | None = None
) -> tuple[Schedule, GroupPlan] | None:
    """Parallelise the outermost dependence-free loop, collapsing a second one when the first
    alone has too few iterations for the cores."""
    plan = plan_of(model, schedule, memo)
    if plan is None:
        return None
    free = free_loops(model, schedule, plan)
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
    if trips < 4 * target.cores and trips % target.cores and nxt in free:
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


def microkernel_efficiency(schedule: Schedule, model: PolyModel, target: CpuTarget) -> float:
    """Fraction of peak FMA throughput the inner code reaches: the microkernel's register
    blocks over the calls' rows (a full tile and the remainder tile of m); plain loops reach
    far less."""
    mk = schedule.microkernel
    if mk is None:
        return 0.15
    lanes = accumulator_lanes(model, target, mk)
    m_ext = loop_extent(model, mk.m)
    m = call_extent(model, schedule, mk.m)
    n = schedule.tile_sizes.get(mk.n, loop_extent(model, mk.n))
    vectors = max(1, math.ceil(n / lanes))
    lane_use = n / (vectors * lanes)
    unit = unit_for(target.isa)
    if mk.blocks and n % lanes == 0 and native_blocks(model, mk):
        # a register tile of whole blocks, or of part of one (`blocking.choose_outer_product`)
        total = vectors * trip_count(model, schedule, mk.blocks)
        widths = [v for v in range(1, min(total, micro_vectors(target)) + 1)
                  if vectors % v == 0 or v % vectors == 0]
    else:
        widths = [min(vectors, micro_vectors(target))]
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
    return efficiency * _micro_panel_factor(schedule, model, target, k)


def _micro_panel_factor(schedule: Schedule, model: PolyModel, target: CpuTarget, k: int) -> float:
    """The register tiles of a call down m reuse one micro-panel of B (k x nr) from L1.
    Contiguous (packed one register tile wide, or B's rows already nr apart), it streams
    through few pages and every L1 set; rows further apart fall into fewer sets (a 512-byte
    stride into one set in eight) and pages; a panel larger than half of L1 is evicted
    before the next register tile reads it.
    see decisions: Micro-panels of B priced by their rows' spread"""
    mk = schedule.microkernel
    assert mk is not None
    nr = accumulator_lanes(model, target, mk) * micro_vectors(target)
    strides = b_strides(model, mk)
    n = call_extent(model, schedule, mk.n)
    contiguous = (mk.pack_b and n <= nr) or (strides is not None and strides[:2] == (1, nr))
    if contiguous:
        return 1.0
    if k * target.cache_line_bytes > target.l1_bytes // 2:
        return 0.75
    return 0.93


def _strided_b(model: PolyModel, mk: MicrokernelBinding) -> bool:
    """Whether a call's B rows fall into few L1 sets: not unit-stride along n, or rows whose
    byte stride is a multiple of 1 KiB (4 KiB apart: one set of 64; 3 KiB: 4 sets), which
    evict each other as a register tile walks k. Rows 4000 bytes apart spread over every
    set and need no copy. see decisions: Micro-panels of B priced by their rows' spread"""
    strides = b_strides(model, mk)
    operands = gemm_operands(model, mk)
    if strides is None or operands is None:
        return False
    row_bytes = abs(strides[1]) * element_bytes(model, operands[2])
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
    per_line = max(line_bytes // element_bytes(model, a), 1)
    if a_k == 1:
        return m * math.ceil(k / per_line)
    if a_m == 1:
        return k * math.ceil(m / per_line)
    return m * k


def _call_traffic(model: PolyModel, target: CpuTarget, schedule: Schedule,
                  call: LevelWorkingSet, capacity: int, traffic: int) -> int:
    """Effects of a microkernel call on the traffic into a cache of `capacity` bytes that
    the whole-level rule does not see. A block of A larger than half the cache is read once
    per register-tile column of the call (the call walks n outside m), not once. And where
    the loop right around the call is n's tile loop, the call's A block is the same in all
    its iterations: if it fits half the cache it is read once, and only B's panels and C's
    tiles stream (likewise A's rows over all of k, with k's tile loop between). And every
    register tile down m reads the strip's micro-panel of B (k x nr); one larger than half of
    L2 (or L3) is read again for each of them (a call over all of k = 32768: 8 MiB of B a
    strip, read 11 times). see decisions: GEMM calls over a long k tiled in k"""
    mk = schedule.microkernel
    assert mk is not None
    line = target.cache_line_bytes
    a_lines = _a_block_lines(model, schedule, line)
    if a_lines is None:
        return traffic
    a_bytes = a_lines * line
    nr = accumulator_lanes(model, target, mk) * micro_vectors(target)
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
    panel = call_extent(model, schedule, mk.k) * panel_row_bytes(model, target, mk, schedule)
    # (from L2 a panel streams at a fraction of L2's bandwidth: only the levels beyond count)
    if capacity > target.l1_bytes and panel > capacity // 2 and m > MICRO_ROWS:
        traffic += (math.ceil(m / MICRO_ROWS) - 1) * panel * strips * call.executions
    return traffic


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


def _nest_dtype(model: PolyModel, plan: GroupPlan) -> str:
    """The dtype the statements of a nest accumulate in: their written arrays' widest."""
    dtypes = {DTYPES[model.nest.array(st.statement.target.array).dtype].accumulates_in
              for st in plan.statements}
    return max(dtypes, key=lambda d: DTYPES[d].bytes)


AMX_CACHED_COLUMNS = 32  # B of at most two tile columns: one block, reused by the next call


def amx_repacked_bytes(model: PolyModel, target: CpuTarget, schedule: Schedule,
                       order: Sequence[str]) -> int:
    """Bytes of B the AMX kernel copies into k pairs over the nest. It copies B at every call,
    except that a call over the same constant B of one block as the thread's previous call
    reuses its copy (`microkernels/amx.py`): then B is copied once per change of the loops
    outside the call that move it: output-channel blocks innermost outside the calls copy B at
    every call, blocks outside the rows and images once a block.
    see decisions: AMX copies of B kept for the next call"""
    mk = schedule.microkernel
    if mk is None or target.isa != "avx512amx":
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
    per_call = element_bytes(model, b) * math.prod(
        call_extent(model, schedule, v) for v in (mk.n, mk.k, *mk.batch))
    outer = [loop for loop in order if loop not in mk.loops]  # tile loops of the call's too
    trips = [trip_count(model, schedule, loop) for loop in outer]
    # the kernel keeps its copy only of a constant input, as codegen passes it (`b_constant`)
    constant = b.array in {arr.name for arr in model.nest.inputs}
    cached = not mk.pack_b and call_extent(model, schedule, mk.n) <= AMX_CACHED_COLUMNS and constant
    moving = [i for i, loop in enumerate(outer) if element_stride(model, b, loop_var(loop)) != 0]
    last = (moving[-1] + 1 if moving else 0) if cached else len(outer)
    return per_call * math.prod(trips[:last])


def packed_elsewhere(model: PolyModel, schedule: Schedule, cores: int) -> float:
    """The packed B's reads from a copy another thread wrote, as a fraction of its size: the
    copy's n blocks run on the threads in OpenMP's static split, and a block one thread wrote
    and another reads comes from the writer's cache, a transfer on top of the shared read.
    see decisions: Reads of lines another core wrote"""
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
    reads one of the two copies from other cores, and charging either ranked worse.
    see decisions: Scratch copies read from other cores"""
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
    and every other thread fetches them from there (the L3 charge of `shared_read_bytes`
    alone does not see it).
    see decisions: Scratch copies read from other cores"""
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
