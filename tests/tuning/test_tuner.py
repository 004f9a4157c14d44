"""The tuner: search space, measurement in a child process (crash, hang, noise), the stored
trials, resuming, the lookup order of `schedule="tuned"`, the cost model, Ray and the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from polydl.cli import main
from polydl.driver.pipeline import build_kernel, lower
from polydl.errors import PolyDLError
from polydl.frontends import builders
from polydl.poly.model import build_model
from polydl.schedules.cpu.auto import auto_schedule
from polydl.target.host import host_target
from polydl.tuner.measure import Limits, Request, measure
from polydl.tuner.search import LocalExecutor, guided_order, tune
from polydl.tuning import records
from polydl.tuning.costmodel import CostModel, evaluate, groups_of
from polydl.tuning.database import PerfDatabase
from polydl.tuning.lookup import tuned_schedule
from polydl.tuning.records import Problem, Trial, schedule_key
from polydl.tuning.space import search_space, tuning_model

# Tests run beside each other (xdist): the load check is off where a test expects `ok`.
QUIET = Limits(max_other_load=math.inf, min_rounds=2, max_rounds=3, budget_s=0.05)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small():  # type: ignore[no-untyped-def]
    nest, params = builders.matmul(32, 32, 32)
    return nest, dict(params)


def _db(tmp_path: Path) -> PerfDatabase:
    return PerfDatabase(tmp_path / "perf.sqlite", system=False)


@pytest.mark.slow
def test_space_starts_with_the_analytic_choice_and_holds_more(small) -> None:  # type: ignore[no-untyped-def]
    nest, params = small
    target = host_target()
    model = build_model(nest, params)
    space = search_space(model, target)
    keys = [c.key for c in space]
    assert len(keys) == len(set(keys)) > 10
    auto = auto_schedule(tuning_model(model), target).schedule
    assert space[0].analytic and space[0].key == schedule_key(auto.to_dict())
    assert sum(c.analytic for c in space) == 1
    assert len({c.schedule.parallel for c in space}) > 1  # thread mappings are searched
    a, b = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32)).astype(np.float32)
    for c in space[:: max(1, len(space) // 4)]:
        kernel = build_kernel(nest, params, target, schedule=c.schedule)
        np.testing.assert_allclose(kernel(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def _fault_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fault: str, schedule: dict) -> None:
    """A sitecustomize that makes the measuring child misbehave on one schedule."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(textwrap.dedent("""
        import json, os, signal, time
        import polydl.tuner.measure as m
        original = m.candidate_kernel
        def candidate_kernel(request, schedule):
            if json.dumps(dict(schedule), sort_keys=True) == os.environ["TUNING_TEST_SCHEDULE"]:
                if os.environ["TUNING_TEST_FAULT"] == "crash":
                    os.kill(os.getpid(), signal.SIGSEGV)
                time.sleep(60)
            return original(request, schedule)
        m.candidate_kernel = candidate_kernel
    """))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "site"), str(ROOT)]))
    monkeypatch.setenv("TUNING_TEST_FAULT", fault)
    import json

    monkeypatch.setenv("TUNING_TEST_SCHEDULE", json.dumps(schedule, sort_keys=True))


@pytest.mark.parametrize("fault", ["crash", "hang"])
@pytest.mark.slow
def test_a_candidate_that_crashes_or_hangs_is_recorded_and_the_rest_measured(
    small, fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    nest, params = small
    target = host_target()
    schedules = tuple(c.schedule.to_dict() for c in search_space(build_model(nest, params), target)[:3])
    _fault_env(monkeypatch, tmp_path, fault, schedules[1])
    outcomes = measure(Request(nest, params, target, schedules, limits=replace(QUIET, timeout_s=5)))
    assert [o.status for o in outcomes] == [
        records.OK, records.CRASHED if fault == "crash" else records.TIMED_OUT, records.OK]
    assert ("signal 11" in outcomes[1].message) == (fault == "crash")
    assert all(o.samples for o in (outcomes[0], outcomes[2]))


def test_a_busy_core_gives_noisy_trials_never_a_winner(small, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nest, params = small
    cpu = sorted(os.sched_getaffinity(0))[0]
    target = replace(host_target(), cores=1)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(busy.pid, {cpu})
        db = _db(tmp_path)
        noisy = Limits(max_other_load=0.2, load_waits=1, min_rounds=50, max_rounds=10_000,
                       budget_s=0.5, spread=0.0)  # rounds for whole load windows
        result = tune(nest, params, target=target, trials=2, db=db, limits=noisy,
                      executor=LocalExecutor(cpus=(cpu,)))
    finally:
        busy.kill()
        busy.wait()
    seen = [(t.status, t.other_load, t.message) for t in result.measured]
    assert [t.status for t in result.measured] == [records.NOISY] * 2, seen
    assert all(t.other_load is not None and t.other_load > 0.2 for t in result.measured)
    assert db.best(result.problem.key, target.key()) is None
    assert db.measured(result.problem.key, target.key()) == set()  # measured again next time


def test_tune_stores_every_trial_and_resumes(small, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nest, params = small
    target = host_target()
    db = _db(tmp_path)
    first = tune(nest, params, target=target, trials=3, db=db, limits=QUIET)
    assert first.strategy == "guided" and len(first.measured) == 3
    assert first.measured[0].schedule_key == first.analytic_key  # the analytic choice first
    stored = db.trials(first.problem.key, target.key())
    # where a candidate measured faster than the analytic choice, the finalists and the
    # analytic choice are timed again (`confirmed`): whether one did is up to the machine
    assert len(stored) == 3 + len(first.confirmed)
    assert {t.schedule_key for t in stored} == {t.schedule_key for t in first.measured}
    assert all(t.status == records.OK and t.features for t in stored)
    assert first.best is not None
    # the fastest by the times that compare across measuring processes (each trial's ratio to
    # the reference timed beside it), not by its own seconds: those drift with the machine;
    # among schedules timed twice, each by its slower time
    times = records.comparable_times(stored)
    twice = {t.schedule_key for t in first.confirmed}
    if twice:
        slowest = {key: max(x for x, t in zip(times, stored, strict=True) if t.schedule_key == key)
                   for key in twice}
        assert first.best.schedule_key == min(slowest, key=slowest.__getitem__)
    else:
        assert first.best.schedule_key == stored[times.index(min(times))].schedule_key
    again = tune(nest, params, target=target, trials=2, db=db, limits=QUIET, strategy="random")
    assert again.skipped == 3
    assert not {t.schedule_key for t in again.measured} & {t.schedule_key for t in first.measured}
    with pytest.raises(PolyDLError, match="unknown strategy"):
        tune(nest, params, target=target, strategy="annealing", db=db)
    with pytest.raises(PolyDLError, match="at least 1"):
        tune(nest, params, target=target, trials=0, db=db)


def _synthetic(problems: int = 6, per: int = 12) -> list[Trial]:
    """Trials whose time follows one feature: the model must learn to pick its smallest."""
    out = []
    for p in range(problems):
        problem = Problem(f"p{p}", "matmul", (("M", 16 * (p + 1)),), "float32")
        for i in range(per):
            x = (i * 7 + p) % per
            out.append(Trial(problem, '{"cores": 1}', {"order": [str(i)]}, records.OK,
                             samples=(1e-3 * (1 + x),), features={"x": float(x), "y": float(p)}))
    return out


def test_cost_model_learns_saves_and_loads(tmp_path: Path) -> None:
    trials = _synthetic()
    model = CostModel.train(trials)
    picks = evaluate(model, groups_of(trials))
    assert [p.quality for p in picks] == [1.0] * 6 and all(p.first_good == 1 for p in picks)
    model.save(tmp_path / "m.txt")
    loaded = CostModel.load(tmp_path / "m.txt")
    rows = [t.features for t in trials]
    assert loaded.predict(rows) == model.predict(rows)
    (tmp_path / "bad.txt").write_text("not a model\n")
    with pytest.raises(PolyDLError, match="not a polydl cost model"):
        CostModel.load(tmp_path / "bad.txt")
    with pytest.raises(PolyDLError, match="too few"):
        CostModel.train(trials[:3])


@pytest.mark.slow
def test_tuned_is_database_else_model_else_analytic(
    small, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    nest, params = small
    target = host_target()
    model = build_model(nest, params)
    db = _db(tmp_path)
    monkeypatch.setenv("POLYDL_COST_MODEL", str(tmp_path / "none.txt"))
    choice = tuned_schedule(model, target, db)
    assert choice.decided_by == "analytic" and "no cost model" in choice.reason
    (tmp_path / "bad.txt").write_text("garbage\n")
    monkeypatch.setenv("POLYDL_COST_MODEL", str(tmp_path / "bad.txt"))
    assert "cannot be used" in tuned_schedule(model, target, db).reason
    other, other_params = builders.matmul(48, 32, 16)
    tune(other, other_params, target=target, trials=6, db=db, limits=QUIET)
    tune(*builders.matmul(16, 48, 32), target=target, trials=6, db=db, limits=QUIET)
    CostModel.train(db.trials()).save(tmp_path / "model.txt")
    monkeypatch.setenv("POLYDL_COST_MODEL", str(tmp_path / "model.txt"))
    choice = tuned_schedule(model, target, db)
    assert choice.decided_by == "model"
    assert schedule_key(choice.schedule.to_dict()) in {c.key for c in search_space(model, target)}
    # a model whose training found its first points no better than the analytic choice
    keeping = replace(CostModel.load(tmp_path / "model.txt"), switch_margin=math.inf)
    kept = tuned_schedule(model, target, db, cost_model=keeping)
    analytic = next(c for c in search_space(model, target) if c.analytic)
    assert kept.decided_by == "model" and schedule_key(kept.schedule.to_dict()) == analytic.key
    tune(nest, params, target=target, trials=2, db=db, limits=QUIET)
    monkeypatch.setenv("POLYDL_TUNING_DB", str(db.path))
    choice = tuned_schedule(model, target)
    assert choice.decided_by == "database"
    assert "the database decided" in lower(nest, params, target, "tuned").decision.reason


@pytest.mark.slow
def test_cli_tune_suite_model_and_schedule_tuned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db, model = tmp_path / "perf.sqlite", tmp_path / "model.txt"
    monkeypatch.setattr("polydl.tuner.search.Limits", lambda: QUIET)
    monkeypatch.setenv("POLYDL_TUNING_DB", str(db))
    monkeypatch.setenv("POLYDL_COST_MODEL", str(model))
    suite = tmp_path / "suite.json"
    suite.write_text('{"shapes": [{"name": "a", "M": 32, "N": 32, "K": 32},'
                     ' {"name": "b", "M": 16, "N": 48, "K": 32}]}')
    assert main(["tune", "--suite", str(suite), "--trials", "6", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "a " in out and "best" in out and f"stored   {db}" in out
    assert main(["model", "train"]) == 0 and model.is_file()
    assert main(["model", "eval"]) == 0
    assert "within 5% of the best" in capsys.readouterr().out
    spec = ["examples/matmul.c", "-p", "M=32", "-p", "N=32", "-p", "K=32"]
    monkeypatch.chdir(ROOT)
    assert main(["explain", *spec, "--schedule", "tuned"]) == 0
    assert "the model decided" in capsys.readouterr().out  # this nest was never measured
    assert main(["tune", *spec, "--trials", "2", "--no-progress"]) == 0
    assert main(["explain", *spec, "--schedule", "tuned"]) == 0
    assert "the database decided" in capsys.readouterr().out
    assert main(["run", *spec, "--schedule", "tuned", "--repeat", "2"]) == 0
    assert "verify   ok" in capsys.readouterr().out
    assert main(["tune", *spec, "--suite", str(suite)]) == 1
    assert "not both" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["tune", "--suite", str(tmp_path / "bad.json")]) == 1
    assert "bad.json" in capsys.readouterr().err


def test_workers_without_ray_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.chdir(ROOT)
    assert main(["tune", "examples/matmul.c", "-p", "M=32", "-p", "N=32", "-p", "K=32",
                 "--workers", "2", "--no-progress"]) == 1
    assert "polydl[tune]" in capsys.readouterr().err


def test_a_suite_without_ray_stops_its_search_spaces_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The spaces' processes are forked before Ray starts: where Ray is missing they are
    stopped, not left computing."""
    import multiprocessing

    suite = tmp_path / "two.json"
    suite.write_text(json.dumps({"shapes": [{"name": "a", "M": 32, "N": 32, "K": 32},
                                            {"name": "b", "M": 48, "N": 32, "K": 16}]}))
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(["tune", "--suite", str(suite), "--workers", "2", "--no-progress"]) == 1
    assert "polydl[tune]" in capsys.readouterr().err
    assert not multiprocessing.active_children()


@pytest.mark.slow
def test_two_ray_workers_store_the_same_records_as_one(small, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("ray")
    from polydl.tuner.distributed import local_executor

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    nest, params = small
    executor, target = local_executor(2, host_target())
    try:
        assert target.cores == len(os.sched_getaffinity(0)) // 2
        by_ray = tune(nest, params, target=target, trials=6, db=PerfDatabase(tmp_path / "r.sqlite", system=False),
                      executor=executor, limits=QUIET)
    finally:
        executor.shutdown()
    alone = tune(nest, params, target=target, trials=6, db=PerfDatabase(tmp_path / "l.sqlite", system=False),
                 limits=QUIET)
    assert {(t.schedule_key, t.status) for t in by_ray.measured} == {
        (t.schedule_key, t.status) for t in alone.measured}
    assert len(by_ray.measured) == 6 and not math.isnan(by_ray.best.seconds or math.nan)


def test_the_guided_order_takes_the_two_rankings_in_turn() -> None:
    """A learned model that ranks a family it never saw backwards still leaves the analytic
    model's best points among the first measured."""
    costs = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    backwards = [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    assert guided_order(costs, backwards, first=0) == [0, 5, 1, 4, 2, 3]
    assert guided_order(costs, None, first=3) == [3, 0, 1, 2, 4, 5]
    assert guided_order(costs, costs, first=None) == [0, 1, 2, 3, 4, 5]
    assert guided_order([], None) == []
