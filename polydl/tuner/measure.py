"""Honest measurements of candidate schedules, in a child process.

The child pins itself to the cores it is given (and OpenMP to as many threads), compiles each
candidate, checks its output against a reference, then times the candidates interleaved (a
round runs each once, in a rotating order) until the spread of every candidate's samples is
small; one whose first call was several times the fastest is timed by that call alone. A
round during which other processes took more than a share of those cores is thrown away and
the child waits; when the machine stays busy the candidates are kept as `noisy`, never as a
winner. The parent reads the child's progress through a pipe: a candidate that
kills the child is recorded as `crashed`, one that stops answering as `timed_out`, and a
new child measures the rest. A child that finished its request waits for the next one
(`measuring_processes`), so its start and imports are paid once, not per request.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
import traceback
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from polydl.codegen.artifact import GeneratedCode
from polydl.driver import c_backend
from polydl.driver.backend import Plan
from polydl.driver.reference import LazyReference
from polydl.driver.verification import STEP_BUDGET
from polydl.errors import PolyDLError
from polydl.ir import LoopNest
from polydl.names import spelling
from polydl.poly.model import PolyModel, build_model
from polydl.poly.reference import python_steps
from polydl.runtime.c.kernel import Kernel
from polydl.runtime.c.toolchain import build_shared_library
from polydl.runtime.inputs import random_inputs
from polydl.runtime.kernel import NUMPY_DTYPES, aligned_zeros
from polydl.runtime.verify import compare
from polydl.target.cpu import CpuTarget
from polydl.tuner.processes import POOL
from polydl.tuning import records

# A problem whose numpy reference is cheap enough to run at full size (multiply-adds);
# larger ones are checked against the analytic schedule's kernel, itself verified by `polydl run`.
REFERENCE_FLOPS = 5e7
# Wall time over which the load on the pinned cores is read (the kernel's ticks are 10 ms).
METER_WINDOW_S = 0.25
# A candidate (not the reference) whose first two calls each took this many times the fastest
# first call of its request, and at least SLOW_CALL_S, is timed by the faster alone: it cannot be
# the best, and the rounds the others need took seconds a call of it (a random search of a
# 1024^3 GEMM on two cores drew one of 1.8 s a call, 120x the fastest: 40 s -> 35 s).
SLOW_FACTOR = 4.0
SLOW_CALL_S = 0.02


@dataclass(frozen=True)
class Limits:
    min_rounds: int = 3
    max_rounds: int = 15
    spread: float = 0.03  # stop when the ratios' (p75 - p25) / median are below this (`settled`)
    sample_s: float = 2e-3  # calls are batched so that one sample lasts at least this long
    budget_s: float = 1.0  # timing seconds per candidate, after `min_rounds`
    timeout_s: float = 120.0  # silence from the child that counts as a hang
    max_other_load: float = 0.2  # share of the pinned cores other processes may take
    load_waits: int = 3  # busy rounds waited out (0.5 s each) before giving up as noisy


@dataclass(frozen=True)
class Request:
    nest: LoopNest
    params: Mapping[str, int]
    target: CpuTarget
    schedules: tuple[Mapping[str, Any], ...]  # Schedule.to_dict() of each candidate
    cpus: tuple[int, ...] | None = None  # the cores to pin to (None: the process's own)
    limits: Limits = field(default_factory=Limits)
    # the index of the analytic choice among `schedules`, if there: where the numpy reference
    # is too slow its output is the reference, with no second planning of "auto"
    reference: int | None = None


@dataclass(frozen=True)
class Outcome:
    index: int  # into Request.schedules
    status: str
    samples: tuple[float, ...] = ()
    message: str = ""
    other_load: float | None = None


def measure(request: Request) -> list[Outcome]:
    """One outcome per schedule of `request`, in its order."""
    outcomes: dict[int, Outcome] = {}
    pending = list(range(len(request.schedules)))
    while pending:
        finished, current, code, log = _run_child(request, pending, outcomes)
        if not finished and current is not None and current not in outcomes:
            why = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
            outcomes[current] = Outcome(current, records.CRASHED,
                                        message=f"the measuring process died ({why}){log}")
        left = [i for i in pending if i not in outcomes]
        if left == pending:
            raise PolyDLError(f"the measuring process died before measuring (exit status {code}){log}")
        pending = left
    return [outcomes[i] for i in range(len(request.schedules))]


def _run_child(
    request: Request, pending: list[int], outcomes: dict[int, Outcome]
) -> tuple[bool, int | None, int | None, str]:
    """Run `pending` in a measuring process (an idle one of the pool, else a new one), filling
    `outcomes`; returns (finished, the candidate it was running when it stopped, its exit
    status, the end of its stderr); the last two only where it died."""
    failure = ""
    with POOL.lease(request.cpus, request.target.cores) as process:
        current: int | None = None
        if not process.send((request, tuple(pending))):
            code, log = process.close()
            return False, current, code, log
        while True:
            if not process.receiver.poll(request.limits.timeout_s):
                process.kill()
                if current is not None:
                    outcomes[current] = Outcome(current, records.TIMED_OUT, message=(
                        f"no progress in {request.limits.timeout_s:g} s: killed"))
                break
            try:
                message = process.receiver.recv()
            except EOFError:
                break
            if message[0] == "begin":
                current = message[1]
            elif message[0] == "outcome":
                outcomes[message[1].index] = message[1]
            elif message[0] == "failed":  # nothing can be measured (no reference)
                failure = message[1]  # raised once the process, still sound, is back
                break
            elif message[0] == "done":
                return True, current, None, ""
        if not failure:
            code, log = process.close()
            return False, current, code, log
    raise PolyDLError(failure)


# ---------------------------------------------------------------------------- the child


def child_main(requests_fd: int, messages_fd: int) -> None:
    """The measuring process: pickled (request, indices) pairs from `requests_fd`, one at a
    time until the parent closes it; messages to `messages_fd`, each request's ending in
    "done" or "failed"."""
    requests = Connection(requests_fd, writable=False)
    conn = Connection(messages_fd, readable=False)
    pinned: tuple[tuple[int, ...] | None, int] | None = None
    share: tuple[int, ...] | None = None
    try:
        while True:
            try:
                request, indices = requests.recv()
            except EOFError:
                return
            try:
                if pinned is None:  # before any kernel loads the OpenMP runtime
                    pinned = request.cpus, request.target.cores
                    share = _pin(*pinned)
                elif pinned != (request.cpus, request.target.cores):
                    raise PolyDLError(f"a measuring process pinned to {pinned} was sent a request "
                                      f"for {(request.cpus, request.target.cores)}")
                _Child(request, conn, share).run(indices)
                conn.send(("done",))
            except PolyDLError as exc:
                conn.send(("failed", str(exc)))
            except Exception:  # noqa: BLE001 - reported to the parent, which raises it
                conn.send(("failed", "the measuring process failed:\n" + traceback.format_exc()))
    finally:
        conn.close()
        requests.close()


def _pin(cpus: tuple[int, ...] | None, threads: int) -> tuple[int, ...] | None:
    """Bind this process to `cpus` and OpenMP to one thread per core, before any kernel
    (and with it the OpenMP runtime) is loaded; returns the cores this process may use."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    share = _own_cores()
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["OMP_PROC_BIND"] = "close"
    os.environ["OMP_PLACES"] = "cores"
    return share


def _own_cores() -> tuple[int, ...] | None:
    return tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None


class _Child:
    def __init__(self, request: Request, conn: Any, cpus: tuple[int, ...] | None = None) -> None:
        """`cpus`: the cores the process was pinned to. Once OpenMP has started, the main
        thread is bound to the first of them only (OMP_PROC_BIND), so they are not read
        from it then."""
        self.request, self.conn = request, conn
        self.limits = request.limits
        self.cpus = cpus or _own_cores()

    def run(self, indices: tuple[int, ...]) -> None:
        ready: dict[int, tuple[Any, list[np.ndarray], dict[str, np.ndarray]]] = {}
        reference: _Reference | None = None
        self._build_ahead(indices)
        # the analytic choice first: where numpy is too slow, its kernel is the reference
        for i in sorted(indices, key=lambda i: i != self.request.reference):
            self.conn.send(("begin", i))
            try:
                kernel = candidate_kernel(self.request, self.request.schedules[i])
            except PolyDLError as exc:
                self._send(Outcome(i, records.COMPILE_FAILED, message=_one_line(exc)))
                continue
            if reference is None:
                inputs = random_inputs(kernel.arguments, seed=0,
                                       index_checks=kernel.code.index_checks)
                analytic = kernel if i == self.request.reference else None
                reference = _Reference.of(self.request, kernel, inputs, analytic)
            outputs = _named_outputs(kernel)
            ok, error = reference.check(kernel, outputs)
            if not ok:
                self._send(Outcome(i, records.WRONG_RESULT, message=(
                    f"max relative error {error:.2e} against {reference.what}")))
                continue
            ready[i] = (kernel, reference.inputs, outputs)
        if ready:
            self._time(ready)

    def _send(self, outcome: Outcome) -> None:
        self.conn.send(("outcome", outcome))

    def _build_ahead(self, indices: tuple[int, ...]) -> None:
        """Compile the candidates' libraries on all of this process's cores at once: each is
        planned here, one after another (over one model, so what its plans share is planned
        once), then handed to gcc (its own process) while the next is planned.
        `candidate_kernel` then loads them one at a time, so a candidate that kills this
        process is still the one named; one that kills it while planned is named too."""
        _BUILT.clear()
        if not indices:
            return
        share = self.cpus or ()
        model = build_model(self.request.nest, dict(self.request.params))
        target = self.request.target
        building = {}
        # the pool's threads, and the compilers they start, run on every core of the process
        bind = (lambda: os.sched_setaffinity(0, share)) if share else None
        # the reference last: an earlier request of the problem has usually built it, and its
        # planning would only hold back the first compile
        order = sorted(indices, key=lambda i: i == self.request.reference)
        with ThreadPoolExecutor(max(1, min(len(share), len(indices))), initializer=bind) as pool:
            for i in order:
                schedule = self.request.schedules[i]
                self.conn.send(("begin", i))
                try:
                    plan, code = _planned(model, target, c_backend.schedule_from(schedule))
                except PolyDLError as exc:
                    _BUILT[_built_key(schedule)] = exc
                    continue
                building[_built_key(schedule)] = (plan, code, pool.submit(build_shared_library, code))
            for key, (plan, code, library) in building.items():
                try:
                    library.result()
                except PolyDLError as exc:
                    _BUILT[key] = exc
                    continue
                finally:
                    self.conn.send(("built",))  # progress: the parent's silence limit restarts
                _BUILT[key] = (model, plan, code)

    @staticmethod
    def _slow(seconds: float, fastest: float) -> bool:
        """Whether a call this long cannot belong to the request's best (`SLOW_FACTOR`)."""
        return seconds >= SLOW_CALL_S and seconds >= SLOW_FACTOR * fastest

    def _time(self, ready: dict[int, tuple[Any, list[np.ndarray], dict[str, np.ndarray]]]) -> None:
        calls, firsts = {}, {}
        for i, (kernel, inputs, outputs) in ready.items():
            self.conn.send(("begin", i))
            t0 = time.perf_counter()
            kernel(*inputs, **outputs)
            firsts[i] = once = max(time.perf_counter() - t0, 1e-7)
            calls[i] = max(1, math.ceil(self.limits.sample_s / once))
        fastest = min(firsts.values())
        aside: dict[int, str] = {}  # the candidates timed once, sent with the rounds' load
        for i in list(ready):
            if i == self.request.reference or not self._slow(firsts[i], fastest):
                continue
            # a first call may carry the process's one-time costs (its OpenMP threads started,
            # pages first touched), many times a call's time: a second call confirms the
            # candidate slow before it is set aside
            kernel, inputs, outputs = ready[i]
            t0 = time.perf_counter()
            kernel(*inputs, **outputs)
            firsts[i] = min(firsts[i], max(time.perf_counter() - t0, 1e-7))
            calls[i] = max(1, math.ceil(self.limits.sample_s / firsts[i]))
            if self._slow(firsts[i], fastest):
                del ready[i]
                aside[i] = f"timed once: {firsts[i] / fastest:.1f}x the fastest first call"
        samples: dict[int, list[float]] = {i: [] for i in ready}
        order = list(ready)
        cpus = self.cpus or ()
        deadline = time.monotonic() + self.limits.budget_s * len(ready)
        rounds = waits = 0
        load: float | None = None
        noisy = False
        # rounds are committed a window at a time: a window is long enough for /proc/stat's
        # ticks to tell whether other processes ran on these cores meanwhile
        window: dict[int, list[float]] = {i: [] for i in ready}
        meter = CoreMeter(cpus)

        def timed(i: int) -> float:
            kernel, inputs, outputs = ready[i]
            self.conn.send(("begin", i))
            kernel(*inputs, **outputs)  # untimed: the turn starts warm, whichever kernel ran before
            t0 = time.perf_counter()
            for _ in range(calls[i]):
                kernel(*inputs, **outputs)
            return (time.perf_counter() - t0) / calls[i]

        while rounds < self.limits.max_rounds:
            shift = rounds % len(order)
            for i in order[shift:] + order[:shift]:
                window[i].append(timed(i))
            rounds += 1
            last = rounds >= self.limits.max_rounds
            if not (meter.long_enough() or last):
                continue
            while not meter.long_enough():
                # a last window shorter than a few ticks would read one tick of anyone as a
                # busy core: run on, unrecorded, until the meter can tell
                for i in order:
                    timed(i)
            share = meter.other_share()
            load = share if share is not None else load
            if share is not None and share > self.limits.max_other_load:
                waits += 1
                if waits <= self.limits.load_waits and not last:
                    rounds -= len(window[order[0]])  # the window's rounds do not count
                    time.sleep(0.5)
                    meter, window = CoreMeter(cpus), {i: [] for i in ready}
                    continue
                noisy = True
            for i in ready:
                samples[i] += window[i]
            if noisy:
                break
            meter, window = CoreMeter(cpus), {i: [] for i in ready}
            if rounds >= self.limits.min_rounds and (
                settled(samples, self.request.reference, self.limits.spread)
                or time.monotonic() > deadline
            ):
                break
        busy = (f"other processes took {load:.0%} of cores {_cpu_list(cpus)} after "
                f"{waits - 1} waits") if noisy else ""
        for i in ready:
            if noisy:
                self._send(Outcome(i, records.NOISY, tuple(samples[i]), busy, load))
            else:
                self._send(Outcome(i, records.OK, tuple(samples[i]),
                                   f"spread {spread(samples[i]):.1%} over {len(samples[i])} rounds", load))
        for i, why in aside.items():
            # a first call slowed by another process is no measure of the candidate: one
            # stored as OK would be the request's only OK trial, so its winner
            self._send(Outcome(i, records.NOISY if noisy else records.OK, (firsts[i],),
                               f"{busy}; {why}" if noisy else why, load))


# What `_Child._build_ahead` built for the request being measured, by `_built_key`: the
# model, plan and code of a candidate whose library is in the cache, or why it failed.
_BUILT: dict[str, tuple[PolyModel, Plan, GeneratedCode] | PolyDLError] = {}


def _built_key(schedule: Mapping[str, Any]) -> str:
    return json.dumps(schedule, sort_keys=True, default=str)


def candidate_kernel(request: Request, schedule: Mapping[str, Any]) -> Kernel:
    """Compile one candidate for the request's target (not through the stored-lowering cache:
    a candidate is built once; its library is still cached by content), or load what
    `_Child._build_ahead` built."""
    built = _BUILT.pop(_built_key(schedule), None)
    if isinstance(built, PolyDLError):
        raise built
    if built is None:
        model = build_model(request.nest, dict(request.params))
        return _kernel(model, request.target, c_backend.schedule_from(schedule))
    return _loaded(*built, request.target)


def _named_outputs(kernel: Any) -> dict[str, np.ndarray]:
    """Output buffers passed by name: every call updates them in place, none allocates."""
    return {spelling(a.name): aligned_zeros(a.shape, NUMPY_DTYPES[a.dtype])
            for a in kernel.arguments if not a.is_input}


@dataclass
class _Reference:
    inputs: list[np.ndarray]
    expected: dict[str, np.ndarray]
    what: str

    @classmethod
    def of(cls, request: Request, kernel: Any, inputs: list[np.ndarray], analytic: Any = None) -> _Reference:
        """The numpy evaluation of the nest where it is cheap; else the output of the analytic
        schedule's kernel (the one `schedule="auto"` builds and `polydl run` verifies): the
        request's `analytic` kernel when it is already built, else built here."""
        model = build_model(request.nest, dict(request.params))
        if model.flops <= REFERENCE_FLOPS and python_steps(model) <= STEP_BUDGET:
            return cls(inputs, _by_name(kernel, kernel.reference(*inputs)), "the numpy reference")
        auto = analytic if analytic is not None else _kernel(model, request.target, "auto")
        return cls(inputs, _by_name(auto, auto(*inputs)), "the analytic schedule's kernel")

    def check(self, kernel: Any, outputs: dict[str, np.ndarray]) -> tuple[bool, float]:
        fresh = {name: np.zeros_like(buf) for name, buf in outputs.items()}
        kernel(*self.inputs, **fresh)
        worst_ok, worst = True, 0.0
        for arg in (a for a in kernel.arguments if not a.is_input):
            name = spelling(arg.name)
            ok, err = compare(fresh[name], self.expected[name], arg.dtype)
            worst_ok, worst = worst_ok and ok, max(worst, err)
        return worst_ok, worst


def _kernel(model: PolyModel, target: CpuTarget, schedule: Any) -> Kernel:
    return _loaded(model, *_planned(model, target, schedule), target)


def _planned(model: PolyModel, target: CpuTarget, schedule: Any) -> tuple[Plan, GeneratedCode]:
    plan = c_backend.plan(model, target, schedule)
    return plan, c_backend.generate(model, plan, target)


def _loaded(model: PolyModel, plan: Plan, code: GeneratedCode, target: CpuTarget) -> Kernel:
    return c_backend.load(code, model.nest, model.params, plan.schedule, model.flops,
                          LazyReference(model.nest, model.params, model), target)


def _by_name(kernel: Any, result: Any) -> dict[str, np.ndarray]:
    outs = result if isinstance(result, tuple) else (result,)
    names = [spelling(a.name) for a in kernel.arguments if not a.is_input]
    return dict(zip(names, outs, strict=True))


class CoreMeter:
    """The share of `cpus` that other processes took since construction: their busy time in
    /proc/stat less this process's own CPU time (its OpenMP threads run only there)."""

    def __init__(self, cpus: Sequence[int]) -> None:
        self.cpus = tuple(cpus)
        self._start = self._read(), time.perf_counter()

    def _read(self) -> tuple[float, float] | None:
        try:
            lines = Path("/proc/stat").read_text().splitlines()
        except OSError:
            return None
        wanted = {f"cpu{c}" for c in self.cpus}
        busy = 0
        for line in lines:
            fields = line.split()
            if fields and fields[0] in wanted:
                ticks = [int(f) for f in fields[1:9]]
                busy += sum(ticks) - ticks[3] - ticks[4]  # less idle and iowait
        own = sum(os.times()[:2])
        return busy / os.sysconf("SC_CLK_TCK"), own

    def long_enough(self) -> bool:
        return time.perf_counter() - self._start[1] >= METER_WINDOW_S

    def other_share(self) -> float | None:
        (start, t0), end = self._start, self._read()
        wall = (time.perf_counter() - t0) * len(self.cpus)
        if start is None or end is None or wall <= 0:
            return None
        return max(0.0, (end[0] - start[0]) - (end[1] - start[1])) / wall


def settled(samples: Mapping[int, Sequence[float]], reference: int | None, limit: float) -> bool:
    """Whether the rounds so far are enough: with the reference among the kernels, every
    candidate's per-round ratios to it spread at most `limit` (the ratios are the labels
    stored: a drift of the machine that moves both sides leaves them, a burst on one side
    shows in them); else every kernel's own samples. The rounds pair: every kernel of the
    request gets one sample a round."""
    base = samples.get(reference) if reference is not None else None
    if base is None or len(samples) == 1:
        return all(spread(s) <= limit for s in samples.values())
    return all(spread([t / r for t, r in zip(s, base, strict=True)]) <= limit
               for i, s in samples.items() if i != reference)


def spread(samples: Sequence[float]) -> float:
    """(p75 - p25) / median: how far apart the middle half of the samples lie."""
    if len(samples) < 2:
        return math.inf
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return (q[2] - q[0]) / max(statistics.median(samples), 1e-12)


def _cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in cpus)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
