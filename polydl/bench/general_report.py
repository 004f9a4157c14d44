"""The general suite's report: the distribution of polydl's speed against each other side, the
full per-kernel table, and the machine the numbers come from.

Takes the result rows (`general.Result.to_json()`); returns text lines and a JSON-ready summary.
A ratio is the other side's median time over polydl's (above 1: polydl is faster), taken over
the rows polydl built correctly (status "ok") that the other side also ran. For each thread
count, suite and compared side: the geometric mean, the 10th percentile (linear interpolation
between order statistics), the lowest ratio and the ten lowest with their kernels. Nothing is
picked by hand: every row of the run is in the distribution it belongs to.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
from collections.abc import Iterable, Sequence
from importlib import metadata
from typing import Any

import numpy as np

import polydl

COMPARED = {
    "torch": "PyTorch eager",
    "gcc": "gcc -O3 -march=native -fopenmp",
    "gcc_fastmath": "gcc -O3 -march=native -fopenmp -ffast-math",
    "polly": "clang-19 -O3 -march=native Polly (parallel)",
}
TIMED_SIDES = ("polydl", "gcc", "gcc_fastmath", "polly", "torch")
SLOWEST = 10

Row = dict[str, Any]


def ratio(row: Row, over: str) -> float | None:
    """`over`'s median time over polydl's in `row`, or None where either is missing."""
    ms = row["ms"]
    if "polydl" not in ms or over not in ms or ms["polydl"] <= 0:
        return None
    return float(ms[over] / ms["polydl"])


def geomean(values: Iterable[float]) -> float | None:
    kept = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in kept) / len(kept)) if kept else None


def distribution(rows: Sequence[Row], over: str) -> dict[str, Any] | None:
    """polydl's speed ratios against `over` over the correct rows that have both.

    Args:
        rows: result rows.
        over: the compared side ("torch", "gcc", "gcc_fastmath" or "polly").

    Returns:
        count, geomean, p10, lowest ([kernel, ratio]) and slowest (up to ten [kernel, ratio],
        lowest first); None where no row has both sides.
    """
    pairs = sorted(((r["kernel"], v) for r in rows if r["status"] == "ok"
                    if (v := ratio(r, over)) is not None), key=lambda p: p[1])
    if not pairs:
        return None
    values = [v for _, v in pairs]
    return {"count": len(pairs), "geomean": geomean(values),
            "p10": float(np.percentile(values, 10)), "lowest": list(pairs[0]),
            "slowest": [list(p) for p in pairs[:SLOWEST]]}


def summarise(rows: Sequence[Row]) -> dict[str, Any]:
    """Counts by status and every distribution, per thread count and suite.

    Args:
        rows: result rows (each with kernel, suite, threads, status and ms).

    Returns:
        {"<threads> threads, <suite>": {"kernels", "ok", "refused", "wrong", "error",
        "distributions": {side: distribution}}}.
    """
    out: dict[str, Any] = {}
    for threads in sorted({r["threads"] for r in rows}):
        for suite in sorted({r["suite"] for r in rows}):
            group = [r for r in rows if r["threads"] == threads and r["suite"] == suite]
            counts = {kind: sum(r["status"].startswith(kind) for r in group)
                      for kind in ("ok", "refused", "wrong", "error")}
            out[f"{threads} threads, {suite}"] = {
                "kernels": len(group), **counts,
                "distributions": {side: d for side in COMPARED
                                  if (d := distribution(group, side)) is not None}}
    return out


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary as text: one block per thread count and suite."""
    lines: list[str] = []
    for group, values in summary.items():
        lines.append(f"== {group}: {values['kernels']} kernels, {values['ok']} built and correct, "
                     f"{values['refused']} refused, {values['wrong']} wrong, "
                     f"{values['error']} errors")
        for side, d in values["distributions"].items():
            slowest = ", ".join(f"{k} {v:.2f}" for k, v in d["slowest"])
            lines.append(f"  polydl vs {COMPARED[side]} ({d['count']} kernels): geomean "
                         f"{fmt(d['geomean'])}x, p10 {fmt(d['p10'])}x, lowest "
                         f"{d['lowest'][0]} {fmt(d['lowest'][1])}x")
            lines.append(f"    ten slowest: {slowest}")
    return lines


def table_header() -> str:
    ms = " ".join(f"{side + ' ms':>13s}" for side in TIMED_SIDES)
    ratios = " ".join(f"{'/' + side:>13s}" for side in COMPARED)
    return f"{'kernel':19s} {'thr':>3s} {ms} {ratios}  status"


def table_row(row: Row) -> str:
    """One kernel's line: median ms per side, polydl's ratio over each, status and notes."""
    ms = " ".join(f"{fmt(row['ms'].get(side), '.3f'):>13s}" for side in TIMED_SIDES)
    ratios = " ".join(f"{fmt(ratio(row, side)):>13s}" for side in COMPARED)
    notes = "; ".join(row["notes"])
    return (f"{row['kernel']:19s} {row['threads']:>3d} {ms} {ratios}  {row['status']}"
            + (f"; {notes}" if notes else ""))


def machine() -> dict[str, Any]:
    """The CPU model, the cores this process may use, and every tool's version."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    versions = {"python": platform.python_version(), "polydl": polydl.__version__,
                "polydl_commit": _commit()}
    for package in ("numpy", "islpy-barvinok", "torch"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "-"
    for compiler in ("gcc", "clang-19"):
        try:
            versions[compiler] = subprocess.run(
                [compiler, "--version"], capture_output=True, text=True,
                check=True).stdout.splitlines()[0]
        except (OSError, subprocess.CalledProcessError):
            versions[compiler] = "-"
    return {"cpu": model, "cores": len(os.sched_getaffinity(0)), "machine": platform.machine(),
            "versions": versions}


def _commit() -> str:
    """The checkout's commit, with "+changes" where its files differ from it; "-" outside git."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "-"
    return head + ("+changes" if dirty else "")
