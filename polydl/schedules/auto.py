"""Choose a schedule when the user asks for `schedule="auto"`.

Takes a `PolyModel`; returns an explicit `Schedule` (every loop named, parallel loops resolved),
so that what a kernel reports is exactly what it runs.
"""

from __future__ import annotations

from dataclasses import replace

from polydl.machine import Machine
from polydl.poly.model import PolyModel
from polydl.schedules.apply import apply_schedule
from polydl.schedules.epilogues import choose_fusion
from polydl.schedules.rank import rank
from polydl.schedules.schedule import Schedule


def resolve(model: PolyModel, schedule: Schedule) -> Schedule:
    """Fill in the order and parallel loops a partial schedule leaves to polydl."""
    plan = apply_schedule(model, schedule).main
    return Schedule(
        order=plan.order,
        tiles=schedule.tiles,
        parallel=tuple(plan.order[d] for d in plan.parallel_dims),
        microkernel=schedule.microkernel,
        epilogues=schedule.epilogues,
        notes=schedule.notes,
    )


def auto_schedule(model: PolyModel, machine: Machine) -> Schedule:
    """The best schedule by the reuse model (see `rank`), or the original order if no
    candidate is legal; with the consumer nests fused where that is legal and pays."""
    ranked = rank(model, machine)
    if not ranked:
        return choose_fusion(model, resolve(model, Schedule()), machine)[0]
    best = ranked[0]
    chosen = replace(
        resolve(model, best.schedule),
        notes=(("model_cost", round(best.cost)), ("candidates", len(ranked))),
    )
    return choose_fusion(model, chosen, machine)[0]
