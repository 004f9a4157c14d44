"""isl's affine scheduler under a time limit.

`compute_schedule(constraints, seconds)` runs `isl_schedule_constraints_compute_schedule` in a
forked child and returns its schedule, or None where isl finds none; after `seconds` it stops
the child and raises `ScheduleTimeout`. isl's scheduler solves integer programs per schedule
row and, on some nests (two statements of four loops each: a 3-d heat stencil), spends minutes
on them; isl's own operation limit does not bound that time, a child process does. The
schedule comes back as isl's text form (bands with their permutable and coincident flags),
read in the parent's context.
"""

from __future__ import annotations

import os
import select
import signal
import time

import islpy as isl


class ScheduleTimeout(Exception):
    """isl's scheduler did not finish in the time given."""


def compute_schedule(constraints: isl.ScheduleConstraints, seconds: float) -> isl.Schedule | None:
    if not hasattr(os, "fork"):
        return _in_process(constraints)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, write the text, leave without cleanup handlers
        status = 1
        try:
            os.close(read_end)
            schedule = _in_process(constraints)
            if schedule is not None:
                data = schedule.to_str().encode()
                with os.fdopen(write_end, "wb") as out:
                    out.write(data)
                status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    chunks: list[bytes] = []
    deadline = time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                raise ScheduleTimeout(f"isl's scheduler took more than {seconds:.0f} s")
            ready, _, _ = select.select([read_end], [], [], left)
            if not ready:
                continue
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    if not chunks:
        return None
    return isl.Schedule.read_from_str(constraints.get_ctx(), b"".join(chunks).decode())


def _in_process(constraints: isl.ScheduleConstraints) -> isl.Schedule | None:
    try:
        return constraints.compute_schedule()
    except isl.Error:
        return None
