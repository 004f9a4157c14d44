"""Decide which consumer nests to fuse into the main nest of a schedule, and say why.

Takes a `PolyModel`, a schedule of its main nest and the `CpuTarget`; returns the schedule with
`epilogues` filled in and one `FusionDecision` per consumer nest. The nests that follow the main
one are taken in order (a chain: bias, then ReLU, ...); each joins the chain at the deepest level
where the whole chain is legal (see `fusion.py`) and pays: the fused tile's working set (by the
reuse analysis) fits the cache. The first nest that cannot join ends the chain, since the nests
after it must still run after it.
"""

from __future__ import annotations

from dataclasses import replace

from polydl.errors import ScheduleError
from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.apply import apply_schedule, consumer_groups, fusion_max_level
from polydl.schedules.fusion import (
    L2_SHARE,
    FusedMaps,
    FusionDecision,
    fits_cache,
    fuse_at,
    fused_working_set,
    fusion_levels,
    level_loop,
)
from polydl.schedules.schedule import AFFINE, Schedule
from polydl.target.cpu import CpuTarget

MAX_COUNTED_ACCESSES = 64  # consumers' accesses whose fused working set is counted


def choose_fusion(
    model: PolyModel, schedule: Schedule, target: CpuTarget
) -> tuple[Schedule, tuple[FusionDecision, ...]]:
    unfused = replace(schedule, epilogues=())
    groups = consumer_groups(model)
    if not groups or schedule.scheduler == AFFINE:
        return unfused, ()
    try:
        plan = apply_schedule(model, unfused).main
    except ScheduleError as exc:
        return unfused, tuple(
            FusionDecision(_names(g), False, None, None, None, f"the schedule is illegal: {exc}")
            for g in groups
        )
    if plan.private_sum is not None:
        return unfused, tuple(
            FusionDecision(_names(g), False, None, None, None, "the threads sum into copies of "
                           f"{plan.private_sum} of their own, complete only after the nest")
            for g in groups
        )
    assert plan.instance_map is not None
    chain: list[StatementModel] = []
    level: int | None = None
    decisions: list[FusionDecision] = []
    stopped: str | None = None
    for group in groups:
        names = _names(group)
        if stopped is not None:
            decisions.append(FusionDecision(names, False, None, None, None, stopped))
            continue
        levels = [level] if level is not None else fusion_levels(fusion_max_level(plan), plan.parallel_dims)
        found: FusedMaps | None = None
        reasons: list[str] = []
        for candidate in levels:
            result = fuse_at(model, plan.statements, plan.instance_map, [*chain, *group], candidate, plan.parallel_dims)
            if isinstance(result, FusedMaps):
                found = result
                break
            reasons.append(f"level {candidate}: {result}")
        if found is None:
            why = "; ".join(reasons) or "no producer loop inside the parallel loops to fuse at"
            decisions.append(FusionDecision(names, False, None, None, None, why))
            stopped = f"an earlier nest of the chain ({', '.join(names)}) stays separate"
            continue
        loop = level_loop(plan.order, found.level)
        refused, nbytes = _cache_refusal(model, target, [*chain, *group], found, loop)
        if refused is not None:
            decisions.append(FusionDecision(names, False, found.level, loop, nbytes, refused))
            stopped = f"an earlier nest of the chain ({', '.join(names)}) stays separate"
            continue
        chain += group
        level = found.level
        deeper = f"; not deeper: {'; '.join(reasons)}" if reasons else ""
        fits = ("the whole nest is one tile, its epilogues the microkernel's post-ops"
                if nbytes is None else
                f"the fused tile's working set {nbytes} B fits {_l2_budget(target)} B of L2")
        decisions.append(FusionDecision(names, True, found.level, loop, nbytes,
                                        f"legal by the dependence check; {fits}{deeper}"))
    if not chain:
        return unfused, tuple(decisions)
    assert level is not None
    fused = replace(
        schedule,
        epilogues=tuple(s.name for s in chain),
        notes=tuple(schedule.notes) + (("fused_at", f"{level_loop(plan.order, level)} (level {level})"),),
    )
    return fused, tuple(decisions)


def _names(group: tuple[StatementModel, ...]) -> tuple[str, ...]:
    return tuple(s.name for s in group)


def _l2_budget(target: CpuTarget) -> int:
    return int(target.l2_bytes * L2_SHARE)


def _cache_refusal(model: PolyModel, target: CpuTarget, consumers: list[StatementModel],
                   found: FusedMaps, loop: str) -> tuple[str | None, int | None]:
    """Why `consumers` may not fuse at `found.level` for the cache (None where they may), and
    the fused tile's working set in bytes where it was counted. At level 0 the one call is the
    whole nest: the epilogue pays only as its post-ops, which read the output from registers
    however large it is, so nothing is counted there (the whole nest's count can take barvinok
    minutes: a Winograd output transform, 16 statements reading 36 planes each); nor over
    `MAX_COUNTED_ACCESSES` accesses."""
    if not found.level:
        return None, None
    accesses = sum(len(s.accesses) for s in consumers)
    if accesses > MAX_COUNTED_ACCESSES:
        return (f"the fused tile's working set, over {accesses} accesses, is not counted (the "
                f"count grows with the union of their footprints: minutes for a Winograd "
                f"output transform's 600)"), None
    nbytes = fused_working_set(model, consumers, found, target.cache_line_bytes)
    if not fits_cache(target, nbytes):
        return (f"the deepest legal level {found.level} (loop {loop}) has a fused working set of "
                f"{nbytes} B, more than {_l2_budget(target)} B of L2: the tile would leave the "
                "cache anyway"), nbytes
    return None, nbytes
