"""A suite run in this process (its threads already set): the peak, every case, the report."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from polydl import settings
from polydl.bench.cases import DEFAULT_BUDGET_S, load_suite, select_cases
from polydl.bench.load import CpuMeter
from polydl.bench.measure import bench_case
from polydl.bench.peak import FmaPeak
from polydl.bench.report import Environment, format_report, num, report_json, write_json
from polydl.bench.threads import THREAD_ENV, import_torch
from polydl.bench.timing import MIN_SAMPLE_S, SAMPLES_PER_ROUND
from polydl.bench.variants import CASE_RUNNERS

if TYPE_CHECKING:
    from polydl.target import CpuTarget


@contextlib.contextmanager
def private_compile_cache(enabled: bool) -> Iterator[None]:
    """A fresh, temporary compile cache, so the compile column shows cold compilation."""
    if not enabled:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="polydl-bench-cache-") as root, \
            settings.override(cache_dir=root):
        yield


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_suite(
    target: CpuTarget, suite: str, json_path: str | None, cases: list[str], repeat: int,
    budget_s: float | None, cold_cache: bool, layouts: Sequence[str], compare_layouts: bool,
    batch: int | None = None, schedule: str = "auto", kept_weights: bool = False,
) -> int:
    """Run `cases` of `suite` on `target` with the threads of `OMP_NUM_THREADS`: print the
    table, write `json_path` if given; 0 when every case built and verified, else 1."""
    selected = select_cases(load_suite(suite, batch), cases)
    budget = DEFAULT_BUDGET_S[suite] if budget_s is None else budget_s
    threads = int(os.environ["OMP_NUM_THREADS"])
    torch = import_torch(threads)
    _progress(f"bench {suite}: {len(selected)} case(s), {threads} threads, "
              f"{'PyTorch ' + torch.__version__ if torch else 'no PyTorch (numpy only)'}")
    run_case = (partial(CASE_RUNNERS[suite], kept_weights=kept_weights) if suite in CASE_RUNNERS
                else partial(bench_case, schedule=schedule, kept_weights=kept_weights))
    meter = CpuMeter()
    peak = FmaPeak(target.isa)
    try:
        peak_samples = peak.measure()
        rows = []
        grad = torch.inference_mode() if torch is not None else contextlib.nullcontext()
        with private_compile_cache(cold_cache), grad:
            for i, case in enumerate(selected, 1):
                t0 = time.perf_counter()
                peak_now = max(peak_samples)
                row = run_case(case, torch, repeat, budget, peak_now, layouts, compare_layouts)
                rows.append(row)
                best = row.best_reference
                _progress(
                    f"[{i}/{len(selected)}] {case.name}: polydl {num(row.polydl_gflops, '.1f')} "
                    f"vs {best[0] + ' ' + format(best[1], '.1f') if best else '-'} GFLOP/s, "
                    f"{row.status}, {time.perf_counter() - t0:.1f} s"
                )
        peak_samples += peak.measure()
    finally:
        peak.close()
    # The peak is what the machine can do: the best sample, not the typical one.
    peak_gflops = max(peak_samples)
    rows = [replace(row, peak_gflops=peak_gflops) for row in rows]
    env = Environment(target, threads, peak_gflops, peak_samples,
                      torch.__version__ if torch is not None else None,
                      meter.other_share(), kept_weights=kept_weights)
    print(format_report(suite, env, rows), flush=True)
    if json_path:
        settings = {"repeat": repeat, "budget_s": budget, "cold_cache": cold_cache,
                    "layouts": list(layouts),
                    "compare_layouts": compare_layouts, "samples_per_round": SAMPLES_PER_ROUND,
                    "min_sample_s": MIN_SAMPLE_S, "cases": [c.name for c in selected],
                    "batch": batch, "schedule": schedule, "kept_weights": kept_weights,
                    "thread_env": {n: os.environ.get(n) for n in THREAD_ENV}}
        write_json(json_path, report_json(suite, env, rows, settings))
        print(f"wrote {json_path}", flush=True)
    return 0 if all(r.status == "ok" for r in rows) else 1
