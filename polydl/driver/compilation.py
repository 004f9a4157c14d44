"""What one compilation produced, and the decisions that produced it, as records.

`Compilation` holds every stage's output for one spec and target; `ScheduleDecision` keeps what
chose the schedule (who decided, the ranked candidates, each fusion decision), so `explain`
prints the decisions that were made instead of making them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polydl.codegen.artifact import GeneratedCode
from polydl.poly.model import PolyModel
from polydl.schedules.apply import ScheduledNest
from polydl.schedules.cpu.cost import RankedSchedule
from polydl.schedules.fusion import FusionDecision
from polydl.target import Target


@dataclass(frozen=True)
class ScheduleDecision:
    source: str  # "auto", "given", "tuned", "gpu"
    reason: str  # one line: how the schedule was chosen
    ranking: tuple[RankedSchedule, ...] = ()  # the ranked candidates, best first ("auto")
    fusion: tuple[FusionDecision, ...] = ()  # each consumer nest fused or not, and why

    def describe(self) -> str:
        return f"{self.source}: {self.reason}"


@dataclass(frozen=True, eq=False)
class Compilation:
    """Every stage's output for one spec and target: what `explain` prints and a kernel wraps."""

    model: PolyModel
    target: Target
    schedule: Any  # a `Schedule` (C) or a `GpuSchedule`
    code: GeneratedCode
    decision: ScheduleDecision
    scheduled: ScheduledNest | None = None  # the C backend's scheduled nest

    @property
    def flops(self) -> int:
        return self.model.flops
