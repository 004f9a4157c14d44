"""Measuring processes kept alive between requests: who serves which request, and when a
fresh process takes over."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from polydl.frontends import builders
from polydl.poly.model import build_model
from polydl.target.host import host_target
from polydl.tuner import processes as measuring_processes
from polydl.tuner.measure import Limits, Request, measure
from polydl.tuner.processes import POOL
from polydl.tuner.search import LocalExecutor, PoolExecutor
from polydl.tuning import records
from polydl.tuning.space import search_space

QUIET = Limits(max_other_load=math.inf, min_rounds=2, max_rounds=3, budget_s=0.05)

# Each compiled candidate notes the measuring process's pid; a flag file, where present, is
# removed and the process crashes on the spot.
SITECUSTOMIZE = '''
import json
import os
import signal
import time

import polydl.tuner.measure as measure

original = measure.candidate_kernel


def candidate_kernel(request, schedule):
    with open(os.environ["TUNING_TEST_PIDS"], "a") as pids:
        pids.write(f"{os.getpid()}\\n")
    flag = os.environ["TUNING_TEST_CRASH_FLAG"]
    if os.path.exists(flag):
        os.remove(flag)
        os.kill(os.getpid(), signal.SIGSEGV)
    return original(request, schedule)


measure.candidate_kernel = candidate_kernel
built = measure.build_shared_library


def build_shared_library(code):
    start = time.monotonic()
    time.sleep(0.2)  # long enough for the other candidate's compile to start beside it
    library = built(code)
    with open(os.environ["TUNING_TEST_BUILDS"], "a") as builds:
        builds.write(json.dumps([os.getpid(), sorted(os.sched_getaffinity(0)), start,
                                 time.monotonic()]) + "\\n")
    return library


measure.build_shared_library = build_shared_library
'''


class Served:
    """The pids of the processes that compiled the candidates, request by request."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        site = tmp_path / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
            p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p))
        self.pids_file = tmp_path / "pids"
        self.crash_flag = tmp_path / "crash"
        monkeypatch.setenv("TUNING_TEST_PIDS", str(self.pids_file))
        monkeypatch.setenv("TUNING_TEST_CRASH_FLAG", str(self.crash_flag))
        self.builds_file = tmp_path / "builds"
        monkeypatch.setenv("TUNING_TEST_BUILDS", str(self.builds_file))
        self.seen = 0
        nest, params = builders.matmul(32, 32, 32)
        self.target = host_target()
        space = search_space(build_model(nest, dict(params)), self.target)
        self.request = Request(nest, dict(params), self.target,
                               tuple(c.schedule.to_dict() for c in space[:2]), limits=QUIET)

    def measure(self, **changes: object) -> tuple[list[str], list[int]]:
        """The request's statuses and the pids that served it."""
        outcomes = measure(replace(self.request, **changes))  # type: ignore[arg-type]
        pids = [int(line) for line in self.pids_file.read_text().split()]
        mine, self.seen = pids[self.seen:], len(pids)
        return [o.status for o in outcomes], mine


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Served:
    return Served(tmp_path, monkeypatch)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_one_process_serves_request_after_request_and_a_crash_hands_over(served: Served) -> None:
    statuses, first = served.measure()
    assert statuses == [records.OK] * 2 and len(set(first)) == 1
    assert served.measure()[1] == first  # no new interpreter: the same process again
    served.crash_flag.touch()
    statuses, crashed = served.measure()
    assert statuses == [records.CRASHED, records.OK]
    assert crashed[0] == first[0] and crashed[1] != first[0]  # a new process for the rest
    assert _gone(first[0])
    assert served.measure()[1] == [crashed[1]] * 2


def test_a_process_started_ahead_serves_the_first_request(served: Served) -> None:
    started = POOL.prestart(None, served.target.cores)
    statuses, pids = served.measure()
    assert statuses == [records.OK] * 2 and pids == [started.pid] * 2


@pytest.mark.parametrize("executor", ["local", "pool"])
def test_an_executor_starts_ahead_the_processes_its_requests_take(
    served: Served, monkeypatch: pytest.MonkeyPatch, executor: str
) -> None:
    """What `polydl tune` starts while the search spaces are computed is what its requests
    lease: no second process is started."""
    started: list[object] = []
    real = measuring_processes.MeasuringProcess.__init__

    def counted(self: measuring_processes.MeasuringProcess, *args: object) -> None:
        started.append(args)
        real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(measuring_processes.MeasuringProcess, "__init__", counted)
    cores = sorted(os.sched_getaffinity(0))[: served.target.cores]
    chosen = LocalExecutor() if executor == "local" else PoolExecutor([tuple(cores)])
    chosen.prestart(served.target)
    assert len(started) == 1
    outcomes = [o for _, found in chosen.run([served.request]) for o in found]
    assert [o.status for o in outcomes] == [records.OK] * 2
    assert len(started) == 1


def test_a_measuring_process_has_a_session_of_its_own(served: Served) -> None:
    """A Ctrl-C at the terminal reaches the tuning process, not the candidate being measured or
    compiled (which would be stored as crashed)."""
    _, pids = served.measure()
    assert os.getsid(pids[0]) == pids[0] != os.getsid(0)


def test_another_core_count_or_environment_gets_its_own_process(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, first = served.measure()
    if served.target.cores > 1:  # OpenMP reads its thread count once, at the first kernel
        _, fewer = served.measure(target=replace(served.target, cores=1))
        assert set(fewer).isdisjoint(first)
    assert served.measure()[1] == first
    monkeypatch.setenv("TUNING_TEST_UNRELATED", "1")
    _, changed = served.measure()
    assert set(changed).isdisjoint(first)
    assert _gone(first[0])  # a process of the old environment is not kept idle


def test_a_process_retires_after_its_share_of_requests(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(measuring_processes, "REQUESTS_PER_PROCESS", 2)
    pids = [served.measure()[1][0] for _ in range(3)]
    assert pids[0] == pids[1] != pids[2]
    assert _gone(pids[0])


def test_closing_the_pool_ends_its_idle_processes(served: Served) -> None:
    _, pids = served.measure()
    POOL.close()
    assert _gone(pids[0])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core compiles one at a time")
def test_every_request_compiles_on_all_the_cores_of_its_process(served: Served) -> None:
    """OpenMP binds a process's main thread to its first core once a kernel has run: the
    compiles of the requests after the first still run on all the process's cores, at once."""
    share = tuple(sorted(os.sched_getaffinity(0))[:2])
    served.request = replace(served.request, cpus=share, target=replace(served.target, cores=2))
    for _ in range(2):
        served.builds_file.unlink(missing_ok=True)
        statuses, pids = served.measure()
        assert statuses == [records.OK] * 2
        builds = [json.loads(line) for line in served.builds_file.read_text().splitlines()]
        assert len(builds) == 2 and {pid for pid, *_ in builds} == set(pids)
        assert all(tuple(cpus) == share for _, cpus, _, _ in builds)
        (_, _, start1, end1), (_, _, start2, end2) = builds
        assert max(start1, start2) < min(end1, end2)  # the two compiles overlapped
