"""The GPU schedule: which loops become the grid and the block, and how a GEMM is tiled.

Takes a `PolyModel` and a `GpuTarget`; returns a `GpuSchedule` with one `GpuKernelPlan` per
statement, launched in source order (one stream, so each launch sees the previous one's
writes). Distributing the statements of one loop nest into separate launches is legal only if no
dependence runs from a later statement back to an earlier one; otherwise `ScheduleError`.

Inside one statement, the threads run the loops of a set P that no dependence crosses: every
dependence between two instances has equal values on all loops of P (checked with isl on the
memory-based dependences). The other loops stay sequential in each thread, in their original
order, so reductions are sequential per thread. A statement `C += A * B` that has a GEMM
binding (`schedules.microkernel`) instead becomes a block-tiled implicit GEMM: the loops that
index C and A are M, C and B are N, the reduction loops are K, the loops that index all three
are the batch. Its block tile (shared memory) and thread/warp tile (registers) are chosen from
the footprint of one tile step, counted with isl (`card()` of the accessed cells), against the
device's shared-memory and register capacities.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.errors import ScheduleError
from polydl.ir import (
    Access,
    Guard,
    Loop,
    Statement,
    eval_int,
    expr_loads,
    int_vars,
    walk_statements,
)
from polydl.poly.counting import count_points
from polydl.poly.dependences import dependences_of
from polydl.poly.isl_parts import maps_of
from polydl.poly.model import PolyModel, StatementModel, build_model
from polydl.schedules.gpu.epilogues import GemmEpilogue, with_epilogues
from polydl.schedules.gpu.staging import stage_channels_last
from polydl.schedules.gpu.windows import WindowMap, read_through_copies, window_map
from polydl.schedules.gpu.winograd import winograd_convolutions
from polydl.schedules.microkernel import (
    _only_accumulation,
    candidate_bindings,
    multiply_accumulate,
)
from polydl.schedules.strides import element_stride
from polydl.target.gpu import GpuTarget

ELEMENT_BYTES = {name: d.bytes for name, d in DTYPES.items()}
THREADS_PER_BLOCK = 256
# The FMA kernel's K step and warp tiles, measured on an H200 (fp32 4096^3 against cuBLAS in one
# process): 128 x 128 blocks of 128 threads, 16 x 8 outputs a thread in 64 x 64 warp tiles,
# K steps of 16: 0.93-0.95 of cuBLAS (46.8 TFLOP/s); the former 256 threads of 8 x 8 in K steps of
# 8: 0.81; 8 x 16 a thread 0.83-0.87; 8 x 8 in warp tiles of 32 x 64 with 256 threads 0.66. They
# take operands that load as float4s; with half the warps of the 8 x 8 tiles a block, grids too
# small to fill the device unsplit keep the 8 x 8 tiles (`choose_tiling`), as do operands loaded
# element by element (a convolution's gathered windows: 16 loads a thread spilled registers).
FMA_BLOCK_K = 16
WARP_THREAD_TILE = (16, 8)
# Block tiles tried for a GEMM, largest first; thread tiles are 8x8 (FMA) or warp tiles of
# 16x16 fragments (MMA).
BLOCK_TILES = ((128, 128), (128, 64), (64, 128), (64, 64), (32, 64), (64, 32), (32, 32))
# Tensor-core block tiles (BM, BN, BK, warps along M, warps along N, shared-memory stages).
# Measured on an H100 (benchmarks/gpu_tiles.py): the 64-deep K steps and the 3-4 stage rings
# ran best; the schedule still picks by footprint, fit and occupancy.
# Warpgroup-MMA block tiles (BM, BN, BK, stages); one warpgroup of 128 threads per 64 rows.
# Measured on an H100 (4096^3): 256x128 (4 warpgroups) 380 TFLOP/s, 128x256 348, 128x128 325.
# N = 64 tiles for layers of 64 output channels (a convolution's K), where BN = 128 wastes half.
WGMMA_TILES = ((256, 128, 64, 4), (128, 256, 64, 4), (128, 128, 64, 5), (64, 256, 64, 5), (64, 128, 64, 6),
               (256, 64, 64, 4), (128, 64, 64, 6))
# Descriptor byte offsets (leading, strided dimension) of the swizzled wgmma operands with
# BK = 64: A K-major (8-row groups 1024 bytes apart), B N-major (64-wide n blocks BK * 128
# bytes apart, 8-row k groups 1024 bytes apart).
WGMMA_STRIDES = {"a": (16, 1024), "b": (8192, 1024)}
# TMA-fed, warp-specialised persistent tiles (BM, BN, BK, stages): one producer warpgroup
# moves operand tiles with the tensor-memory accelerator, BM / 64 consumer warpgroups issue
# wgmma on them; 4 stages of 128x256 fill 192 KiB of shared memory.
TMA_TILES = ((128, 256, 64, 4), (128, 128, 64, 6), (64, 256, 64, 6), (64, 128, 64, 8), (128, 64, 64, 8))
# TMA tiles of one consumer warpgroup run two blocks a multiprocessor (half the registers and
# under half the shared memory each): while one block's consumers store a tile, the other's
# issue products. Where K is a few steps (a 1 x 1 layer of 64-256 channels) the store is as
# long as the products, and one block a multiprocessor leaves the tensor cores idle during it.
TMA_PAIRED_TILES = ((64, 128, 64, 4), (64, 64, 64, 6))
TMA_MAX_RANK = 5
TF32_BLOCK_K = 32  # float32 operands: a 128-byte swizzled row is 32 elements
MMA_TILES = (
    (256, 128, 64, 4, 2, 3), (128, 256, 64, 2, 4, 4), (128, 128, 32, 2, 4, 4),
    (128, 64, 32, 2, 2, 4), (64, 128, 32, 2, 2, 4), (64, 64, 32, 2, 2, 4), (32, 64, 32, 1, 2, 4),
    (32, 32, 32, 1, 1, 4),
)
# Operands without 16-byte runs (an im2col gather of a convolution) go element by element
# through registers: K steps of 16 keep each thread's loads, and the row offsets it keeps, to
# 16 or fewer (BK = 64 tiles took 64 + 32 loads a thread and spilled: 3 TFLOP/s on a 3x3
# layer where these reach the FMA kernel's load rate with tensor-core arithmetic).
MMA_SCALAR_TILES = (
    (128, 128, 16, 2, 4, 2), (128, 64, 16, 2, 2, 2), (64, 128, 16, 2, 2, 2), (64, 64, 16, 2, 2, 2),
    (32, 64, 16, 1, 2, 2), (32, 32, 16, 1, 1, 2),
)
# The warps per SM a grid should have (the tile choice favours grids that reach it) ...
WARPS_PER_SM = 8
# ... and those for which K is split over blocks (partial sums added atomically, four cells
# an atomic on Hopper). Half as many: every slice reads and adds into all of C, and on an
# H100 splitting to 8 left 30 fp32 ResNet-50 layers (N=2 and 32) 1.06x slower (geomean) than
# splitting to 4, up to 1.6x where a 98-tile grid was split in two.
SPLIT_WARPS_PER_SM = 4
MIN_K_TILES_PER_SPLIT = 8
# The TMA kernel's store of a tile (through shared memory, or pairs from registers) costs
# about this many K steps of products, which one block a multiprocessor waits for.
TMA_STORE_STEPS = 1.0
# An operand this small stays in the L2 between the tiles that read it (Hopper's holds 50 MB).
L2_RESIDENT_BYTES = 8 << 20
MAX_GRID_Z = 65535
FMA_TILE_REGISTERS = 128  # an 8 x 8 FMA tile's registers a thread, operand offsets and copies included
REGISTER_FILE = 65536  # 32-bit registers of a multiprocessor (every CUDA architecture since sm_50)


@dataclass(frozen=True)
class ThreadLoop:
    """A loop whose iterations run on separate threads: `var = lower + step * index`."""

    var: str
    lower: int
    extent: int
    step: int


@dataclass(frozen=True)
class GemmDim:
    """One loop of an implicit GEMM, relative to its lower bound; strides in elements."""

    var: str
    lower: int
    extent: int
    stride_a: int
    stride_b: int
    stride_c: int

    def stride(self, operand: str) -> int:
        """The element stride in operand "a", "b" or "c"."""
        return {"a": self.stride_a, "b": self.stride_b, "c": self.stride_c}[operand]


@dataclass(frozen=True)
class GemmTiling:
    # "tma" (TMA-fed warp-specialised wgmma) | "wgmma" (warpgroup MMA over cp.async) |
    # "mma" (warp-level fragments) | "fma" (register tile)
    kind: str
    block_m: int
    block_n: int
    block_k: int
    warps_m: int = 1  # mma: warps along M and N
    warps_n: int = 1
    thread_m: int = 8  # fma: outputs per thread along M and N
    thread_n: int = 8
    splits: int = 1  # blocks sharing one output tile, each over a slice of K
    stages: int = 2  # shared-memory buffers in flight
    operand_bytes: int = 2  # tma: 2 (bf16) or 4 (float32 read as TF32)
    # tma: blocks resident on a multiprocessor at once (1 or 2); fma: blocks the kernel's
    # registers are held to (`__launch_bounds__`), 1: as ptxas chooses
    blocks_per_sm: int = 1

    @property
    def shared_bytes(self) -> int:
        if self.kind == "tma":  # operand stages, two mbarriers per stage, 1 KiB for alignment,
            # and a 64 x 32 float staging tile (rows padded to 36) per consumer warpgroup
            return (self.stages * ((self.block_m + self.block_n) * self.block_k * self.operand_bytes + 16) + 1024
                    + 16 + self.block_m // 64 * 64 * 36 * 4)
        if self.kind == "wgmma":
            return self.stages * (self.block_m + self.block_n) * self.block_k * 2
        if self.kind == "mma":  # rows padded by 8 elements along K, M or N, as the operand runs
            m, n, k = self.block_m, self.block_n, self.block_k
            return self.stages * (max(m * (k + 8), k * (m + 8)) + max(k * (n + 8), n * (k + 8))) * 2
        return 2 * self.block_k * (self.block_m + self.block_n + 8) * 4

    @property
    def threads(self) -> int:
        if self.kind == "tma":  # a producer warpgroup and one consumer per 64 rows
            return 128 * (1 + self.block_m // 64)
        if self.kind == "wgmma":
            return 128 * (self.block_m // 64)
        if self.kind == "mma":
            return 32 * self.warps_m * self.warps_n
        return (self.block_m // self.thread_m) * (self.block_n // self.thread_n)


@dataclass(frozen=True)
class TensorMap:
    """A TMA view of one operand: extents and byte strides innermost first (the first dimension
    is contiguous), the box one copy moves, and where the GEMM's indices enter: the tile
    coordinate of each dimension is "k", "m", "n" or a batch loop's name."""

    extents: tuple[int, ...]
    strides: tuple[int, ...]  # bytes, of dimensions 1.. (dimension 0 is contiguous)
    box: tuple[int, ...]
    roles: tuple[str, ...]

    @property
    def rank(self) -> int:
        return len(self.extents)

    @property
    def element_strides(self) -> tuple[int, ...]:
        return (1,) * len(self.extents)


@dataclass(frozen=True)
class TmaOperands:
    a: TensorMap | WindowMap  # K-major: (k, m, batch...), or a window over A's array
    b: TensorMap  # N-major (n, k, batch...) or K-major (k, n, batch...)
    b_major: str  # "n" | "k"


@dataclass(frozen=True, eq=False)
class GemmPlan:
    c: Access
    a: Access
    b: Access
    m: tuple[GemmDim, ...]
    n: tuple[GemmDim, ...]
    k: tuple[GemmDim, ...]
    batch: tuple[GemmDim, ...]
    base_a: int
    base_b: int
    base_c: int
    dtype_ab: str
    dtype_c: str
    tiling: GemmTiling
    footprint_bytes: int  # A and B cells one block's K step reads (isl count)
    tma: TmaOperands | None = None  # set when the tiling is "tma"
    epilogue: GemmEpilogue | None = None  # neighbouring statements applied in the kernel

    @property
    def copy_source(self) -> WindowMap | None:
        """The window when A is read from the source of a padded copy of it, not from A."""
        window = self.tma.a if self.tma is not None else None
        return window if isinstance(window, WindowMap) and window.source else None

    @staticmethod
    def size(dims: tuple[GemmDim, ...]) -> int:
        return math.prod(d.extent for d in dims)


@dataclass(frozen=True, eq=False)
class GpuKernelPlan:
    statement: StatementModel
    enclosing: tuple[Loop | Guard, ...]  # loops and guards around the statement, outermost first
    threads: tuple[ThreadLoop, ...]  # loops mapped to threads, outermost first
    block: int  # threads per block (generic kernels)
    register_accumulator: bool  # reduction into one target kept in a register
    gemm: GemmPlan | None = None
    # (u, v): a copy whose source runs along thread loop u and whose target runs along v,
    # moved through 32 x 32 shared-memory tiles (`transpose_loops`)
    transpose: tuple[str, str] | None = None
    # statements after `statement` that the same threads run, each under its own guards
    # (`sibling_groups`: the same loops, every one on threads, no dependence between threads)
    siblings: tuple[tuple[StatementModel, tuple[Loop | Guard, ...]], ...] = ()

    @property
    def name(self) -> str:
        return self.statement.name

    @property
    def sequential(self) -> tuple[str, ...]:
        mapped = {t.var for t in self.threads}
        return tuple(x.var for x in self.enclosing if isinstance(x, Loop) and x.var not in mapped)

    def describe(self) -> str:
        if self.gemm is not None:
            g, t = self.gemm, self.gemm.tiling
            dims = "; ".join(
                f"{label}=({', '.join(d.var for d in ds)})"
                for label, ds in (("batch", g.batch), ("m", g.m), ("n", g.n), ("k", g.k)) if ds
            )
            return (
                f"{self.name}: gemm[{t.kind}] {dims}; block tile {t.block_m}x{t.block_n}x{t.block_k}, "
                f"{t.threads} threads" + (f", K split {t.splits} ways" if t.splits > 1 else "")
                + (f", {t.blocks_per_sm} blocks a multiprocessor" if t.blocks_per_sm > 1 else "")
                + (", float32 operands as TF32" if t.operand_bytes == 4 else "")
                + (f"; {g.epilogue.describe()}" if g.epilogue is not None else "")
                + (f"; reads {w.source} through TMA boxes zero-filled at its edges "
                   f"({w.copy}, its padded copy, dropped)" if (w := g.copy_source) else "")
            )
        par = ", ".join(t.var for t in self.threads) or "none"
        seq = ", ".join(self.sequential) or "none"
        acc = " (register accumulator)" if self.register_accumulator else ""
        tiles = (f"; tiles of {self.transpose[0]} x {self.transpose[1]} through shared memory"
                 if self.transpose else "")
        name = self.name if not self.siblings else f"{self.name}-{self.siblings[-1][0].name}"
        return f"{name}: threads over ({par}); sequential ({seq}){acc}{tiles}"

    @property
    def statements(self) -> tuple[StatementModel, ...]:
        return (self.statement, *(s for s, _ in self.siblings))


@dataclass(frozen=True, eq=False)
class GpuSchedule:
    device: GpuTarget
    kernels: tuple[GpuKernelPlan, ...]
    notes: tuple[tuple[str, Any], ...] = field(default=())
    # the model the kernels were planned on where it is not the user's nest
    # (`gpu_staging`: windows read channels-last copies)
    model: PolyModel | None = None

    def describe(self) -> str:
        return f"gpu {self.device.name}: " + " | ".join(k.describe() for k in self.kernels)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device.to_dict(), "kernels": [k.describe() for k in self.kernels]}


@dataclass(frozen=True)
class StoredGpuSchedule:
    """A GPU schedule read back from the lowering cache: the plans themselves hold isl objects
    and stay behind; what a loaded kernel reports (its device and each launch's description)
    comes back."""

    device: GpuTarget
    kernels: tuple[str, ...]  # each launch's `describe()`

    def describe(self) -> str:
        return f"gpu {self.device.name}: " + " | ".join(self.kernels)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device.to_dict(), "kernels": list(self.kernels)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> StoredGpuSchedule:
        kernels = data["kernels"]
        if not isinstance(kernels, list) or not all(isinstance(k, str) for k in kernels):
            raise ValueError("kernels must be a list of descriptions")
        return StoredGpuSchedule(GpuTarget.from_dict(data["device"]), tuple(kernels))


# ----------------------------------------------------------------------------- legality


def _between(deps: isl.UnionMap, source: str, sink: str) -> list[isl.Map]:
    return [
        m for m in maps_of(deps)
        if m.get_tuple_name(isl.dim_type.in_) == source
        and m.get_tuple_name(isl.dim_type.out) == sink
    ]


def check_distribution(model: PolyModel) -> None:
    """Each statement becomes its own launch, in source order: no dependence may go backwards."""
    deps = dependences_of(model).all
    names = [s.name for s in model.statements]
    for i, early in enumerate(names):
        for late in names[i + 1:]:
            if any(not m.is_empty() for m in _between(deps, late, early)):
                raise ScheduleError(
                    f"the GPU target runs each statement as its own kernel, but {early} depends "
                    f"on a later instance of {late}: the loop nest cannot be distributed"
                )


def _agree(deps: list[isl.Map], pairs: list[tuple[int, int]]) -> bool:
    """True if every dependence joins instances equal on each (source dim, sink dim) pair:
    those on one thread when the pairs are the thread loops' positions."""
    for dep in deps:
        eq = isl.Map.universe(dep.get_space())
        for a, b in pairs:
            eq = eq.equate(isl.dim_type.in_, a, isl.dim_type.out, b)
        if not dep.is_subset(eq):
            return False
    return True


def thread_loops(
    model: PolyModel, s: StatementModel, enclosing: tuple[Loop | Guard, ...]
) -> tuple[ThreadLoop, ...]:
    """The largest outermost-first greedy set of loops with constant bounds that no dependence
    of `s` on itself crosses."""
    deps = _between(dependences_of(model).all, s.name, s.name)
    params = set(model.params)
    chosen: list[int] = []
    out: list[ThreadLoop] = []
    for d, loop in enumerate(s.loops):
        if not (int_vars(loop.lower) | int_vars(loop.upper)) <= params:
            continue  # bounds that move with another loop cannot be hoisted to the grid
        if not _agree(deps, [(c, c) for c in (*chosen, d)]):
            continue
        lo, hi = eval_int(loop.lower, model.params), eval_int(loop.upper, model.params)
        extent = max(0, -(-(hi - lo) // loop.step))
        chosen.append(d)
        out.append(ThreadLoop(loop.var, lo, extent, loop.step))
    return tuple(out)


def _last_var(acc: Access) -> str | None:
    """The one loop variable of an access's last subscript (`iw`, `iw + 1`), if it has one."""
    if not acc.indices:
        return None
    names = int_vars(acc.indices[-1])
    return next(iter(names)) if len(names) == 1 else None


def transpose_loops(
    model: PolyModel, stmt: Statement, enclosing: tuple[Loop | Guard, ...], threads: tuple[ThreadLoop, ...]
) -> tuple[str, str] | None:
    """(u, v) where `stmt` is an assignment of float32/bf16 values (computed in float) whose
    every loop runs on threads, its first load running along loop u in memory and its target
    along another loop v (a copy into another layout: NCHW into channels-last). One thread a
    cell reads coalesced and writes a cell per C elements, or the reverse; tiles of u x v
    through shared memory do both in runs."""
    if stmt.op != "=" or any(isinstance(x, Guard) for x in enclosing):
        return None
    if any(a.dtype not in ("float32", "bfloat16") and not DTYPES[a.dtype].is_integer for a in model.nest.arrays):
        return None  # a double compute type: tiles of float would round
    loads = expr_loads(stmt.value)
    if not loads or any(model.nest.array(a.array).dtype not in ("float32", "bfloat16")
                        for a in (stmt.target, *loads)):
        return None
    mapped = {t.var for t in threads}
    if any(isinstance(x, Loop) and x.var not in mapped for x in enclosing):
        return None
    u, v = _last_var(loads[0]), _last_var(stmt.target)
    if u is None or v is None or u == v or not {u, v} <= mapped:
        return None
    # tiles even for runs much shorter than 32 (a 7 x 7 image's rows, 3 x 3 taps): a thread
    # a cell took ResNet-50's 14 x 14 layers (bf16 NCHW, N=32) 1.3-2x as long
    return u, v


def _register_accumulator(
    s: StatementModel, enclosing: tuple[Loop | Guard, ...], threads: tuple[ThreadLoop, ...]
) -> bool:
    """A `+=`/`-=` whose target moves with no sequential loop, read nowhere else, unguarded."""
    stmt = s.statement
    if stmt.op not in ("+=", "-=") or any(isinstance(x, Guard) for x in enclosing):
        return False
    mapped = {t.var for t in threads}
    sequential = {x.var for x in enclosing if isinstance(x, Loop)} - mapped
    if not sequential:
        return False
    target_vars: set[str] = set()
    for index in stmt.target.indices:
        target_vars |= int_vars(index)
    if target_vars & sequential:
        return False
    return all(acc.array != stmt.target.array for acc in stmt.reads[1:])


# ----------------------------------------------------------------------------- GEMM


def _flat_offset(model: PolyModel, access: Access, env: dict[str, int]) -> int:
    shape = model.nest.array(access.array).concrete_shape(model.params)
    offset = 0
    for extent, index in zip(shape, access.indices, strict=True):
        offset = offset * extent + eval_int(index, env)
    return offset


def _gemm_dims(
    model: PolyModel, s: StatementModel, device: GpuTarget, rank: int = 0
) -> GemmPlan | None:
    if not candidate_bindings(model, s, s.iterators):
        return None
    if not _only_accumulation(s, s.iterators):
        return None
    mac = multiply_accumulate(s)
    assert mac is not None
    c, x, y = mac
    dtypes = {acc.array: model.nest.array(acc.array).dtype for acc in (c, x, y)}
    if dtypes[x.array] != dtypes[y.array] or dtypes[x.array] not in ("float32", "bfloat16"):
        return None
    if dtypes[c.array] not in ("float32", "bfloat16"):
        return None
    lows = {v: s.domain.dim_min_val(d).to_python() for d, v in enumerate(s.iterators)}
    highs = {v: s.domain.dim_max_val(d).to_python() for d, v in enumerate(s.iterators)}
    strides: dict[str, tuple[int, int, int]] = {}
    for v in s.iterators:
        sx, sy, sc = (element_stride(model, acc, v) for acc in (x, y, c))
        if sx is None or sy is None or sc is None:
            return None
        strides[v] = (sx, sy, sc)
    # A is the load that moves with some C loop the other load ignores.
    a, b = x, y
    if not any(sc and sx and not sy for sx, sy, sc in strides.values()):
        a, b = y, x
    # The tensor-core kernels hold C's rows in pairs along N: where C runs along a loop of A
    # only (an NCHW output's positions), the operands trade places (C^T = B^T A^T), unless A
    # is a window there (a K loop moving along the same dimension: the TMA window kernel
    # reads A's windows, not B's)
    tensor_cores = device.tensor_cores and dtypes[x.array] == "bfloat16"
    moving = [v for v in s.iterators if highs[v] > lows[v]]
    along = [v for v in moving if strides[v][2] == 1]
    if tensor_cores and along:
        i = 0 if a is x else 1
        unit = strides[along[0]]
        taps = {v for v in moving if strides[v][2] == 0}
        window = any(along[0] in int_vars(e) and int_vars(e) & taps for e in a.indices)
        if unit[i] and not unit[1 - i] and not window:
            a, b = b, a
    groups: dict[str, list[GemmDim]] = {"m": [], "n": [], "k": [], "batch": []}
    for v in s.iterators:
        sx, sy, sc = strides[v]
        sa, sb = (sx, sy) if a is x else (sy, sx)
        extent = highs[v] - lows[v] + 1
        if extent == 1:
            continue
        dim = GemmDim(v, lows[v], extent, sa, sb, sc)
        if sc == 0:
            groups["k"].append(dim)
        elif sa and not sb:
            groups["m"].append(dim)
        elif sb and not sa:
            groups["n"].append(dim)
        else:
            groups["batch"].append(dim)
    if tensor_cores and len(groups["n"]) > 1:
        # the outermost N loop where it does not continue the others in B (the images of
        # NCHW positions): a batch loop that A ignores, so B's N runs as one strided matrix
        outer, inner = groups["n"][0], groups["n"][1:]
        if outer.stride_b != inner[0].stride_b * math.prod(d.extent for d in inner):
            groups["n"], groups["batch"] = inner, [*groups["batch"], outer]
    if not groups["m"] or not groups["n"] or not groups["k"]:
        return None
    batch = math.prod(d.extent for d in groups["batch"])
    if batch > MAX_GRID_Z:
        return None
    dtype_ab = dtypes[x.array]
    plan = GemmPlan(
        c=c, a=a, b=b,
        m=tuple(groups["m"]), n=tuple(groups["n"]), k=tuple(groups["k"]),
        batch=tuple(groups["batch"]),
        base_a=_flat_offset(model, a, {**model.params, **lows}),
        base_b=_flat_offset(model, b, {**model.params, **lows}),
        base_c=_flat_offset(model, c, {**model.params, **lows}),
        dtype_ab=dtype_ab, dtype_c=dtypes[c.array],
        tiling=GemmTiling("fma", 0, 0, 0), footprint_bytes=0,
    )
    return choose_tiling(model, s, plan, device, rank)


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


def contiguous_runs(plan: GemmPlan, operand: str, along: str, vec: int) -> bool:
    """Whether `vec` consecutive flat indices of the `along` loops ("m", "n" or "k"), from a
    multiple of vec, are `vec` consecutive, vec-aligned elements of `operand` ("a", "b", "c"):
    the innermost of those loops has unit stride, it and the loops around it that continue it
    in memory span an extent that vec divides, and every other stride of the operand, and its
    base offset, are multiples of vec."""
    dims = getattr(plan, along)
    if not dims or dims[-1].stride(operand) != 1:
        return False
    # inner loops that continue one another in memory (a 7 x 7 image's rows) form one run
    run, extent = 1, dims[-1].extent
    while run < len(dims) and dims[-run - 1].stride(operand) == extent:
        extent *= dims[-run - 1].extent
        run += 1
    if extent % vec:
        return False
    inner = dims[len(dims) - run:]
    others = [d.stride(operand) for d in plan.m + plan.n + plan.k + plan.batch
              if not any(d is x for x in inner)]
    base = {"a": plan.base_a, "b": plan.base_b, "c": plan.base_c}[operand]
    return all(x % vec == 0 for x in [base, *others])


def wgmma_b_major(plan: GemmPlan, vec: int = 8) -> str | None:
    """How the wgmma kernel copies B in 16-byte runs: "n" (contiguous along N) or "k" (along K,
    as a channels-last convolution's weights); None where A is not contiguous along K or B
    along neither."""
    if not contiguous_runs(plan, "a", "k", vec):
        return None
    if contiguous_runs(plan, "b", "n", vec):
        return "n"
    if contiguous_runs(plan, "b", "k", vec):
        return "k"
    return None


def operand_modes(plan: GemmPlan) -> tuple[str, str]:
    """Along which index each operand is contiguous: A "m" or "k", B "k" or "n"."""
    a_mode = "m" if plan.m[-1].stride_a == 1 and plan.k[-1].stride_a != 1 else "k"
    b_mode = "k" if plan.k[-1].stride_b == 1 and plan.n[-1].stride_b != 1 else "n"
    return a_mode, b_mode


def mma_vectors(plan: GemmPlan) -> tuple[int, int]:
    """Elements per copy of A and of B in the warp-level MMA kernel: 8 (16-byte runs) where the
    operand runs in aligned eights along the index it runs in memory (`operand_modes`), else 1."""
    a_mode, b_mode = operand_modes(plan)
    return (8 if contiguous_runs(plan, "a", a_mode, 8) else 1,
            8 if contiguous_runs(plan, "b", b_mode, 8) else 1)


def mma_vector(plan: GemmPlan) -> bool:
    """The warp-level MMA kernel copies both operands in 16-byte runs."""
    return mma_vectors(plan) == (8, 8)


def operand_runs(dims: tuple[GemmDim, ...], operand: str) -> list[tuple[int, int]]:
    """(extent, element stride) of `dims` for one operand, outermost first, a loop merged into
    the one inside it where its stride is the inner one's run (both 0 where the operand ignores
    them): loops that continue one another in memory (an image's p and q) are one run."""
    runs: list[tuple[int, int]] = []
    for d in reversed(dims):
        stride = d.stride(operand)
        if runs and stride == runs[-1][1] * runs[-1][0]:
            runs[-1] = (runs[-1][0] * d.extent, runs[-1][1])
        else:
            runs.append((d.extent, stride))
    return list(reversed(runs))


def _collapsed(dims: tuple[GemmDim, ...], operand: str) -> tuple[int, int] | None:
    """(extent, element stride) of `dims` read as one dimension of the operand: each loop's
    stride is the next inner one's stride times its extent."""
    runs = operand_runs(dims, operand)
    return runs[0] if len(runs) == 1 else None


def tma_operands(plan: GemmPlan, block_m: int = 64, block_n: int = 64, block_k: int = 64,
                 shape_a: tuple[int, ...] | None = None) -> TmaOperands | None:
    """TMA views of A (K-major) and B (N- or K-major), or None where the operands are not
    strided matrices that the tensor-memory accelerator can address: one contiguous dimension,
    16-byte aligned rows and base offsets, at most five dimensions. Given the shape of A's
    array, an A that is a sliding window over it (a channels-last convolution) is one too."""
    if plan.dtype_ab not in ("bfloat16", "float32"):
        return None
    tf32 = plan.dtype_ab == "float32"  # TF32 wgmma reads both operands K-major
    elem = ELEMENT_BYTES[plan.dtype_ab]
    run = 16 // elem  # elements in 16 bytes
    if plan.base_a % run or plan.base_b % run:
        return None
    if 2 + len(plan.batch) > TMA_MAX_RANK:
        return None
    ak, am = _collapsed(plan.k, "a"), _collapsed(plan.m, "a")
    bk, bn = _collapsed(plan.k, "b"), _collapsed(plan.n, "b")
    # a batch loop one operand ignores (stride 0: NCHW images against the weights) is no
    # dimension of that operand's map
    a_batch = [d for d in plan.batch if d.stride_a]
    b_batch = [d for d in plan.batch if d.stride_b]
    batch_a = [d.stride_a for d in a_batch]
    batch_b = [d.stride_b for d in b_batch]
    names_a, names_b = tuple(f"z_{d.var}" for d in a_batch), tuple(f"z_{d.var}" for d in b_batch)
    extents_a, extents_b = tuple(d.extent for d in a_batch), tuple(d.extent for d in b_batch)
    a: TensorMap | WindowMap
    if ak and am and ak[1] == 1 and am[1] % run == 0:
        a = TensorMap((ak[0], am[0], *extents_a), (am[1] * elem, *(s * elem for s in batch_a)),
                      (block_k, block_m, *(1,) * len(a_batch)), ("k", "m", *names_a))
    else:
        window = window_map(plan, shape_a, block_m, block_k, elem) if shape_a else None
        if window is None:
            return None
        a = window
    if bk is None or bn is None or any(s % run or s <= 0 for s in batch_a + batch_b):
        return None
    ones = (1,) * len(b_batch)
    if bn[1] == 1 and bk[1] % run == 0 and not tf32:
        b = TensorMap((bn[0], bk[0], *extents_b), (bk[1] * elem, *(s * elem for s in batch_b)),
                      (64, block_k, *ones), ("n", "k", *names_b))
        major = "n"
    elif bk[1] == 1 and bn[1] % run == 0:
        b = TensorMap((bk[0], bn[0], *extents_b), (bn[1] * elem, *(s * elem for s in batch_b)),
                      (block_k, block_n, *ones), ("k", "n", *names_b))
        major = "k"
    else:
        return None
    if any(e >= 1 << 32 for e in a.extents + b.extents) or any(s >= 1 << 40 for s in a.strides + b.strides):
        return None
    return TmaOperands(a, b, major)


def _candidates(plan: GemmPlan, device: GpuTarget, shape_a: tuple[int, ...]) -> list[GemmTiling]:
    tma_tiles = [(*tile, 1) for tile in TMA_TILES] + [(*tile, 2) for tile in TMA_PAIRED_TILES]
    if device.tensor_memory_accelerator and plan.dtype_ab == "bfloat16" and tma_operands(plan, shape_a=shape_a):
        return [GemmTiling("tma", bm, bn, bk, stages=st, blocks_per_sm=pair) for bm, bn, bk, st, pair in tma_tiles]
    if (device.tensor_memory_accelerator and device.allow_tf32 and plan.dtype_ab == "float32"
            and tma_operands(plan, block_k=TF32_BLOCK_K, shape_a=shape_a)):
        # the same tiles with 128-byte rows of 32 floats: K steps of 32
        return [GemmTiling("tma", bm, bn, TF32_BLOCK_K, stages=st, operand_bytes=4, blocks_per_sm=pair)
                for bm, bn, _, st, pair in tma_tiles]
    if device.warpgroup_mma and plan.dtype_ab == "bfloat16" and wgmma_b_major(plan):
        return [GemmTiling("wgmma", bm, bn, bk, stages=st) for bm, bn, bk, st in WGMMA_TILES]
    if device.tensor_cores and plan.dtype_ab == "bfloat16":
        return [GemmTiling("mma", bm, bn, bk, warps_m=wm, warps_n=wn, stages=st)
                for bm, bn, bk, wm, wn, st in (MMA_TILES if mma_vector(plan) else MMA_SCALAR_TILES)]
    # both operands move in float4s (A along K or M, B along N or K: `codegen.gpu.generate.fma_vectors`)
    # and C's rows run along N: a warp's lanes span columns, so its stores stay coalesced (an
    # NCHW convolution's C runs along M: its 1 x 1 layers at N=32 ran 0.72-0.91x as fast)
    vector = (plan.dtype_ab == "float32"
              and any(contiguous_runs(plan, "a", axis, 4) for axis in ("k", "m"))
              and any(contiguous_runs(plan, "b", axis, 4) for axis in ("n", "k"))
              and contiguous_runs(plan, "c", "n", 4))
    # warp tiles first: where the grid fills the device either way, the choice keeps them.
    # K steps of 16 where a thread copies at most 8 float4s of the two operands a step, else
    # 8: a 64 x 128 tile's 64 threads copying 12 spilled 316 bytes beside the 128 accumulators
    warp = []
    for bm, bn in BLOCK_TILES:
        if vector and bm % 64 == 0 and bn % 64 == 0:
            threads = bm // WARP_THREAD_TILE[0] * (bn // WARP_THREAD_TILE[1])
            bk = FMA_BLOCK_K if (bm + bn) * FMA_BLOCK_K // (4 * threads) <= 8 else 8
            warp.append(GemmTiling("fma", bm, bn, bk, thread_m=WARP_THREAD_TILE[0], thread_n=WARP_THREAD_TILE[1]))
    plain = []
    for bm, bn in BLOCK_TILES:
        tiling = GemmTiling("fma", bm, bn, 8)
        if device.kind == "cuda" and tiling.threads * FMA_TILE_REGISTERS * 2 == REGISTER_FILE:
            # two blocks a multiprocessor only at 128 registers a thread: asked of ptxas first
            # (1 x 1 layers at N=32 1.07-1.43x faster on an H100), as ptxas chose otherwise
            # (gathered operands' offsets spilled when held to 128: 0.8-0.93x on some)
            plain.append(replace(tiling, blocks_per_sm=2))
        plain.append(tiling)
    return warp + plain


def _loads_divide(t: GemmTiling) -> bool:
    """Every thread copies the same number of elements (16-byte runs for the MMA kernels) of
    both operand tiles, as the kernels assume (TMA copies whole boxes)."""
    if t.kind == "tma":
        return True
    vec = 1 if t.kind == "fma" else 8  # an MMA operand may be copied in 16-byte runs
    return all(cells % (vec * t.threads) == 0
               for cells in (t.block_m * t.block_k, t.block_k * t.block_n))


def _registers(t: GemmTiling) -> int:
    if t.kind in ("wgmma", "tma"):
        return t.block_n // 2 + 32
    if t.kind == "mma":
        fm, fn = t.block_m // t.warps_m // 16, t.block_n // t.warps_n // 16
        return fm * fn * 8 + (fm + fn) * 4
    return t.thread_m * t.thread_n + t.thread_m + t.thread_n


def blocks_fit(t: GemmTiling, device: GpuTarget) -> bool:
    """Whether `blocks_per_sm` blocks of `t` fit a multiprocessor's shared memory (each block
    also holds 1 KiB the hardware reserves) and register file: ptxas compiles every thread,
    consumers too, within the launch bound's share of it (64 Ki / threads / blocks), whatever
    `setmaxnreg` moves later (a 64 x 256 tile's consumer needs 154 of the 128 two blocks leave)."""
    if t.blocks_per_sm == 1:
        return True
    if t.kind == "fma":  # held there by the launch bound (`_candidates`)
        return t.blocks_per_sm * t.threads * FMA_TILE_REGISTERS <= REGISTER_FILE
    return (t.kind == "tma" and t.block_m == 64
            and t.blocks_per_sm * (t.shared_bytes + 1024) <= device.shared_memory_optin_bytes + 1024
            and _registers(t) <= REGISTER_FILE // (t.blocks_per_sm * t.threads))


def tma_registers(t: GemmTiling) -> tuple[int, int]:
    """(producer, consumer) registers a thread of the TMA kernel keeps after `setmaxnreg`:
    the register file (64 Ki) shared by the blocks of a multiprocessor, the producer warpgroup
    down to 40, the consumers up to what is left, in steps of 8 (at most 232 with one block)."""
    producer = 40
    per_block = REGISTER_FILE // t.blocks_per_sm
    consumers = t.threads - 128
    return producer, min(232, (per_block - 128 * producer) // consumers // 8 * 8)


def _splits(t: GemmTiling, tiles: int, size_k: int, dtype_c: str, device: GpuTarget) -> int:
    """K slices per output tile: enough warps in flight, each slice still a long K loop.
    Slices add into C with atomics, so only float32 outputs are split."""
    if dtype_c != "float32" or t.kind == "tma":  # persistent blocks walk every tile
        return 1
    k_tiles = math.ceil(size_k / t.block_k)
    want = device.multiprocessors * SPLIT_WARPS_PER_SM
    splits = 1
    while (tiles * splits * t.threads // 32 < want
           and k_tiles // (splits * 2) >= MIN_K_TILES_PER_SPLIT):
        splits *= 2
    return splits


def scored_tilings(
    model: PolyModel, s: StatementModel, plan: GemmPlan, device: GpuTarget
) -> list[tuple[float, GemmTiling, int, TmaOperands | None]]:
    """Every candidate tile of `plan` that fits `device`, in candidate order, with its score
    (multiply-adds per byte of footprint, times the fraction of the work that is useful and
    of the device kept busy), its footprint in bytes and its TMA views."""
    size_m, size_n, size_k = plan.size(plan.m), plan.size(plan.n), plan.size(plan.k)
    batch = plan.size(plan.batch)
    scored = []
    shape_a = model.nest.array(plan.a.array).concrete_shape(model.params)
    for tiling in _candidates(plan, device, shape_a):
        bm, bn, bk = tiling.block_m, tiling.block_n, tiling.block_k
        # The tensor-core kernel takes dynamic shared memory (opted in above the default);
        # the FMA kernel's is static and stays within the default.
        limit = device.shared_memory_bytes if tiling.kind == "fma" else device.shared_memory_optin_bytes
        if tiling.shared_bytes > limit or not blocks_fit(tiling, device):
            continue
        if _registers(tiling) > device.registers_per_thread * 3 // 4:
            continue
        if tiling.threads > device.max_threads_per_block or tiling.threads < device.warp_size:
            continue
        if not _loads_divide(tiling):
            continue
        tiles = math.ceil(size_m / bm) * math.ceil(size_n / bn) * batch
        splits = _splits(tiling, tiles, size_k, plan.dtype_c, device)
        if (tiling.kind == "fma" and (tiling.thread_m, tiling.thread_n) == WARP_THREAD_TILE
                and (splits > 1 or tiles < 2 * device.multiprocessors)):
            # fewer than two blocks a multiprocessor: the 8 x 8 tiles' twice as many warps a
            # block (16 x 512^3 batched, 256 blocks: 0.73 against 0.56 of cuBLAS split in two)
            continue
        if tiles * splits > MAX_GRID_Z * 65535:
            continue
        tiling = GemmTiling(**{**tiling.__dict__, "splits": splits})
        useful = size_m * size_n / (math.ceil(size_m / bm) * bm * math.ceil(size_n / bn) * bn)
        blocks = tiles * splits
        operands = None
        if tiling.kind == "tma":  # persistent: the last wave's idle multiprocessors are waste
            operands = tma_operands(plan, bm, bn, bk, shape_a)
            if operands is None:
                continue
            if isinstance(operands.a, WindowMap):  # a 2-D tile of output positions
                useful = operands.a.useful(plan) * size_n / (math.ceil(size_n / bn) * bn)
                blocks = math.prod(operands.a.tile_counts(plan).values()) * math.ceil(size_n / bn)
            slots = device.multiprocessors * tiling.blocks_per_sm
            useful *= blocks / (math.ceil(blocks / slots) * slots)
            if tiling.blocks_per_sm == 1:  # the tile's store does not overlap products
                steps = math.ceil(size_k / bk)
                useful *= steps / (steps + TMA_STORE_STEPS)
        fill = min(1.0, blocks / device.multiprocessors)
        warps = min(1.0, blocks * tiling.threads / 32 / (device.multiprocessors * WARPS_PER_SM))
        cells_a, cells_b = tile_footprint(s, plan, bm, bn, bk)
        footprint = (cells_a + cells_b) * ELEMENT_BYTES[plan.dtype_ab]
        moved = footprint
        if operands is not None and isinstance(operands.a, TensorMap):
            # an operand that is one tile along its own dimension (a 1 x 1 layer's weights
            # where the layer has at most BM output channels) comes from memory once, its
            # re-reads by the other operand's tiles from the L2: only the other's tile moves
            # (NCHW bf16 res2_1x1a at N=32 64 x 64 tiles, 1.42x faster than the 64 x 128 that
            # counting both picked; over 30 layers' tile sweeps the picks 1.048 -> 1.031x the
            # best). Not for windows: their 3 x 3 layers ran 0.87-0.92x as fast on the tiles
            # this picks for them.
            a_once, b_once = (size <= block and size * size_k * ELEMENT_BYTES[plan.dtype_ab] <= L2_RESIDENT_BYTES
                              for size, block in ((size_m, bm), (size_n, bn)))
            if a_once != b_once:
                moved = (cells_b if a_once else cells_a) * ELEMENT_BYTES[plan.dtype_ab]
        # the footprint counts cells that exist (isl clamps the tile to the domain): so does
        # the work it feeds; what a tile larger than the GEMM wastes is in `useful`
        intensity = min(bm, size_m) * min(bn, size_n) * min(bk, size_k) / max(moved, 1)
        scored.append((intensity * useful * fill * (0.5 + 0.5 * warps), tiling, footprint, operands))
    return scored


def ranked_tilings(
    model: PolyModel, s: StatementModel, plan: GemmPlan, device: GpuTarget
) -> list[tuple[float, GemmTiling, int, TmaOperands | None]]:
    """`scored_tilings` best first; of near-equal scores the earlier candidate first."""
    left = scored_tilings(model, s, plan, device)
    ranked = []
    while left:
        best = 0
        for i, candidate in enumerate(left):
            if candidate[0] > left[best][0] * 1.0001:
                best = i
        ranked.append(left.pop(best))
    return ranked


def choose_tiling(
    model: PolyModel, s: StatementModel, plan: GemmPlan, device: GpuTarget, rank: int = 0
) -> GemmPlan:
    """The block tile with the best score (`scored_tilings`): the most multiply-adds per byte
    of footprint that fits the shared memory, keeps its register tile within the register
    file, wastes little on ragged edges and keeps every multiprocessor busy (splitting K where
    the output alone is too small); the first of near-equal scores. `rank` > 0 takes the
    tile that many places down the ranking (a timed alternative: `driver.gpu_timing`)."""
    ranked = ranked_tilings(model, s, plan, device)
    if not ranked:
        raise ScheduleError(f"no GEMM tile of {s.name} fits the shared memory of {device.name}")
    _, tiling, footprint, tma = ranked[min(rank, len(ranked) - 1)]
    return GemmPlan(**{**plan.__dict__, "tiling": tiling, "footprint_bytes": footprint, "tma": tma})


# ----------------------------------------------------------------------------- the schedule


def gpu_schedule(model: PolyModel, device: GpuTarget, ranks: Mapping[str, int] | None = None) -> GpuSchedule:
    """Kernels for `model` on `device`: GEMMs tiled for its tensor cores or FMA units, the
    other statements one thread a point of their parallel loops. Convolution windows that
    the tensor cores cannot read in runs are planned on a staged nest (`gpu_staging`).
    `ranks` takes a GEMM statement's tile that many places down its ranking (by the name of
    the statement in the planned nest; absent: the best)."""
    winograd = winograd_convolutions(model.nest, model.params, device)
    staged = stage_channels_last(winograd, model.params, device)
    if staged is not model.nest:
        staged_model = build_model(staged, model.params)
        writes = _writes(staged_model)
        how = []
        if winograd is not model.nest:
            how.append("3 x 3 convolutions by Winograd's F(m x m, 3 x 3) (schedules/gpu/winograd.py)")
        if staged is not winograd:
            how.append("bf16 operands copied channels-last (schedules/gpu/staging.py)")
        note = f"{'; '.join(how)}; the kernels' statements are the rewritten nest's: {writes}"
        return replace(_planned(staged_model, device, ranks or {}), model=staged_model, notes=(("staged", note),))
    return _planned(model, device, ranks or {})


def replanned(model: PolyModel, schedule: GpuSchedule, ranks: Mapping[str, int]) -> GpuSchedule:
    """`schedule` planned again with the GEMM tiles `ranks` names (as `gpu_schedule` takes it)."""
    planned = _planned(schedule.model or model, schedule.device, ranks)
    return replace(planned, model=schedule.model, notes=schedule.notes)


def tile_counts(model: PolyModel, schedule: GpuSchedule) -> dict[str, int]:
    """How many tiles each GEMM statement of `schedule` has in its ranking."""
    planned = schedule.model or model
    return {k.name: len(ranked_tilings(planned, k.statement, k.gemm, schedule.device))
            for k in schedule.kernels if k.gemm is not None}


def _writes(model: PolyModel) -> str:
    """"S0 writes xp, S1-S36 write u, ...": the statements in runs writing one array."""
    runs: list[list[str]] = []  # [first, last, array]
    for s in model.statements:
        array = s.statement.target.array
        if runs and runs[-1][2] == array:
            runs[-1][1] = s.name
        else:
            runs.append([s.name, s.name, array])
    return ", ".join(f"{first} writes {array}" if first == last else f"{first}-{last} write {array}"
                     for first, last, array in runs)


def _planned(model: PolyModel, device: GpuTarget, ranks: Mapping[str, int]) -> GpuSchedule:
    check_distribution(model)
    chains = {stmt.name: enclosing for stmt, enclosing in walk_statements(model.nest.body)}
    kernels = []
    for s in model.statements:
        enclosing = chains[s.name]
        gemm = None
        if not any(isinstance(x, Guard) for x in enclosing):
            gemm = _gemm_dims(model, s, device, ranks.get(s.name, 0))
        threads = thread_loops(model, s, enclosing)
        kernels.append(
            GpuKernelPlan(
                statement=s,
                enclosing=enclosing,
                threads=threads,
                block=THREADS_PER_BLOCK,
                register_accumulator=_register_accumulator(s, enclosing, threads),
                gemm=gemm,
                transpose=transpose_loops(model, s.statement, enclosing, threads) if gemm is None else None,
            )
        )
    planned = read_through_copies(model, with_epilogues(model, kernels))
    return GpuSchedule(device, tuple(sibling_groups(model, planned)))


def _plain(plan: GpuKernelPlan) -> bool:
    """A kernel of one statement whose every loop runs on threads (a point a thread)."""
    return (plan.gemm is None and plan.transpose is None and not plan.register_accumulator
            and not plan.sequential)


def _loops_of(plan: GpuKernelPlan) -> tuple[int, ...]:
    return tuple(id(x) for x in plan.enclosing if isinstance(x, Loop))


def sibling_groups(model: PolyModel, kernels: list[GpuKernelPlan]) -> list[GpuKernelPlan]:
    """Consecutive plain kernels of statements in the same loops, on the same thread loops,
    as one kernel whose threads run each statement of their point in source order: legal
    where every dependence between two of them stays on one thread (the same values of the
    thread loops). A Winograd transform's (m+2)^2 statements read the same tile: one launch
    reads it once, and the compiler shares the sums its statements have in common."""
    deps = dependences_of(model).all
    out: list[GpuKernelPlan] = []
    for plan in kernels:
        head = out[-1] if out else None
        if (head is not None and _plain(head) and _plain(plan) and _loops_of(head) == _loops_of(plan)
                and head.threads == plan.threads
                and all(_same_thread(deps, early, plan.statement, plan.threads)
                        for early in head.statements)):
            out[-1] = replace(head, siblings=(*head.siblings, (plan.statement, plan.enclosing)))
        else:
            out.append(plan)
    return out


def _same_thread(deps: isl.UnionMap, early: StatementModel, late: StatementModel,
                 threads: tuple[ThreadLoop, ...]) -> bool:
    """Whether every dependence from `early` to `late` joins instances of one thread."""
    position = [{lp.var: d for d, lp in enumerate(s.loops)} for s in (early, late)]
    return _agree(_between(deps, early.name, late.name),
                  [(position[0][t.var], position[1][t.var]) for t in threads])
