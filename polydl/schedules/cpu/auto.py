"""Choose a schedule when the user asks for `schedule="auto"`.

Takes a `PolyModel`; returns an explicit `Schedule` (every loop named, parallel loops resolved),
so that what a kernel reports is exactly what it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from polydl.poly.model import PolyModel
from polydl.schedules.apply import apply_schedule
from polydl.schedules.cpu.cost import RankedSchedule
from polydl.schedules.cpu.epilogues import choose_fusion
from polydl.schedules.cpu.nests import main_is_general
from polydl.schedules.cpu.rank import rank
from polydl.schedules.cpu.register_tiles import register_tiled
from polydl.schedules.fusion import FusionDecision
from polydl.schedules.schedule import AFFINE, Schedule
from polydl.target.cpu import CpuTarget


@dataclass(frozen=True)
class AutoChoice:
    """The automatic schedule and what decided it: the ranking and each fusion decision."""

    schedule: Schedule
    ranking: tuple[RankedSchedule, ...]
    fusion: tuple[FusionDecision, ...]


def resolve(model: PolyModel, schedule: Schedule) -> Schedule:
    """Fill in the order and parallel loops a partial schedule leaves to polydl."""
    if schedule.scheduler == AFFINE:
        return schedule
    plan = apply_schedule(model, schedule).main
    return Schedule(
        order=plan.order,
        tiles=schedule.tiles,
        parallel=tuple(plan.order[d] for d in plan.parallel_dims),
        microkernel=schedule.microkernel,
        epilogues=schedule.epilogues,
        notes=schedule.notes,
        private_sums=plan.private_sum is not None,
    )


def auto_schedule(model: PolyModel, target: CpuTarget) -> AutoChoice:
    """The best schedule by the reuse model (see `rank`), or the original order if no
    candidate is legal; with the consumer nests fused where that is legal and pays. A main
    nest that is no band nest (see `nests.py`) is left to the general scheduler."""
    if main_is_general(model):
        return AutoChoice(Schedule(scheduler=AFFINE), (), ())
    ranked = tuple(rank(model, target))
    if not ranked:
        chosen = resolve(model, Schedule())
    else:
        best = ranked[0]
        resolved = resolve(model, best.schedule)
        chosen = replace(
            register_tiled(model, resolved, target) or resolved,
            notes=(*resolved.notes, ("model_cost", round(best.cost)), ("candidates", len(ranked))),
        )
    fused, decisions = choose_fusion(model, chosen, target)
    return AutoChoice(fused, ranked, tuple(decisions))
