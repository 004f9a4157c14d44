"""The three steps every backend takes, and the registry of backends by target kind.

A backend plans a schedule for a model and a target, generates code from that plan, and loads
the built code as a callable kernel. `pipeline` drives any backend the same way; a new target
kind is a new module with these three functions and an entry in `BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from polydl.codegen.artifact import GeneratedCode
from polydl.driver.compilation import Compilation, ScheduleDecision
from polydl.driver.reference import LazyReference
from polydl.ir import LoopNest
from polydl.poly.model import PolyModel
from polydl.runtime.kernel import CompiledKernel


@dataclass(frozen=True, eq=False)
class Plan:
    """A backend's schedule for one model: the value kernels report, what codegen reads."""

    schedule: Any  # Schedule (C) or GpuSchedule
    decision: ScheduleDecision
    detail: Any = None  # what the generator needs beyond the schedule (C: the ScheduledNest)


class Backend(Protocol):
    kind: str
    # whether a plan's schedule round-trips through JSON, so a stored lowering can be reused
    stores_lowerings: bool

    def plan(self, model: PolyModel, target: Any, schedule: Any) -> Plan: ...

    def generate(self, model: PolyModel, plan: Plan, target: Any) -> GeneratedCode: ...

    def load(
        self, code: GeneratedCode, nest: LoopNest, params: Mapping[str, int], schedule: Any,
        flops: int, reference: LazyReference, target: Any,
    ) -> CompiledKernel: ...

    def schedule_from_dict(self, data: dict[str, Any]) -> Any: ...

    def checked(self, compilation: Compilation) -> Compilation:
        """`compilation` with the choices this machine can time made by timing (the GPU's
        tiles where a device is present); the same compilation where there are none."""
        ...
