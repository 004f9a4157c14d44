"""The GPU pipeline: a loop nest through the GPU schedule and the CUDA/HIP generator to a kernel.

Takes a `LoopNest`, its size parameters and a GPU target; returns a `GpuCompilation` (model,
GPU schedule, generated code) or, for CUDA, a callable `GpuKernel`. `api.lower` and
`api.build_kernel` hand GPU targets here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polydl.codegen.artifact import GeneratedCode
from polydl.codegen.gpu_target import generate_gpu
from polydl.errors import PolyDLError
from polydl.gpu import DEVICES
from polydl.ir import LoopNest
from polydl.poly.model import PolyModel, build_model
from polydl.schedules.gpu import GpuSchedule, gpu_schedule


@dataclass(frozen=True, eq=False)
class GpuCompilation:
    model: PolyModel
    schedule: GpuSchedule
    code: GeneratedCode

    @property
    def flops(self) -> int:
        return self.model.flops


def lower_gpu(
    nest: LoopNest, params: Mapping[str, int], target: str, schedule: Any = "auto"
) -> GpuCompilation:
    if not (isinstance(schedule, str) and schedule == "auto"):
        raise PolyDLError(f"target '{target}' takes schedule='auto' only (the GPU schedule is "
                          f"derived from the dependences and the device), not {schedule!r}")
    model = build_model(nest, dict(params))
    plan = gpu_schedule(model, DEVICES[target])
    return GpuCompilation(model, plan, generate_gpu(model, plan))


def build_gpu_kernel(
    nest: LoopNest, params: Mapping[str, int], target: str, schedule: Any = "auto"
):  # type: ignore[no-untyped-def]
    if target != "cuda":
        raise PolyDLError(
            f"target '{target}' generates source only here (polydl compile --target {target} -o DIR); "
            "only 'cuda' kernels can be called from Python"
        )
    from polydl.api import LazyReference
    from polydl.runtime.gpu_kernel import GpuKernel
    from polydl.runtime.gpu_toolchain import build_gpu_library

    compilation = lower_gpu(nest, params, target, schedule)
    return GpuKernel(
        code=compilation.code,
        nest=nest,
        params=params,
        schedule=compilation.schedule,
        flops=compilation.flops,
        reference_impl=LazyReference(nest, params, compilation.model),
        library_path=build_gpu_library(compilation.code),
    )
