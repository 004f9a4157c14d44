"""Device time of GPU kernels that take the same arguments, measured against one another.

Every kernel runs on the same device buffers (random inputs, zeroed outputs), the kernels
interleaved round by round so a change in the device's clocks or load falls on all of them.
A sample is a batch of calls captured in one CUDA graph and timed between two events
(`NAME_graph_time` in the launcher): no host time falls between the calls, so a host busy
with other work (compiling the next kernels on every core) does not stretch them. A kernel
that does not run gets no time (inf), not an error. One timing at a time runs in a process.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Sequence

import numpy as np

from polydl.errors import PolyDLError
from polydl.runtime.gpu.kernel import GpuKernel
from polydl.runtime.inputs import random_array
from polydl.runtime.kernel import NUMPY_DTYPES

ROUNDS = 5
SAMPLE_S = 0.004  # one batch of launches
MAX_LAUNCHES = 200
_DEVICE = threading.Lock()


def device_seconds(kernels: Sequence[GpuKernel], rounds: int = ROUNDS, seed: int = 0) -> list[float]:
    """Median seconds a launch of each kernel takes (all take `kernels[0]`'s arguments)."""
    with _DEVICE:
        return _timed(kernels, rounds, seed)


def _timed(kernels: Sequence[GpuKernel], rounds: int, seed: int) -> list[float]:
    first = kernels[0]
    rng = np.random.default_rng(seed)
    host = {arg.name: random_array(arg, rng) if arg.is_input else np.zeros(arg.shape, NUMPY_DTYPES[arg.dtype])
            for arg in first.arguments}
    with first.device_copies(host) as pointers:
        launches = [_calibrated(k, pointers) for k in kernels]
        samples: list[list[float]] = [[] for _ in kernels]
        for _ in range(rounds):
            for i, (kernel, count) in enumerate(zip(kernels, launches, strict=True)):
                if count:
                    samples[i].append(_batch(kernel, pointers, count) / count)
    return [statistics.median(s) if s else float("inf") for s in samples]


def _batch(kernel: GpuKernel, pointers: list[int], count: int) -> float:
    """Seconds of `count` calls back to back on the device."""
    milliseconds = kernel._ffi.new("float *")
    kernel._check(kernel._fn("_graph_time")(*pointers, count, milliseconds), "timing")
    return float(milliseconds[0]) / 1e3


def _calibrated(kernel: GpuKernel, pointers: list[int]) -> int:
    """Calls a sample takes (0: the kernel does not run)."""
    try:
        kernel._launch(pointers)  # the first call loads the module and opts in to its memory
        kernel.synchronize()
        once = _batch(kernel, pointers, 1)
    except PolyDLError:
        return 0
    return max(1, min(MAX_LAUNCHES, int(SAMPLE_S / max(once, 1e-6))))
