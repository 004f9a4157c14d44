"""The CUDA and HIP targets: a `GpuSchedule` becomes device kernels, a host launcher and a header.

Takes a `PolyModel` and its `GpuSchedule`; returns `GeneratedCode` whose `source` holds the
kernels, `launcher` the host function `NAME(device pointers..., stream)` that launches them in
order, and `header` its declaration. Both dialects render the same templates; what differs
(runtime API names, headers, tensor-core availability) lives in `templates/gpu/dialect_*.j2`.

A plain statement becomes a kernel whose threads enumerate its thread loops (flattened, the
innermost fastest so neighbouring threads touch neighbouring cells) and run the rest of its
loops and guards sequentially; a GEMM statement becomes the block-tiled implicit GEMM of
`gemm_wgmma.j2` (Hopper warpgroup MMA, bf16, contiguous operands; built for sm_90a),
`gemm_mma.j2` (warp-level mma.sync, bf16) or `gemm_fma.j2` (FMA).
"""

from __future__ import annotations

import math
from dataclasses import replace

from polydl.codegen.artifact import GeneratedCode, KernelArgument
from polydl.codegen.c_expr import ArrayLayout, StatementPrinter
from polydl.codegen.templating import render
from polydl.dtypes import DTYPES
from polydl.ir import Condition, Guard, Loop
from polydl.poly.model import PolyModel
from polydl.schedules.gpu import (
    WGMMA_STRIDES,
    GemmDim,
    GemmPlan,
    GpuKernelPlan,
    GpuSchedule,
    vector_operands,
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
    openers: list[str] = []
    for node in plan.enclosing:
        if isinstance(node, Loop) and node.var not in mapped:
            openers.append(
                f"for (long {node.var} = {node.lower.to_c()}; {node.var} < {node.upper.to_c()}; "
                f"{node.var} += {node.step}) {{"
            )
        elif isinstance(node, Guard):
            conds = " && ".join(f"({_condition(c)})" for c in node.conditions) or "1"
            openers.append(f"if ({conds}) {{")
    inner = [f"_pd_acc += {printer.expr(stmt.value)};"] if plan.register_accumulator else [
        printer.statement(stmt)
    ]
    nested = _nest(openers, inner)
    if plan.register_accumulator:
        nested = ["{", f"  {printer.ctype} _pd_acc = 0;", *("  " + x for x in nested),
                  "  " + _accumulate(printer, stmt.target, stmt.op), "}"]
    lines += ["    " + x for x in nested]
    lines += ["  }", "}"]
    return "\n".join(lines), total


def _nest(openers: list[str], body: list[str]) -> list[str]:
    if not openers:
        return body
    return [openers[0], *("  " + x for x in _nest(openers[1:], body)), "}"]


def _accumulate(printer: StatementPrinter, target, op: str) -> str:  # type: ignore[no-untyped-def]
    cell = printer.element(target)
    if printer.layouts[target.array].dtype == "bfloat16":
        return f"{cell} = _pd_f32_to_bf16({printer.load(target)} {op[0]} _pd_acc);"
    return f"{cell} {op} _pd_acc;"


# ----------------------------------------------------------------------------- GEMM statements


def _index_function(kernel: str, name: str, dims: tuple[GemmDim, ...], operand: str) -> str:
    """`long {kernel}_{name}(long idx)`: the element offset of flat index `idx` of `dims`."""
    terms, inner = [], 1
    for d in reversed(dims):
        stride = {"a": d.stride_a, "b": d.stride_b, "c": d.stride_c}[operand]
        rel = f"(idx / {inner}L)" if inner != 1 else "idx"
        if d is not dims[0]:
            rel = f"({rel} % {d.extent}L)"
        if stride:
            terms.append(f"{rel} * {stride}L")
        inner *= d.extent
    body = " + ".join(reversed(terms)) or "0L"
    return (
        f"static __device__ __forceinline__ long {kernel}_{name}(long idx) "
        f"{{ (void)idx; return {body}; }}"
    )


def _wgmma_function(kernel: str, bn: int) -> str:
    """`{kernel}_wgmma(acc, da, db)`: acc += A(64x16) * B(16xBN), both from shared memory."""
    n = bn // 2
    regs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n))
    return (
        f"static __device__ __forceinline__ void {kernel}_wgmma(float *d, uint64_t da, uint64_t db) {{\n"
        f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n + 2}, 0;\\n"\n'
        f'    "wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.bf16.bf16 {{{regs}}}, %{n}, %{n + 1}, p, 1, 1, 0, 1;\\n}}\\n"\n'
        f'    : {outs}\n'
        f'    : "l"(da), "l"(db), "r"(1));\n'
        "}"
    )


def _gemm_kernel(
    model: PolyModel, plan: GpuKernelPlan, kernel: str, device: GpuTarget
) -> tuple[str, tuple[int, int, int], int, int]:
    g: GemmPlan = plan.gemm  # type: ignore[assignment]
    t = g.tiling
    funcs = [
        _index_function(kernel, "am", g.m, "a"),
        _index_function(kernel, "ak", g.k, "a"),
        _index_function(kernel, "az", g.batch, "a"),
        _index_function(kernel, "bn", g.n, "b"),
        _index_function(kernel, "bk", g.k, "b"),
        _index_function(kernel, "bz", g.batch, "b"),
        _index_function(kernel, "cm", g.m, "c"),
        _index_function(kernel, "cn", g.n, "c"),
        _index_function(kernel, "cz", g.batch, "c"),
    ]
    a_mode = "m" if g.m[-1].stride_a == 1 and g.k[-1].stride_a != 1 else "k"
    b_mode = "k" if g.k[-1].stride_b == 1 and g.n[-1].stride_b != 1 else "n"
    dtype_c = g.dtype_c
    c_type = "uint16_t" if dtype_c == "bfloat16" else "float"
    ab_type = "uint16_t" if g.dtype_ab == "bfloat16" else "float"
    convert = "_pd_bf16_to_f32" if g.dtype_ab == "bfloat16" else ""
    value = "acc[i][j]" if t.kind == "fma" else "value"
    if t.splits > 1:  # K slices of one tile meet in C
        store_c = f"atomicAdd(cell, {value});"
    elif dtype_c == "bfloat16":
        store_c = f"*cell = _pd_f32_to_bf16(_pd_bf16_to_f32(*cell) + {value});"
    else:
        store_c = f"*cell += {value};"
    values = dict(
        kernel=kernel,
        index_functions="\n".join(funcs),
        params=_kernel_parameters(model),
        bm=t.block_m, bn=t.block_n, bk=t.block_k, threads=t.threads,
        size_m=GemmPlan.size(g.m), size_n=GemmPlan.size(g.n), size_k=GemmPlan.size(g.k),
        a_name=g.a.array, b_name=g.b.array, c_name=g.c.array,
        base_a=g.base_a, base_b=g.base_b, base_c=g.base_c,
        a_mode=a_mode, b_mode=b_mode, c_type=c_type, ab_type=ab_type, store_c=store_c,
        load_a=f"{convert}(a_base[a_row[i] + {kernel}_ak(kk)])",
        load_b=f"{convert}(b_base[b_col[i] + {kernel}_bk(kk)])",
        splits=t.splits,
    )
    if t.kind == "wgmma":
        (lbo_a, sbo_a), (lbo_b, sbo_b) = WGMMA_STRIDES["a"], WGMMA_STRIDES["b"]
        text = render(
            "gpu/gemm_wgmma.j2", **{**values, "index_functions": values["index_functions"] + "\n"
                                    + _wgmma_function(kernel, t.block_n)},
            stages=t.stages, lbo_a=lbo_a, sbo_a=sbo_a, lbo_b=lbo_b, sbo_b=sbo_b,
        )
    elif t.kind == "mma":
        vec = 8 if a_mode == "k" and b_mode == "n" and vector_operands(g) else 1
        if vec != 8:
            t = replace(t, stages=2)  # the register-staged path double-buffers
        text = render(
            "gpu/gemm_mma.j2", **values, vec=vec, warps_m=t.warps_m, warps_n=t.warps_n,
            stages=t.stages,
        )
    else:
        text = render("gpu/gemm_fma.j2", **values)
    grid = (
        math.ceil(GemmPlan.size(g.n) / t.block_n),
        math.ceil(GemmPlan.size(g.m) / t.block_m),
        GemmPlan.size(g.batch) * t.splits,
    )
    return text, grid, t.threads, 0 if t.kind == "fma" else t.shared_bytes


# ----------------------------------------------------------------------------- the unit


def generate_gpu(model: PolyModel, schedule: GpuSchedule) -> GeneratedCode:
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
    all_arrays = [a.name for a in model.nest.arrays]
    for plan in schedule.kernels:
        kernel = f"{name}_{plan.name}"
        if plan.gemm is not None:
            text, grid, block, smem = _gemm_kernel(model, plan, kernel, device)
            grid_dims = [str(g) for g in grid]
        else:
            text, total = _plain_kernel(model, plan, kernel, printer)
            smem = 0
            block = plan.block
            grid_dims = [str(max(1, min(math.ceil(total / block), MAX_GRID_X)))]
        kernels.append(text)
        launches.append({"kernel": kernel, "grid": grid_dims, "block": block, "args": all_arrays,
                         "smem": smem})
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
    launcher = render(
        "gpu/launcher.j2",
        **values,
        kernels_file=f"{name}{suffix}",
        parameters=parameters,
        locals=[
            {"name": a.name, "c_type": layouts[a.name].c_type, "count": math.prod(layouts[a.name].shape)}
            for a in model.nest.locals
        ],
        launches=launches,
    )
    header = render("gpu/header.j2", **values, arguments=arguments, parameters=parameters)
    hopper = any(p.gemm is not None and p.gemm.tiling.kind == "wgmma" for p in schedule.kernels)
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
