"""Empirical autotuning: time the best-ranked schedules and remember the winner.

Takes a loop nest with bound sizes; compiles the top candidates of the reuse model, times each
on random inputs (median of several runs), stores the fastest in the tuning database and
returns it. Later compiles with `schedule="tuned"` read the database instead of timing again.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from polydl.driver import c_backend
from polydl.driver.reference import LazyReference
from polydl.errors import PolyDLError, TargetError
from polydl.ir import LoopNest
from polydl.poly.model import PolyModel, build_model
from polydl.runtime.inputs import random_inputs
from polydl.runtime.kernel import Kernel
from polydl.schedules.auto import resolve
from polydl.schedules.database import TuningDatabase, TuningRecord, nest_key
from polydl.schedules.epilogues import choose_fusion
from polydl.schedules.rank import rank
from polydl.schedules.schedule import Schedule
from polydl.target.cpu import CpuTarget
from polydl.target.host import cannot_run_here


@dataclass(frozen=True)
class TrialResult:
    schedule: Schedule
    seconds: float
    model_cost: float


@dataclass(frozen=True)
class TuneResult:
    best: TrialResult
    trials: tuple[TrialResult, ...]
    stored_in: str


def time_kernel(kernel, args: list[np.ndarray], repeats: int = 5, budget_s: float = 2.0) -> float:
    kernel(*args)  # warm up: page in, spin up threads
    samples = []
    start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        kernel(*args)
        samples.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s and len(samples) >= 3:
            break
    return statistics.median(samples)


def candidate_kernel(model: PolyModel, target: CpuTarget, schedule: Schedule) -> Kernel:
    """Compile one candidate schedule for `target` (not through the stored-lowering cache: a
    candidate is built once)."""
    plan = c_backend.plan(model, target, schedule)
    code = c_backend.generate(model, plan, target)
    return c_backend.load(code, model.nest, model.params, plan.schedule, model.flops,
                          LazyReference(model.nest, model.params, model), target)


def tune(
    nest: LoopNest,
    params: Mapping[str, int],
    *,
    target: CpuTarget,
    trials: int = 8,
    db: TuningDatabase | None = None,
    log=sys.stderr,
) -> TuneResult:
    """Time the `trials` best-ranked schedules for `target` on this machine and store the
    fastest under the target's key; the target must be one this CPU can run."""
    reason = cannot_run_here(target)
    if reason:
        raise TargetError(f"cannot tune here: {reason}")
    db = db or TuningDatabase()
    model = build_model(nest, dict(params))
    ranked = rank(model, target)[: max(trials, 1)]
    if not ranked:
        raise PolyDLError("no legal schedule candidates to tune")
    results: list[TrialResult] = []
    args: list[np.ndarray] | None = None
    for i, candidate in enumerate(ranked):
        # each candidate runs as "auto" would run it: with its consumer nests fused
        schedule = choose_fusion(model, resolve(model, candidate.schedule), target)[0]
        kernel = candidate_kernel(model, target, schedule)
        if args is None:
            args = random_inputs(kernel.arguments)
        seconds = time_kernel(kernel, args)
        results.append(TrialResult(kernel.schedule, seconds, candidate.cost))
        if log is not None:
            gflops = kernel.flops / seconds / 1e9
            print(
                f"[{i + 1}/{len(ranked)}] {seconds * 1e3:9.3f} ms {gflops:8.2f} GFLOP/s  "
                f"{kernel.schedule.describe()}",
                file=log,
            )
    best = min(results, key=lambda r: r.seconds)
    record = TuningRecord(best.schedule, best.seconds, _gflops(model, best.seconds), len(results))
    db.store(
        nest_key(nest, dict(params)),
        target.key(),
        nest.name,
        dict(params),
        _dtype(nest),
        record,
    )
    return TuneResult(best, tuple(results), str(db.path))


def _gflops(model: PolyModel, seconds: float) -> float:
    return model.flops / seconds / 1e9


def _dtype(nest: LoopNest) -> str:
    return "/".join(sorted({a.dtype for a in nest.arrays}))


def tuned_schedule(model: PolyModel, target: CpuTarget, trials: int = 8) -> tuple[Schedule, str]:
    """The database's schedule for this nest on `target`, tuning it first if absent; and how
    it was found."""
    db = TuningDatabase()
    record = db.lookup(nest_key(model.nest, model.params), target.key())
    how = f"database hit in {db.path}"
    if record is None:
        tune(model.nest, model.params, target=target, trials=trials, db=db)
        record = db.lookup(nest_key(model.nest, model.params), target.key())
        assert record is not None
        how = f"tuned now ({record.trials} trials), stored in {db.path}"
    return resolve(model, record.schedule), how
