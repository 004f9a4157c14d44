"""Interleaved timing: every side of a case runs in alternating rounds in one process, so
machine noise hits every side alike."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

SAMPLES_PER_ROUND = 3  # timed samples of each runner per round, after one untimed call
MIN_SAMPLE_S = 1e-3  # a sample of a fast call times this long a batch of calls


@dataclass(frozen=True)
class Runner:
    """One way to compute a case. `run` is what is timed (after inputs are prepared);
    `fresh` computes the result from scratch and returns it as a plain-layout numpy array."""

    name: str
    run: Callable[[], object]
    fresh: Callable[[], np.ndarray]


def time_call(run: Callable[[], object], inner: int) -> float:
    t0 = time.perf_counter()
    for _ in range(inner):
        run()
    return (time.perf_counter() - t0) / inner


def plan(
    single_s: dict[str, float], repeat: int, budget_s: float
) -> tuple[int, dict[str, int]]:
    """Rounds (at most `repeat`, within `budget_s`) and calls per sample for each runner."""
    inner = {n: max(1, math.ceil(MIN_SAMPLE_S / max(t, 1e-9))) for n, t in single_s.items()}
    per_round = sum(t * (1 + SAMPLES_PER_ROUND * inner[n]) for n, t in single_s.items())
    rounds = int(budget_s / per_round) if per_round > 0 else repeat
    return max(1, min(repeat, rounds)), inner


def time_interleaved(
    runners: Sequence[Runner], rounds: int, inner: dict[str, int]
) -> dict[str, list[float]]:
    """Seconds per call: every round runs each runner in turn (order rotated per round), one
    untimed call first so a runner never pays for the previous one's threads or caches."""
    samples: dict[str, list[float]] = {r.name: [] for r in runners}
    for i in range(rounds):
        turn = i % len(runners)
        for runner in [*runners[turn:], *runners[:turn]]:
            runner.run()
            for _ in range(SAMPLES_PER_ROUND):
                samples[runner.name].append(time_call(runner.run, inner[runner.name]))
    return samples


def time_runners(
    runners: Sequence[Runner], repeat: int, budget_s: float
) -> tuple[int, dict[str, list[float]]]:
    """(rounds, seconds per call of each runner): one call each to plan, then interleaved rounds."""
    single = {r.name: time_call(r.run, 1) for r in runners}
    rounds, inner = plan(single, repeat, budget_s)
    return rounds, time_interleaved(runners, rounds, inner)
