"""Each suite's issue target (ratios against named references) and whether a run met it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from polydl.bench.results import Row


@dataclass(frozen=True)
class Target:
    """An issue target: ratios against the references named by `prefixes`."""

    description: str
    prefixes: tuple[str, ...]
    geomean_min: float | None
    each_min: float | None


TARGETS = {
    "resnet50": Target("geomean >= 1.0 vs best oneDNN path, no layer < 0.8", ("torch.",), 1.0, 0.8),
    "gemm": Target(">= numpy on every shape", ("numpy",), None, 1.0),
    "gemm_reductions": Target("geomean >= 1.0 vs numpy", ("numpy",), 1.0, None),
    "resnet50_fused": Target("fused faster than unfused polydl on every layer",
                             ("polydl.unfused",), None, 1.0),
    "resnet50_bf16": Target("bf16 geomean >= 1.6x fp32 polydl", ("polydl.fp32",), 1.6, None),
    "resnet50_bwd_data": Target("geomean >= 0.9 vs best oneDNN path", ("torch.",), 0.9, None),
    "resnet50_bwd_weights": Target("geomean >= 0.9 vs best oneDNN path", ("torch.",), 0.9, None),
}


def geometric_mean(values: Sequence[float]) -> float | None:
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


@dataclass(frozen=True)
class TargetResult:
    description: str
    geomean: float | None
    minimum: float | None
    minimum_case: str | None
    met: bool | None  # None: not evaluated (its reference did not run)
    note: str = ""
    # the lowest case's ratio in each interleaved round: whether its minimum is the machine's
    minimum_rounds: tuple[float, ...] = ()


def evaluate_target(target: Target, rows: Sequence[Row]) -> TargetResult:
    failed = [r.case for r in rows if r.status != "ok"]
    ratios = {r.case: r.ratio_vs(target.prefixes) for r in rows if r.status == "ok"}
    measured = {c: v for c, v in ratios.items() if v is not None}
    if not rows or (not measured and not failed):
        return TargetResult(target.description, None, None, None, None,
                            "not evaluated: its reference did not run")
    geomean = geometric_mean(list(measured.values()))
    worst = min(measured, key=lambda c: measured[c]) if measured else None
    minimum = measured[worst] if worst else None
    if len(measured) < len(ratios):
        return TargetResult(target.description, geomean, minimum, worst, None,
                            "not evaluated: its reference did not run on every case")
    met = not failed
    if target.geomean_min is not None:
        met = met and geomean is not None and geomean >= target.geomean_min
    if target.each_min is not None:
        met = met and minimum is not None and minimum >= target.each_min
    note = f"{len(failed)} case(s) failed or did not build" if failed else ""
    rounds = next((r.round_ratios(target.prefixes) for r in rows if r.case == worst), [])
    return TargetResult(target.description, geomean, minimum, worst, met, note, tuple(rounds))


@dataclass(frozen=True)
class Summary:
    geomean_ratio: float | None
    min_ratio: float | None
    min_case: str | None
    failed: tuple[str, ...]
    target: TargetResult


def summarize(suite: str, rows: Sequence[Row]) -> Summary:
    ratios = {r.case: r.ratio for r in rows if r.ratio is not None}
    worst = min(ratios, key=lambda c: ratios[c]) if ratios else None
    return Summary(
        geomean_ratio=geometric_mean([v for v in ratios.values() if v is not None]),
        min_ratio=ratios[worst] if worst else None,
        min_case=worst,
        failed=tuple(r.case for r in rows if r.status != "ok"),
        target=evaluate_target(TARGETS[suite], rows),
    )
