"""The CUDA and HIP targets: a `GpuSchedule` becomes device kernels, a host launcher and a header.

Takes a `PolyModel` and its `GpuSchedule`; returns `GeneratedCode` whose `source` holds the
kernels, `launcher` the host function `NAME(device pointers..., stream)` that launches them in
order, and `header` its declaration. Both dialects render the same templates; what differs
(runtime API names, headers, tensor-core availability) lives in `templates/gpu/dialect_*.j2`.

A plain statement becomes a kernel whose threads enumerate its thread loops
(`codegen.gpu.elementwise`); a GEMM statement the kernel of its tile's variant
(`codegen.gpu.gemm`: TMA-fed and warp-specialised or warpgroup MMA over cp.async on Hopper,
both built for sm_90a; warp-level mma.sync; FMA), each storing C with the fused epilogue
applied (`codegen.gpu.stores`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from polydl.codegen.artifact import GeneratedCode, in_code, kernel_arguments
from polydl.codegen.c_expr import ArrayLayout, StatementPrinter
from polydl.codegen.gpu.elementwise import plain_kernel, transpose_kernel
from polydl.codegen.gpu.gemm import gemm_kernel
from polydl.codegen.gpu.launch import KernelLaunch
from polydl.codegen.templating import render
from polydl.poly.model import PolyModel
from polydl.schedules.gpu.plans import GpuSchedule
from polydl.schedules.gpu.variants import TmaTiling
from polydl.target.gpu import GpuTarget
from polydl.version import __version__

SOURCE_SUFFIX = {"cuda": ".cu", "hip": ".hip.cpp"}


@dataclass(frozen=True)
class Scratch:
    """A local array the launcher allocates for a call (zeroed on the stream)."""

    name: str
    c_type: str
    count: int
    is_input: bool = False


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


def _launch(kernel: str, launch: KernelLaunch, arrays: list[str], target: GpuTarget) -> dict[str, Any]:
    """What `launcher.j2` takes of one launch: shared memory above the target's per-block
    default needs the kernel's opt-in."""
    return {
        "kernel": kernel, "grid": list(launch.grid), "block": launch.block, "arrays": arrays,
        "smem": launch.shared_bytes, "opt_in": launch.shared_bytes > target.shared_memory_bytes,
        "carveout": launch.shared_carveout, "tensor_maps": launch.tensor_maps,
        "persistent": launch.persistent_tiles is not None, "tiles": launch.persistent_tiles,
        "paired": launch.blocks_per_sm > 1, "blocks_per_sm": launch.blocks_per_sm,
    }


def generate_gpu(model: PolyModel, schedule: GpuSchedule) -> GeneratedCode:
    model = schedule.model or model  # a staged nest's kernels read its copies
    target = schedule.target
    kind = target.kind
    name = model.nest.name
    arguments = kernel_arguments(model.nest, model.params)
    in_source = in_code(arguments)  # the launcher and header name them as the kernels do
    layouts = {
        a.name: ArrayLayout(a.name, a.dtype, a.concrete_shape(model.params))
        for a in model.nest.arrays
    }
    printer = StatementPrinter(layouts)
    kernels, launches = [], []
    alignment = 1
    tilings = [p.gemm.tiling for p in schedule.kernels if p.gemm is not None]
    all_arrays = [a.name for a in model.nest.arrays]
    for plan in schedule.kernels:
        kernel = f"{name}_{plan.name}"
        if plan.gemm is not None:
            launch = gemm_kernel(model, plan, kernel, target)
        elif plan.transpose is not None:
            launch = transpose_kernel(model, plan, kernel, printer)
        else:
            launch = plain_kernel(model, plan, kernel, printer)
        kernels.append(launch.text)
        alignment = max(alignment, launch.alignment)
        launches.append(_launch(kernel, launch, all_arrays, target))
    suffix = SOURCE_SUFFIX[kind]
    values = dict(
        name=name, version=__version__, origin=model.nest.filename, kind=kind,
        suffix=suffix, schedule=schedule.describe(),
    )
    source = render(
        "gpu/kernels.j2",
        **values,
        dialect=render(f"gpu/dialect_{kind}.j2"),
        size_params=[{"name": p, "value": v} for p, v in model.params.items()],
        kernels=kernels,
    )
    used = _arrays_read(schedule)
    scratch = [Scratch(a.name, layouts[a.name].c_type, math.prod(layouts[a.name].shape))
               for a in model.nest.locals if a.name in used]
    unused = [Scratch(a.name, layouts[a.name].c_type, 0) for a in model.nest.locals if a.name not in used]
    launcher = render(
        "gpu/launcher.j2",
        **values,
        kernels_file=f"{name}{suffix}",
        arguments=list(in_source),
        locals=scratch,
        unused_locals=unused,
        argument_names=[a.name for a in in_source],
        local_names=[s.name for s in scratch],
        launches=launches,
        tma=any(isinstance(t, TmaTiling) for t in tilings),
    )
    header = render("gpu/header.j2", **values, arguments=in_source)
    return GeneratedCode(
        function=name,
        arguments=arguments,
        source=source,
        header=header,
        kind=kind,
        # wgmma exists only in the architecture-specific sm_90a
        compile_flags=("-gencode=arch=compute_90a,code=sm_90a",) if any(t.warpgroup_mma for t in tilings)
        else architecture_flags(kind, target.architectures),
        launcher=launcher,
        pointer_alignment=alignment,
    )


def architecture_flags(kind: str, architectures: tuple[str, ...]) -> tuple[str, ...]:
    """The compiler flags that build for `architectures` (sm_90, gfx90a, ...)."""
    if kind == "cuda":
        return tuple(f"-gencode=arch=compute_{a[3:]},code={a}" for a in architectures)
    return tuple(f"--offload-arch={a}" for a in architectures)
