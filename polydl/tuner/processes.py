"""Measuring processes kept alive between requests.

A measuring process starts an interpreter and imports polydl (as long as measuring a few
small candidates; see decisions: Measuring processes kept between requests), so one serves
request after request: a pool keeps the idle ones,
keyed by what a process fixes at its first request and cannot change later: the cores it is
pinned to, its OpenMP thread count (read once, when the first kernel loads the runtime), and
the environment, working directory and interpreter it was started with. A process that dies
or is killed is not returned, so the next request starts a fresh one; a process is retired
after `REQUESTS_PER_PROCESS` requests, so that the kernels it loaded do not pile up.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import IO, Any

REQUESTS_PER_PROCESS = 64
IDLE_PROCESSES = 16  # idle processes kept at most, the longest idle closed first
WAIT_FOR_EXIT_S = 10.0

Key = tuple[Any, ...]


def key_of(cpus: tuple[int, ...] | None, threads: int) -> Key:
    """What a measuring process is started with and keeps."""
    return (cpus, threads, sys.executable, os.getcwd(), frozenset(os.environ.items()))


class MeasuringProcess:
    """One `python -m polydl.tuner.child` process: requests go in through one pipe, its
    messages come back through another; its stderr goes to a file read when it dies."""

    def __init__(self, key: Key, cpus: tuple[int, ...] | None) -> None:
        self.key = key
        self.requests = 0
        self.ended: tuple[int | None, str] | None = None  # close()'s answer, once closed
        self._stderr: IO[bytes] = tempfile.TemporaryFile()
        to_child, from_parent = os.pipe()
        from_child, to_parent = os.pipe()
        try:
            with _started_on(cpus):
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "polydl.tuner.child", str(to_child), str(to_parent)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
                    pass_fds=(to_child, to_parent),
                    # a session of its own: a Ctrl-C at the terminal interrupts the tuning
                    # (which stops handing out requests), not the candidate being measured or
                    # compiled, which would then be stored as crashed or failed to compile
                    start_new_session=True,
                )
        except BaseException:
            for fd in (to_child, from_parent, from_child, to_parent):
                os.close(fd)
            self._stderr.close()
            raise
        os.close(to_child)
        os.close(to_parent)
        self.sender = Connection(from_parent, readable=False)
        self.receiver = Connection(from_child, writable=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, message: Any) -> bool:
        """Hand the process a request; False where it is gone."""
        self.requests += 1
        try:
            self.sender.send(message)
        except (BrokenPipeError, OSError):
            return False
        return True

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.process.kill()

    def close(self) -> tuple[int | None, str]:
        """End the process (it exits when its request pipe closes); returns its exit status
        and the last lines of its stderr."""
        if self.ended is not None:
            return self.ended
        for conn in (self.sender, self.receiver):
            conn.close()
        try:
            self.process.wait(timeout=WAIT_FOR_EXIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace").strip().splitlines()[-3:]
        self._stderr.close()
        self.ended = self.process.returncode, (": " + " | ".join(tail)) if tail else ""
        return self.ended


class ProcessPool:
    """The idle measuring processes of this process, by key (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[MeasuringProcess] = []

    @contextmanager
    def lease(self, cpus: tuple[int, ...] | None, threads: int) -> Iterator[MeasuringProcess]:
        """An idle process of that key, or a new one. It goes back to the pool when the body
        ends normally with the process alive and not closed; an exception ends it."""
        key = key_of(cpus, threads)
        with self._lock:
            mine = next((p for p in self._idle if p.key == key), None)
            if mine is not None:
                self._idle.remove(mine)
            # an environment that changed will not be asked for again: its processes go
            stale = [p for p in self._idle if p.key[2:] != key[2:]]
            self._idle = [p for p in self._idle if p not in stale]
        for process in stale:
            process.close()
        process = mine if mine is not None and mine.alive() else MeasuringProcess(key, cpus)
        if mine is not None and process is not mine:
            mine.close()
        try:
            yield process
        except BaseException:
            process.kill()
            process.close()
            raise
        self.give_back(process)

    def prestart(self, cpus: tuple[int, ...] | None, threads: int) -> MeasuringProcess:
        """Start a process of that key now, idle in the pool, so that its interpreter's start
        and imports run while the caller does other work (a suite's search spaces) rather
        than before the first request."""
        process = MeasuringProcess(key_of(cpus, threads), cpus)
        self.give_back(process)
        return process

    def give_back(self, process: MeasuringProcess) -> None:
        if process.ended is not None or not process.alive() or process.requests >= REQUESTS_PER_PROCESS:
            process.close()
            return
        with self._lock:
            self._idle.append(process)
            surplus = self._idle[:-IDLE_PROCESSES] if len(self._idle) > IDLE_PROCESSES else []
            self._idle = self._idle[len(surplus):]
        for old in surplus:
            old.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for process in idle:
            process.close()


POOL = ProcessPool()
atexit.register(POOL.close)


@contextmanager
def _started_on(cpus: tuple[int, ...] | None) -> Iterator[None]:
    """Start the measuring process on its cores: it inherits the affinity of the thread that
    starts it, so its interpreter's start and imports (a second of work) do not run on the
    cores where other workers are timing. The calling thread gets its own cores back."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    mine = os.sched_getaffinity(0)  # on Linux, of the calling thread
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)
