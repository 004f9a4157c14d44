"""Other work on the machine during a run: the report warns when the cores were shared."""

from __future__ import annotations

import os
import time
from pathlib import Path


class CpuMeter:
    """The share of the machine's CPU time that other processes take while this one runs:
    busy time from /proc/stat less this process's and its children's (the C compiler)."""

    def __init__(self) -> None:
        self._start = self._read(), time.perf_counter()

    @staticmethod
    def _read() -> tuple[float, float] | None:
        import resource  # POSIX only: imported here so the harness still loads elsewhere

        try:
            ticks = [int(f) for f in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
        except (OSError, ValueError):
            return None
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait
        own = sum(
            r.ru_utime + r.ru_stime
            for r in (resource.getrusage(resource.RUSAGE_SELF),
                      resource.getrusage(resource.RUSAGE_CHILDREN))
        )
        return busy, own

    def other_share(self) -> float | None:
        (start, t0), end = self._start, self._read()
        wall = (time.perf_counter() - t0) * (os.cpu_count() or 1)
        if start is None or end is None or wall <= 0:
            return None
        return max(0.0, (end[0] - start[0]) - (end[1] - start[1])) / wall
