"""The report of a suite run: a table on stdout and a JSON document with every measurement."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from polydl.bench.results import Row
from polydl.bench.targets import summarize
from polydl.bench.timing import SAMPLES_PER_ROUND, SLOW_REFERENCE
from polydl.version import __version__

if TYPE_CHECKING:
    from polydl.target import CpuTarget

NOISY_SHARE = 0.10  # other processes' share of the CPU time above which the report warns


@dataclass(frozen=True)
class Environment:
    """Where a run took place: the machine, its threads and peak, the reference libraries."""

    target: CpuTarget
    threads: int
    peak_gflops: float
    peak_samples: list[float]
    torch_version: str | None
    # share of the machine's CPU time that other processes used during the run (None: unknown)
    other_cpu_share: float | None = None
    # inference: polydl keeps the weights between calls, PyTorch's oneDNN reorders them once
    kept_weights: bool = False
    numpy_version: str = np.__version__
    polydl_version: str = __version__
    python: str = platform.python_version()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["machine"] = asdict(self.target)
        return data


def report_json(
    suite: str, env: Environment, rows: Sequence[Row], settings: dict[str, Any]
) -> dict[str, Any]:
    summary = summarize(suite, rows)
    return {
        "suite": suite,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": env.to_json(),
        "settings": settings,
        "rows": [r.to_json() for r in rows],
        "summary": {
            "geomean_ratio": summary.geomean_ratio,
            "min_ratio": summary.min_ratio,
            "min_case": summary.min_case,
            "failed": list(summary.failed),
            "target": asdict(summary.target),
        },
    }


def write_json(path: str | os.PathLike[str], report: dict[str, Any]) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=1) + "\n")


def num(value: float | None, fmt: str) -> str:
    """`value` formatted by `fmt`, or "-" where there is none."""
    return "-" if value is None else format(value, fmt)


def spread(values: Sequence[float]) -> str:
    """The lowest and highest of `values` ("-" for fewer than two)."""
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else "-"


def _check(row: Row) -> str:
    if row.status == "ERROR":
        return "ERROR"
    return f"{row.status} {num(row.relative_error, '.0e')}"


def _table(header: Sequence[str], lines: Sequence[Sequence[str]], left: int) -> list[str]:
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [fmt(header), fmt(["-" * w for w in widths]), *(fmt(line) for line in lines)]


def format_report(suite: str, env: Environment, rows: Sequence[Row]) -> str:
    m = env.target
    out = [
        f"polydl {env.polydl_version} bench --suite {suite}",
        f"machine  {m.model}, {m.isa}, {m.cores} cores; {env.threads} threads for every side",
        f"peak     {env.peak_gflops:.1f} GFLOP/s fp32 (FMA loop, best of "
        f"{len(env.peak_samples)} samples; median {statistics.median(env.peak_samples):.0f})",
        "others   " + ("unknown" if env.other_cpu_share is None else
                         f"{100 * env.other_cpu_share:.0f}% of the CPU time went to other work "
                         "during the run")
        + ("" if (env.other_cpu_share or 0.0) < NOISY_SHARE else
           ": the cores were shared, expect noise"),
        "refs     numpy " + env.numpy_version + (
            f", PyTorch {env.torch_version} (oneDNN: NCHW, channels_last, mkldnn blocked)"
            if env.torch_version else "; PyTorch not installed: numpy only"),
        *(["weights  kept between calls (inference): polydl's copies of them made at the first "
           "call, oneDNN's reordered before the timed calls (torch.mkldnn)"] if env.kept_weights else []),
        "",
    ]
    header = ["case", "shape", "layout", "polydl", "best ref", "ref", "ratio", "rounds",
              "%peak", "compile s", "check"]
    lines = []
    for r in rows:
        best = r.best_reference
        lines.append([
            r.case, r.shape, r.variant or "-", num(r.polydl_gflops, ".1f"),
            num(best[1] if best else None, ".1f"), best[0] if best else "-",
            num(r.ratio, ".2f"), spread(r.round_ratios()), num(r.peak_percent, ".0f"), num(r.compile_s, ".1f"),
            _check(r),
        ])
    out += _table(header, lines, left=3)
    out.append("(speeds in GFLOP/s, medians; ratio = polydl / best reference; rounds = the "
               "lowest and highest of that ratio in one interleaved round)")

    names = sorted({n for r in rows for n in r.references})
    if names:
        out += ["", "every reference (GFLOP/s):"]
        lines = [[r.case, *(num(r.references.get(n), ".1f") + ("*" if _first_round_only(r, n) else "")
                            for n in names), str(r.rounds)] for r in rows]
        out += _table(["case", *names, "rounds"], lines, left=1)
        if any(_first_round_only(r, n) for r in rows for n in names):
            out.append(f"(* timed in the first round only: over {SLOW_REFERENCE:g}x slower than "
                       "the fastest reference)")

    out += ["", "polydl schedules:"]
    for r in rows:
        detail = r.schedule if r.status != "ERROR" else r.message
        variants = ", ".join(f"{k} {v:.1f}" for k, v in r.variants.items())
        out.append(f"  {r.case}: {detail}" + (f"  [layouts: {variants}]" if variants else ""))

    s = summarize(suite, rows)
    t = s.target
    verdict = {True: "MET", False: "MISSED", None: "NOT EVALUATED"}[t.met]
    out += [
        "",
        f"geomean ratio {num(s.geomean_ratio, '.2f')}, min ratio {num(s.min_ratio, '.2f')}"
        + (f" ({s.min_case})" if s.min_case else "")
        + (f"; failed: {', '.join(s.failed)}" if s.failed else ""),
        f"target   {t.description}: {verdict} (geomean {num(t.geomean, '.2f')}, "
        f"min {num(t.minimum, '.2f')}{' ' + t.minimum_case if t.minimum_case else ''}"
        + (f", its rounds {spread(t.minimum_rounds)}" if len(t.minimum_rounds) > 1 else "") + ")"
        + (f"; {t.note}" if t.note else ""),
    ]
    return "\n".join(out)


def _first_round_only(row: Row, reference: str) -> bool:
    """Whether `reference` was left out of the row's later rounds (`timing.slow_references`)."""
    taken = row.samples.get(reference, 0)
    return row.rounds > 1 and 0 < taken < row.rounds * SAMPLES_PER_ROUND
