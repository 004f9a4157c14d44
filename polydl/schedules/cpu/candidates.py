"""The candidate schedules of a nest on a CPU target: the search space the ranking prices and
the tuner walks.

Takes a `PolyModel` and a `CpuTarget`; returns `Schedule`s. `candidates` gives the seeds:
blockings around a microkernel call (calls over the whole k, over a packed B, BLIS-like
micro-panels) and tiled plain loops. The variant generators take one schedule and return its
neighbours that the ranking refines a winner with: outer tilings, calls over several output
blocks, k tiles, window calls, private sums split among the threads, and batch tiles below the
model's view. `parallel_choices` gives the thread mappings. Nothing here prices a schedule
(`cost.py` does).
"""

from __future__ import annotations

import math
from dataclasses import replace

from polydl.poly.counting import count_points
from polydl.poly.model import PolyModel
from polydl.schedules.apply import band_of, group_statements, main_group, summed_output
from polydl.schedules.cpu.calls import (
    MICRO_ROWS,
    Memo,
    accumulator_lanes,
    b_strides,
    call_bytes,
    call_cells,
    call_of,
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
from polydl.schedules.cpu.register_blocking import (
    BATCH_TILE_MAX_WAYS,
    l1_ways,
    lines_per_set,
    unit_for,
)
from polydl.schedules.microkernel import (
    candidate_bindings,
    gemm_operands,
)
from polydl.schedules.schedule import MicrokernelBinding, Schedule, loop_var, tile_loop
from polydl.schedules.strides import element_stride
from polydl.target.cpu import CpuTarget

K_TILE = 256  # a k block of B's micro-panel (K_TILE x vectors) stays in L1


def _m_tiles(extent: int, tall: bool) -> list[int]:
    """Rows per call: whole extent when small, else the five largest of the sizes that fill
    the vector registers (the fifth, 14 rows where 64 is offered, is AVX-512's register tile);
    `tall`, also 128 rows: each block of B read by twice the rows.
    see decisions: Rows per microkernel call"""
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
    blocks (n blocks outside m blocks: a copy per block beats one copy of all of B before the
    nest, and a count that is no multiple of the cores leaves threads idle)."""
    if cores <= 2:
        return None
    for units in (cores, 2 * cores, 3 * cores):
        tile = lanes * -(-extent // (units * lanes))
        if 2 * lanes <= tile <= 4 * lanes and -(-extent // tile) % cores == 0:
            return tile
    return None


def microkernel_candidates(
    model: PolyModel, target: CpuTarget, band_vars: tuple[str, ...], binding: MicrokernelBinding
) -> list[Schedule]:
    lanes = accumulator_lanes(model, target, binding)
    m_ext, n_ext = loop_extent(model, binding.m), loop_extent(model, binding.n)
    outer_vars = [v for v in band_vars if v not in binding.loops]
    # calls over the whole k: where a copy of B pays, also over a packed B (one parallel
    # region, each thread's C tiles finished in its calls)
    bindings = [binding]
    if not binding.batch and packing_pays(model, target, binding):
        bindings.insert(0, replace(binding, pack_b=True))
    out: list[Schedule] = []
    tall = unit_for(target.isa).registers >= 32 and n_ext >= 4 * lanes
    for mt in _m_tiles(m_ext, tall):
        for nt in _n_tiles(n_ext, lanes, target.cores):
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




def packing_pays(model: PolyModel, target: CpuTarget, binding: MicrokernelBinding) -> bool:
    """Copying B into n blocks pays when the copy changes its layout (B's n stride is not 1,
    or its k rows are longer than a block) and enough rows of C reuse every block."""
    operands = gemm_operands(model, binding)
    if operands is None:
        return False
    c, _, b = operands
    b_n, b_k = element_stride(model, b, binding.n), element_stride(model, b, binding.k)
    c_n = element_stride(model, c, binding.n)
    lanes = accumulator_lanes(model, target, binding)
    if c_n != 1 or b_n is None or b_k is None:
        return False
    n_ext = loop_extent(model, binding.n)
    # rows of B a page or more apart: each k step of a register tile misses the TLB
    row_bytes = abs(b_k) * element_bytes(model, b)
    long_rows = n_ext > lanes * micro_vectors(target) and row_bytes >= 1024
    reshaped = b_n != 1 or (long_rows and not _bf16_b(model, binding))
    # a B the caller keeps between calls is copied once for all of them: no rows of C need
    # to pay for it
    return reshaped and (loop_extent(model, binding.m) >= 4 * MICRO_ROWS
                         or kept_b(model, binding))


def _bf16_b(model: PolyModel, binding: MicrokernelBinding) -> bool:
    """Whether B is bfloat16. Its kernels need B unit-stride along n, so a strided B is copied;
    but over a unit-stride B the AMX kernel copies each block into k pairs itself, and the
    vdpbf16ps kernel gains nothing overall from a copy: long rows alone do not pay for one.
    see decisions: A unit-stride bf16 B read in place"""
    operands = gemm_operands(model, binding)
    return operands is not None and model.nest.array(operands[2].array).dtype == "bfloat16"


def packed_candidates(
    model: PolyModel, target: CpuTarget, band_vars: tuple[str, ...], binding: MicrokernelBinding
) -> list[Schedule]:
    """BLIS-like blockings over a packed B: n blocks of whole register tiles, m blocks of
    whole register rows, k blocked so that a micro-panel of B stays in L1."""
    if not packing_pays(model, target, binding):
        return []
    packed = replace(binding, pack_b=True)
    lanes = accumulator_lanes(model, target, binding)
    nr = lanes * micro_vectors(target)
    m_ext, n_ext, k_ext = (loop_extent(model, v) for v in (binding.m, binding.n, binding.k))
    n_tiles = [t for t in (8 * nr, 4 * nr) if t < n_ext] + [n_ext] * (n_ext <= 16 * nr)
    # whole register rows; besides the usual sizes, ones that split m evenly over the cores
    cores = max(target.cores, 1)
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
    model: PolyModel, target: CpuTarget, band_vars: tuple[str, ...], binding: MicrokernelBinding
) -> list[Schedule]:
    """BLIS's loop nest over a packed B: each call is one register tile wide along n, so its
    packed B (`[n/nr][k][nr]`) is one contiguous micro-panel that stays in L1 while the call's
    register tiles walk down m; an m block of A (m tile x k tile) stays in L2 across the
    calls of the n loop inside it; k is blocked near K_TILE so that the micro-panel fits L1."""
    nr = accumulator_lanes(model, target, binding) * micro_vectors(target)
    m_ext, n_ext, k_ext = (loop_extent(model, v) for v in (binding.m, binding.n, binding.k))
    if (binding.batch or n_ext <= nr or m_ext < 4 * MICRO_ROWS or b_strides(model, binding) is None
            or _bf16_b(model, binding)):
        return []
    # A stays in place: the copy into packed panels (`pack_a`) costs more than the strided
    # broadcasts it saves (see decisions: A left in place beside a packed B)
    packed = replace(binding, pack_b=True)
    cores = max(target.cores, 1)
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


def loop_candidates(model: PolyModel, target: CpuTarget, band_vars: tuple[str, ...]) -> list[Schedule]:
    """Tiled schedules without a microkernel: square-ish tiles, the original point order, and
    where the innermost loop does not stream, the order with one that does innermost, tiled
    only (the reuse model ranks untiled dot products such as syrk's first, and they run far
    slower than tiles). see decisions: Plain loop nests with a streaming loop innermost"""
    orders = [band_vars]
    if band_vars and not streams_along(model, band_vars[-1]):
        orders += [tuple(v for v in band_vars if v != inner) + (inner,)
                   for inner in band_vars[:-1] if streams_along(model, inner)][:1]
    # a transpose's tiles first: the ranking keeps the first of equals
    out = [Schedule(), *transpose_candidates(model, target, band_vars)]
    for order in orders:
        big = [v for v in order if loop_extent(model, v) > 64]
        for size in (32, 64, 128):
            tiles = {v: size for v in big if loop_extent(model, v) > size}
            if not tiles:
                continue
            tile_order = [tile_loop(v) for v in order if v in tiles]
            out.append(Schedule(order=tuple(tile_order) + order, tiles=tuple(sorted(tiles.items()))))
    return out


# Tile sizes of a transpose's two loops, in cache lines of its elements (a tile row of one
# line first, which the ranking keeps among equals): square blocks of both arrays, in L1
# together.
TRANSPOSE_TILE_LINES = (1.0, 0.5, 2.0)


def transpose_candidates(model: PolyModel, target: CpuTarget,
                         band_vars: tuple[str, ...]) -> list[Schedule]:
    """Where no loop walks every access at unit stride but two loops each walk some (a
    transpose: one array's rows are the other's columns), square tiles of those two loops
    innermost, their tile loops right outside, the other loops outermost in the written
    order: each tile reads and writes whole runs of lines of both arrays while they sit in
    L1, where the written order writes one element per line and comes back to each line
    only a whole plane later."""
    if any(streams_along(model, v) for v in band_vars):
        return []
    accesses = [a.access for s in group_statements(model)[main_group(model)] for a in s.accesses]
    unit = [v for v in band_vars
            if any(element_stride(model, a, v) in (1, -1) for a in accesses)]
    if len(unit) != 2:
        return []
    out = []
    outer = tuple(v for v in band_vars if v not in unit)
    element = max(element_bytes(model, a) for a in accesses)
    for lines in TRANSPOSE_TILE_LINES:
        size = max(int(lines * target.cache_line_bytes // element), 2)
        tiles = {v: size for v in unit if loop_extent(model, v) > size}
        if len(tiles) < 2 or 2 * size * size * element > target.l1_bytes // 2:
            continue
        # the loop the written array streams along innermost first: a vector stores whole
        # lines and the strided side is loads
        for points in sorted((tuple(unit), tuple(reversed(unit))),
                             key=lambda p: not _written_streams(model, p[-1])):
            out.append(Schedule(order=outer + tuple(tile_loop(v) for v in points) + points,
                                tiles=tuple(sorted(tiles.items()))))
    return out


def _written_streams(model: PolyModel, var: str) -> bool:
    """Whether every array the main nest writes is at unit stride along `var`."""
    return all(element_stride(model, a.access, var) in (1, -1)
               for s in group_statements(model)[main_group(model)] for a in s.accesses
               if a.is_write)


def candidates(model: PolyModel, target: CpuTarget) -> list[Schedule]:
    statements = group_statements(model)[main_group(model)]
    band = band_of(statements)
    band_vars = tuple(loop.var for loop in band)
    out: list[Schedule] = []
    if len(statements) == 1:
        for binding in candidate_bindings(model, statements[0], band_vars)[:1]:
            out += micro_panel_candidates(model, target, band_vars, binding)
            out += packed_candidates(model, target, band_vars, binding)
            out += microkernel_candidates(model, target, band_vars, binding)
    return out + loop_candidates(model, target, band_vars)


def parallel_choices(model: PolyModel, schedule: Schedule, memo: Memo | None = None) -> list[tuple[str, ...]]:
    """Every legal choice of parallel loops for `schedule`: one dependence-free loop, or two
    adjacent ones collapsed (the search space's thread mappings)."""
    plan = plan_of(model, schedule, memo)
    if plan is None:
        return []
    free = free_loops(model, schedule, plan)
    choices: list[tuple[str, ...]] = [(loop,) for loop in free]
    order = list(plan.order)
    choices += [(a, b) for a, b in zip(free, free[1:], strict=False)
                if order.index(b) == order.index(a) + 1]
    return choices


# How many ways `private_sum_splits` splits a call's k loop among the threads.
SUM_SPLITS = (2, 4, 8, 16)


def private_sum_splits(model: PolyModel, target: CpuTarget, schedule: Schedule) -> list[Schedule]:
    """Variants of a microkernel schedule whose parallel loops leave cores idle or unevenly
    loaded, with a reduction loop of its calls run among the threads as well, each thread
    summing into a copy of the output of its own (`Schedule.private_sums`): one of the two
    outermost batch loops taken out of the call, k's tile loop, or k split into tiles, in
    front of the parallel loops. oneDNN splits the images of a small minibatch's weight
    gradient so (an output of 64 x 3 x 7 x 7 cells is 28 units of work for 16 cores)."""
    mk = schedule.microkernel
    if (mk is None or mk.pack_a or mk.pack_b or schedule.epilogues or not schedule.parallel
            or schedule.private_sums or target.cores < 2
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
        if splits > target.cores or tile * (splits - 1) >= extent:
            continue
        out.append(replace(schedule, order=(*outer, k_tile, *inner),
                           tiles=tuple(sorted((*schedule.tiles, (mk.k, tile)))),
                           parallel=(k_tile, *schedule.parallel), private_sums=True))
    return out


def outer_tilings(model: PolyModel, schedule: Schedule) -> list[Schedule]:
    """Variants of a microkernel schedule that tile one loop outside the call which A (the
    operand along m) does not depend on, such as a convolution's output-channel blocks: its
    tile loop stays in place and its point loop moves in, next to the call, so that a block of
    B (the weights) stays in cache across the loops in between. (Tiling the loops B does not
    index instead measured slower.)"""
    call = call_of(model, schedule)
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


def k_tilings(model: PolyModel, target: CpuTarget, schedule: Schedule) -> list[Schedule]:
    """A GEMM call over all of a long k with k tiled right outside the call instead, each
    call's micro-panels of B (k tile x nr) an eighth of L2, read again by every register tile
    of the call from there rather than from L3 or memory. The parallel loops left to the
    model. see decisions: GEMM calls over a long k tiled in k"""
    mk = schedule.microkernel
    if mk is None or mk.batch or mk.k in schedule.tile_sizes:
        return []
    if gemm_operands(model, mk) is None:
        return []
    row_bytes = panel_row_bytes(model, target, mk, schedule)
    k_ext = loop_extent(model, mk.k)
    if k_ext * row_bytes <= target.l2_bytes // 2:
        return []
    per = max(K_TILE, target.l2_bytes // 8 // row_bytes // K_TILE * K_TILE)
    k_tile = math.ceil(k_ext / math.ceil(k_ext / per))
    return [replace(call_loop_tiled(schedule, mk.k, k_tile), parallel=())]


# A call reading fewer flops per byte of A than this re-reads A from L2 for every block when
# A outgrows half of L1 (1 x 1 convolutions: 8; 3 x 3 ones: ~22, A's window reused in the call).
# see decisions: Calls over several output-channel blocks
BLOCKS_A_INTENSITY = 16.0


def block_variants(model: PolyModel, schedule: Schedule, target: CpuTarget,
                   gated: bool = True) -> list[Schedule]:
    """Variants of a microkernel schedule whose call also runs a loop along which C and B
    move and A does not (a convolution's output-channel blocks): the loop right outside the
    call where it is a point loop already (see `outer_tilings`), or any such loop tiled by 2
    or 4 with its point loop moved into the call. One load of A then feeds a vector of each
    block. Offered where one block's call is short of that: its register tile is
    latency-bound while A serves many flops within the call, or it reads A, larger than half
    of L1, again for every block at few flops per byte, or its register tile is one vector
    wide (`_one_vector`); elsewhere more blocks only crowd L1. `gated=False` (the tuner's
    search space) offers them wherever a call can run over blocks, so that measuring can find
    what these rules leave out.
    see decisions: Calls over several output-channel blocks"""
    call = call_of(model, schedule)
    if call is None or call.mk.blocks or call.mk.pack_a or call.mk.pack_b:
        return []
    mk, s, c, a, b = call.mk, call.statement, call.c, call.a, call.b
    if not native_blocks(model, mk) or trip_count(model, schedule, mk.n) % accumulator_lanes(model, target, mk):
        return []  # no register tile over blocks: whole vectors of float accumulators only
    a_bytes = call_bytes(model, schedule, s, a)
    flops = 2 * count_points(call_cells(model, schedule, s))
    reused = flops >= BLOCKS_A_INTENSITY * a_bytes  # A's cells serve many flops within a call
    if gated and not ((reused and _latency_bound(model, target, schedule))
                      or (not reused and a_bytes > target.l1_bytes // 2)
                      or _one_vector(model, target, schedule)):
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


def window_calls(model: PolyModel, schedule: Schedule, target: CpuTarget) -> list[Schedule]:
    """Variants of a batch-reduce call whose B (the weights) outgrows half of L1 and so
    streams from L2 at every call, reused only by the call's rows: the outermost batch loop
    (a convolution's input-channel blocks) tiled, its tile loop right outside the loops along
    which A moves and B does not (the output rows), so that each call reduces one tile
    (a 3 x 3 window of one block) and its B stays in L1 across the rows, the partial sums in
    C (oneDNN's input-channel blocking for L2). Tiles of 1, 2 and 4 whose B fits half of L1.
    see decisions: Window calls over input-channel tiles"""
    call = call_of(model, schedule)
    if (call is None or not call.mk.batch or call.mk.pack_a or call.mk.pack_b
            or call.mk.batch[0] in schedule.tile_sizes):
        return []
    s, c, a, b, outer, inner = call.statement, call.c, call.a, call.b, call.outer, call.inner
    if call_bytes(model, schedule, s, b) <= target.l1_bytes // 2:
        return []
    var = call.mk.batch[0]
    at, sums = len(outer), call_bytes(model, schedule, s, c)
    while at:  # out past the rows while their partial sums stay in L1 beside B
        loop = outer[at - 1]
        if (element_stride(model, a, loop_var(loop)) in (0, None)
                or element_stride(model, b, loop_var(loop)) != 0):
            break
        sums *= trip_count(model, schedule, loop)
        if sums > target.l1_bytes // 4:
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
        if size == 1 or call_bytes(model, variant, s, b) <= target.l1_bytes // 2:
            out.append(variant)
    return out


# Of the L2, the share one call's B (the weights) may take when its batch is tiled for it.
BATCH_TILE_B_SHARE = 8
# `BATCH_TILE_MAX_WAYS` (register_blocking): the most ways of an L1 whose calls get their batch
# tiled; on more the register tile pays for A's misses instead
# (`register_blocking.A_LINE_MISS_CYCLES`). A call's rows must span more register tiles than
# BATCH_TILE_MIN_ROW_TILES for its B to be worth a smaller batch.
# see decisions: Batch tiles where a call overflows L1's sets or L2
BATCH_TILE_MIN_ROW_TILES = 2


def batch_tiled_call(model: PolyModel, target: CpuTarget, schedule: Schedule) -> Schedule:
    """`schedule` with its call's outermost batch loop (a 1 x 1 convolution's input-channel
    blocks, or a backward-data layer's output-channel blocks) tiled right outside the call
    where one call over all of it overflows the caches in ways the model, which stops at the
    call, does not see; else `schedule` itself. Each register tile of the call reads its rows
    of A over the whole batch again for every vector strip of B, and reads all of B once per
    row tile:
    - A's blocks a multiple of 4 KiB apart put a row's lines of every block into one L1 set;
      more blocks than its ways evict each other between strips;
    - a B larger than an eighth of L2 streams from beyond it for each row tile; not where the
      call has few row tiles to read it.
    Only where the batch is that one loop and the call reads each cell of A once per strip
    (not a window's call, whose taps overlap).
    see decisions: Batch tiles where a call overflows L1's sets or L2"""
    call = call_of(model, schedule)
    if (call is None or not call.mk.batch or call.mk.pack_a or call.mk.pack_b
            or l1_ways(target.l1_bytes) > BATCH_TILE_MAX_WAYS):
        return schedule
    mk, s = call.mk, call.statement
    var = mk.batch[0]
    stride = element_stride(model, call.a, var)
    if (var in schedule.tile_sizes or not native_blocks(model, mk) or not stride
            or any(trip_count(model, schedule, v) > 1 for v in mk.batch[1:])):
        return schedule
    a_reads = math.prod(trip_count(model, schedule, v) for v in (mk.m, mk.k, *mk.batch))
    if call_bytes(model, schedule, s, call.a) < a_reads * element_bytes(model, call.a):
        return schedule  # the call reads cells of A again across its batch: a window
    extent = loop_extent(model, var)
    stride_bytes = abs(stride) * element_bytes(model, call.a)
    ways = l1_ways(target.l1_bytes)
    b_block = call_bytes(model, schedule, s, call.b) // extent
    b_budget = max(target.l2_bytes // BATCH_TILE_B_SHARE, b_block)
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


def _latency_bound(model: PolyModel, target: CpuTarget, schedule: Schedule) -> bool:
    """Whether one call's register tile has fewer accumulators than FMAs in flight."""
    mk = schedule.microkernel
    assert mk is not None
    unit = unit_for(target.isa)
    rows = trip_count(model, schedule, mk.m)
    vectors = math.ceil(trip_count(model, schedule, mk.n) / accumulator_lanes(model, target, mk))
    return rows * min(vectors, micro_vectors(target)) < unit.fma_ports * unit.fma_latency


def _one_vector(model: PolyModel, target: CpuTarget, schedule: Schedule) -> bool:
    """Whether one call's register tile is one vector wide over a reduction of at least a
    vector's lanes: each FMA then takes a load of its own (a broadcast of A) beside the
    vector of B, and the loads, not the FMAs, set the pace (AVX-512's 16-lane blocks)."""
    mk = schedule.microkernel
    assert mk is not None
    lanes = accumulator_lanes(model, target, mk)
    return (math.ceil(trip_count(model, schedule, mk.n) / lanes) == 1
            and trip_count(model, schedule, mk.k) >= lanes)


