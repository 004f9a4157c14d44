"""Benchmark suites: polydl against reference libraries, timed interleaved in one run.

Takes a suite name (`gemm`, `gemm_reductions`, `resnet50`, its backward passes `resnet50_bwd_data` and
`resnet50_bwd_weights`, or the A/B suites `resnet50_fused` and `resnet50_bf16`; shapes shipped
as package data in `suites/`) and returns a table on stdout plus, optionally, a JSON report.
Every case is run by polydl and by each reference available here (numpy; PyTorch's oneDNN paths
when torch is importable), all in the same process, with the same threads, in alternating
rounds, so machine noise hits every side alike; speeds are medians and are compared as ratios.
The machine's peak is measured in the same run by an FMA-throughput loop. Speed is reported
here, never asserted in tests.

The harness sits above the driver: it imports polydl's public API, and nothing at or below the
driver imports it; above it, the `polydl bench` command and the tuner (`polydl tune --suite`,
which reads the suites' cases) do.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from polydl.bench.cases import SUITE_FILES, BenchError, load_suite, select_cases
from polydl.bench.harness import run_suite
from polydl.bench.measure import CONV_LAYOUTS, PASSES
from polydl.bench.threads import pinned_cores, run_pinned, runs_on
from polydl.bench.variants import CASE_RUNNERS
from polydl.target import host_target

__all__ = ["CONV_LAYOUTS", "SUITE_FILES", "BenchError", "main"]


def main(
    suite: str,
    json_path: str | None,
    cases: list[str] | None,
    repeat: int,
    *,
    budget_s: float | None = None,
    cold_cache: bool = True,
    layouts: Sequence[str] = CONV_LAYOUTS,
    compare_layouts: bool = True,
    batch: int | None = None,
    threads: int | None = None,
    schedule: str = "auto",
    kept_weights: bool = False,
) -> int:
    """Run `suite` (or only `cases` of it): print the table, write `json_path` if given.

    `repeat` bounds the rounds per case and `budget_s` the timing seconds per case. Returns 0
    when every case built and verified, 1 otherwise (missed speed targets are reported, not
    failures). `batch` replaces a convolution suite's minibatch. `threads` runs every side on
    that many threads pinned to as many cores (the first of this process's), and polydl
    schedules for that many cores; by default `OMP_NUM_THREADS` threads if set, else one
    thread per core this process may use. `schedule="tuned"` builds polydl's kernels from the
    performance database (`polydl tune --suite`), as `polydl run --schedule tuned` would.
    `kept_weights` times inference: polydl's kernels keep the weights between calls
    (`constant=`: a GEMM's B, a convolution's w), so the copies of them a schedule makes are
    made at the first call, as PyTorch's oneDNN path has its weights reordered beforehand.
    A process started without the thread settings (`threads.THREAD_ENV`), or on other cores
    than `threads` asks for, runs the benchmark in a child process that has them. The machine
    is detected here, once per process, and passed down."""
    if schedule not in ("auto", "tuned") or (schedule != "auto" and suite in CASE_RUNNERS):
        raise BenchError(f"schedule '{schedule}': 'auto' for every suite, 'tuned' for the gemm, "
                         "resnet50 and backward suites (the fused and bf16 suites compare builds "
                         "of their own)")
    selected = select_cases(load_suite(suite, batch), cases)
    if kept_weights and suite not in CASE_RUNNERS and any(
            PASSES[c.primitive].weights is None for c in selected):
        raise BenchError(f"--kept-weights: the {suite} suite's inputs all change between calls "
                         "(a training step); it times the gemm and forward convolution suites")
    arguments: dict[str, Any] = dict(
        suite=suite, json_path=json_path, cases=[c.name for c in selected], repeat=max(1, repeat),
        budget_s=budget_s, cold_cache=cold_cache, layouts=list(layouts),
        compare_layouts=compare_layouts, batch=batch, schedule=schedule,
        kept_weights=kept_weights,
    )
    cores = pinned_cores(threads)
    if not runs_on(cores):
        return _run_in_child({**arguments, "threads": len(cores)}, cores)
    return run_suite(host_target(), **arguments)


def _run_in_child(arguments: dict[str, Any], cores: list[int]) -> int:
    code = (
        "import json, sys; from polydl.bench import main; "
        "sys.exit(main(**json.loads(sys.argv[1])))"
    )
    return run_pinned([sys.executable, "-c", code, json.dumps(arguments)], cores)
