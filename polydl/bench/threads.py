"""The thread settings every side of a benchmark shares, and PyTorch sized to them.

They are fixed before any runtime loads, so every side gets the same threads and none keeps
spinning on the cores after its call: OpenBLAS's idle workers otherwise busy-wait about 2^28
cycles (~0.1 s), halving the speed of whatever runs next; 2^4 cycles makes them sleep at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import ModuleType

from polydl.bench.cases import BenchError

THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT")


def thread_environment(cores: int, forced: bool = False) -> dict[str, str]:
    """The thread settings for a run: one thread per core, unless `OMP_NUM_THREADS` (and for
    OpenBLAS `OPENBLAS_NUM_THREADS`) says otherwise and the count is not `forced`."""
    threads = str(cores) if forced else (os.environ.get("OMP_NUM_THREADS") or str(cores))
    return {
        "OMP_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads if forced else (
            os.environ.get("OPENBLAS_NUM_THREADS") or threads),
        "OPENBLAS_THREAD_TIMEOUT": os.environ.get("OPENBLAS_THREAD_TIMEOUT") or "4",
    }


def pinned_cores(threads: int | None) -> list[int]:
    """The cores a run of `threads` threads is pinned to: the first `threads` of this process's
    (when None: `OMP_NUM_THREADS` of them if it is a number, else all of them)."""
    available = sorted(os.sched_getaffinity(0))
    if threads is None:
        requested = os.environ.get("OMP_NUM_THREADS", "")
        if not requested.isdigit():
            return available
        threads = min(int(requested), len(available))
    if not 1 <= threads <= len(available):
        raise BenchError(f"threads must be between 1 and the {len(available)} cores this "
                         f"process may use, got {threads}")
    return available[:threads]


def threads_prepared() -> bool:
    """Whether this process started with the thread settings (numpy's BLAS reads them at load)."""
    return all(name in os.environ for name in THREAD_ENV)


def runs_on(cores: list[int]) -> bool:
    """Whether this process started with the thread settings for `cores` and runs on them."""
    return (threads_prepared() and cores == sorted(os.sched_getaffinity(0))
            and os.environ["OMP_NUM_THREADS"] == str(len(cores)))


def run_pinned(command: list[str], cores: list[int]) -> int:
    """Run `command` with one thread per core of `cores`, pinned to them; its exit status."""
    env = {**os.environ, **thread_environment(len(cores), forced=True)}
    sys.stdout.flush()
    return subprocess.run(command, env=env, preexec_fn=lambda: os.sched_setaffinity(0, cores)).returncode


def import_torch(threads: int) -> ModuleType | None:
    """PyTorch if importable (it is optional), with its thread pool sized to `threads`."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return torch
