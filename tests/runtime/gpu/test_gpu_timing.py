"""Timing GPU kernels against one another: a kernel that does not run gets no time (inf)
instead of failing the timing of the others. (Real timings: tests/runtime/gpu/test_gpu_kernel.py
on a GPU.)"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from polydl.errors import PolyDLError
from polydl.runtime.gpu.timing import device_seconds


class _NotRunning:
    """A kernel without arguments whose launch fails."""

    arguments = ()

    @contextlib.contextmanager
    def device_copies(self, host: dict[str, Any]) -> Iterator[list[int]]:
        yield []

    def _launch(self, pointers: list[int]) -> None:
        raise PolyDLError("kernel k: launch failed: too many resources requested (error 701)")

    def synchronize(self) -> None:
        pass


def test_a_kernel_that_does_not_run_gets_no_time() -> None:
    assert all(math.isinf(t) for t in device_seconds([_NotRunning(), _NotRunning()]))  # type: ignore[list-item]
