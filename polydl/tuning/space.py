"""The schedule search space of one problem on one target.

Seeds are the reuse model's candidates (loop orders, tile sizes, microkernel bindings, packing);
around each seed the space adds its neighbours: every tile size halved and doubled, packing of
A and B switched, the outer tilings of microkernel schedules, calls over 2 and 4 output-channel
blocks wherever a call can take them (not only where the ranking's rules offer them), and every
legal choice of parallel loops. Each point is evaluated by the analytic model, which drops the
illegal ones (a dependence check refuses them) and gives the prior cost; each keeps the fusion
"auto" would apply, so a candidate is timed as it would run.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from polydl.poly.model import PolyModel
from polydl.schedules.cpu.auto import resolve
from polydl.schedules.cpu.calls import Memo, loop_extent
from polydl.schedules.cpu.candidates import (
    block_variants,
    candidates,
    outer_tilings,
    parallel_choices,
)
from polydl.schedules.cpu.cost import RankedSchedule, evaluate
from polydl.schedules.cpu.distribution import isolate_gemms
from polydl.schedules.cpu.epilogues import choose_fusion
from polydl.schedules.cpu.nests import main_is_general
from polydl.schedules.cpu.rank import rank
from polydl.schedules.schedule import AFFINE, Schedule
from polydl.target.cpu import CpuTarget
from polydl.tuning.features import features
from polydl.tuning.records import schedule_key

# Points evaluated at most per problem, each by the analytic model
# (see decisions: A tuning space's points and fusion time bounded).
MAX_POINTS = 400
# Seconds of fusion choices per space: a point of a Winograd layer (its transforms around
# 16-36 GEMMs) takes far longer than one of a statement and its epilogue; past this the space
# keeps the best-ranked points (see decisions: A tuning space's points and fusion time bounded).
FUSION_SECONDS = 30.0


@dataclass(frozen=True)
class Candidate:
    schedule: Schedule  # as compiled: order, tiles, parallel loops, microkernel, fusion
    cost: float  # the analytic model's cycles (the prior)
    features: Mapping[str, float]
    analytic: bool = False  # the schedule `schedule="auto"` compiles (the analytic ranking's best)

    @property
    def key(self) -> str:
        return schedule_key(self.schedule.to_dict())


def tuning_model(model: PolyModel) -> PolyModel:
    """The model the C backend schedules (GEMM-like statements split into their own nests)."""
    return isolate_gemms(model)


def search_space(model: PolyModel, target: CpuTarget, limit: int = MAX_POINTS) -> list[Candidate]:
    """Every legal point found around the seeds: the analytic choice first, then by
    analytic cost."""
    model = tuning_model(model)
    if main_is_general(model):
        # no band to choose: the general scheduler decides alone
        return [Candidate(Schedule(scheduler=AFFINE), 0.0, {}, analytic=True)]
    memo: Memo = {}
    evaluated: dict[str, RankedSchedule] = {}

    def add(points: Iterable[Schedule]) -> None:
        for point in points:
            if len(evaluated) >= limit:
                return
            result = evaluate(model, target, point, memo)
            if result is not None:
                evaluated.setdefault(schedule_key(result.schedule.to_dict()), result)

    def add_threadings() -> None:
        for point in list(evaluated.values()):
            add(replace(point.schedule, parallel=choice)
                for choice in parallel_choices(model, point.schedule, memo)
                if choice != point.schedule.parallel)

    ranked = rank(model, target)  # the analytic choice is in the space, whatever the cap
    for result in ranked:
        evaluated.setdefault(schedule_key(result.schedule.to_dict()), result)
    add(candidates(model, target))
    add_threadings()  # the seeds' thread mappings before the cap can cut them
    for seed in list(evaluated.values()):
        add(outer_tilings(model, seed.schedule))
    for seed in list(evaluated.values()):
        add(block_variants(model, seed.schedule, target, gated=False))
    for seed in list(evaluated.values()):
        add(_neighbours(model, seed.schedule))
    add_threadings()
    if not evaluated:
        return [Candidate(resolve(model, Schedule()), 0.0, {})]
    best = min(r.cost for r in evaluated.values())
    chosen = ranked[0].schedule if ranked else None
    out: list[Candidate] = []
    deadline = time.monotonic() + FUSION_SECONDS
    for result in sorted(evaluated.values(), key=lambda r: (r.schedule != chosen, r.cost)):
        if out and time.monotonic() > deadline:
            break
        resolved = resolve(model, result.schedule)  # the loop order filled in, as compiled
        schedule = choose_fusion(model, resolved, target)[0]
        mine = result.schedule == chosen
        values = {**features(model, target, replace(result, schedule=resolved), best),
                  "analytic_choice": float(mine)}
        out.append(Candidate(schedule, result.cost, values, analytic=mine))
    return _distinct(out)


def _neighbours(model: PolyModel, schedule: Schedule) -> list[Schedule]:
    """One step from `schedule`: a tile size halved or doubled (within the loop's extent), or
    the packing of one microkernel operand switched; the parallel loops left to the model."""
    out = []
    base = replace(schedule, parallel=())
    tiles = schedule.tile_sizes
    for var, size in tiles.items():
        extent = loop_extent(model, var)
        for new in (size // 2, size * 2):
            if 1 < new < extent:
                out.append(replace(base, tiles=tuple(sorted({**tiles, var: new}.items()))))
    mk = schedule.microkernel
    if mk is not None:
        if mk.blocks is None:  # a call over n blocks packs nothing
            out.append(replace(base, microkernel=replace(mk, pack_b=not mk.pack_b)))
        if not mk.batch and mk.blocks is None:
            out.append(replace(base, microkernel=replace(mk, pack_a=not mk.pack_a)))
    return out


def _distinct(candidates: list[Candidate]) -> list[Candidate]:
    """Different evaluated points may compile to one schedule (fusion and resolution fill in
    the same loops): keep the first of each."""
    seen: set[str] = set()
    out = []
    for c in candidates:
        if c.key not in seen:
            seen.add(c.key)
            out.append(c)
    return out
