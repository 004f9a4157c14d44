"""GEMM kernels: a GEMM statement's `GemmPlan` becomes the kernel of its tile's variant.

Takes the model, a kernel plan with a `GemmPlan` and the target; returns a `KernelLaunch`.
Each variant of `schedules.gpu.variants` has its template (`FmaTiling`: `gemm_fma.j2`,
`MmaTiling`: `gemm_mma.j2`, `WgmmaTiling`: `gemm_wgmma.j2`, `TmaTiling`: `gemm_tma.j2`) and a
function here that computes what it decides: index functions of the GEMM's loops, how each
operand is copied, how C is stored (`codegen.gpu.stores`), the TMA views and coordinates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from polydl.codegen.gpu.launch import KernelLaunch, TensorMapSetup, kernel_pointers
from polydl.codegen.gpu.stores import (
    c_stores,
    epilogue_dims,
    pair_stores,
    staged_stores,
    staged_width,
)
from polydl.codegen.templating import render
from polydl.poly.model import PolyModel
from polydl.schedules.gpu.operands import (
    contiguous_runs,
    mma_vectors,
    operand_modes,
    operand_runs,
    wgmma_b_major,
)
from polydl.schedules.gpu.plans import GemmDim, GemmPlan, GpuKernelPlan, TensorMap, WindowMap
from polydl.schedules.gpu.variants import FmaTiling, GemmTiling, MmaTiling, TmaTiling, WgmmaTiling
from polydl.target.gpu import GpuTarget

# Flat K indices below this decode on `int` (`index_function`): 2^30 leaves room for the tile
# past the end that guarded loads compute indices for.
INT_INDEX_LIMIT = 1 << 30
# Descriptor byte offsets (leading, strided dimension) of the swizzled wgmma operands with
# BK = 64: A K-major (8-row groups 1024 bytes apart), B N-major (64-wide n blocks BK * 128
# bytes apart, 8-row k groups 1024 bytes apart).
WGMMA_STRIDES = {"a": (16, 1024), "b": (8192, 1024)}


@dataclass(frozen=True)
class IndexTerm:
    """`((idx / divisor) % modulus) * stride` (no division or modulus where None)."""

    divisor: int | None
    modulus: int | None
    stride: int


@dataclass(frozen=True)
class IndexFunction:
    kernel: str
    name: str
    terms: tuple[IndexTerm, ...]  # outermost first
    narrow: bool  # divisions on `int`

    @property
    def declares_int(self) -> bool:
        return self.narrow and bool(self.terms)


@dataclass(frozen=True)
class WgmmaFunction:
    kernel: str
    block_n: int
    tf32: bool
    b_transposed: bool

    @property
    def accumulators(self) -> int:  # the asm's float operands %0..%(n - 1)
        return self.block_n // 2

    @property
    def a_operand(self) -> int:
        return self.accumulators

    @property
    def b_operand(self) -> int:
        return self.accumulators + 1

    @property
    def predicate(self) -> int:
        return self.accumulators + 2


def index_function(kernel: str, name: str, dims: tuple[GemmDim, ...], operand: str,
                   narrow: bool = False) -> IndexFunction:
    """`long {kernel}_{name}(long idx)`: the element offset of flat index `idx` of `dims`.
    Loops that continue one another in this operand (a position's p and q in an image's rows)
    are one index: no division between them. `narrow`: the divisions left run on `int` (where
    the flat indices, and a tile past their end, fit 31 bits): a 64-bit division by a constant
    is a long sequence on a GPU."""
    runs = operand_runs(dims, operand)
    narrow = narrow and len(runs) > 1 and math.prod(e for e, _ in runs) < INT_INDEX_LIMIT
    terms, inner = [], 1
    for position, (extent, stride) in enumerate(reversed(runs)):
        if stride:
            terms.append(IndexTerm(inner if inner != 1 else None,
                                   extent if position != len(runs) - 1 else None, stride))
        inner *= extent
    return IndexFunction(kernel, name, tuple(reversed(terms)), narrow)


def fma_vectors(g: GemmPlan) -> tuple[str, str]:
    """Along which index one global load of A and of B moves a float4 in the fp32 FMA kernel:
    "k" or "m" for A, "n" or "k" for B (where the operand runs there in aligned fours: a
    GEMM's A along K, a 1 x 1 convolution's NCHW input along its output positions M), or ""
    (element by element)."""
    if g.dtype_ab != "float32":
        return "", ""
    t = g.tiling
    a_tile, b_tile = (t.block_m * t.block_k) % (4 * t.threads) == 0, (t.block_k * t.block_n) % (4 * t.threads) == 0
    a = next((axis for axis in ("k", "m") if a_tile and contiguous_runs(g, "a", axis, 4)), "")
    b = next((axis for axis in ("n", "k") if b_tile and contiguous_runs(g, "b", axis, 4)), "")
    return a, b


def _common(model: PolyModel, g: GemmPlan, kernel: str) -> dict[str, Any]:
    """What every GEMM template takes."""
    t = g.tiling
    functions = [
        index_function(kernel, "am", g.m, "a"),
        # decoded on every load of a tile (a gathered window's (c, r, s)): on `int`; not the
        # others (see decisions: GPU index functions on int)
        index_function(kernel, "ak", g.k, "a", narrow=True),
        index_function(kernel, "az", g.batch, "a"),
        index_function(kernel, "bn", g.n, "b"),
        index_function(kernel, "bk", g.k, "b", narrow=True),
        index_function(kernel, "bz", g.batch, "b"),
        index_function(kernel, "cm", g.m, "c"),
        index_function(kernel, "cn", g.n, "c"),
        index_function(kernel, "cz", g.batch, "c"),
        *(index_function(kernel, name, dims, "c") for name, dims in epilogue_dims(g)),
    ]
    a_mode, b_mode = operand_modes(g)
    return dict(
        kernel=kernel,
        index_functions=functions,
        wgmma_function=None,
        params=kernel_pointers(model),
        bm=t.block_m, bn=t.block_n, bk=t.block_k, threads=t.threads,
        size_m=GemmPlan.size(g.m), size_n=GemmPlan.size(g.n), size_k=GemmPlan.size(g.k),
        a_name=g.a.array, b_name=g.b.array, c_name=g.c.array,
        base_a=g.base_a, base_b=g.base_b, base_c=g.base_c,
        a_m_major=a_mode == "m", b_k_major=b_mode == "k",
        c_type="uint16_t" if g.dtype_c == "bfloat16" else "float",
        ab_type="uint16_t" if g.dtype_ab == "bfloat16" else "float",
        bf16_operands=g.dtype_ab == "bfloat16",
        c_store=c_stores(g, kernel),
        splits=t.splits,
    )


def _grid(g: GemmPlan, t: GemmTiling) -> tuple[int, int, int]:
    return (math.ceil(GemmPlan.size(g.n) / t.block_n), math.ceil(GemmPlan.size(g.m) / t.block_m),
            GemmPlan.size(g.batch) * t.splits)


def _fma_kernel(values: dict[str, Any], g: GemmPlan, t: FmaTiling, target: GpuTarget) -> KernelLaunch:
    a_along, b_along = fma_vectors(g)
    vector_copies = bool(a_along or b_along)
    # 16-byte stores of C where its rows run in aligned fours (the operands' float4 loads
    # already ask for 16-byte aligned arrays) (see decisions: GPU FMA stores of four cells)
    quads = vector_copies and g.dtype_c == "float32" and contiguous_runs(g, "c", "n", 4)
    # C running along M (an NCHW output: its columns are channels P * Q apart): a warp's
    # lanes go along M, so each store instruction writes neighbouring cells, 16 bytes a
    # thread where the operands' float4s already ask for aligned arrays
    lanes_m = not t.warp_tiles and contiguous_runs(g, "c", "m", 4)
    rows_four = lanes_m and vector_copies and g.dtype_c == "float32"
    text = render(
        t.template, **values, vec_a=4 if a_along else 1, vec_b=4 if b_along else 1,
        a_along=a_along, b_along=b_along,
        a_float4=bool(a_along), a_float4_along_m=a_along == "m",
        b_float4=bool(b_along), b_float4_along_k=b_along == "k",
        min_blocks=t.blocks_per_sm, thread_m=t.thread_m, thread_n=t.thread_n,
        warp_tiles=t.warp_tiles, lanes_m=lanes_m, quads=quads, rows_four=rows_four,
    )
    return KernelLaunch(text, _grid(g, t), t.threads, 0, alignment=16 if vector_copies else 1)


def _mma_kernel(values: dict[str, Any], g: GemmPlan, t: MmaTiling, target: GpuTarget) -> KernelLaunch:
    vec_a, vec_b = mma_vectors(g)
    ring = (vec_a, vec_b) == (8, 8)
    if not ring:
        t = replace(t, stages=2)  # an operand staged in registers: two buffers
    text = render(
        t.template, **values, vec_a=vec_a, vec_b=vec_b, a_vector=vec_a == 8, b_vector=vec_b == 8,
        ring=ring, warps_m=t.warps_m, warps_n=t.warps_n, stages=t.stages,
    )
    return KernelLaunch(text, _grid(g, t), t.threads, t.shared_bytes, alignment=16 if 8 in (vec_a, vec_b) else 1)


def _wgmma_kernel(values: dict[str, Any], g: GemmPlan, t: WgmmaTiling, target: GpuTarget) -> KernelLaunch:
    b_major = wgmma_b_major(g)
    lbo_a, sbo_a = WGMMA_STRIDES["a"]
    # B K-major sits in shared memory as A does: a 128-byte row of K per n
    lbo_b, sbo_b = WGMMA_STRIDES["b"] if b_major == "n" else WGMMA_STRIDES["a"]
    text = render(
        t.template, **{**values, "wgmma_function": WgmmaFunction(values["kernel"], t.block_n, False, b_major == "n")},
        stages=t.stages, lbo_a=lbo_a, sbo_a=sbo_a, lbo_b=lbo_b, sbo_b=sbo_b,
        b_n_major=b_major == "n", pairs=pair_stores(g),
    )
    return KernelLaunch(text, _grid(g, t), t.threads, t.shared_bytes, alignment=16)


@dataclass(frozen=True)
class WindowAxis:
    """One window axis's box coordinate: an M loop's tile (times its box), a K loop's value, an
    offset into the copy's source."""

    m: str | None
    box: int
    k: str | None
    offset: int

    @property
    def constant(self) -> bool:  # neither loop moves it
        return self.m is None and self.k is None

    @property
    def below(self) -> bool:
        return self.offset < 0

    @property
    def distance(self) -> int:
        return abs(self.offset)


@dataclass(frozen=True)
class Decoded:
    """`const long {prefix}_{var} = {source} / {divisor}L % {extent}L;`: one loop's coordinate
    from a flat tile index."""

    var: str
    divisor: int
    extent: int


@dataclass(frozen=True)
class WindowRow:
    """`m_{var} = t_{var} * tile + row / inner % tile`: a tile row's position along one M loop."""

    var: str
    tile: int
    inner: int


@dataclass(frozen=True)
class WindowTile:
    """The TMA kernel's pieces for an A read as a window (a channels-last convolution)."""

    m_tiles: tuple[Decoded, ...]  # each M loop's tile index from tm, innermost first
    tiles_m: int
    channels: str  # the channel loop (innermost K) and its BK steps
    channel_steps: int
    taps: tuple[Decoded, ...]  # the other K loops from kt, innermost first
    axes: tuple[WindowAxis, ...]
    rows: tuple[WindowRow, ...]  # innermost first
    edges: tuple[GemmDim, ...]  # the M loops a tile row may pass the end of
    first: str  # the outermost M loop
    rest: tuple[GemmDim, ...]  # the others, outer first


def _window_tile(g: GemmPlan, window: WindowMap) -> WindowTile:
    tile = dict(window.tile_m)
    counts = window.tile_counts(g)
    m_tiles, inner = [], 1
    for d in reversed(g.m):  # tm = (.. * tiles of p + tile of p) * tiles of q + tile of q
        m_tiles.append(Decoded(d.var, inner, counts[d.var]))
        inner *= counts[d.var]
    channels = g.k[-1]
    steps = channels.extent // window.box[0]
    taps, inner = [], steps
    for d in reversed(g.k[:-1]):  # the taps, outer loops slower
        taps.append(Decoded(d.var, inner, d.extent))
        inner *= d.extent
    offsets = window.offsets or (0,) * window.rank
    axes = tuple(WindowAxis(axis.m, box, axis.k, offset)
                 for axis, box, offset in zip(window.axes, window.box, offsets, strict=True))
    rows, inner = [], 1
    for d in reversed(g.m):  # a tile row walks the innermost M loop fastest
        rows.append(WindowRow(d.var, tile[d.var], inner))
        inner *= tile[d.var]
    return WindowTile(tuple(m_tiles), math.prod(counts.values()), channels.var, steps, tuple(taps), axes,
                      tuple(rows), tuple(d for d in g.m if tile[d.var] > 1), g.m[0].var, g.m[1:])


def _tensor_map(operand: str, view: TensorMap | WindowMap, array: str, offset: int | None,
                float32: bool) -> TensorMapSetup:
    return TensorMapSetup(operand, array, offset, view.extents, view.strides, view.box, view.element_strides,
                          float32)


def _tma_kernel(values: dict[str, Any], g: GemmPlan, t: TmaTiling, target: GpuTarget) -> KernelLaunch:
    tma = g.tma
    assert tma is not None
    transposed = tma.b_major == "n"
    tf32 = g.dtype_ab == "float32"
    window = _window_tile(g, tma.a) if isinstance(tma.a, WindowMap) else None
    batch, inner = [], 1
    for d in reversed(g.batch):  # the batch loops' coordinates, innermost fastest
        batch.append(Decoded(d.var, inner, d.extent))
        inner *= d.extent
    staged = staged_stores(g)
    run = staged_width(g) if staged else 4
    producer, consumer = t.register_split(target)
    text = render(
        t.template,
        **{**values, "wgmma_function": WgmmaFunction(values["kernel"], t.block_n, tf32, transposed)},
        mma_k=8 if tf32 else 16,
        stages=t.stages, batch=GemmPlan.size(g.batch),
        b_boxes=t.block_n // 64 if transposed else 1,
        batch_coordinates=batch, window=window,
        # each box coordinate's role: "k", "m", "n" or a batch coordinate's name
        a_roles=tma.a.roles if isinstance(tma.a, TensorMap) else (), b_roles=tma.b.roles,
        b_n_major=transposed,
        rank_a=tma.a.rank, rank_b=tma.b.rank,
        lbo_a=WGMMA_STRIDES["a"][0], sbo_a=WGMMA_STRIDES["a"][1],
        lbo_b=t.block_k * 128 if transposed else WGMMA_STRIDES["a"][0],
        sbo_b=1024 if transposed else WGMMA_STRIDES["a"][1],
        blocks_per_sm=t.blocks_per_sm, producer_registers=producer, consumer_registers=consumer,
        pairs=pair_stores(g), staged=staged, run=run, eight=run == 8,
        staged_steps=64 * 32 // run // 128, runs_a_row=32 // run,
    )
    source = g.copy_source.source if g.copy_source is not None else None
    m_tiles = window.tiles_m if window is not None else math.ceil(GemmPlan.size(g.m) / t.block_m)
    tiles = m_tiles * math.ceil(GemmPlan.size(g.n) / t.block_n) * GemmPlan.size(g.batch)
    maps = (
        _tensor_map("a", tma.a, source or g.a.array, None if source else g.base_a, tf32),
        _tensor_map("b", tma.b, g.b.array, g.base_b, tf32),
    )
    return KernelLaunch(text, (), t.threads, t.shared_bytes, tensor_maps=maps, persistent_tiles=tiles,
                        blocks_per_sm=t.blocks_per_sm, alignment=16, shared_carveout=t.blocks_per_sm > 1)


KERNELS: dict[type, Callable[[dict[str, Any], GemmPlan, Any, GpuTarget], KernelLaunch]] = {
    FmaTiling: _fma_kernel,
    MmaTiling: _mma_kernel,
    WgmmaTiling: _wgmma_kernel,
    TmaTiling: _tma_kernel,
}


def gemm_kernel(model: PolyModel, plan: GpuKernelPlan, kernel: str, target: GpuTarget) -> KernelLaunch:
    g = plan.gemm
    assert g is not None
    return KERNELS[type(g.tiling)](_common(model, g, kernel), g, g.tiling, target)
