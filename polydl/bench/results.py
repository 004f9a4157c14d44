"""One case's result: polydl's speed, each verified reference's, and how they compare."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from polydl.bench.cases import Case


@dataclass(frozen=True)
class Row:
    """One case's result. Speeds are median GFLOP/s; `references` maps each reference that
    verified to its speed."""

    case: str
    shape: str
    flops: int
    polydl_gflops: float | None
    references: dict[str, float]
    status: str  # "ok", "FAILED" (wrong result) or "ERROR" (polydl could not build or run)
    relative_error: float | None = None
    compile_s: float | None = None
    variant: str = ""
    schedule: str = ""
    message: str = ""
    peak_gflops: float | None = None
    rounds: int = 0
    samples: dict[str, int] = field(default_factory=dict)
    variants: dict[str, float] = field(default_factory=dict)
    # the fastest sample of each side (polydl under "polydl"): less sensitive to a busy machine
    fastest: dict[str, float] = field(default_factory=dict)
    reference_errors: dict[str, float] = field(default_factory=dict)
    # each side's median speed in each interleaved round, in round order
    round_gflops: dict[str, list[float]] = field(default_factory=dict)
    # the inputs polydl's kernel kept between calls (`constant=`: the weights, timing inference)
    kept: tuple[str, ...] = ()

    def best_among(self, prefixes: Sequence[str] = ("",)) -> tuple[str, float] | None:
        """The fastest reference whose name starts with one of `prefixes`, and its speed."""
        speeds = {n: g for n, g in self.references.items() if n.startswith(tuple(prefixes))}
        if not speeds:
            return None
        name = max(speeds, key=lambda n: speeds[n])
        return name, speeds[name]

    @property
    def best_reference(self) -> tuple[str, float] | None:
        return self.best_among()

    def ratio_vs(self, prefixes: Sequence[str] = ("",)) -> float | None:
        """polydl's speed over the best reference whose name starts with one of `prefixes`."""
        best = self.best_among(prefixes)
        if self.polydl_gflops is None or best is None or self.status != "ok":
            return None
        return self.polydl_gflops / best[1]

    def round_ratios(self, prefixes: Sequence[str] = ("",)) -> list[float]:
        """polydl's speed over the reference of `ratio_vs` in each round: how far the rounds
        spread around the ratio of the medians (empty where rounds were not kept)."""
        best = self.best_among(prefixes)
        if self.status != "ok" or best is None or "polydl" not in self.round_gflops:
            return []
        return [p / r for p, r in zip(self.round_gflops["polydl"], self.round_gflops.get(best[0], []),
                                      strict=False) if r > 0]

    @property
    def ratio(self) -> float | None:
        return self.ratio_vs()

    @property
    def peak_percent(self) -> float | None:
        if self.polydl_gflops is None or not self.peak_gflops:
            return None
        return 100.0 * self.polydl_gflops / self.peak_gflops

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        best = self.best_reference
        data.update(
            best_reference=best[0] if best else None,
            best_reference_gflops=best[1] if best else None,
            ratio=self.ratio,
            round_ratios=self.round_ratios(),
            peak_percent=self.peak_percent,
        )
        return data


def one_line(exc: BaseException) -> str:
    """An exception as one line of the report: its type and the first line of its message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def error_row(case: Case, exc: BaseException, peak_gflops: float, t0: float) -> Row:
    """The row of a case polydl could not build or run: one failure does not end the run."""
    return Row(case.name, case.shape, case.flops, None, {}, "ERROR", peak_gflops=peak_gflops,
               compile_s=time.perf_counter() - t0, message=one_line(exc))
