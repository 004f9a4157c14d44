"""The CUDA and HIP backends: a GPU schedule derived from the dependences and the GPU target,
kernels and a host launcher from the templates, a launcher library loaded through cffi.

HIP code is generated and built, not run, from Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polydl.codegen.artifact import GeneratedCode
from polydl.codegen.gpu.generate import generate_gpu
from polydl.driver.backend import Plan
from polydl.driver.compilation import Compilation, ScheduleDecision
from polydl.driver.gpu_checks import timed
from polydl.driver.reference import LazyReference
from polydl.errors import PolyDLError
from polydl.ir import LoopNest
from polydl.poly.model import PolyModel
from polydl.runtime.gpu.kernel import GpuKernel
from polydl.runtime.gpu.toolchain import build_gpu_library
from polydl.schedules.gpu.planning import gpu_schedule
from polydl.schedules.gpu.plans import GpuSchedule, StoredGpuSchedule
from polydl.target.gpu import GpuTarget


class GpuBackend:
    # stored lowerings come back with a StoredGpuSchedule (the descriptions, not the plans)
    stores_lowerings = True

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def plan(self, model: PolyModel, target: GpuTarget, schedule: Any) -> Plan:
        if not (isinstance(schedule, str) and schedule == "auto"):
            raise PolyDLError(f"target '{self.kind}' takes schedule='auto' only (the GPU schedule "
                              f"is derived from the dependences and the target), not {schedule!r}")
        scalars = [a.name for a in model.nest.parameters if a.is_input and not a.shape]
        if scalars:
            raise PolyDLError(f"target '{self.kind}' takes no scalar parameters yet "
                              f"({', '.join(scalars)}); pass them as one-element arrays")
        chosen = gpu_schedule(model, target)
        decision = ScheduleDecision("gpu", f"derived from the dependences and {target.name}")
        return Plan(chosen, decision)

    def generate(self, model: PolyModel, plan: Plan, target: GpuTarget) -> GeneratedCode:
        return generate_gpu(model, plan.schedule)

    def load(
        self, code: GeneratedCode, nest: LoopNest, params: Mapping[str, int],
        schedule: GpuSchedule | StoredGpuSchedule, flops: int, reference: LazyReference, target: GpuTarget,
    ) -> GpuKernel:
        if self.kind != "cuda":
            raise PolyDLError(
                f"target '{self.kind}' generates source only here (polydl compile --target "
                f"{self.kind} -o DIR); only 'cuda' kernels can be called from Python"
            )
        return GpuKernel(code=code, nest=nest, params=params, schedule=schedule, flops=flops,
                         reference_impl=reference, library_path=build_gpu_library(code))

    def schedule_from_dict(self, data: dict[str, Any]) -> StoredGpuSchedule:
        return StoredGpuSchedule.from_dict(data)

    def checked(self, compilation: Compilation) -> Compilation:
        if self.kind != "cuda":
            return compilation
        model, target = compilation.model, compilation.target
        assert isinstance(target, GpuTarget)
        reference = LazyReference(model.nest, model.params, model)

        def build(code: GeneratedCode, schedule: GpuSchedule) -> GpuKernel:
            return self.load(code, model.nest, model.params, schedule, compilation.flops, reference, target)

        return timed(compilation, build)


CUDA = GpuBackend("cuda")
HIP = GpuBackend("hip")
