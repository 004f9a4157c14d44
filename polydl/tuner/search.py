"""Tuning one problem: search its schedule space, measure, store every trial.

The strategy picks what to measure next. `exhaustive` measures the whole space (the default
when the space fits the trial budget); `guided` measures in batches, each half the next
unmeasured points of `guided_order` (the learned cost model's ranking and the analytic model's
in turn; the analytic one alone where no model is trained) and half the first of them that are
neighbours (one aspect changed: order, tiles, parallel loops or microkernel) of the fastest
measured so far, an evolutionary search;
`random` samples the space uniformly (the baseline the benchmark compares with). Trials already
in the database for this problem and target are not measured again, so an interrupted run
resumes where it stopped.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import queue
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import (
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Protocol

from polydl.errors import PolyDLError, TargetError
from polydl.ir import LoopNest
from polydl.poly.model import build_model
from polydl.target.cpu import CpuTarget
from polydl.target.host import cannot_run_here
from polydl.tuner.measure import Limits, Outcome, Request, measure
from polydl.tuner.processes import POOL
from polydl.tuning import records
from polydl.tuning.costmodel import CostModel
from polydl.tuning.database import PerfDatabase
from polydl.tuning.records import Problem, Trial
from polydl.tuning.space import Candidate, search_space

STRATEGIES = ("auto", "exhaustive", "guided", "random")
BATCH = 8  # candidates measured together (interleaved) per worker
# The search's fastest few, measured again beside the analytic choice in a process of their
# own, over more rounds: the one stored as the best must win there too (`database._fastest`).
FINALISTS = 3


class Executor(Protocol):
    """Runs measurement requests: `slots` at a time, results as they complete."""

    @property
    def slots(self) -> int: ...

    def run(self, requests: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]: ...

    def parts(self) -> Sequence[Executor]:
        """One executor per slot (the workers `SharedWorkers` serves problems from)."""
        ...


class LocalExecutor:
    """Measures in one child process at a time, pinned to the target's number of cores."""

    slots = 1

    def __init__(self, cpus: tuple[int, ...] | None = None) -> None:
        self.cpus = cpus

    def run(self, requests: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]:
        for i, request in enumerate(requests):
            yield i, measure(replace(request, cpus=self._cpus(request.target.cores)))

    def parts(self) -> Sequence[Executor]:
        return [self]

    def prestart(self, target: CpuTarget) -> None:
        """Start the measuring process for `target` now, ahead of the first request."""
        POOL.prestart(self._cpus(target.cores), target.cores)

    def _cpus(self, cores: int) -> tuple[int, ...] | None:
        """The cores a request's process is pinned to: what `prestart` starts, `run` leases."""
        return self.cpus or _first_cpus(cores)


class PoolExecutor:
    """Measures on `shares` of the cores at once, one thread per share driving its own
    measuring process (the threads only wait): Ray's local workers without Ray."""

    def __init__(self, shares: Sequence[tuple[int, ...]]) -> None:
        self.shares = list(shares)
        self.slots = len(self.shares)

    def parts(self) -> Sequence[Executor]:
        return [PoolExecutor([share]) for share in self.shares]

    def prestart(self, target: CpuTarget) -> None:
        for share in self.shares:
            POOL.prestart(share, target.cores)

    def run(self, requests: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]:
        free = list(self.shares)
        queue = list(enumerate(requests))
        with ThreadPoolExecutor(self.slots) as pool:
            running: dict[object, tuple[int, tuple[int, ...]]] = {}
            while queue or running:
                while queue and free:
                    index, request = queue.pop(0)
                    share = free.pop()
                    running[pool.submit(measure, replace(request, cpus=share))] = (index, share)
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)  # type: ignore[arg-type]
                for future in done:
                    index, share = running.pop(future)
                    free.append(share)
                    yield index, future.result()


def _first_cpus(count: int) -> tuple[int, ...] | None:
    try:
        mine = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return None
    return tuple(mine[:count]) if count <= len(mine) else None


@dataclass(frozen=True)
class TuneResult:
    problem: Problem
    best: Trial | None  # fastest ok trial in the database after this run
    measured: tuple[Trial, ...]  # trials of this run
    skipped: int  # candidates already in the database
    space: int
    strategy: str
    db_path: str
    analytic_key: str  # the schedule key of the analytic choice (`schedule="auto"`)
    confirmed: tuple[Trial, ...] = ()  # the finalists and the analytic choice, timed again


Progress = Callable[[int, int, Trial | None], None]  # (done, total, best so far)


def tune(
    nest: LoopNest,
    params: Mapping[str, int],
    *,
    target: CpuTarget,
    trials: int = 32,
    strategy: str = "auto",
    db: PerfDatabase | None = None,
    executor: Executor | None = None,
    cost_model: CostModel | None = None,
    limits: Limits | None = None,
    progress: Progress | None = None,
    seed: int = 0,
    space: Sequence[Candidate] | None = None,
) -> TuneResult:
    """Measure up to `trials` candidates of the problem's search space on `target` and store
    every trial; the target must be one this CPU can run."""
    if strategy not in STRATEGIES:
        raise PolyDLError(f"unknown strategy '{strategy}'; known: {', '.join(STRATEGIES)}")
    if trials < 1:
        raise PolyDLError(f"trials must be at least 1, not {trials}")
    reason = cannot_run_here(target)
    if reason:
        raise TargetError(f"cannot tune here: {reason}")
    db = db or PerfDatabase()
    executor = executor or LocalExecutor()
    limits = limits or Limits()
    problem = Problem.of(nest, params)
    space = list(space) if space is not None else search_space(build_model(nest, dict(params)), target)
    done = db.measured(problem.key, target.key())
    todo = [c for c in space if c.key not in done]
    skipped = len(space) - len(todo)
    budget = min(trials, len(todo))
    if strategy == "auto":
        strategy = "exhaustive" if len(todo) <= trials else "guided"
    scores = cost_model.predict([c.features for c in todo]) if cost_model is not None and todo else None
    picker = _Picker(strategy, todo, scores, seed)
    measured: list[Trial] = []
    best = db.best(problem.key, target.key())
    # timed beside every batch: trials compare by their ratio to it, whichever process, core
    # or minute measured them
    reference = analytic_choice(space)
    batch_size = getattr(executor, "batch", None) or BATCH * executor.slots
    while len(measured) < budget:
        batch = picker.next(min(batch_size, budget - len(measured)), measured)
        if not batch:
            break
        parts = executor.slots  # read once: over shared workers it follows their queue
        chunks = [chunk for chunk in (batch[i::parts] for i in range(parts)) if chunk]
        requests = [referenced_request(nest, params, target, chunk, reference, limits)
                    for chunk in chunks]
        for index, outcomes in executor.run(requests):
            new = referenced_trials(problem, target, chunks[index], reference, outcomes)
            db.add(new)  # the one writer: workers only measure
            measured += new
            for t in new:
                if t.status == records.OK and (best is None or _faster(t, best)):
                    best = t
            if progress:
                progress(len(measured), budget, best)
    confirmed: list[Trial] = []
    confirming = _confirmation(nest, params, target, problem, db, space, reference, limits) \
        if measured else None
    if confirming is not None:
        request, chunk = confirming
        for _, outcomes in executor.run([request]):
            confirmed = referenced_trials(problem, target, chunk, reference, outcomes)
            db.add(confirmed)
    analytic = next((c.key for c in space if c.analytic), "")
    return TuneResult(problem, db.best(problem.key, target.key()), tuple(measured), skipped,
                      len(space), strategy, str(db.path), analytic, tuple(confirmed))


def _confirmation(nest: LoopNest, params: Mapping[str, int], target: CpuTarget, problem: Problem,
                  db: PerfDatabase, space: Sequence[Candidate], reference: Candidate,
                  limits: Limits) -> tuple[Request, list[Candidate]] | None:
    """The request that times the `FINALISTS` fastest schedules measured faster than the
    analytic choice again, with the analytic choice among them (so that it too is stored
    measured twice), over twice the rounds; None when none was faster."""
    ok = db.trials(problem.key, target.key(), statuses=[records.OK])
    times = records.comparable_times(ok)
    base = min((t for t, trial in zip(times, ok, strict=True) if trial.schedule_key == reference.key),
               default=None)
    if base is None:
        return None
    by_key = {c.key: c for c in space}
    finalists: list[Candidate] = []
    for i in sorted(range(len(ok)), key=times.__getitem__):
        key = ok[i].schedule_key
        if times[i] >= base or len(finalists) == FINALISTS:
            break
        if key in by_key and key != reference.key and by_key[key] not in finalists:
            finalists.append(by_key[key])
    if not finalists:
        return None
    chunk = [reference, *finalists]
    longer = replace(limits, min_rounds=2 * limits.min_rounds, max_rounds=2 * limits.max_rounds,
                     budget_s=2 * limits.budget_s)
    return referenced_request(nest, params, target, chunk, reference, longer), chunk


def _space_of(job: tuple[LoopNest, Mapping[str, int], CpuTarget]) -> list[Candidate]:
    nest, params, target = job
    return search_space(build_model(nest, dict(params)), target)


class SearchSpaces:
    """Every problem's search space, computed on all cores before any measurement starts:
    seconds of analysis per problem that would otherwise run beside the workers' timing.
    The processes are forked when this is made, so the caller may then start threads (Ray's)
    and other work while they compute; `result()` waits for the spaces. One problem's is
    computed in this process, by `result()`."""

    def __init__(self, problems: Sequence[tuple[LoopNest, Mapping[str, int]]], target: CpuTarget) -> None:
        self._jobs = [(nest, dict(params), target) for nest, params in problems]
        self._pool: ProcessPoolExecutor | None = None
        self._futures: list[Future[list[Candidate]]] = []
        if len(self._jobs) > 1:
            # with fork every worker starts at the first submit: none is forked later, from
            # a process where other threads may hold locks
            self._pool = ProcessPoolExecutor(min(len(self._jobs), os.cpu_count() or 1),
                                             mp_context=multiprocessing.get_context("fork"))
            self._futures = [self._pool.submit(_space_of, job) for job in self._jobs]

    def result(self) -> list[list[Candidate]]:
        if self._pool is None:
            return [_space_of(job) for job in self._jobs]
        try:
            return [future.result() for future in self._futures]
        finally:
            self.close()

    def close(self) -> None:
        """Drop the spaces not started yet (an error elsewhere); those being computed end."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)


def search_spaces(problems: Sequence[tuple[LoopNest, Mapping[str, int]]], target: CpuTarget) -> list[list[Candidate]]:
    """Every problem's search space (`SearchSpaces`), waited for."""
    return SearchSpaces(problems, target).result()


def tune_problems(
    problems: Sequence[tuple[str, LoopNest, Mapping[str, int]]],
    spaces: Sequence[Sequence[Candidate]],
    *,
    target: CpuTarget,
    executor: Executor,
    report: Callable[[str, TuneResult], None],
    progress: Callable[[str], AbstractContextManager[Progress | None]] | None = None,
    **options: Any,
) -> None:
    """Tune named problems over their `search_spaces`. With several workers, up to two
    problems a worker are tuned at once and share the workers (`SharedWorkers`): each batch
    of a problem is split into small requests, and a worker takes the next request of any
    problem as it comes free, so that neither a long problem nor the last batches leave the
    others idle. `report` gets each result as it completes; `options` go to `tune`. The
    problems with the most arithmetic start first."""
    waiting = sorted(zip(problems, spaces, strict=True), key=lambda item: -problem_flops(item[1]))
    lock = threading.Lock()

    def work(part: Executor) -> None:
        while True:
            with lock:
                if not waiting:
                    return
                (name, nest, params), space = waiting.pop(0)
            # a progress bar per problem while they run one at a time
            with progress(name) if progress and sequential else nullcontext() as watch:
                result = tune(nest, params, target=target, executor=part, space=space,
                              progress=watch, **options)
            with lock:
                report(name, result)

    sequential = len(problems) < 2 or executor.slots < 2
    if sequential:
        work(executor)
        return
    shared = SharedWorkers(executor)
    at_once = min(len(problems), 2 * executor.slots)
    pool = ThreadPoolExecutor(at_once)
    try:
        running = [pool.submit(work, shared.view()) for _ in range(at_once)]
        pending = set(running)
        while pending:
            # an interrupt in any of them stops all at once; another error lets the rest finish
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in done:
                if isinstance(future.exception(), KeyboardInterrupt):
                    future.result()
        for future in running:
            future.result()
    except KeyboardInterrupt:
        # no new problem starts and the queued requests are answered as cancelled; what the
        # workers are measuring is finished and stored, so a later run resumes from there
        # (a problem that fails lets the others finish)
        with lock:
            waiting.clear()
        shared.cancel()
        raise
    finally:
        pool.shutdown(wait=True)
        shared.close()


class SharedWorkers:
    """The workers of an executor (its `parts`, one per slot) serving several problems' tuning
    at once: a problem hands in its batch as requests of up to `CHUNK` candidates (each with the
    reference beside it, so any worker's times compare), every worker thread takes the next
    request, and each problem gets its own requests' outcomes back.

    The next request is the longest expected: a problem's first requests (nothing known yet)
    in the order handed in, then by the seconds a candidate of that problem took so far times
    the request's candidates. Handed out in arrival order, the last batch of a slow problem
    (the 7 x 7 stem's compiles take several times the others') waited behind short ones and
    then ran alone at the end while the other workers sat idle.
    see decisions: Tuning requests longest first"""

    # candidates a request while a worker would otherwise wait (`requests_per_batch`)
    CHUNK = 4

    def __init__(self, executor: Executor) -> None:
        self._requests: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._cancelled = False
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._serve, args=(part,), daemon=True)
                         for part in executor.parts()]
        for thread in self._threads:
            thread.start()

    def _serve(self, part: Executor) -> None:
        while (item := self._requests.get()[2]) is not None:
            index, request, replies = item
            start = time.monotonic()
            try:
                for _, outcomes in part.run([request]):
                    replies.put((index, outcomes, time.monotonic() - start))
            except BaseException as exc:  # noqa: BLE001 - raised again in the problem's thread
                replies.put((index, exc, 0.0))

    def view(self) -> _SharedView:
        return _SharedView(self)

    def requests_per_batch(self) -> int:
        """How many requests a problem's next batch goes out as: one while every worker has a
        request waiting for it, else batches of `CHUNK` (at the start and the end, when some
        worker would wait). Each request also times the reference, so fewer, larger requests
        do more work in all, though requests of 4 leave a smaller tail that keeps the workers
        busier. see decisions: Tuning requests of 8 while the queue is full"""
        if self._requests.qsize() >= len(self._threads):
            return 1
        return max(1, BATCH // self.CHUNK)

    def submit(self, index: int, request: Request, replies: queue.Queue,
               expected_s: float | None = None) -> None:
        """Queue a request; `expected_s`: how long it should take (None: not known yet)."""
        rank = -math.inf if expected_s is None else -expected_s
        with self._lock:
            if self._cancelled:
                replies.put((index, _cancelled(), 0.0))
                return
            self._requests.put((rank, next(self._order), (index, request, replies)))

    def cancel(self) -> None:
        """Answer every queued request, and every one submitted from now on, as cancelled;
        the requests being measured finish."""
        with self._lock:
            self._cancelled = True
            while True:
                try:
                    item = self._requests.get_nowait()[2]
                except queue.Empty:
                    break
                if item is not None:
                    index, _, replies = item
                    replies.put((index, _cancelled(), 0.0))

    def close(self) -> None:
        for _ in self._threads:
            self._requests.put((math.inf, next(self._order), None))
        for thread in self._threads:
            thread.join()


def _cancelled() -> PolyDLError:
    return PolyDLError("tuning was interrupted: this request was not measured")


class _SharedView:
    """One problem's executor over `SharedWorkers`: a batch of BATCH candidates in as many
    requests as the workers' queue calls for (`SharedWorkers.requests_per_batch`, read by
    `tune` at each batch), each queued with the time its candidates are expected to take."""

    batch = BATCH

    def __init__(self, shared: SharedWorkers) -> None:
        self.shared = shared
        self.seconds = 0.0  # what its requests took so far, over this many candidates
        self.candidates = 0

    @property
    def slots(self) -> int:
        return self.shared.requests_per_batch()

    def parts(self) -> Sequence[Executor]:
        return [self]

    def run(self, requests: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]:
        replies: queue.Queue = queue.Queue()
        each = self.seconds / self.candidates if self.candidates else None
        for index, request in enumerate(requests):
            expected = None if each is None else each * len(request.schedules)
            self.shared.submit(index, request, replies, expected)
        for _ in requests:
            index, outcomes, seconds = replies.get()
            if isinstance(outcomes, BaseException):
                raise outcomes
            self.seconds += seconds
            self.candidates += len(requests[index].schedules)
            yield index, outcomes


def analytic_choice(space: Sequence[Candidate]) -> Candidate:
    """The schedule the analytic ranking chose (the first point where none was ranked): the
    reference every measuring process times beside its candidates."""
    return next((c for c in space if c.analytic), space[0])


def problem_flops(space: Sequence[Candidate]) -> float:
    """A problem's arithmetic, as its analytic choice's features count it (0 without a band)."""
    return float(analytic_choice(space).features.get("flops", 0.0)) if space else 0.0


def guided_order(costs: Sequence[float], scores: Sequence[float] | None = None,
                 first: int | None = None) -> list[int]:
    """The order the guided search takes points in, by index: `first` (the analytic choice),
    then the learned model's ranking (`scores`, lower is better) and the analytic model's
    (`costs`) in turn, each point once; the analytic ranking alone where no model is trained.
    In turn: the model learns what this machine's trials show and the analytic model cannot,
    but on a family of problems it was not trained on it can rank far worse than the analytic
    model; in turn, a poor model costs at most every other measurement.
    see decisions: The guided search takes both rankings in turn"""
    by_cost = sorted(range(len(costs)), key=costs.__getitem__)
    rankings = [by_cost] if scores is None else [sorted(range(len(scores)), key=scores.__getitem__), by_cost]
    order: list[int] = [] if first is None else [first]
    taken = set(order)
    cursors = [iter(r) for r in rankings]
    while True:
        turn = [next((i for i in cursor if i not in taken), None) for cursor in cursors]
        if all(i is None for i in turn):
            return order
        for i in turn:  # each ranking's next point not yet taken
            if i is not None and i not in taken:
                taken.add(i)
                order.append(i)


class _Picker:
    def __init__(self, strategy: str, todo: list[Candidate], scores: Sequence[float] | None,
                 seed: int) -> None:
        self.strategy = strategy
        # the analytic choice first: what tuning gains is measured against it
        first = next((i for i, c in enumerate(todo) if c.analytic), None)
        self.order = guided_order([c.cost for c in todo], scores, first)
        self.todo = todo
        self.taken: set[int] = set()
        self.rng = random.Random(seed)
        if strategy == "random":
            self.rng.shuffle(self.order)

    def next(self, count: int, measured: Sequence[Trial]) -> list[Candidate]:
        picks: list[int] = []
        if self.strategy == "guided" and measured:
            ok = [t for t in measured if t.status == records.OK]
            times = records.comparable_times(ok)
            fastest = [ok[i] for i in sorted(range(len(ok)), key=times.__getitem__)[:2]]
            near = [i for i in self.order if i not in self.taken
                    and any(_one_step(self.todo[i], t.schedule) for t in fastest)]
            picks += near[: count // 2]
        for i in self.order:
            if len(picks) >= count:
                break
            if i not in self.taken and i not in picks:
                picks.append(i)
        self.taken.update(picks)
        return [self.todo[i] for i in picks]


def _one_step(candidate: Candidate, schedule: Mapping[str, object]) -> bool:
    """Whether `candidate` differs from `schedule` in exactly one aspect."""
    mine = candidate.schedule.to_dict()
    aspects = ("order", "tiles", "parallel", "microkernel")
    return sum(mine.get(a) != schedule.get(a) for a in aspects) == 1


def _faster(trial: Trial, than: Trial) -> bool:
    mine, other = records.comparable_times([trial, than])
    return mine < other


def referenced_request(nest: LoopNest, params: Mapping[str, int], target: CpuTarget,
                       chunk: Sequence[Candidate], reference: Candidate, limits: Limits) -> Request:
    """A request that times `chunk` interleaved with the problem's `reference` schedule
    (first, unless the chunk holds it)."""
    schedules = chunk if any(c.key == reference.key for c in chunk) else [reference, *chunk]
    index = next(i for i, c in enumerate(schedules) if c.key == reference.key)
    return Request(nest, dict(params), target, tuple(c.schedule.to_dict() for c in schedules),
                   limits=limits, reference=index if reference.analytic else None)


def referenced_trials(problem: Problem, target: CpuTarget, chunk: Sequence[Candidate],
                      reference: Candidate, outcomes: Sequence[Outcome]) -> list[Trial]:
    """The trials of `chunk` from the outcomes of its `referenced_request`, each carrying the
    reference's samples from the same process."""
    prepended = len(outcomes) == len(chunk) + 1
    own = outcomes[1:] if prepended else outcomes
    timed = outcomes[0] if prepended else next(
        o for c, o in zip(chunk, own, strict=True) if c.key == reference.key)
    samples = timed.samples if timed.status == records.OK else ()
    return [trial_of(problem, target, c, o, samples) for c, o in zip(chunk, own, strict=True)]


def trial_of(problem: Problem, target: CpuTarget, candidate: Candidate, outcome: Outcome,
             reference_samples: tuple[float, ...] = ()) -> Trial:
    return Trial(
        problem=problem, target_key=target.key(), schedule=candidate.schedule.to_dict(),
        status=outcome.status, samples=outcome.samples,
        features=candidate.features,
        message=outcome.message, other_load=outcome.other_load, host=socket.gethostname(),
        created=time.time(), reference_samples=reference_samples,
    )
