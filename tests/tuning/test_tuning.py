"""Tuning beyond the basics of test_tuner.py: the search space of every kind of nest, each way a
measurement can fail, the load judged over whole windows, what a resumed run measures again,
the lookup order with a system database, and the `polydl tune` command's errors."""

from __future__ import annotations

import math
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polydl import layouts
from polydl.cli import main
from polydl.driver import c_backend
from polydl.driver.pipeline import build_kernel, lower
from polydl.errors import CompileError, PolyDLError, TargetError
from polydl.frontends import builders, load_spec
from polydl.ir import LoopNest
from polydl.poly.model import build_model
from polydl.schedules.cpu.auto import auto_schedule
from polydl.schedules.schedule import Schedule
from polydl.target.cpu import CpuTarget
from polydl.target.host import cannot_run_here, host_target
from polydl.tuner.measure import Limits, Outcome, Request, measure, settled
from polydl.tuner.search import (
    BATCH,
    LocalExecutor,
    PoolExecutor,
    SearchSpaces,
    SharedWorkers,
    _SharedView,
    search_spaces,
    tune,
    tune_problems,
)
from polydl.tuning import records
from polydl.tuning.costmodel import CostModel
from polydl.tuning.database import PerfDatabase
from polydl.tuning.lookup import tuned_schedule
from polydl.tuning.records import Problem, Trial, schedule_key
from polydl.tuning.space import search_space, tuning_model
from tests.frontends.test_builders import conv2d_numpy
from tests.kernels import run_and_check

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
MATMUL_SPEC = [str(EXAMPLES / "matmul.c"), "-p", "M=32", "-p", "N=32", "-p", "K=32"]
# Tests run beside each other: the load check is off where a test expects `ok`.
QUIET = Limits(max_other_load=math.inf, min_rounds=2, max_rounds=3, budget_s=0.05)


Nest = tuple[LoopNest, dict[str, int]]


@pytest.fixture(scope="module")
def matmul32() -> Nest:
    nest, params = builders.matmul(32, 32, 32)
    return nest, dict(params)


def _db(tmp_path: Path, name: str = "perf.sqlite") -> PerfDatabase:
    return PerfDatabase(tmp_path / name, system=False)


def _without_notes(schedule: Schedule) -> dict[str, Any]:
    return {k: v for k, v in schedule.to_dict().items() if k != "notes"}


# ------------------------------------------------------------------------------ search space


NESTS: dict[str, Callable[[], tuple[Any, Any]]] = {
    "matmul_odd": lambda: builders.matmul(33, 17, 9),
    "linear_bias_relu": lambda: load_spec(EXAMPLES / "linear_bias_relu.c",
                                          {"N": 4, "C": 24, "K": 20}),
    "conv2d_nchw": lambda: builders.conv2d(N=1, C=3, K=4, H=6, W=6, R=3, S=3, padding=1),
    "wavefront": lambda: load_spec(EXAMPLES / "wavefront.c", {"N": 16}),  # no band to choose
}


@pytest.mark.parametrize("name", NESTS)
def test_the_space_leads_with_what_auto_compiles(name: str) -> None:
    nest, params = NESTS[name]()
    target = host_target()
    model = build_model(nest, dict(params))
    space = search_space(model, target)
    keys = [c.key for c in space]
    assert len(keys) == len(set(keys))
    assert [c.analytic for c in space] == [True] + [False] * (len(space) - 1)
    auto = auto_schedule(tuning_model(model), target).schedule
    assert _without_notes(space[0].schedule) == _without_notes(auto)
    assert space[0].key == schedule_key(auto.to_dict())


def test_slow_fusion_choices_keep_the_best_ranked_points(
    matmul32: Nest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polydl.tuning import space as space_module

    nest, params = matmul32
    model = build_model(nest, params)
    whole = search_space(model, host_target())
    monkeypatch.setattr(space_module, "FUSION_SECONDS", 0.0)
    cut = search_space(model, host_target())
    assert len(whole) > 1 and [c.key for c in cut] == [whole[0].key] and cut[0].analytic


def test_the_space_holds_tile_neighbours_and_thread_mappings_beyond_the_ranking(
    matmul32: Nest,
) -> None:
    from polydl.schedules.cpu.rank import rank

    nest, params = matmul32
    target = host_target()
    model = build_model(nest, params)
    space = [c.schedule for c in search_space(model, target)]
    assert len(space) > len(rank(tuning_model(model), target))

    def same_but(a: Schedule, b: Schedule, aspect: str) -> bool:
        return all(getattr(a, f) == getattr(b, f)
                   for f in ("order", "tiles", "parallel", "microkernel") if f != aspect)

    def one_tile_doubled(a: Schedule, b: Schedule) -> bool:
        ta, tb = a.tile_sizes, b.tile_sizes
        changed = [v for v in ta if ta[v] != tb.get(v)]
        return ta.keys() == tb.keys() and len(changed) == 1 and tb[changed[0]] == 2 * ta[changed[0]]

    assert any(same_but(a, b, "tiles") and one_tile_doubled(a, b) for a in space for b in space)
    assert any(same_but(a, b, "parallel") and a.parallel != b.parallel
               for a in space for b in space)


def test_thread_features_say_what_every_thread_reads_whole_and_how_often_they_fork() -> None:
    """C[i][j] += A[i][k] * B[k][j] at 64 x 32 x 16 on two cores: threads that split the rows
    each read all of B (512 of the 3584 floats), threads that split the columns all of A (1024),
    and a parallel j inside i forks once per row."""
    nest, params = builders.matmul(64, 32, 16)
    space = search_space(build_model(nest, dict(params)), replace(host_target(), cores=2))
    split_rows = next(c for c in space if c.schedule.parallel == ("i",))
    inside = next(c for c in space if c.schedule.parallel == ("j",) and c.schedule.order[0] == "i")
    assert split_rows.features["parallel_replicated_share"] == pytest.approx(512 / 3584)
    assert split_rows.features["parallel_log_forks"] == 0
    assert inside.features["parallel_replicated_share"] == pytest.approx(1024 / 3584)
    assert inside.features["parallel_log_forks"] == 6 and inside.features["parallel_depth"] == 1
    assert all(c.features["loops"] == len(c.schedule.order) for c in space)


@pytest.mark.slow
def test_every_candidate_of_an_odd_matmul_computes_the_product() -> None:
    nest, params = builders.matmul(33, 17, 9)
    target = host_target()
    for c in search_space(build_model(nest, dict(params)), target):
        kernel = build_kernel(nest, params, target, schedule=c.schedule)
        run_and_check(kernel, lambda a, b: a.astype(np.float64) @ b)


@pytest.mark.slow
def test_blocked_convolution_candidates_compute_the_convolution() -> None:
    nest, params = builders.conv2d(N=1, C=16, K=16, H=6, W=6, R=3, S=3, padding=1,
                                   layout="nchw16c")
    target = host_target()
    space = search_space(build_model(nest, dict(params)), target)
    assert any(c.schedule.microkernel is None for c in space)  # not only microkernel bindings

    def expected(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        plain = conv2d_numpy(layouts.from_nchw16c(x, 16), layouts.from_kcrs16c16k(w, 16, 16),
                             stride=1, padding=1)
        return layouts.to_nchw16c(plain)

    for c in space[:: max(1, len(space) // 5)]:
        run_and_check(build_kernel(nest, params, target, schedule=c.schedule), expected)


def test_the_single_candidate_of_a_general_nest_computes_the_recurrence() -> None:
    nest, params = NESTS["wavefront"]()
    target = host_target()
    (only,) = search_space(build_model(nest, dict(params)), target)
    a = np.random.default_rng(0).uniform(-1, 1, (16, 16)).astype(np.float32)
    expected = a.astype(np.float64)
    for i in range(1, 16):
        for j in range(1, 16):
            expected[i, j] = 0.5 * (expected[i - 1, j] + expected[i, j - 1])
    got = build_kernel(nest, params, target, schedule=only.schedule)(A=a.copy())
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------- measuring

# Loaded by every Python started with the test's PYTHONPATH, so by the measuring child:
# TUNING_TEST_FAULT=KIND:INDEX makes candidate INDEX misbehave; "meter" swaps the load meter.
SITECUSTOMIZE = '''
import os
import signal

import polydl.tuner.measure as measure
from polydl.errors import PolyDLError

KIND, _, INDEX = os.environ.get("TUNING_TEST_FAULT", "").partition(":")
original = measure.candidate_kernel


class Faulty:
    """The candidate's kernel with wrong outputs, or crashing on its third call (after the
    check against the reference and the calibration: while it is timed)."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __call__(self, *inputs, **outputs):
        self.calls += 1
        if KIND == "crash" and self.calls == 3:
            os.kill(os.getpid(), signal.SIGSEGV)
        result = self.kernel(*inputs, **outputs)
        if KIND == "wrong":
            for buffer in outputs.values():
                buffer += 1
        return result


def candidate_kernel(request, schedule):
    if INDEX and schedule == request.schedules[int(INDEX)]:
        if KIND == "compile":
            raise PolyDLError("refused by the test")
        return Faulty(original(request, schedule))
    return original(request, schedule)


class ShortWindowsLookBusy(measure.CoreMeter):
    """The worst a window shorter than the meter can judge may read: every core taken."""

    def other_share(self):
        return 0.0 if self.long_enough() else 1.0


measure.candidate_kernel = candidate_kernel
if KIND == "meter":
    measure.CoreMeter = ShortWindowsLookBusy
'''


Fault = Callable[[str], None]  # sets TUNING_TEST_FAULT for the measuring children


@pytest.fixture
def child_fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fault:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p))
    return lambda fault: monkeypatch.setenv("TUNING_TEST_FAULT", fault)


def _first_schedules(nest: LoopNest, params: dict[str, int], target: CpuTarget,
                     n: int = 3) -> tuple[dict, ...]:
    space = search_space(build_model(nest, params), target)
    return tuple(c.schedule.to_dict() for c in space[:n])


def test_rounds_stop_when_the_ratios_to_the_reference_settle() -> None:
    """The labels are the candidates' per-round ratios to the reference: a drift of the machine
    that moves both sides stops nothing, sides that waver against each other keep the rounds
    going though each alone is steady."""
    drifting = {0: [1.0, 2.0, 4.0, 8.0], 1: [0.9, 1.8, 3.6, 7.2]}
    assert settled(drifting, reference=0, limit=0.03)
    assert not settled(drifting, reference=None, limit=0.03)  # by each side's own samples
    wavering = {0: [1.0, 1.02, 1.0, 1.02], 1: [1.02, 1.0, 1.02, 1.0]}  # each spread 2%
    assert not settled(wavering, reference=0, limit=0.03)  # their ratios spread 4%
    assert settled(wavering, reference=None, limit=0.03)
    assert settled({0: [1.0, 1.01, 1.0]}, reference=0, limit=0.03)  # the reference alone
    assert not settled({0: [1.0, 2.0, 1.0, 2.0], 2: [1.0] * 4}, reference=1, limit=0.03)  # no reference


@pytest.mark.parametrize("fault, status, said", [
    ("compile:1", records.COMPILE_FAILED, "refused by the test"),
    ("wrong:0", records.WRONG_RESULT, "against the numpy reference"),
    ("crash:2", records.CRASHED, "signal 11"),  # while timed, not while compiled
])
def test_a_failing_candidate_is_recorded_and_the_rest_measured(
    matmul32: Nest, child_fault: Fault, fault: str, status: str, said: str
) -> None:
    nest, params = matmul32
    target = host_target()
    child_fault(fault)
    outcomes = measure(Request(nest, params, target, _first_schedules(nest, params, target),
                               limits=QUIET))
    bad = int(fault.split(":")[1])
    assert [o.index for o in outcomes] == [0, 1, 2]
    assert outcomes[bad].status == status and said in outcomes[bad].message
    assert not outcomes[bad].samples
    for o in outcomes[:bad] + outcomes[bad + 1:]:
        assert o.status == records.OK and 2 <= len(o.samples) <= 3 and "spread" in o.message


def test_the_load_is_judged_over_a_whole_window_however_few_the_rounds(
    matmul32: Nest, child_fault: Fault
) -> None:
    nest, params = matmul32
    target = host_target()
    child_fault("meter")
    limits = replace(QUIET, max_other_load=0.2)
    outcomes = measure(Request(nest, params, target, _first_schedules(nest, params, target, 2),
                               limits=limits))
    assert [(o.status, o.other_load) for o in outcomes] == [(records.OK, 0.0)] * 2


class _Messages:
    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def send(self, message: tuple) -> None:
        self.sent.append(message)


@pytest.mark.parametrize("reference", [0, 2, None])
def test_a_large_problem_checks_against_the_analytic_kernel_built_once(
    matmul32: Nest, monkeypatch: pytest.MonkeyPatch, reference: int | None
) -> None:
    """Where numpy is too slow, the candidates are checked against the analytic choice's
    output: the request's own kernel when it names the analytic choice among its schedules
    (built first wherever it stands, nothing planned twice), else one built for
    `schedule="auto"`."""
    from polydl.tuner import measure as measuring
    from polydl.tuner.search import analytic_choice, referenced_request

    nest, params = matmul32
    target = host_target()
    space = search_space(build_model(nest, params), target)
    request = referenced_request(nest, params, target, space[1:3], analytic_choice(space), QUIET)
    assert request.reference == 0
    if reference == 2:  # the analytic choice last
        request = replace(request, schedules=(*request.schedules[1:], request.schedules[0]))
    request = replace(request, reference=reference)
    planned: list[object] = []
    real = c_backend.plan

    def counted(model: Any, target: CpuTarget, schedule: Any) -> Any:
        planned.append(schedule)
        return real(model, target, schedule)

    monkeypatch.setattr(measuring, "REFERENCE_FLOPS", 0)
    monkeypatch.setattr(c_backend, "plan", counted)
    messages = _Messages()
    measuring._Child(request, messages).run((0, 1, 2))
    outcomes = [m[1] for m in messages.sent if m[0] == "outcome"]
    assert [o.status for o in outcomes] == [records.OK] * 3
    assert len(planned) == (4 if reference is None else 3)
    assert ("auto" in planned) == (reference is None)


def test_a_request_plans_every_candidate_over_one_model_on_one_core_too(
    matmul32: Nest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plans of a model's other nests are kept per model: a request whose candidates were
    each planned over a model of their own would rank those nests once a candidate."""
    from polydl.tuner import measure as measuring

    nest, params = matmul32
    target = replace(host_target(), cores=1)
    request = Request(nest, params, target, _first_schedules(nest, params, target, 3), limits=QUIET)
    models: list[object] = []  # held, so that no two share an id
    real = c_backend.plan

    def recorded(model: Any, target: CpuTarget, schedule: Any) -> Any:
        models.append(model)
        return real(model, target, schedule)

    monkeypatch.setattr(c_backend, "plan", recorded)
    messages = _Messages()
    measuring._Child(request, messages, cpus=(sorted(os.sched_getaffinity(0))[0],)).run((0, 1, 2))
    assert [m[1].status for m in messages.sent if m[0] == "outcome"] == [records.OK] * 3
    assert len(models) == 3 and all(m is models[0] for m in models)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core compiles one at a time")
def test_a_process_compiles_its_candidates_on_all_its_cores_and_names_the_one_that_fails(
    matmul32: Nest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polydl.tuner import measure as measuring

    nest, params = matmul32
    target = host_target()
    schedules = _first_schedules(nest, params, target, 3)
    request = Request(nest, params, target, schedules, limits=QUIET)
    real = measuring.build_shared_library
    lock = threading.Lock()
    running, most, failing = [0], [0], []

    def watched(code: Any) -> Any:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.3)  # long enough for the others to start beside it
            if not failing:
                failing.append(code.source)
            if code.source == failing[0]:
                raise CompileError("cc", ["cc"], "refused by the test")
            return real(code)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(measuring, "build_shared_library", watched)
    messages = _Messages()
    measuring._Child(request, messages).run((0, 1, 2))
    assert most[0] == min(3, len(os.sched_getaffinity(0)))
    outcomes = [m[1] for m in messages.sent if m[0] == "outcome"]
    assert sorted(o.status for o in outcomes) == [records.COMPILE_FAILED] + [records.OK] * 2
    failed = next(o for o in outcomes if o.status == records.COMPILE_FAILED)
    assert failed.message == "CompileError: cc failed"
    assert not measuring._BUILT  # every built candidate was loaded


def test_a_process_plans_the_reference_after_its_candidates(
    matmul32: Nest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An earlier request of the problem has usually built the reference: planned first, it
    would only hold back the first candidate's compile."""
    from polydl.tuner import measure as measuring

    nest, params = matmul32
    target = host_target()
    schedules = _first_schedules(nest, params, target, 3)
    request = Request(nest, params, target, schedules, limits=QUIET, reference=0)
    planned: list[int] = []
    real = measuring._planned

    def watched(model: Any, target: CpuTarget, schedule: Any) -> Any:
        planned.append(next(i for i, s in enumerate(schedules) if c_backend.schedule_from(s) == schedule))
        return real(model, target, schedule)

    monkeypatch.setattr(measuring, "_planned", watched)
    messages = _Messages()
    measuring._Child(request, messages).run((0, 1, 2))
    assert planned[:3] == [1, 2, 0]
    assert sorted(m[1].status for m in messages.sent if m[0] == "outcome") == [records.OK] * 3


class _Sleeper:
    """A kernel's stand-in that takes `seconds` a call."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, *args: Any, **outputs: Any) -> None:
        time.sleep(self.seconds)


def test_a_candidate_far_slower_than_the_others_is_timed_by_its_first_call(matmul32: Nest) -> None:
    """It cannot be the best, and its rounds would take most of the request's time; the
    reference is timed in full whatever its speed, every trial being compared through it."""
    from polydl.tuner import measure as measuring

    nest, params = matmul32
    request = Request(nest, params, host_target(), ({}, {}, {}), limits=QUIET, reference=2)
    messages = _Messages()
    slow = 2 * measuring.SLOW_FACTOR * 0.02
    measuring._Child(request, messages)._time(
        {0: (_Sleeper(0.02), [], {}), 1: (_Sleeper(slow), [], {}), 2: (_Sleeper(slow), [], {})})
    outcomes = {m[1].index: m[1] for m in messages.sent if m[0] == "outcome"}
    assert all(o.status == records.OK for o in outcomes.values())
    assert len(outcomes[1].samples) == 1 and outcomes[1].samples[0] >= slow
    assert outcomes[1].message.startswith("timed once: ")
    assert len(outcomes[0].samples) >= QUIET.min_rounds
    assert len(outcomes[2].samples) >= QUIET.min_rounds  # the reference


class _ColdAfterAnother:
    """A kernel's stand-in whose call takes `cold` seconds right after another kernel's (its
    data out of the caches, its threads asleep), `warm` after its own, `first` the first time."""

    last: list[object] = [None]

    def __init__(self, first: float, warm: float, cold: float) -> None:
        self.first, self.warm, self.cold = first, warm, cold

    def __call__(self, *args: Any, **outputs: Any) -> None:
        seconds = self.first if self.first else self.warm if self.last[0] is self else self.cold
        self.first = 0.0
        self.last[0] = self
        time.sleep(seconds)


def test_every_turn_starts_warm_whatever_its_calls(matmul32: Nest) -> None:
    """A turn of few calls (the reference's first timed call was cold: it follows every
    candidate's check) would otherwise carry the cold call after another kernel's turn in a
    larger share of its time: the reference measured 0.71-0.76 ms beside candidates of
    0.56-0.67, and alone 0.55."""
    from polydl.tuner import measure as measuring

    nest, params = matmul32
    request = Request(nest, params, host_target(), ({}, {}), limits=QUIET, reference=0)
    messages = _Messages()
    measuring._Child(request, messages)._time(
        {0: (_ColdAfterAnother(0.01, 0.002, 0.008), [], {}),
         1: (_ColdAfterAnother(0.0005, 0.002, 0.008), [], {})})
    outcomes = {m[1].index: m[1] for m in messages.sent if m[0] == "outcome"}
    reference, candidate = (statistics.median(outcomes[i].samples) for i in (0, 1))
    assert reference == pytest.approx(candidate, rel=0.25) and reference < 0.004


def test_a_candidate_timed_once_on_busy_cores_is_noisy(matmul32: Nest, monkeypatch: Any) -> None:
    """Its one call may have waited for another process: stored as OK, it would be the only
    OK trial of a request whose rounds were all noisy, so the request's winner."""
    from polydl.tuner import measure as measuring

    nest, params = matmul32
    monkeypatch.setattr(measuring.CoreMeter, "other_share", lambda self: 0.9)
    monkeypatch.setattr(measuring, "METER_WINDOW_S", 0.0)
    busy = replace(QUIET, max_other_load=0.2, load_waits=0)
    request = Request(nest, params, host_target(), ({}, {}), limits=busy, reference=0)
    messages = _Messages()
    slow = 2 * measuring.SLOW_FACTOR * 0.02
    measuring._Child(request, messages)._time({0: (_Sleeper(0.02), [], {}), 1: (_Sleeper(slow), [], {})})
    outcomes = {m[1].index: m[1] for m in messages.sent if m[0] == "outcome"}
    assert [outcomes[i].status for i in (0, 1)] == [records.NOISY] * 2
    assert "timed once" in outcomes[1].message and outcomes[1].other_load == 0.9


class _SlowStart:
    """A kernel whose first call pays a one-time cost (threads started, pages touched)."""

    def __init__(self, first: float, then: float) -> None:
        self.waits = [first]
        self.then = then

    def __call__(self, *args: Any, **outputs: Any) -> None:
        time.sleep(self.waits.pop() if self.waits else self.then)


def test_a_candidate_slow_on_its_first_call_only_is_timed_in_full(matmul32: Nest) -> None:
    """The first call of a process may start its OpenMP threads: a candidate is set aside
    as slow only when a second call is slow too."""
    from polydl.tuner import measure as measuring

    nest, params = matmul32
    request = Request(nest, params, host_target(), ({}, {}), limits=QUIET, reference=1)
    messages = _Messages()
    slow = 2 * measuring.SLOW_FACTOR * 0.02
    measuring._Child(request, messages)._time(
        {0: (_SlowStart(slow, 0.02), [], {}), 1: (_Sleeper(0.02), [], {})})
    outcomes = {m[1].index: m[1] for m in messages.sent if m[0] == "outcome"}
    assert outcomes[0].status == records.OK and not outcomes[0].message.startswith("timed once")
    assert len(outcomes[0].samples) >= QUIET.min_rounds and max(outcomes[0].samples) < slow


def test_search_spaces_fork_their_processes_when_made() -> None:
    """`polydl tune --workers` starts Ray's threads while the spaces are computed: the
    processes computing them are forked before, when `SearchSpaces` is made."""
    import multiprocessing

    target = host_target()
    problems = [builders.matmul(n, 32, 16) for n in (16, 48)]
    before = set(multiprocessing.active_children())
    computing = SearchSpaces(problems, target)
    forked = set(multiprocessing.active_children()) - before
    assert len(forked) == min(2, os.cpu_count() or 1)
    spaces = computing.result()
    assert [[c.key for c in s] for s in spaces] == [
        [c.key for c in search_space(build_model(nest, dict(params)), target)] for nest, params in problems]


@pytest.fixture
def busy_core() -> Iterator[int]:
    """A core another process keeps busy."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(busy.pid, {cpu})
        yield cpu
    finally:
        busy.kill()
        busy.wait()


def test_a_core_shared_with_a_busy_process_gives_noisy_outcomes(
    matmul32: Nest, busy_core: int
) -> None:
    nest, params = matmul32
    target = replace(host_target(), cores=1)
    limits = Limits(max_other_load=0.2, load_waits=1, min_rounds=2, max_rounds=3, budget_s=0.05)
    outcomes = measure(Request(nest, params, target, _first_schedules(nest, params, target),
                               cpus=(busy_core,), limits=limits))
    assert [o.status for o in outcomes] == [records.NOISY] * 3
    for o in outcomes:
        assert o.other_load is not None and o.other_load > 0.2
        assert o.samples and f"of cores {busy_core}" in o.message


# ------------------------------------------------------------------------------------ tuning


class Scripted:
    """An executor that measures nothing: each schedule's outcome is `script(schedule)`."""

    slots = 1

    def __init__(self, script: Callable[[dict], tuple[str, float]]) -> None:
        self.script = script

    def parts(self) -> list[Scripted]:
        return [self]

    def run(self, requests: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]:
        for n, request in enumerate(requests):
            outcomes = []
            for i, schedule in enumerate(request.schedules):
                status, seconds = self.script(dict(schedule))
                samples = (seconds,) * 3 if status in (records.OK, records.NOISY) else ()
                outcomes.append(Outcome(i, status, samples))
            yield n, outcomes


def test_a_resumed_run_measures_again_only_what_was_noisy(matmul32: Nest, tmp_path: Path) -> None:
    nest, params = matmul32
    target = host_target()
    space = search_space(build_model(nest, params), target)
    rank = {c.key: n for n, c in enumerate(space)}
    statuses = [records.OK, records.NOISY, records.CRASHED, records.TIMED_OUT, records.OK,
                records.COMPILE_FAILED, records.WRONG_RESULT]

    def script(schedule: dict) -> tuple[str, float]:
        n = rank[schedule_key(schedule)]
        return statuses[n % len(statuses)], 1e-3 * (len(space) - n)  # the last is fastest

    db = _db(tmp_path)
    first = tune(nest, params, target=target, trials=len(space), db=db, executor=Scripted(script))
    assert first.strategy == "exhaustive" and first.skipped == 0
    assert {t.schedule_key for t in first.measured} == set(rank)
    ok = [t for t in first.measured if t.status == records.OK]
    assert first.best is not None and first.best.seconds == min(t.seconds or math.inf for t in ok)
    noisy = {t.schedule_key for t in first.measured if t.status == records.NOISY}
    assert noisy and all(rank[k] % len(statuses) == 1 for k in noisy)
    again = tune(nest, params, target=target, trials=len(space), db=db, executor=Scripted(script))
    assert {t.schedule_key for t in again.measured} == noisy
    assert again.skipped == len(space) - len(noisy)
    assert len(db.trials(statuses=[records.NOISY])) == 2 * len(noisy)


def test_trials_compare_by_the_reference_timed_beside_them(matmul32: Nest, tmp_path: Path) -> None:
    """The measuring process that times the fastest candidate runs three times slower than
    the others (a busy minute, a slow core): its seconds lose, its ratio to the analytic
    choice timed in the same process wins."""
    nest, params = matmul32
    target = host_target()
    space = search_space(build_model(nest, params), target)
    rank = {c.key: n for n, c in enumerate(space)}
    fastest = space[-1].key
    requests: list[Request] = []

    class Drifting:
        slots = 2

        def run(self, batch: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]:
            for n, request in enumerate(batch):
                requests.append(request)
                keys = [schedule_key(dict(s)) for s in request.schedules]
                slow = 3.0 if fastest in keys else 1.0
                yield n, [Outcome(i, records.OK, (slow * 1e-3 * (2 - rank[k] / len(space)),) * 3)
                          for i, k in enumerate(keys)]

    result = tune(nest, params, target=target, trials=len(space), db=_db(tmp_path),
                  executor=Drifting())
    assert len(requests) > 1 and all(space[0].key in {schedule_key(dict(s)) for s in r.schedules}
                                     for r in requests)
    assert all(t.reference_samples for t in result.measured)
    assert result.best is not None and result.best.schedule_key == fastest
    assert min(result.measured, key=lambda t: t.seconds or 0).schedule_key != fastest


def test_the_fastest_are_timed_again_and_a_lucky_one_is_not_kept(matmul32: Nest, tmp_path: Path) -> None:
    """A candidate that measured fastest by luck (its second measurement is slower than the
    analytic choice) is not stored as the best; the runner-up that wins again is."""
    nest, params = matmul32
    target = host_target()
    space = search_space(build_model(nest, params), target)
    lucky, steady = space[-1].key, space[-2].key
    requests: list[Request] = []
    timed: set[str] = set()

    class Lucky:
        slots = 1

        def run(self, batch: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]:
            for n, request in enumerate(batch):
                requests.append(request)
                keys = [schedule_key(dict(s)) for s in request.schedules]
                seconds = {lucky: 1.2e-3 if lucky in timed else 0.5e-3, steady: 0.8e-3}
                timed.update(keys)
                yield n, [Outcome(i, records.OK, (seconds.get(k, 1e-3),) * 3)
                          for i, k in enumerate(keys)]

    db = _db(tmp_path)
    result = tune(nest, params, target=target, trials=len(space), db=db, executor=Lucky())
    *search, last = requests  # the search's batches, then its finalists again
    assert len(search) == math.ceil(len(space) / BATCH)
    again = [schedule_key(dict(s)) for s in last.schedules]
    assert again[0] == space[0].key and last.reference == 0  # beside the analytic choice
    assert set(again[1:]) == {lucky, steady}  # the only two faster than it
    assert last.limits.max_rounds == 2 * search[0].limits.max_rounds
    assert [t.schedule_key for t in result.confirmed] == again
    assert len(result.measured) == len(space)  # the search's trials only
    assert result.best is not None and result.best.schedule_key == steady
    assert db.best(result.problem.key, target.key()) == result.best
    assert tuned_schedule(build_model(nest, params), target, db).decided_by == "database"


def test_noisy_trials_are_stored_but_never_the_best(matmul32: Nest, tmp_path: Path) -> None:
    nest, params = matmul32
    target = host_target()
    db = _db(tmp_path)
    result = tune(nest, params, target=target, trials=4, db=db,
                  executor=Scripted(lambda s: (records.NOISY, 1e-6)))
    assert result.best is None and db.best(result.problem.key, target.key()) is None
    stored = db.trials(result.problem.key, target.key())
    assert [t.status for t in stored] == [records.NOISY] * 4 and all(t.samples for t in stored)
    assert tuned_schedule(build_model(nest, params), target, db).decided_by != "database"


def test_progress_is_reported_after_every_request(matmul32: Nest, tmp_path: Path) -> None:
    nest, params = matmul32
    target = host_target()
    seen: list[tuple[int, int, float | None]] = []

    def progress(done: int, total: int, best: Trial | None) -> None:
        seen.append((done, total, best.seconds if best else None))

    tune(nest, params, target=target, trials=10, strategy="guided", db=_db(tmp_path),
         executor=Scripted(lambda s: (records.OK, 1e-3 * len(s["tiles"]) + 1e-4)),
         progress=progress)
    assert [(done, total) for done, total, _ in seen] == [(BATCH, 10), (10, 10)]
    assert seen[-1][2] == 1e-4  # an untiled candidate


def test_exhaustive_tuning_measures_the_whole_space_once(tmp_path: Path) -> None:
    nest, params = builders.matmul(4, 4, 4)
    target = host_target()
    db = _db(tmp_path)
    first = tune(nest, params, target=target, trials=50, db=db, limits=QUIET)
    space = {c.key for c in search_space(build_model(nest, dict(params)), target)}
    assert first.strategy == "exhaustive" and first.space == len(space)
    assert {t.schedule_key for t in first.measured} == space
    assert all(t.status == records.OK for t in first.measured)
    # the best is the analytic choice or a finalist that beat it again (timed twice)
    assert first.best is not None and first.best == db.best(first.problem.key, target.key())
    assert first.best.schedule_key in {first.analytic_key, *(t.schedule_key for t in first.confirmed)}
    again = tune(nest, params, target=target, trials=50, db=db, limits=QUIET)
    assert again.measured == () and again.skipped == len(space)
    assert again.best == first.best


def test_a_pool_of_one_core_workers_stores_what_one_worker_does(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two cores")
    nest, params = builders.matmul(4, 4, 4)
    target = replace(host_target(), cores=1)
    pooled = tune(nest, params, target=target, trials=50, db=_db(tmp_path, "pool.sqlite"),
                  executor=PoolExecutor([(cpus[0],), (cpus[1],)]), limits=QUIET)
    alone = tune(nest, params, target=target, trials=50, db=_db(tmp_path, "one.sqlite"),
                 executor=LocalExecutor(cpus=(cpus[0],)), limits=QUIET)
    assert {(t.schedule_key, t.status) for t in pooled.measured} == {
        (t.schedule_key, t.status) for t in alone.measured}


def test_problems_tuned_side_by_side_share_the_workers(matmul32: Nest, tmp_path: Path) -> None:
    """Three problems on two workers: a problem's requests go to whichever worker is free
    (one problem's to both here), and the records are those of tuning the problems one after
    another (largest first)."""
    target = host_target()
    problems = [(f"mm{n}", *builders.matmul(n, 32, 16)) for n in (16, 32, 48)]
    spaces = search_spaces([(nest, params) for _, nest, params in problems], target)
    served: dict[str, set[int]] = {}
    sizes: list[int] = []

    class Part(Scripted):
        def __init__(self, number: int, pause: float = 0.0) -> None:
            super().__init__(lambda s: (records.OK, 1e-3 * (1 + len(s["order"]))))
            self.number, self.pause = number, pause

        def run(self, requests: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]:
            for request in requests:
                served.setdefault(str(request.params["M"]), set()).add(self.number)
                sizes.append(len(request.schedules))
                time.sleep(self.pause)
            yield from super().run(requests)

    class Two:
        slots = 2

        def parts(self) -> list[Part]:
            return [Part(0, pause=0.05), Part(1, pause=0.01)]

    trials = 6  # a problem's one batch
    reports: dict[str, list] = {}
    for name, executor in (("side", Two()), ("one", Part(0))):
        done = reports.setdefault(name, [])
        sizes.clear()
        tune_problems(problems, spaces, target=target, executor=executor,  # type: ignore[arg-type]
                      report=lambda n, r, done=done: done.append((n, r)), trials=trials,
                      db=_db(tmp_path, f"{name}.sqlite"))
        if name == "side":
            assert set().union(*served.values()) == {0, 1}
            assert any(workers == {0, 1} for workers in served.values())  # a problem spread
            assert max(sizes) <= trials + 1  # the batch and the reference, whole or split
        else:
            assert min(sizes) > SharedWorkers.CHUNK + 1  # one worker: a batch in one request
    assert sorted(n for n, _ in reports["side"]) == ["mm16", "mm32", "mm48"]
    # one worker takes them the most arithmetic first (no long problem left for last)
    assert [n for n, _ in reports["one"]] == ["mm48", "mm32", "mm16"]
    side = {n: {t.schedule_key for t in r.measured} for n, r in reports["side"]}
    one = {n: {t.schedule_key for t in r.measured} for n, r in reports["one"]}
    assert side == one and all(len(keys) == trials for keys in side.values())


def test_shared_workers_serve_the_longest_expected_request_first(matmul32: Nest) -> None:
    """Requests whose time is unknown go first, in the order handed in; the rest longest
    first, so that a slow problem's last batch does not run alone at the end."""
    nest, params = matmul32
    base = Request(nest, params, host_target(), ())
    started, gate = threading.Event(), threading.Event()
    served: list[int] = []

    class Worker:
        slots = 1

        def parts(self) -> list[Worker]:
            return [self]

        def run(self, requests: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]:
            for request in requests:
                if request.params["M"] == 0:  # holds the worker while the others queue
                    started.set()
                    gate.wait(10)
                served.append(request.params["M"])
                yield 0, []

    shared = SharedWorkers(Worker())  # type: ignore[arg-type]
    replies: queue.Queue = queue.Queue()
    try:
        shared.submit(0, replace(base, params={"M": 0}), replies)
        assert started.wait(10)
        for m, expected in ((1, 1.0), (2, 3.0), (3, None), (4, 2.0), (5, None)):
            shared.submit(0, replace(base, params={"M": m}), replies, expected)
        gate.set()
        for _ in range(6):
            replies.get(timeout=10)
    finally:
        gate.set()
        shared.close()
    assert served == [0, 3, 5, 2, 4, 1]


def test_a_batch_is_split_only_while_a_worker_would_wait(matmul32: Nest) -> None:
    """One request a batch while every worker has one waiting (each request also times the
    reference); batches of `CHUNK` when a worker would otherwise sit idle."""
    nest, params = matmul32
    base = Request(nest, params, host_target(), ())
    gate = threading.Event()
    taken = threading.Semaphore(0)

    class Held:
        def run(self, requests: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]:
            taken.release()
            gate.wait(10)
            yield 0, []

    class Two:
        slots = 2

        def parts(self) -> list[Held]:
            return [Held(), Held()]

    shared = SharedWorkers(Two())  # type: ignore[arg-type]
    view = shared.view()
    replies: queue.Queue = queue.Queue()
    split = BATCH // SharedWorkers.CHUNK
    try:
        assert split > 1 and view.slots == split  # idle workers
        for _ in range(2):
            shared.submit(0, base, replies)
        assert taken.acquire(timeout=10) and taken.acquire(timeout=10)
        assert view.slots == split  # both busy, nothing waiting for them
        shared.submit(0, base, replies)
        assert view.slots == split  # one waiting: the next worker free would find none
        shared.submit(0, base, replies)
        assert view.slots == 1  # a request waiting for each
        gate.set()
        for _ in range(4):
            replies.get(timeout=10)
        assert view.slots == split
    finally:
        gate.set()
        shared.close()


def test_a_problem_expects_its_requests_to_take_what_its_candidates_took_so_far(
    matmul32: Nest
) -> None:
    nest, params = matmul32
    base = Request(nest, params, host_target(), ())
    expected: list[float | None] = []

    class Recorder:  # stands in for SharedWorkers: a request takes 0.5 s a candidate
        def submit(self, index: int, request: Request, replies: queue.Queue,
                   expected_s: float | None = None) -> None:
            expected.append(expected_s)
            replies.put((index, [], 0.5 * len(request.schedules)))

    view = _SharedView(Recorder())  # type: ignore[arg-type]
    list(view.run([replace(base, schedules=({},) * 2), replace(base, schedules=({},) * 4)]))
    list(view.run([replace(base, schedules=({},) * 3)]))
    assert expected == [None, None, 1.5]


def test_a_failing_worker_fails_the_tuning_of_the_problem_it_served(matmul32: Nest, tmp_path: Path) -> None:
    target = host_target()
    problems = [(f"mm{n}", *builders.matmul(n, 32, 16)) for n in (16, 32)]
    spaces = search_spaces([(nest, params) for _, nest, params in problems], target)

    class Broken(Scripted):
        def run(self, requests: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]:
            raise PolyDLError("the measuring process died before measuring")
            yield  # a generator, as the executors are

    class Two:
        slots = 2

        def parts(self) -> list[Scripted]:
            return [Broken(lambda s: (records.OK, 1e-3)), Broken(lambda s: (records.OK, 1e-3))]

    with pytest.raises(PolyDLError, match="died before measuring"):
        tune_problems(problems, spaces, target=target, executor=Two(),  # type: ignore[arg-type]
                      report=lambda n, r: None, trials=4, db=_db(tmp_path))


def test_an_interrupted_tuning_stops_handing_out_requests_and_keeps_what_was_measured(
    matmul32: Nest, tmp_path: Path
) -> None:
    """Ctrl-C during side-by-side tuning: no new problem starts, queued requests are dropped,
    the requests being measured finish and are stored; a later run resumes from there."""
    target = host_target()
    problems = [(f"mm{n}", *builders.matmul(n, 32, 16)) for n in (16, 32, 48, 64)]
    spaces = search_spaces([(nest, params) for _, nest, params in problems], target)
    served: list[int] = []

    class Slow(Scripted):
        def run(self, requests: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]:
            for request in requests:
                served.append(len(request.schedules))
                # the larger problems' requests take far longer (16x for the largest): the
                # smallest finishes (and is interrupted on) while the others are part-way, not
                # all of them at once, even where the interrupt reaches the main thread late
                time.sleep(0.01 * (request.params["M"] / 16) ** 2)
            yield from super().run(requests)

    class Two:
        slots = 2

        def parts(self) -> list[Scripted]:
            return [Slow(lambda s: (records.OK, 1e-3)), Slow(lambda s: (records.OK, 1e-3))]

    at_interrupt: list[int] = []

    def interrupt(name: str, result: Any) -> None:  # as Ctrl-C would, once a problem is done
        at_interrupt.append(sum(served))
        raise KeyboardInterrupt

    db = _db(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        tune_problems(problems, spaces, target=target, executor=Two(),  # type: ignore[arg-type]
                      report=interrupt, trials=40, db=db, limits=QUIET)
    stored = db.trials()
    assert all(t.status == records.OK for t in stored)
    # after the interrupt, only the requests in flight (two workers, one each, and one each
    # more taken before the queue was cleared) were measured
    assert sum(served) - at_interrupt[0] <= 4 * (SharedWorkers.CHUNK + 1)
    assert len(stored) < 4 * 40
    # a problem stopped part-way resumes where it stopped
    counts = {t.problem.key: 0 for t in stored}
    for t in stored:
        counts[t.problem.key] += 1
    stopped = [(p, sp) for p, sp in zip(problems, spaces, strict=True)
               if counts.get(Problem.of(p[1], p[2]).key, 0) < min(40, len(sp))]
    assert stopped, "every problem was tuned to the end"
    (_, nest, params), space = next((p, sp) for p, sp in stopped
                                    if counts.get(Problem.of(p[1], p[2]).key, 0))
    done = counts[Problem.of(nest, params).key]
    again = tune(nest, params, target=target, trials=40, db=db,
                 executor=Slow(lambda s: (records.OK, 1e-3)), space=space)
    assert again.skipped == done and again.measured


def test_tuning_for_a_target_this_cpu_cannot_run_is_refused(matmul32: Nest, tmp_path: Path) -> None:
    target = replace(host_target(), isa="avx512amx")
    if not cannot_run_here(target):
        pytest.skip("this CPU runs AMX code")
    with pytest.raises(TargetError, match="cannot tune here"):
        tune(*matmul32, target=target, db=_db(tmp_path))


# ------------------------------------------------------------------------------------ lookup


def _trial(nest: LoopNest, params: dict[str, int], target: CpuTarget, schedule: Schedule,
           seconds: float) -> Trial:
    return Trial(Problem.of(nest, params), target.key(), schedule.to_dict(), records.OK,
                 (seconds,))


def test_the_system_database_decides_until_the_user_has_measured(
    matmul32: Nest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nest, params = matmul32
    target = host_target()
    model = build_model(nest, params)
    space = search_space(model, target)
    _db(tmp_path, "system.sqlite").add([_trial(nest, params, target, space[1].schedule, 1e-6)])
    monkeypatch.setenv("POLYDL_SYSTEM_DB", str(tmp_path / "system.sqlite"))
    user = PerfDatabase(tmp_path / "user.sqlite")
    choice = tuned_schedule(model, target, user)
    assert choice.decided_by == "database" and "the system database" in choice.reason
    assert choice.schedule == space[1].schedule
    user.add([_trial(nest, params, target, space[2].schedule, 1.0)])  # slower, still the user's
    choice = tuned_schedule(model, target, user)
    assert choice.schedule == space[2].schedule and str(user.path) in choice.reason


def test_explain_says_the_analytic_ranking_decided_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POLYDL_TUNING_DB", str(tmp_path / "empty.sqlite"))
    monkeypatch.setenv("POLYDL_COST_MODEL", str(tmp_path / "none.txt"))
    assert main(["explain", *MATMUL_SPEC, "--schedule", "tuned"]) == 0
    out = capsys.readouterr().out
    assert "the analytic decided" in out and f"no cost model at {tmp_path / 'none.txt'}" in out
    nest, params = builders.matmul(32, 32, 32)
    target = host_target()
    compilation = lower(nest, params, target, "tuned")
    assert compilation.decision.source == "tuned"
    assert compilation.schedule == lower(nest, params, target, "auto").schedule


def test_a_cost_model_lightgbm_cannot_read_leaves_the_analytic_choice(
    matmul32: Nest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("lightgbm")
    nest, params = matmul32
    target = host_target()
    model = build_model(nest, params)
    bad = tmp_path / "model.txt"
    bad.write_text('{"format": "polydl-cost-model 1", "features": ["x"]}\nnot trees\n')
    monkeypatch.setenv("POLYDL_COST_MODEL", str(bad))
    choice = tuned_schedule(model, target, _db(tmp_path))
    assert choice.decided_by == "analytic"
    assert "the cost model cannot be used" in choice.reason and "cannot be read" in choice.reason
    assert choice.schedule == auto_schedule(tuning_model(model), target).schedule


def test_the_cost_model_decides_with_its_lowest_prediction(
    matmul32: Nest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("lightgbm")
    nest, params = matmul32
    target = host_target()
    model = build_model(nest, params)
    # a model taught that the analytically slowest schedules run fastest
    problems = [Problem(f"p{p}", "matmul", (("M", p),), "float32") for p in range(8)]
    trials = [Trial(p, "{}", {"order": [str(i)]}, records.OK, (1.0 / (1 + i * 20),),
                    features={"cost_vs_best": 1.0 + i * 20})
              for p in problems for i in range(8)]
    cost_model = CostModel.train(trials)
    cost_model.save(tmp_path / "model.txt")
    monkeypatch.setenv("POLYDL_COST_MODEL", str(tmp_path / "model.txt"))
    choice = tuned_schedule(model, target, _db(tmp_path))
    assert choice.decided_by == "model" and "trained on 64 trials" in choice.reason
    space = search_space(model, target)
    scores = cost_model.predict([c.features for c in space])
    pick = space[scores.index(min(scores))]
    assert choice.schedule == pick.schedule and pick.features["cost_vs_best"] > 1


# ---------------------------------------------------------------------------------- the CLI


@pytest.fixture
def quiet_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("polydl.tuner.search.Limits", lambda: QUIET)
    monkeypatch.setenv("POLYDL_COST_MODEL", str(tmp_path / "none.txt"))


def test_cli_tunes_a_spec_into_the_database_it_is_given(
    quiet_cli: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "given.sqlite"
    assert main(["tune", *MATMUL_SPEC, "--trials", "4", "--db", str(db), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "guide    analytic model" in out
    assert re.search(r"^matmul +best [0-9.]+ ms.*; measured 4 of \d+", out, re.M)
    assert f"stored   {db}" in out
    # where a candidate measured faster than the analytic choice, the finalists and the
    # analytic choice are timed again and stored too (`TuneResult.confirmed`), as the line says
    again = re.search(r"; the (\d+) fastest timed again beside the analytic", out)
    confirmed = int(again.group(1)) + 1 if again else 0
    assert len(PerfDatabase(db, system=False).trials()) == 4 + confirmed


def test_cli_tunes_every_layer_of_a_convolution_suite_file(
    quiet_cli: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = tmp_path / "convs.json"
    suite.write_text('{"N": 1, "layers": [{"name": "tiny", "C": 3, "K": 4, "H": 6, "W": 6,'
                     ' "R": 3, "S": 3, "stride": 1, "padding": 1}]}')
    db = tmp_path / "perf.sqlite"
    assert main(["tune", "--suite", str(suite), "--trials", "2", "--db", str(db),
                 "--no-progress"]) == 0
    assert re.search(r"^tiny +best .*measured 2 of", capsys.readouterr().out, re.M)
    (problem,) = {t.problem for t in PerfDatabase(db, system=False).trials()}
    assert problem.primitive == "conv2d" and problem.sizes["C"] == 3
    # --batch tunes the suite at another minibatch, as `polydl bench --batch` runs it
    assert main(["tune", "--suite", str(suite), "--batch", "2", "--trials", "1", "--db", str(db),
                 "--no-progress"]) == 0
    assert {t.problem.sizes["N"] for t in PerfDatabase(db, system=False).trials()} == {1, 2}


def test_a_built_in_suite_is_tuned_at_the_batch_given() -> None:
    from polydl.tuner.suites import suite_problems

    assert {p.params["N"] for p in suite_problems("resnet50", 32)} == {32}
    assert {p.params["N"] for p in suite_problems("resnet50")} == {2}


def _bad_suites(tmp_path: Path) -> dict[str, str]:
    files = {
        "missing": '{"shapes": [{"name": "a", "M": 8, "N": 8}]}',
        "primitive": '{"N": 1, "primitive": "pool", "layers": [{"name": "p", "C": 1, "K": 1,'
                     ' "H": 4, "W": 4, "R": 2, "S": 2, "stride": 1, "padding": 0}]}',
        "broken": '{"shapes": [',
    }
    for name, text in files.items():
        (tmp_path / f"{name}.json").write_text(text)
    return {name: str(tmp_path / f"{name}.json") for name in files}


@pytest.mark.parametrize("argv, said", [
    ([], "tune needs a spec or --suite"),
    (["--suite", "nosuch"], "unknown suite 'nosuch'"),
    (["--suite", "{missing}"], "{missing}: a shape or layer lacks 'K'"),
    (["--suite", "{primitive}"], "{primitive}: suite layer p: unknown primitive 'pool'"),
    (["--suite", "{broken}"], "{broken}: not a suite file"),
    (["--suite", "gemm", "--batch", "4"], "--batch is for convolution suites"),
    (["--suite", "{missing}", "--batch", "4"], "{missing}: a suite of GEMM shapes has no minibatch"),
    (["--suite", "resnet50", "--batch", "0"], "batch must be a positive minibatch, got 0"),
    (["--suite", "{primitive}", "--batch", "0"], "batch must be a positive minibatch, got 0"),
    ([*MATMUL_SPEC, "--no-winograd"], "--no-winograd: for ONNX networks, not for the loop nest"),
    (["--suite", "resnet50", "--no-winograd"], "--no-winograd: for ONNX networks, not for --suite"),
    (["--suite", "resnet50", "--images-per-pass", "2", "--no-winograd"],
     "--images-per-pass, --no-winograd: for ONNX networks, not for --suite"),
    ([*MATMUL_SPEC, "--batch", "4"], "--batch: for ONNX networks, not for the loop nest"),
    ([*MATMUL_SPEC, "--workers", str(len(os.sched_getaffinity(0)) + 1)], "one per worker at most"),
])
def test_cli_tune_errors_are_one_line(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _bad_suites(tmp_path)
    argv = [a.format(**files) for a in argv]
    assert main(["tune", *argv, "--db", str(tmp_path / "perf.sqlite"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert said.format(**files) in err



@pytest.mark.slow
def test_the_space_holds_calls_over_blocks_the_ranking_leaves_out() -> None:
    """A blocked 1 x 1 layer on AVX2: the ranking's rules offer no call over several output
    blocks there (a block is two vectors), but the search space measures them too."""
    from polydl.schedules.cpu.candidates import block_variants
    from polydl.schedules.cpu.rank import rank
    from polydl.target import CpuTarget

    nest, params = builders.conv2d(N=1, C=64, K=64, H=14, W=14, R=1, S=1, layout="nchw16c")
    model = build_model(nest, params)
    avx2 = CpuTarget(isa="avx2", cores=2)
    best = rank(tuning_model(model), avx2)[0].schedule
    assert best.microkernel is not None and best.microkernel.blocks is None
    assert block_variants(tuning_model(model), best, avx2) == []
    assert block_variants(tuning_model(model), best, avx2, gated=False)
    space = search_space(model, avx2)
    assert not space[0].schedule.microkernel.blocks
    assert any(c.schedule.microkernel is not None and c.schedule.microkernel.blocks for c in space)
