"""Interleaved timing: every side of a case runs in alternating rounds in one process, so
machine noise hits every side alike."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

SAMPLES_PER_ROUND = 3  # timed samples of each runner per round, after one untimed call
MIN_SAMPLE_S = 1e-3  # a sample of a fast call times this long a batch of calls
# A runner's turn starts once the process's other threads are idle: its CPU time grows by less
# than QUIET_CORES of a core over a window of QUIET_WINDOW_S, waiting QUIET_MAX_S at most.
QUIET_CORES = 0.5
QUIET_WINDOW_S = 0.005
QUIET_MAX_S = 1.0
# A reference this many times slower than the fastest reference, by its planning call and by its
# first round alike, is timed in that first round only: it cannot be the one polydl is compared
# with, and it would take most of each round (see decisions: Slow references timed in the first
# round only).
SLOW_REFERENCE = 4.0


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


def quiesce() -> float:
    """Wait until no thread of this process is busy; return the seconds waited.

    The sides of a case run different thread pools in one process: polydl's and PyTorch's
    OpenMP, numpy's OpenBLAS. A pool's workers spin for a while after a call before they sleep
    (OpenBLAS's for about 0.1 s), on the cores the next side then runs on (see decisions: A
    benchmark turn waits for idle threads). The main thread sleeping, the process's CPU time
    shows whether any worker still spins."""
    start = time.perf_counter()
    while True:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(QUIET_WINDOW_S)
        busy = (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)
        if busy < QUIET_CORES or time.perf_counter() - start > QUIET_MAX_S:
            return time.perf_counter() - start


def time_interleaved(
    runners: Sequence[Runner], rounds: int, inner: dict[str, int], first_round: int = 0,
) -> dict[str, list[float]]:
    """Seconds per call: every round runs each runner in turn (order rotated per round, counting
    from `first_round`), once the previous runner's threads are idle (`quiesce`) and after one
    untimed call, so a runner never pays for the previous one's threads or caches."""
    samples: dict[str, list[float]] = {r.name: [] for r in runners}
    for i in range(first_round, first_round + rounds):
        turn = i % len(runners)
        for runner in [*runners[turn:], *runners[:turn]]:
            quiesce()
            runner.run()
            for _ in range(SAMPLES_PER_ROUND):
                samples[runner.name].append(time_call(runner.run, inner[runner.name]))
    return samples


def round_medians(samples: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each runner's median seconds per call in each round (its `SAMPLES_PER_ROUND` samples
    of that round), in round order: sides compared round by round met the same machine."""
    return {name: [statistics.median(values[i:i + SAMPLES_PER_ROUND])
                   for i in range(0, len(values), SAMPLES_PER_ROUND)]
            for name, values in samples.items()}


@dataclass(frozen=True)
class Speeds:
    """GFLOP/s of each runner from its samples: the median, the fastest sample, and the
    median of each round."""

    median: dict[str, float]
    fastest: dict[str, float]
    rounds: dict[str, list[float]]

    @classmethod
    def of(cls, flops: float, samples: dict[str, list[float]]) -> Speeds:
        def rate(seconds: float) -> float:
            return flops / seconds / 1e9

        return cls({n: rate(statistics.median(v)) for n, v in samples.items()},
                   {n: rate(min(v)) for n, v in samples.items()},
                   {n: [rate(t) for t in v] for n, v in round_medians(samples).items()})


def slow_references(
    single_s: dict[str, float], first_round: dict[str, list[float]], subject: str
) -> set[str]:
    """The references (every runner but `subject`) slower than `SLOW_REFERENCE` times the
    fastest reference both in their planning call and in their first round's median: two
    measurements apart, so one burst on the machine does not drop the reference that matters."""
    references = [n for n in single_s if n != subject]
    if len(references) < 2:
        return set()
    first = {n: statistics.median(first_round[n]) for n in references}
    fastest_single = min(single_s[n] for n in references)
    fastest_first = min(first.values())
    return {n for n in references
            if single_s[n] > SLOW_REFERENCE * fastest_single
            and first[n] > SLOW_REFERENCE * fastest_first}


def time_runners(
    runners: Sequence[Runner], repeat: int, budget_s: float
) -> tuple[int, dict[str, list[float]]]:
    """(rounds, seconds per call of each runner): one call each to plan, a first round of every
    runner, then interleaved rounds of all but the slow references (`slow_references`), as many
    as the rest of the budget holds. The first runner is the one under test."""
    start = time.perf_counter()
    single = {r.name: time_call(r.run, 1) for r in runners}
    rounds, inner = plan(single, repeat, budget_s)
    samples = time_interleaved(runners, 1, inner)
    slow = slow_references(single, samples, runners[0].name)
    kept = [r for r in runners if r.name not in slow]
    if slow and repeat > 1:
        left = budget_s - (time.perf_counter() - start)
        more, _ = plan({r.name: single[r.name] for r in kept}, repeat - 1, left)
        rounds = 1 + (more if left > 0 else 0)
    for name, values in time_interleaved(kept, rounds - 1, inner, first_round=1).items():
        samples[name] += values
    return rounds, samples
