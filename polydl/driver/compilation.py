"""What one compilation produced, and the decisions that produced it, as records.

`Compilation` holds every stage's output for one spec and target; `ScheduleDecision` keeps what
chose the schedule (who decided, the ranked candidates, each fusion decision), so `explain`
prints the decisions that were made instead of making them again. Where the general scheduler
planned the main nest, the compilation's schedule (the one its kernel reports and the compile
cache stores) carries what it did as a note, in the words `explain` prints for that nest.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from polydl.codegen.artifact import GeneratedCode
from polydl.poly.model import PolyModel
from polydl.schedules.apply import ScheduledNest
from polydl.schedules.cpu.cost import RankedSchedule
from polydl.schedules.cpu.nests import describe_plan
from polydl.schedules.fusion import FusionDecision
from polydl.schedules.schedule import AFFINE, GENERAL_SCHEDULER_NOTE, Schedule
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

    def __post_init__(self) -> None:
        schedule, scheduled = self.schedule, self.scheduled
        if isinstance(schedule, Schedule) and schedule.scheduler == AFFINE and scheduled is not None:
            notes = dict(schedule.notes)
            notes[GENERAL_SCHEDULER_NOTE] = describe_plan(scheduled.main)
            # a frozen record completed once, as it is made
            object.__setattr__(self, "schedule", replace(schedule, notes=tuple(sorted(notes.items()))))

    @property
    def flops(self) -> int:
        return self.model.flops
