"""Where a GPU GEMM tile is chosen: the candidate tiles of each kernel variant, their score,
the ranking.

Takes a `GemmPlan` (its loops found by `schedules.gpu.planning`) and a `GpuTarget`; returns
the plan with its tile (`choose_tiling`). The candidates are those of the best variant the
target and the operands allow (`_candidates`: TMA, wgmma over cp.async, warp-level MMA, FMA);
each that fits the target (shared memory, registers, threads, copies that divide) is scored by
multiply-adds per byte of its footprint (the cells of A and B one block's K step reads,
counted with isl), times the share of the work that is useful and of the target kept busy.
"""

from __future__ import annotations

import math
from dataclasses import replace

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.errors import ScheduleError
from polydl.poly.counting import count_points
from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.gpu.operands import contiguous_runs, mma_vector, tma_operands, wgmma_b_major
from polydl.schedules.gpu.plans import GemmDim, GemmPlan, TensorMap, TmaOperands, WindowMap
from polydl.schedules.gpu.variants import (
    FMA_TILE_REGISTERS,
    WARP_THREAD_TILE,
    FmaTiling,
    GemmTiling,
    MmaTiling,
    TmaTiling,
    WgmmaTiling,
)
from polydl.target.gpu import GpuTarget

# The FMA kernel's K step with warp tiles; grids too small to fill the target unsplit keep
# the 8 x 8 tiles (twice the warps a block), as do operands loaded element by element
# (see decisions: GPU FMA warp tiles).
FMA_BLOCK_K = 16
# Block tiles tried for a GEMM, largest first; thread tiles are 8x8 (FMA) or warp tiles of
# 16x16 fragments (MMA).
BLOCK_TILES = ((128, 128), (128, 64), (64, 128), (64, 64), (32, 64), (64, 32), (32, 32))
# Warpgroup-MMA block tiles (BM, BN, BK, stages); one warpgroup of 128 threads per 64 rows.
# N = 64 tiles for layers of 64 output channels (a convolution's K), where BN = 128 wastes half
# (see decisions: GPU tensor-core tiles).
WGMMA_TILES = ((256, 128, 64, 4), (128, 256, 64, 4), (128, 128, 64, 5), (64, 256, 64, 5), (64, 128, 64, 6),
               (256, 64, 64, 4), (128, 64, 64, 6))
# TMA-fed, warp-specialised persistent tiles (BM, BN, BK, stages): one producer warpgroup
# moves operand tiles with the tensor-memory accelerator, BM / 64 consumer warpgroups issue
# wgmma on them; 4 stages of 128x256 fill 192 KiB of shared memory.
TMA_TILES = ((128, 256, 64, 4), (128, 128, 64, 6), (64, 256, 64, 6), (64, 128, 64, 8), (128, 64, 64, 8))
# TMA tiles of one consumer warpgroup run two blocks a multiprocessor (half the registers and
# under half the shared memory each): while one block's consumers store a tile, the other's
# issue products. Where K is a few steps (a 1 x 1 layer of 64-256 channels) the store is as
# long as the products, and one block a multiprocessor leaves the tensor cores idle during it.
TMA_PAIRED_TILES = ((64, 128, 64, 4), (64, 64, 64, 6))
TF32_BLOCK_K = 32  # float32 operands: a 128-byte swizzled row is 32 elements
# Tensor-core block tiles (BM, BN, BK, warps along M, warps along N, shared-memory stages):
# the schedule picks by footprint, fit and occupancy (see decisions: GPU tensor-core tiles).
MMA_TILES = (
    (256, 128, 64, 4, 2, 3), (128, 256, 64, 2, 4, 4), (128, 128, 32, 2, 4, 4),
    (128, 64, 32, 2, 2, 4), (64, 128, 32, 2, 2, 4), (64, 64, 32, 2, 2, 4), (32, 64, 32, 1, 2, 4),
    (32, 32, 32, 1, 1, 4),
)
# Operands without 16-byte runs (an im2col gather of a convolution) go element by element
# through registers: K steps of 16 keep each thread's loads, and the row offsets it keeps, to
# 16 or fewer (see decisions: GPU MMA tiles of gathered operands).
MMA_SCALAR_TILES = (
    (128, 128, 16, 2, 4, 2), (128, 64, 16, 2, 2, 2), (64, 128, 16, 2, 2, 2), (64, 64, 16, 2, 2, 2),
    (32, 64, 16, 1, 2, 2), (32, 32, 16, 1, 1, 2),
)
# The warps per SM a grid should have (the tile choice favours grids that reach it) ...
WARPS_PER_SM = 8
# ... and those for which K is split over blocks (partial sums added atomically, four cells
# an atomic on Hopper). Half as many: every slice reads and adds into all of C
# (see decisions: GPU split-K occupancy).
SPLIT_WARPS_PER_SM = 4
MIN_K_TILES_PER_SPLIT = 8
# The TMA kernel's store of a tile (through shared memory, or pairs from registers) costs
# about this many K steps of products, which one block a multiprocessor waits for.
TMA_STORE_STEPS = 1.0
MAX_GRID_Z = 65535

Scored = tuple[float, GemmTiling, int, TmaOperands | None]


def _flat_constraint(dims: tuple[GemmDim, ...], limit: int) -> str:
    """`0 <= flat index of dims < limit`, the flat index taken relative to the lower bounds."""
    flat, stride = [], 1
    for d in reversed(dims):
        flat.append(f"{stride}*({d.var} - {d.lower})" if stride != 1 else f"({d.var} - {d.lower})")
        stride *= d.extent
    return f"0 <= {' + '.join(reversed(flat))} < {limit}"


def tile_footprint(s: StatementModel, plan: GemmPlan, bm: int, bn: int, bk: int) -> tuple[int, int]:
    """Distinct cells of A and of B that the first block tile's first K step reads (card())."""
    cons = [_flat_constraint(plan.m, bm), _flat_constraint(plan.n, bn), _flat_constraint(plan.k, bk)]
    cons += [f"{d.var} = {d.lower}" for d in plan.batch]
    space = f"{s.name}[{', '.join(s.iterators)}]"
    tile = isl.Set(f"{{ {space} : {' and '.join(cons)} }}").intersect(s.domain)
    counts = []
    for access in (plan.a, plan.b):
        relation = next(am.relation for am in s.accesses if am.access is access)
        counts.append(count_points(relation.intersect_domain(tile).range()))
    return counts[0], counts[1]


def _candidates(plan: GemmPlan, target: GpuTarget, shape_a: tuple[int, ...]) -> list[GemmTiling]:
    tma_tiles = [(*tile, 1) for tile in TMA_TILES] + [(*tile, 2) for tile in TMA_PAIRED_TILES]
    if target.tensor_memory_accelerator and plan.dtype_ab == "bfloat16" and tma_operands(plan, shape_a=shape_a):
        return [TmaTiling(bm, bn, bk, stages=st, blocks_per_sm=pair) for bm, bn, bk, st, pair in tma_tiles]
    if (target.tensor_memory_accelerator and target.allow_tf32 and plan.dtype_ab == "float32"
            and tma_operands(plan, block_k=TF32_BLOCK_K, shape_a=shape_a)):
        # the same tiles with 128-byte rows of 32 floats: K steps of 32
        return [TmaTiling(bm, bn, TF32_BLOCK_K, stages=st, operand_bytes=4, blocks_per_sm=pair)
                for bm, bn, _, st, pair in tma_tiles]
    if target.warpgroup_mma and plan.dtype_ab == "bfloat16" and wgmma_b_major(plan):
        return [WgmmaTiling(bm, bn, bk, stages=st) for bm, bn, bk, st in WGMMA_TILES]
    if target.tensor_cores and plan.dtype_ab == "bfloat16":
        return [MmaTiling(bm, bn, bk, warps_m=wm, warps_n=wn, stages=st)
                for bm, bn, bk, wm, wn, st in (MMA_TILES if mma_vector(plan) else MMA_SCALAR_TILES)]
    # both operands move in float4s (A along K or M, B along N or K: `codegen.gpu.gemm.fma_vectors`)
    # and C's rows run along N: a warp's lanes span columns, so its stores stay coalesced
    # (see decisions: GPU FMA tiles for C along N)
    vector = (plan.dtype_ab == "float32"
              and any(contiguous_runs(plan, "a", axis, 4) for axis in ("k", "m"))
              and any(contiguous_runs(plan, "b", axis, 4) for axis in ("n", "k"))
              and contiguous_runs(plan, "c", "n", 4))
    # warp tiles first: where the grid fills the target either way, the choice keeps them.
    # K steps of 16 where a thread copies at most 8 float4s of the two operands a step, else
    # 8: a 64 x 128 tile's 64 threads copying 12 spilled 316 bytes beside the 128 accumulators
    warp: list[GemmTiling] = []
    for bm, bn in BLOCK_TILES:
        if vector and bm % 64 == 0 and bn % 64 == 0:
            threads = bm // WARP_THREAD_TILE[0] * (bn // WARP_THREAD_TILE[1])
            bk = FMA_BLOCK_K if (bm + bn) * FMA_BLOCK_K // (4 * threads) <= 8 else 8
            warp.append(FmaTiling(bm, bn, bk, thread_m=WARP_THREAD_TILE[0], thread_n=WARP_THREAD_TILE[1]))
    plain: list[GemmTiling] = []
    for bm, bn in BLOCK_TILES:
        tiling = FmaTiling(bm, bn, 8)
        if target.kind == "cuda" and tiling.threads * FMA_TILE_REGISTERS * 2 == target.registers_per_multiprocessor:
            # two blocks a multiprocessor only at 128 registers a thread: asked of ptxas first,
            # as ptxas chose otherwise (see decisions: GPU FMA tiles held to two blocks)
            plain.append(replace(tiling, blocks_per_sm=2))
        plain.append(tiling)
    return warp + plain


def _splits(t: GemmTiling, tiles: int, size_k: int, dtype_c: str, target: GpuTarget) -> int:
    """K slices per output tile: enough warps in flight, each slice still a long K loop.
    Slices add into C with atomics, so only float32 outputs are split."""
    if dtype_c != "float32" or isinstance(t, TmaTiling):  # persistent blocks walk every tile
        return 1
    k_tiles = math.ceil(size_k / t.block_k)
    want = target.multiprocessors * SPLIT_WARPS_PER_SM
    splits = 1
    while (tiles * splits * t.threads // 32 < want
           and k_tiles // (splits * 2) >= MIN_K_TILES_PER_SPLIT):
        splits *= 2
    return splits


def _with_splits(t: GemmTiling, splits: int) -> GemmTiling:
    if isinstance(t, FmaTiling | MmaTiling | WgmmaTiling):
        return replace(t, splits=splits)
    assert splits == 1, "a persistent tile takes no K split"
    return t


def scored_tilings(model: PolyModel, s: StatementModel, plan: GemmPlan, target: GpuTarget) -> list[Scored]:
    """Every candidate tile of `plan` that fits `target`, in candidate order, with its score
    (multiply-adds per byte of footprint, times the fraction of the work that is useful and
    of the target kept busy), its footprint in bytes and its TMA views."""
    size_m, size_n, size_k = plan.size(plan.m), plan.size(plan.n), plan.size(plan.k)
    batch = plan.size(plan.batch)
    element = DTYPES[plan.dtype_ab].bytes
    scored: list[Scored] = []
    shape_a = model.nest.array(plan.a.array).concrete_shape(model.params)
    for tiling in _candidates(plan, target, shape_a):
        bm, bn, bk = tiling.block_m, tiling.block_n, tiling.block_k
        # dynamic shared memory is opted in above the default; static stays within it
        limit = target.shared_memory_optin_bytes if tiling.dynamic_shared_memory else target.shared_memory_bytes
        if tiling.shared_bytes > limit or not tiling.blocks_fit(target):
            continue
        if tiling.registers > target.registers_per_thread * 3 // 4:
            continue
        if tiling.threads > target.max_threads_per_block or tiling.threads < target.warp_size:
            continue
        if not tiling.loads_divide():
            continue
        tiles = math.ceil(size_m / bm) * math.ceil(size_n / bn) * batch
        splits = _splits(tiling, tiles, size_k, plan.dtype_c, target)
        if (isinstance(tiling, FmaTiling) and tiling.warp_tiles
                and (splits > 1 or tiles < 2 * target.multiprocessors)):
            # fewer than two blocks a multiprocessor: the 8 x 8 tiles' twice as many warps a
            # block (see decisions: GPU FMA warp tiles)
            continue
        if tiles * splits > MAX_GRID_Z * 65535:
            continue
        tiling = _with_splits(tiling, splits)
        useful = size_m * size_n / (math.ceil(size_m / bm) * bm * math.ceil(size_n / bn) * bn)
        blocks = tiles * splits
        operands = None
        if isinstance(tiling, TmaTiling):  # persistent: the last wave's idle multiprocessors are waste
            operands = tma_operands(plan, bm, bn, bk, shape_a)
            if operands is None:
                continue
            if isinstance(operands.a, WindowMap):  # a 2-D tile of output positions
                useful = operands.a.useful(plan) * size_n / (math.ceil(size_n / bn) * bn)
                blocks = math.prod(operands.a.tile_counts(plan).values()) * math.ceil(size_n / bn)
            slots = target.multiprocessors * tiling.blocks_per_sm
            useful *= blocks / (math.ceil(blocks / slots) * slots)
            if tiling.blocks_per_sm == 1:  # the tile's store does not overlap products
                steps = math.ceil(size_k / bk)
                useful *= steps / (steps + TMA_STORE_STEPS)
        fill = min(1.0, blocks / target.multiprocessors)
        warps = min(1.0, blocks * tiling.threads / 32 / (target.multiprocessors * WARPS_PER_SM))
        cells_a, cells_b = tile_footprint(s, plan, bm, bn, bk)
        footprint = (cells_a + cells_b) * element
        moved = footprint
        if operands is not None and isinstance(operands.a, TensorMap):
            # an operand that is one tile along its own dimension (a 1 x 1 layer's weights
            # where the layer has at most BM output channels) comes from memory once, its
            # re-reads by the other operand's tiles from the L2: only the other's tile moves.
            # Not for windows (see decisions: GPU operands read once from the L2).
            a_once, b_once = (size <= block and size * size_k * element <= target.l2_resident_bytes
                              for size, block in ((size_m, bm), (size_n, bn)))
            if a_once != b_once:
                moved = (cells_b if a_once else cells_a) * element
        # the footprint counts cells that exist (isl clamps the tile to the domain): so does
        # the work it feeds; what a tile larger than the GEMM wastes is in `useful`
        intensity = min(bm, size_m) * min(bn, size_n) * min(bk, size_k) / max(moved, 1)
        scored.append((intensity * useful * fill * (0.5 + 0.5 * warps), tiling, footprint, operands))
    return scored


def ranked_tilings(model: PolyModel, s: StatementModel, plan: GemmPlan, target: GpuTarget) -> list[Scored]:
    """`scored_tilings` best first; of near-equal scores the earlier candidate first."""
    left = scored_tilings(model, s, plan, target)
    ranked = []
    while left:
        best = 0
        for i, candidate in enumerate(left):
            if candidate[0] > left[best][0] * 1.0001:
                best = i
        ranked.append(left.pop(best))
    return ranked


def choose_tiling(
    model: PolyModel, s: StatementModel, plan: GemmPlan, target: GpuTarget, rank: int = 0
) -> GemmPlan:
    """The block tile with the best score (`scored_tilings`): the most multiply-adds per byte
    of footprint that fits the shared memory, keeps its register tile within the register
    file, wastes little on ragged edges and keeps every multiprocessor busy (splitting K where
    the output alone is too small); the first of near-equal scores. `rank` > 0 takes the
    tile that many places down the ranking (a timed alternative: `driver.gpu_checks`)."""
    ranked = ranked_tilings(model, s, plan, target)
    if not ranked:
        raise ScheduleError(f"no GEMM tile of {s.name} fits the shared memory of {target.name}")
    _, tiling, footprint, tma = ranked[min(rank, len(ranked) - 1)]
    return replace(plan, tiling=tiling, footprint_bytes=footprint, tma=tma)
