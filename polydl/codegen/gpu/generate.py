"""The CUDA and HIP targets: a `GpuSchedule` becomes device kernels, a host launcher and a header.

Takes a `PolyModel` and its `GpuSchedule`; returns `GeneratedCode` whose `source` holds the
kernels, `launcher` the host function `NAME(device pointers..., stream)` that launches them in
order, and `header` its declaration. Both dialects render the same templates; what differs
(runtime API names, headers, tensor-core availability) lives in `templates/gpu/dialect_*.j2`.

A plain statement becomes a kernel whose threads enumerate its thread loops (flattened, the
innermost fastest so neighbouring threads touch neighbouring cells) and run the rest of its
loops and guards sequentially; a GEMM statement becomes the block-tiled implicit GEMM of
`gemm_tma.j2` (Hopper: TMA-fed, warp-specialised, persistent; operands that are strided
matrices or windows, see `schedules.gpu.windows`), `gemm_wgmma.j2` (Hopper warpgroup MMA over
cp.async, bf16 operands in 16-byte runs; both built for sm_90a), `gemm_mma.j2` (warp-level
mma.sync, bf16) or `gemm_fma.j2` (FMA). Each stores C with the fused epilogue applied
(`schedules.gpu.epilogues`): cell by cell, in pairs, or staged through shared memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from polydl.codegen.artifact import GeneratedCode, KernelArgument
from polydl.codegen.c_expr import ArrayLayout, StatementPrinter
from polydl.codegen.postops import scalar_expr
from polydl.codegen.templating import render
from polydl.dtypes import DTYPES
from polydl.ir import Condition, Guard, Loop
from polydl.poly.model import PolyModel
from polydl.schedules.gpu.planning import (
    WARP_THREAD_TILE,
    WGMMA_STRIDES,
    GemmDim,
    GemmPlan,
    GpuKernelPlan,
    GpuSchedule,
    TensorMap,
    WindowMap,
    contiguous_runs,
    mma_vectors,
    operand_modes,
    operand_runs,
    tma_registers,
    wgmma_b_major,
)
from polydl.target.gpu import GpuTarget
from polydl.version import __version__

SOURCE_SUFFIX = {"cuda": ".cu", "hip": ".hip.cpp"}
MAX_GRID_X = 1 << 20  # generic kernels loop over the rest (grid-stride)


def device_parameters(arguments: tuple[KernelArgument, ...]) -> list[str]:
    """The launcher's pointer parameters (the header's too: plain C, no restrict)."""
    return [f"{'const ' if a.is_input else ''}{a.c_type} *{a.name}" for a in arguments]


def _kernel_parameters(model: PolyModel) -> list[str]:
    out = []
    for a in model.nest.arrays:
        ctype = ArrayLayout(a.name, a.dtype, ()).c_type
        out.append(f"{'const ' if a.is_input else ''}{ctype} *__restrict__ {a.name}")
    return out


def _condition(c: Condition) -> str:
    return f"{c.left.to_c()} {c.op} {c.right.to_c()}"


# ----------------------------------------------------------------------------- plain statements


def _plain_kernel(
    model: PolyModel, plan: GpuKernelPlan, kernel: str, printer: StatementPrinter
) -> tuple[str, int]:
    """Kernel text and its thread count (the product of the thread-loop extents)."""
    total = math.prod(t.extent for t in plan.threads)
    lines = [
        f"__global__ void __launch_bounds__({plan.block}) {kernel}({', '.join(_kernel_parameters(model))}) {{",
        f"  for (long _pd_i = (long)blockIdx.x * blockDim.x + threadIdx.x; _pd_i < {total}L;",
        "       _pd_i += (long)gridDim.x * blockDim.x) {",
        "    long _pd_rest = _pd_i;",
    ]
    for t in reversed(plan.threads):  # innermost varies fastest
        lines.append(f"    const long {t.var} = {t.lower}L + {t.step}L * (_pd_rest % {t.extent}L);")
        lines.append(f"    _pd_rest /= {t.extent}L;")
    lines.append("    (void)_pd_rest;")
    mapped = {t.var for t in plan.threads}
    stmt = plan.statement.statement
    openers = _openers(plan.enclosing, mapped)
    inner = [f"_pd_acc += {printer.expr(stmt.value)};"] if plan.register_accumulator else [
        printer.statement(stmt)
    ]
    nested = _nest(openers, inner)
    if plan.register_accumulator:
        nested = ["{", f"  {printer.ctype} _pd_acc = 0;", *("  " + x for x in nested),
                  "  " + _accumulate(printer, stmt.target, stmt.op), "}"]
    for sibling, enclosing in plan.siblings:  # every loop on threads: only guards open
        nested += _nest(_openers(enclosing, mapped), [printer.statement(sibling.statement)])
    lines += ["    " + x for x in nested]
    lines += ["  }", "}"]
    return "\n".join(lines), total


def _openers(enclosing: tuple[Loop | Guard, ...], mapped: set[str]) -> list[str]:
    """The `for` and `if` lines around a statement, less the loops mapped to threads."""
    openers: list[str] = []
    for node in enclosing:
        if isinstance(node, Loop) and node.var not in mapped:
            openers.append(
                f"for (long {node.var} = {node.lower.to_c()}; {node.var} < {node.upper.to_c()}; "
                f"{node.var} += {node.step}) {{"
            )
        elif isinstance(node, Guard):
            conds = " && ".join(f"({_condition(c)})" for c in node.conditions) or "1"
            openers.append(f"if ({conds}) {{")
    return openers


TRANSPOSE_TILE = 32  # a warp's lanes along one side of a tile; 8 rows of threads a block


def _transpose_kernel(
    model: PolyModel, plan: GpuKernelPlan, kernel: str, printer: StatementPrinter
) -> KernelLaunch:
    """A copy into another layout by 32 x 32 tiles: each tile's values computed with the
    lanes along u (the source's run), kept as floats in shared memory, stored with the lanes
    along v (the target's run); the other thread loops one tile each through the grid."""
    assert plan.transpose is not None
    u, v = plan.transpose
    loops = {t.var: t for t in plan.threads}
    tile = TRANSPOSE_TILE
    tiles = {x: math.ceil(loops[x].extent / tile) for x in (u, v)}
    others = [t for t in plan.threads if t.var not in (u, v)]
    stmt = plan.statement.statement
    cell = printer.element(stmt.target)
    bf16 = printer.layouts[stmt.target.array].dtype == "bfloat16"
    value = printer.expr(stmt.value)
    stored = "_pd_f32_to_bf16(_pd_tile[_pd_tx][_pd_ty + _pd_j])" if bf16 else f"({printer.ctype})_pd_tile[_pd_tx][_pd_ty + _pd_j]"

    def bind(var: str, index: str) -> str:
        t = loops[var]
        return f"const long {var} = {t.lower}L + {t.step}L * ({index});"

    lines = [
        f"__global__ void __launch_bounds__({tile * 8}) {kernel}({', '.join(_kernel_parameters(model))}) {{",
        f"  __shared__ float _pd_tile[{tile}][{tile + 1}];",
        f"  const int _pd_tx = threadIdx.x % {tile}, _pd_ty = threadIdx.x / {tile};",
        "  long _pd_rest = blockIdx.x;",
        f"  const long _pd_u0 = (_pd_rest % {tiles[u]}L) * {tile}; _pd_rest /= {tiles[u]}L;",
        f"  const long _pd_v0 = (_pd_rest % {tiles[v]}L) * {tile}; _pd_rest /= {tiles[v]}L;",
    ]
    for t in reversed(others):
        lines.append(f"  const long {t.var} = {t.lower}L + {t.step}L * (_pd_rest % {t.extent}L); _pd_rest /= {t.extent}L;")
    lines += [
        "  (void)_pd_rest;",
        f"  for (int _pd_j = 0; _pd_j < {tile}; _pd_j += 8) {{",
        f"    if (_pd_u0 + _pd_tx < {loops[u].extent}L && _pd_v0 + _pd_ty + _pd_j < {loops[v].extent}L) {{",
        f"      {bind(u, '_pd_u0 + _pd_tx')}",
        f"      {bind(v, '_pd_v0 + _pd_ty + _pd_j')}",
        f"      _pd_tile[_pd_ty + _pd_j][_pd_tx] = (float)({value});",
        "    }",
        "  }",
        "  __syncthreads();",
        f"  for (int _pd_j = 0; _pd_j < {tile}; _pd_j += 8) {{",
        f"    if (_pd_v0 + _pd_tx < {loops[v].extent}L && _pd_u0 + _pd_ty + _pd_j < {loops[u].extent}L) {{",
        f"      {bind(v, '_pd_v0 + _pd_tx')}",
        f"      {bind(u, '_pd_u0 + _pd_ty + _pd_j')}",
        f"      {cell} = {stored};",
        "    }",
        "  }",
        "}",
    ]
    blocks = tiles[u] * tiles[v] * math.prod(t.extent for t in others)
    return KernelLaunch("\n".join(lines), (str(blocks),), tile * 8, 0)


def _nest(openers: list[str], body: list[str]) -> list[str]:
    if not openers:
        return body
    return [openers[0], *("  " + x for x in _nest(openers[1:], body)), "}"]


def _accumulate(printer: StatementPrinter, target, op: str) -> str:
    cell = printer.element(target)
    if printer.layouts[target.array].dtype == "bfloat16":
        return f"{cell} = _pd_f32_to_bf16({printer.load(target)} {op[0]} _pd_acc);"
    return f"{cell} {op} _pd_acc;"


# ----------------------------------------------------------------------------- GEMM statements


# Flat K indices below this decode on `int` (`_index_function`): 2^30 leaves room for the tile
# past the end that guarded loads compute indices for.
INT_INDEX_LIMIT = 1 << 30


def _index_function(kernel: str, name: str, dims: tuple[GemmDim, ...], operand: str,
                    narrow: bool = False) -> str:
    """`long {kernel}_{name}(long idx)`: the element offset of flat index `idx` of `dims`.
    Loops that continue one another in this operand (a position's p and q in an image's rows)
    are one index: no division between them. `narrow`: the divisions left run on `int` (where
    the flat indices, and a tile past their end, fit 31 bits): a 64-bit division by a constant
    is a long sequence on a GPU."""
    runs = operand_runs(dims, operand)
    narrow = narrow and len(runs) > 1 and math.prod(e for e, _ in runs) < INT_INDEX_LIMIT
    var, suffix = ("i", "") if narrow else ("idx", "L")
    terms, inner = [], 1
    for position, (extent, stride) in enumerate(reversed(runs)):
        rel = f"({var} / {inner}{suffix})" if inner != 1 else var
        if position != len(runs) - 1:
            rel = f"({rel} % {extent}{suffix})"
        if stride:
            terms.append(f"(long){rel} * {stride}L" if narrow else f"{rel} * {stride}L")
        inner *= extent
    body = " + ".join(reversed(terms)) or "0L"
    start = "const int i = (int)idx; " if narrow and terms else ""
    return (
        f"static __device__ __forceinline__ long {kernel}_{name}(long idx) "
        f"{{ (void)idx; {start}return {body}; }}"
    )


def _wgmma_function(kernel: str, bn: int, b_transposed: bool = True, tf32: bool = False) -> str:
    """`{kernel}_wgmma(acc, da, db)`: acc += A(64x16) * B(16xBN) (bf16), or A(64x8) * B(8xBN)
    (float32 read as TF32), both from shared memory; A K-major, B N-major (`b_transposed`, bf16
    only) or K-major."""
    n = bn // 2
    regs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n))
    shape = f"m64n{bn}k8.f32.tf32.tf32" if tf32 else f"m64n{bn}k16.f32.bf16.bf16"
    layout = "" if tf32 else f", 0, {int(b_transposed)}"  # TF32 takes no transposes
    return (
        f"static __device__ __forceinline__ void {kernel}_wgmma(float *d, uint64_t da, uint64_t db) {{\n"
        f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n + 2}, 0;\\n"\n'
        f'    "wgmma.mma_async.sync.aligned.{shape} {{{regs}}}, %{n}, %{n + 1}, p, 1, 1{layout};\\n}}\\n"\n'
        f'    : {outs}\n'
        f'    : "l"(da), "l"(db), "r"(1));\n'
        "}"
    )


def _store(g: GemmPlan, kernel: str, value: str) -> tuple[str, list[str]]:
    """The statement that stores accumulator `value` into `*cell` (at flat indices m, n and
    batch z), applying the fused epilogue; and the operands' index functions it calls."""
    if g.tiling.splits > 1:  # K slices of one tile meet in C (no epilogue: see gpu_epilogues)
        return f"atomicAdd(cell, {value});", []
    lines, funcs = _cell_value(g, kernel, value, "pd_v", "n", "*cell")
    bf16 = g.dtype_c == "bfloat16"
    lines.append("*cell = _pd_f32_to_bf16(pd_v);" if bf16 else "*cell = pd_v;")
    return "{ " + " ".join(lines) + " }", funcs


def _cell_value(g: GemmPlan, kernel: str, value: str, var: str, n: str,
                stored: str) -> tuple[list[str], list[str]]:
    """Lines computing `var`, the final value of the C cell at column `n` whose stored value
    is `stored` and whose accumulator is `value`; and the operands' index functions."""
    bf16 = g.dtype_c == "bfloat16"
    load = "_pd_bf16_to_f32" if bf16 else ""
    e = g.epilogue
    if e is None:
        return [f"const float {var} = {load}({stored}) + {value};"], []
    funcs = []
    for i, o in enumerate(e.operands):
        for label, dims in (("m", g.m), ("n", g.n), ("z", g.batch)):
            moved = tuple(replace(d, stride_c=o.stride(d.var)) for d in dims)
            funcs.append(_index_function(kernel, f"e{i}{label}", moved, "c"))

    def operand(i: int) -> str:
        o = e.operands[i]
        return (f"{load}({o.array}[{o.base}L + {kernel}_e{i}m(m) + {kernel}_e{i}n({n}) + "
                f"{kernel}_e{i}z(z)])")

    start = f"{load}({stored})" if e.initial is None else scalar_expr(e.initial, "", operand, "float")
    lines = [f"float {var} = {start} + {value};"]
    lines += [f"{var} = {scalar_expr(step, var, operand, 'float')};" for step in e.steps]
    return lines, funcs


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


def pair_stores(g: GemmPlan) -> bool:
    """Whether columns n and n + 1 (n even) of C are adjacent cells of one aligned pair: the
    kernels then store (and read) C two cells at a time."""
    return g.tiling.splits == 1 and contiguous_runs(g, "c", "n", 2)


def staged_stores(g: GemmPlan) -> bool:
    """Whether the TMA kernel stores C through shared memory in runs of 4 cells: a bf16 C of
    a GEMM over strided matrices, its rows contiguous along n in aligned runs, its start value
    not read from C unless C is plain `C += A B` (added in the run). Measured on an H100: bf16
    C = A B at 4096^3 0.88 -> 0.96x cuBLAS; an fp32 C (0.87 -> 0.75x) and the convolution
    windows (3x3 layers 0.8-1.0 -> 0.65-0.7x) store faster in pairs straight from registers."""
    if g.tiling.kind != "tma" or g.tiling.splits > 1 or g.dtype_c != "bfloat16":
        return False
    if g.tma is None or not isinstance(g.tma.a, TensorMap):
        return False
    if g.epilogue is not None and g.epilogue.initial is None:
        return False
    return contiguous_runs(g, "c", "n", 4)


def staged_width(g: GemmPlan) -> int:
    """Cells of C one thread stores at a time from the staged tile: 8 bf16 (16 bytes) where C
    runs in aligned eights along n, else 4."""
    return 8 if g.dtype_c == "bfloat16" and contiguous_runs(g, "c", "n", 8) else 4


def _staged_code(g: GemmPlan, kernel: str) -> tuple[str, str]:
    """(the lines computing the final pd_v0, pd_v1 of a pair, the statement storing the float4s
    `v` (and `w`, for 8 cells) into the run of cells at `cell`)."""
    if g.epilogue is None:
        values = "const float pd_v0 = value0, pd_v1 = value1;"
    else:
        lines0, _ = _cell_value(g, kernel, "value0", "pd_v0", "n", "0")
        lines1, _ = _cell_value(g, kernel, "value1", "pd_v1", "n + 1", "0")
        values = " ".join(lines0 + lines1)
    add = g.epilogue is None  # C += A B: the stored run is read and added
    if g.dtype_c == "bfloat16":
        cells = ["v.x", "v.y", "v.z", "v.w"] + (["w.x", "w.y", "w.z", "w.w"] if staged_width(g) == 8 else [])
        words = ("x", "y", "z", "w")[:len(cells) // 2]
        vector = "uint4" if len(cells) == 8 else "uint2"
        old = ""
        if add:
            old = f"const {vector} o = *(const {vector} *)cell; "
            cells = [f"{c} + _pd_bf16_to_f32((uint16_t)(o.{words[i // 2]}{' >> 16' if i % 2 else ' & 0xffffu'}))"
                     for i, c in enumerate(cells)]
        packed = " ".join(f"q.{word} = _pd_pack_bf16x2({cells[2 * i]}, {cells[2 * i + 1]});"
                          for i, word in enumerate(words))
        store = f"{{ {old}{vector} q; {packed} *({vector} *)cell = q; }}"
    elif add:
        store = ("{ float4 o = *(const float4 *)cell; o.x += v.x; o.y += v.y; o.z += v.z; o.w += v.w; "
                 "*(float4 *)cell = o; }")
    else:
        store = "*(float4 *)cell = v;"
    return values, store


def _store_four(g: GemmPlan, kernel: str, along: str) -> str:
    """The statement storing float accumulators `value0`..`value3` into the aligned run of 4
    float cells at `cell`, the fused epilogue applied to each: along "n", columns n..n+3 of row
    m; along "m", rows `pd_m`..`pd_m` + 3 of column n (each value's epilogue at its own m).
    K slices of one tile add their values into the run (one vector atomic on Hopper)."""
    if g.tiling.splits > 1:  # no epilogue on a split GEMM (see gpu_epilogues)
        return "PD_ATOMIC_ADD4(cell, value0, value1, value2, value3);"
    if g.epilogue is None or g.epilogue.initial is None:  # C's stored run is read once
        read = ["const float4 pd_old = *(const float4 *)cell;"]
        olds = ("pd_old.x", "pd_old.y", "pd_old.z", "pd_old.w")
    else:
        read, olds = [], ("0", "0", "0", "0")
    name = "pd_v" if along == "n" else "pd_q"
    lines = [] if along == "n" else [f"float {name}0, {name}1, {name}2, {name}3;"]
    for i in range(4):
        if along == "n":
            lines += _cell_value(g, kernel, f"value{i}", f"{name}{i}", f"n + {i}" if i else "n", olds[i])[0]
        else:
            value = _cell_value(g, kernel, f"value{i}", "pd_v", "n", olds[i])[0]
            lines.append(f"{{ const long m = pd_m + {i}; (void)m; {' '.join(value)} {name}{i} = pd_v; }}")
    write = f"*(float4 *)cell = make_float4({name}0, {name}1, {name}2, {name}3);"
    return "{ " + " ".join(read + lines + [write]) + " }"


def _store_pair(g: GemmPlan, kernel: str) -> tuple[str, list[str]]:
    """The statement storing accumulators `value0`, `value1` into the pair at `cell`."""
    bf16 = g.dtype_c == "bfloat16"
    if g.epilogue is None or g.epilogue.initial is None:  # C's stored pair is read once
        read = (["const unsigned pd_old = *(const unsigned *)cell;"] if bf16
                else ["const float2 pd_old = *(const float2 *)cell;"])
        olds = ("(uint16_t)(pd_old & 0xffffu)", "(uint16_t)(pd_old >> 16)") if bf16 else ("pd_old.x", "pd_old.y")
    else:
        read, olds = [], ("0", "0")
    lines0, funcs = _cell_value(g, kernel, "value0", "pd_v0", "n", olds[0])
    lines1, _ = _cell_value(g, kernel, "value1", "pd_v1", "n + 1", olds[1])
    if bf16:
        write = "*(unsigned *)cell = _pd_pack_bf16x2(pd_v0, pd_v1);"
    else:
        write = "*(float2 *)cell = make_float2(pd_v0, pd_v1);"
    return "{ " + " ".join(read + lines0 + lines1 + [write]) + " }", funcs


@dataclass(frozen=True)
class KernelLaunch:
    """A kernel's text and how the launcher starts it."""

    text: str
    grid: tuple[str, ...]  # C expressions
    block: int
    shared_bytes: int
    setup: tuple[str, ...] = ()  # launcher lines before the launch
    extra_args: tuple[str, ...] = ()  # arguments after the arrays
    alignment: int = 1  # bytes the operands' device addresses must be a multiple of
    # the whole L1 as shared memory, for several blocks' worth of it on a multiprocessor
    shared_carveout: bool = False


def _tma_coordinates(view: TensorMap, n_offset: str) -> str:
    """The box coordinates (innermost first) of one K step of the current tile."""
    spell = {"k": "kt * BK", "m": "(int)(tm * BM)", "n": f"(int)(tn * BN{n_offset})"}
    return ", ".join(spell.get(role, f"(int){role}") for role in view.roles)  # batch: z_<loop>


def _tma_setup(kernel: str, name: str, view: TensorMap | WindowMap, base: str, float32: bool) -> list[str]:
    """Launcher lines giving the tensor map `{kernel}_{name}` of the operand at `base`. The map
    depends on nothing else, so each thread keeps the last one it encoded and encodes again only
    for another address (encoding costs about as much host time as the launch)."""
    values = lambda xs: ", ".join(f"{x}u" for x in xs)  # noqa: E731
    return [
        f"CUtensorMap {kernel}_{name};",
        "{",
        "  static thread_local CUtensorMap encoded;",
        "  static thread_local const void *encoded_base = 0;",
        f"  const void *base = (const void *)({base});",
        "  if (base != encoded_base) {",
        f"    const cuuint64_t extents[] = {{{values(view.extents)}}};",
        f"    const cuuint64_t strides[] = {{{values(view.strides)}}};",
        f"    const cuuint32_t box[] = {{{values(view.box)}}};",
        f"    const cuuint32_t steps[] = {{{values(view.element_strides)}}};",
        f"    status = pd_tensor_map(&encoded, base, {view.rank}, extents, strides, box, steps, "
        f"CU_TENSOR_MAP_DATA_TYPE_{'FLOAT32' if float32 else 'BFLOAT16'});",
        "    if (status != pdSuccess) return (int)status;",
        "    encoded_base = base;",
        "  }",
        f"  {kernel}_{name} = encoded;",
        "}",
    ]


def _window_code(g: GemmPlan, window: WindowMap, lines: list[str]) -> tuple[str, str, str, str]:
    """The TMA kernel's pieces for an A read as a window (a channels-last convolution):
    (the M tile count, the lines giving each K loop's value at step kt, the box coordinates,
    the lines mapping a tile row to the flat m or skipping it); `lines` (the tile
    coordinates) gain each M loop's tile index."""
    tile = dict(window.tile_m)
    counts = window.tile_counts(g)
    inner = 1
    for d in reversed(g.m):  # tm = (.. * tiles of p + tile of p) * tiles of q + tile of q
        lines.append(f"const long t_{d.var} = tm / {inner}L % {counts[d.var]}L;")
        inner *= counts[d.var]
    channels = g.k[-1]
    steps = {channels.var: channels.extent // window.box[0]}
    step_lines = [f"const int k_{channels.var} = kt % {steps[channels.var]} * BK;"]
    inner = steps[channels.var]
    for d in reversed(g.k[:-1]):  # the taps, outer loops slower
        step_lines.append(f"const int k_{d.var} = kt / {inner} % {d.extent};")
        inner *= d.extent
    coords = []
    offsets = window.offsets or (0,) * window.rank
    for axis, box, offset in zip(window.axes, window.box, offsets, strict=True):
        terms = ([f"(int)(t_{axis.m} * {box})"] if axis.m else []) + ([f"k_{axis.k}"] if axis.k else [])
        text = " + ".join(terms) or "0"
        coords.append(f"{text} {'-' if offset < 0 else '+'} {abs(offset)}" if offset else text)
    rows = []
    inner = 1
    for d in reversed(g.m):  # a tile row walks the innermost M loop fastest
        n = tile[d.var]
        rows.append(f"const long m_{d.var} = t_{d.var} * {n}L + row / {inner} % {n};")
        inner *= n
    rows.append("if (" + " || ".join(f"m_{d.var} >= {d.extent}L" for d in g.m if tile[d.var] > 1) + ") continue;")
    flat = f"m_{g.m[0].var}"
    for d in g.m[1:]:
        flat = f"({flat}) * {d.extent}L + m_{d.var}"
    rows.append(f"const long m = {flat};")
    tiles_m = f"{math.prod(counts.values())}L"
    return tiles_m, "\n".join(step_lines), ", ".join(coords), "\n".join(rows)


def _tma_kernel(values: dict[str, object], g: GemmPlan, kernel: str) -> KernelLaunch:
    t, tma = g.tiling, g.tma
    assert tma is not None
    transposed = tma.b_major == "n"
    tf32 = g.dtype_ab == "float32"
    # Divisions by constants are multiplications; the one by a group's rows (fewer in the
    # last group) is on 32 bits, and by GROUP_M (a shift) in every other group.
    lines = [
        "const long z = tile / (TILES_M * TILES_N), rest = tile % (TILES_M * TILES_N);",
        "const long first_m = rest / (GROUP_M * TILES_N) * GROUP_M;",
        "const int in_group = (int)(rest % (GROUP_M * TILES_N));",
        "const int rows = TILES_M - first_m < GROUP_M ? (int)(TILES_M - first_m) : GROUP_M;",
        "const long tm = first_m + (rows == GROUP_M ? in_group % GROUP_M : in_group % rows);",
        "const long tn = rows == GROUP_M ? in_group / GROUP_M : in_group / rows;",
    ]
    inner = 1
    for d in reversed(g.batch):  # the batch loops' coordinates, innermost fastest
        lines.append(f"const long z_{d.var} = z / {inner}L % {d.extent}L;")
        inner *= d.extent
    lines.append("(void)z; (void)rows;")
    window = tma.a if isinstance(tma.a, WindowMap) else None
    tiles_m = "(SIZE_M + BM - 1) / BM"
    a_step_lines = ""
    row_to_m = "const long m = tm * BM + row;\nif (m >= SIZE_M) continue;"
    coords_a = _tma_coordinates(tma.a, "") if isinstance(tma.a, TensorMap) else ""
    if window is not None:
        tiles_m, a_step_lines, coords_a, row_to_m = _window_code(g, window, lines)
    (lbo_a, sbo_a) = WGMMA_STRIDES["a"]
    lbo_b, sbo_b = (t.block_k * 128, 1024) if transposed else WGMMA_STRIDES["a"]
    producer, consumer = tma_registers(t)
    text = render(
        "gpu/gemm_tma.j2",
        **{**values, "index_functions": f"{values['index_functions']}\n"
           + _wgmma_function(kernel, t.block_n, transposed, tf32)},
        mma_k=8 if tf32 else 16,
        stages=t.stages, batch=GemmPlan.size(g.batch),
        b_boxes=t.block_n // 64 if transposed else 1,
        tile_coordinates="\n".join(lines),
        coords_a=coords_a, coords_b=_tma_coordinates(tma.b, " + j * 64" if transposed else ""),
        tiles_m=tiles_m, a_step_lines=a_step_lines, row_to_m=row_to_m,
        rank_a=tma.a.rank, rank_b=tma.b.rank,
        b_step="kk * 64" if transposed else "kk",
        lbo_a=lbo_a, sbo_a=sbo_a, lbo_b=lbo_b, sbo_b=sbo_b,
        blocks_per_sm=t.blocks_per_sm, producer_registers=producer, consumer_registers=consumer,
    )
    source = g.copy_source.source if g.copy_source is not None else None
    m_tiles = (math.prod(window.tile_counts(g).values()) if window is not None
               else math.ceil(GemmPlan.size(g.m) / t.block_m))
    tiles = m_tiles * math.ceil(GemmPlan.size(g.n) / t.block_n) * GemmPlan.size(g.batch)
    setup = [
        *_tma_setup(kernel, "a", tma.a, source or f"{g.a.array} + {g.base_a}L", tf32),
        *_tma_setup(kernel, "b", tma.b, f"{g.b.array} + {g.base_b}L", tf32),
        "int pd_sms = 0;",
        "status = pd_multiprocessors(&pd_sms);",
        "if (status != pdSuccess) return (int)status;",
    ]
    slots = f"pd_sms * {t.blocks_per_sm}" if t.blocks_per_sm > 1 else "pd_sms"
    return KernelLaunch(text, (f"{slots} < {tiles} ? {slots} : {tiles}",), t.threads, t.shared_bytes,
                        tuple(setup), (f"{kernel}_a", f"{kernel}_b"), alignment=16,
                        shared_carveout=t.blocks_per_sm > 1)


def _gemm_kernel(
    model: PolyModel, plan: GpuKernelPlan, kernel: str, device: GpuTarget
) -> KernelLaunch:
    g: GemmPlan = plan.gemm  # type: ignore[assignment]
    t = g.tiling
    funcs = [
        _index_function(kernel, "am", g.m, "a"),
        # decoded on every load of a tile (a gathered window's (c, r, s)): on `int`; the same
        # for every index function took the 1 x 1 layers and a batched GEMM to 0.6x
        _index_function(kernel, "ak", g.k, "a", narrow=True),
        _index_function(kernel, "az", g.batch, "a"),
        _index_function(kernel, "bn", g.n, "b"),
        _index_function(kernel, "bk", g.k, "b", narrow=True),
        _index_function(kernel, "bz", g.batch, "b"),
        _index_function(kernel, "cm", g.m, "c"),
        _index_function(kernel, "cn", g.n, "c"),
        _index_function(kernel, "cz", g.batch, "c"),
    ]
    a_mode, b_mode = operand_modes(g)
    dtype_c = g.dtype_c
    c_type = "uint16_t" if dtype_c == "bfloat16" else "float"
    ab_type = "uint16_t" if g.dtype_ab == "bfloat16" else "float"
    convert = "_pd_bf16_to_f32" if g.dtype_ab == "bfloat16" else ""
    value = "acc[i][j]" if t.kind == "fma" else "value"
    store_c, operand_funcs = _store(g, kernel, value)
    funcs += operand_funcs
    pairs = t.kind in ("tma", "wgmma") and pair_stores(g)
    store_pair = _store_pair(g, kernel)[0] if pairs else ""
    staged = staged_stores(g)
    stage_pair, store_run = _staged_code(g, kernel) if staged else ("", "")
    values = dict(
        kernel=kernel,
        index_functions="\n".join(funcs),
        params=_kernel_parameters(model),
        bm=t.block_m, bn=t.block_n, bk=t.block_k, threads=t.threads,
        size_m=GemmPlan.size(g.m), size_n=GemmPlan.size(g.n), size_k=GemmPlan.size(g.k),
        a_name=g.a.array, b_name=g.b.array, c_name=g.c.array,
        base_a=g.base_a, base_b=g.base_b, base_c=g.base_c,
        a_mode=a_mode, b_mode=b_mode, c_type=c_type, ab_type=ab_type, store_c=store_c,
        store_pair=store_pair, staged=staged, stage_pair=stage_pair, store_run=store_run,
        run=staged_width(g) if staged else 4,
        load_a=f"{convert}(a_base[a_row[i] + {kernel}_ak(kk)])",
        load_b=f"{convert}(b_base[b_col[i] + {kernel}_bk(kk)])",
        splits=t.splits,
    )
    if t.kind == "tma":
        return _tma_kernel(values, g, kernel)
    vector_copies = t.kind == "wgmma"  # 16-byte cp.async of the operands
    if t.kind == "wgmma":
        b_major = wgmma_b_major(g)
        (lbo_a, sbo_a) = WGMMA_STRIDES["a"]
        # B K-major sits in shared memory as A does: a 128-byte row of K per n
        lbo_b, sbo_b = WGMMA_STRIDES["b"] if b_major == "n" else WGMMA_STRIDES["a"]
        text = render(
            "gpu/gemm_wgmma.j2", **{**values, "index_functions": f"{values['index_functions']}\n"
                                    + _wgmma_function(kernel, t.block_n, b_major == "n")},
            stages=t.stages, lbo_a=lbo_a, sbo_a=sbo_a, lbo_b=lbo_b, sbo_b=sbo_b, b_major=b_major,
            b_step="kk * 64" if b_major == "n" else "kk",
        )
    elif t.kind == "mma":
        vec_a, vec_b = mma_vectors(g)
        vector_copies = 8 in (vec_a, vec_b)
        if (vec_a, vec_b) != (8, 8):
            t = replace(t, stages=2)  # an operand staged in registers: two buffers
        text = render(
            "gpu/gemm_mma.j2", **values, vec_a=vec_a, vec_b=vec_b, warps_m=t.warps_m,
            warps_n=t.warps_n, stages=t.stages,
        )
    else:
        a_along, b_along = fma_vectors(g)
        vec_a, vec_b = 4 if a_along else 1, 4 if b_along else 1
        vector_copies = 4 in (vec_a, vec_b)
        # 16-byte stores of C where its rows run in aligned fours (the operands' float4 loads
        # already ask for 16-byte aligned arrays): 0.88 -> 0.91 of cuBLAS at 4096^3
        quads = vector_copies and g.dtype_c == "float32" and contiguous_runs(g, "c", "n", 4)
        warp_tiles = (t.thread_m, t.thread_n) == WARP_THREAD_TILE
        # C running along M (an NCHW output: its columns are channels P * Q apart): a warp's
        # lanes go along M, so each store instruction writes neighbouring cells, 16 bytes a
        # thread where the operands' float4s already ask for aligned arrays
        lanes_m = not warp_tiles and contiguous_runs(g, "c", "m", 4)
        rows_four = lanes_m and vector_copies and g.dtype_c == "float32"
        text = render("gpu/gemm_fma.j2", **values, vec_a=vec_a, vec_b=vec_b, a_along=a_along, b_along=b_along,
                      min_blocks=t.blocks_per_sm,
                      thread_m=t.thread_m, thread_n=t.thread_n, warp_tiles=warp_tiles, lanes_m=lanes_m,
                      store_four=_store_four(g, kernel, "n") if quads else "",
                      store_rows_four=_store_four(g, kernel, "m") if rows_four else "")
    grid = (
        math.ceil(GemmPlan.size(g.n) / t.block_n),
        math.ceil(GemmPlan.size(g.m) / t.block_m),
        GemmPlan.size(g.batch) * t.splits,
    )
    return KernelLaunch(text, tuple(map(str, grid)), t.threads, 0 if t.kind == "fma" else t.shared_bytes,
                      alignment=16 if vector_copies else 1)


# ----------------------------------------------------------------------------- the unit


def _arrays_read(schedule: GpuSchedule) -> set[str]:
    """The arrays the launches touch (a TMA window over a copy reads the copy's source)."""
    out: set[str] = set()
    for plan in schedule.kernels:
        arrays = {acc.access.array for s in plan.statements for acc in s.accesses}
        g = plan.gemm
        window = g.copy_source if g is not None else None
        if g is not None and window is not None and window.source is not None:
            arrays = (arrays - {g.a.array}) | {window.source}
        out |= arrays
    return out


def generate_gpu(model: PolyModel, schedule: GpuSchedule) -> GeneratedCode:
    model = schedule.model or model  # a staged nest's kernels read its copies
    device = schedule.device
    target = device.kind
    name = model.nest.name
    arguments = kernel_arguments_of(model)
    layouts = {
        a.name: ArrayLayout(a.name, a.dtype, a.concrete_shape(model.params))
        for a in model.nest.arrays
    }
    printer = StatementPrinter(layouts)
    kernels, launches = [], []
    alignment = 1
    kinds = {p.gemm.tiling.kind for p in schedule.kernels if p.gemm is not None}
    all_arrays = [a.name for a in model.nest.arrays]
    for plan in schedule.kernels:
        kernel = f"{name}_{plan.name}"
        if plan.gemm is not None:
            launch = _gemm_kernel(model, plan, kernel, device)
        elif plan.transpose is not None:
            launch = _transpose_kernel(model, plan, kernel, printer)
        else:
            text, total = _plain_kernel(model, plan, kernel, printer)
            launch = KernelLaunch(text, (str(max(1, min(math.ceil(total / plan.block), MAX_GRID_X))),),
                                plan.block, 0)
        kernels.append(launch.text)
        alignment = max(alignment, launch.alignment)
        launches.append({"kernel": kernel, "grid": list(launch.grid), "block": launch.block,
                         "args": all_arrays + list(launch.extra_args), "smem": launch.shared_bytes,
                         "setup": list(launch.setup), "carveout": launch.shared_carveout})
    suffix = SOURCE_SUFFIX[target]
    parameters = device_parameters(arguments)
    values = dict(
        name=name, version=__version__, origin=model.nest.filename, target=target,
        suffix=suffix, schedule=schedule.describe(),
    )
    source = render(
        "gpu/kernels.j2",
        **values,
        dialect=render(f"gpu/dialect_{target}.j2"),
        size_params=[{"name": p, "value": v} for p, v in model.params.items()],
        kernels=kernels,
    )
    used = _arrays_read(schedule)
    scratch = [
        {"name": a.name, "c_type": layouts[a.name].c_type, "count": math.prod(layouts[a.name].shape)}
        for a in model.nest.locals if a.name in used
    ]
    unused = [f"{layouts[a.name].c_type} *{a.name} = 0;  /* no launch reads it */"
              for a in model.nest.locals if a.name not in used]
    launcher = render(
        "gpu/launcher.j2",
        **values,
        kernels_file=f"{name}{suffix}",
        parameters=parameters,
        locals=scratch,
        unused_locals=unused,
        scratch_parameters=[f"{a['c_type']} *{a['name']}" for a in scratch],
        argument_names=[a.name for a in arguments],
        local_names=[a["name"] for a in scratch],
        launches=launches,
        tma="tma" in kinds,
    )
    header = render("gpu/header.j2", **values, arguments=arguments, parameters=parameters)
    hopper = bool(kinds & {"wgmma", "tma"})
    return GeneratedCode(
        function=name,
        arguments=arguments,
        source=source,
        header=header,
        target=target,
        # wgmma exists only in the architecture-specific sm_90a
        compile_flags=("-gencode=arch=compute_90a,code=sm_90a",) if hopper
        else architecture_flags(target, device.architectures),
        launcher=launcher,
        pointer_alignment=alignment,
    )


def architecture_flags(kind: str, architectures: tuple[str, ...]) -> tuple[str, ...]:
    """The compiler flags that build for `architectures` (sm_90, gfx90a, ...)."""
    if kind == "cuda":
        return tuple(f"-gencode=arch=compute_{a[3:]},code={a}" for a in architectures)
    return tuple(f"--offload-arch={a}" for a in architectures)


def kernel_arguments_of(model: PolyModel) -> tuple[KernelArgument, ...]:
    return tuple(
        KernelArgument(a.name, a.dtype, a.concrete_shape(model.params), a.is_input, DTYPES[a.dtype].c_type)
        for a in model.nest.parameters
    )
