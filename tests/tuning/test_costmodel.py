"""The learned cost model on trials whose times follow one feature: what it trains on, what it
predicts, its file, how its picks are scored, and `polydl model train|eval`."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from polydl.cli import main
from polydl.errors import PolyDLError
from polydl.frontends import builders
from polydl.poly.model import build_model
from polydl.target.host import host_target
from polydl.tuning import records
from polydl.tuning.costmodel import CostModel, evaluate, groups_of
from polydl.tuning.database import PerfDatabase
from polydl.tuning.lookup import tuned_schedule
from polydl.tuning.records import Problem, Trial

pytest.importorskip("lightgbm")

TARGET = '{"cores": 1}'
SCHEDULES = 12


def _problem(p: int) -> Problem:
    return Problem(f"p{p}", "matmul", (("M", 16 * (p + 1)),), "float32")


def measured(problems: int = 6, slowest_first: bool = False) -> list[Trial]:
    """SCHEDULES trials of each problem, seconds = 1 + x ms of their feature x (or 12 - x)."""
    out = []
    for p in range(problems):
        for i in range(SCHEDULES):
            x = (5 * i + p) % SCHEDULES
            ms = SCHEDULES - x if slowest_first else 1 + x
            out.append(Trial(_problem(p), TARGET, {"order": [f"s{x}"]}, records.OK,
                             samples=(ms * 1e-3,), features={"x": float(x), "y": float(p)}))
    return out


def test_labels_are_ratios_to_the_reference_where_every_trial_has_one() -> None:
    """Trials of x = 0..11 whose seconds drift up with x (the machine slowed down while it
    measured), and whose ratios to the reference timed beside each fall with x: the model
    learns the ratios."""
    drifted = [Trial(_problem(p), TARGET, {"order": [f"s{x}"]}, records.OK,
                     samples=((1 + x) * 1e-3,), reference_samples=((1 + x) ** 2 * 1e-3,),
                     features={"x": float(x), "y": float(p)})
               for p in range(6) for x in range(SCHEDULES)]
    model = CostModel.train(drifted)
    predicted = model.predict([{"x": float(x), "y": 40.0} for x in range(SCHEDULES)])
    assert min(range(SCHEDULES), key=lambda x: predicted[x]) == SCHEDULES - 1
    [group] = groups_of(drifted[:SCHEDULES]).values()
    assert [q.quality for q in evaluate(model, {("p0", TARGET): group})] == [1.0]


def test_the_model_ranks_a_problem_it_never_saw_by_the_feature_it_learned() -> None:
    model = CostModel.train(measured())
    assert model.trained_on == 6 * SCHEDULES and model.feature_names == ("x", "y")
    predicted = model.predict([{"x": float(x), "y": 40.0} for x in range(SCHEDULES)])
    assert min(range(SCHEDULES), key=lambda x: predicted[x]) == 0
    assert predicted[0] < predicted[SCHEDULES // 2] < predicted[-1]
    assert model.predict([]) == []


def test_training_reads_only_ok_measurements_with_features_one_per_schedule() -> None:
    """A schedule measured twice without paired rounds counts by its faster measurement;
    with paired rounds, by all of them (`test_measurements_of_one_schedule_pool_their_rounds`)."""
    trials = measured()
    first = trials[0]
    remeasured = Trial(first.problem, TARGET, first.schedule, records.OK,
                       samples=(1.0,), features=first.features)
    fast_but_not_ok = [
        Trial(first.problem, TARGET, {"order": [status]}, status, samples=(1e-9,),
              features={"x": -1.0, "y": 0.0})
        for status in (records.NOISY, records.WRONG_RESULT)
    ]
    unfeatured = Trial(first.problem, TARGET, {"order": ["bare"]}, records.OK, samples=(1e-9,))
    groups = groups_of([*trials, remeasured, *fast_but_not_ok, unfeatured])
    assert sorted(len(g) for g in groups.values()) == [SCHEDULES] * 6
    kept = next(t for t in groups[(first.problem.key, TARGET)]
                if t.schedule_key == first.schedule_key)
    assert kept.seconds == first.seconds
    assert CostModel.train([*trials, remeasured, *fast_but_not_ok, unfeatured]).trained_on == 72


def test_a_saved_model_predicts_the_same_after_loading(tmp_path: Path) -> None:
    model = CostModel.train(measured())
    model.save(tmp_path / "deep" / "model.txt")
    loaded = CostModel.load(tmp_path / "deep" / "model.txt")
    rows = [t.features for t in measured(problems=2)] + [{"x": 3.5}]  # a feature missing
    assert loaded.predict(rows) == model.predict(rows)
    assert (loaded.feature_names, loaded.trained_on) == (model.feature_names, model.trained_on)
    # written through a temporary file renamed into place: nothing else left beside it
    assert [p.name for p in (tmp_path / "deep").iterdir()] == ["model.txt"]
    # a file written before the margin existed picks as it did then: its first point
    header, _, trees = (tmp_path / "deep" / "model.txt").read_text().partition("\n")
    meta = json.loads(header)
    del meta["switch_margin"]
    (tmp_path / "old.txt").write_text(json.dumps(meta) + "\n" + trees)
    assert CostModel.load(tmp_path / "old.txt").switch_margin == 0.0


@pytest.mark.parametrize("text, said", [
    (None, "not a polydl cost model"),
    ("tree\nversion=v4\n", "not a polydl cost model"),
    ('{"format": "xgboost 2"}\n', "train one with `polydl model train`"),
    ('{"format": "polydl-cost-model 1", "features": ["x"]}\nnot trees\n', "cannot be read"),
    ('{"format": "polydl-cost-model 1"}\nnot trees\n', "names no feature list"),
    ('{"format": "polydl-cost-model 1", "features": "x"}\n', "names no feature list"),
])
def test_a_file_that_is_not_a_model_is_refused(tmp_path: Path, text: str | None, said: str) -> None:
    path = tmp_path / "model.txt"
    if text is not None:
        path.write_text(text)
    with pytest.raises(PolyDLError, match=said) as error:
        CostModel.load(path)
    assert str(path) in str(error.value)


def test_evaluate_scores_the_pick_of_a_model_taught_the_wrong_order() -> None:
    trials = measured()
    right = evaluate(CostModel.train(trials), groups_of(trials))
    assert [(p.quality, p.rank_of_pick, p.first_good) for p in right] == [(1.0, 0, 1)] * 6
    wrong = evaluate(CostModel.train(measured(slowest_first=True)), groups_of(trials))
    assert all(math.isclose(p.quality, 1 / SCHEDULES) for p in wrong)
    assert {(p.rank_of_pick, p.first_good) for p in wrong} == {(SCHEDULES - 1, SCHEDULES)}
    assert wrong[0].label == "matmul(M=16) float32" and wrong[0].candidates == SCHEDULES


def families(falling_in_convs: bool, analytic_x: dict[str, int]) -> list[Trial]:
    """Six GEMMs and six convolutions of SCHEDULES trials each: time 1 + x ms, or 12 - x ms in
    the convolutions where `falling_in_convs`; the trial of x = analytic_x[family] is each
    problem's analytic choice."""
    out = []
    for family in ("matmul", "conv2d"):
        falls = falling_in_convs and family == "conv2d"
        for p in range(6):
            problem = Problem(f"{family}{p}", family, (("M", 16 * (p + 1)),), "float32")
            for x in range(SCHEDULES):
                ms = SCHEDULES - x if falls else 1 + x
                out.append(Trial(problem, TARGET, {"order": [f"s{x}"]}, records.OK, samples=(ms * 1e-3,),
                                 features={"x": float(x), "y": float(p),
                                           "analytic_choice": float(x == analytic_x[family])}))
    return out


def test_where_held_out_families_showed_the_analytic_choice_better_the_model_keeps_it(
    tmp_path: Path,
) -> None:
    # what made the GEMMs fast makes the convolutions slow, and the analytic choice knows it
    # (the fastest convolution; a GEMM of middling speed): a model of one family misleads on
    # the other, so the trained model keeps the analytic choice
    trials = families(falling_in_convs=True, analytic_x={"matmul": 6, "conv2d": SCHEDULES - 1})
    model = CostModel.train(trials)
    assert math.isinf(model.switch_margin)
    scores = model.predict([{"x": float(x), "y": 9.0, "analytic_choice": float(x == 6)}
                            for x in range(SCHEDULES)])
    assert min(range(SCHEDULES), key=scores.__getitem__) != 6
    assert model.pick(scores, 6) == 6
    model.save(tmp_path / "model.txt")
    assert math.isinf(CostModel.load(tmp_path / "model.txt").switch_margin)


def test_where_held_out_families_showed_the_model_better_it_picks_its_first_point() -> None:
    # one law for both families, the analytic choice a middling schedule: the model's first
    # point was the fastest of every held-out problem
    trials = families(falling_in_convs=False, analytic_x={"matmul": 6, "conv2d": 6})
    model = CostModel.train(trials)
    assert model.switch_margin == 0.0
    scores = model.predict([t.features for t in trials[:SCHEDULES]])
    assert model.pick(scores, 6) == 0
    # a point predicted barely ahead of the analytic choice does not replace it where the
    # margin asks for more
    close = [0.01, 0.0, 0.5]
    assert model.pick(close, 0) == 1
    assert replace(model, switch_margin=math.log2(1.02)).pick(close, 0) == 0


def test_problems_of_one_measurement_are_too_few_to_train_on() -> None:
    one_each = [t for t in measured(problems=6) if t.schedule["order"] == ["s0"]]
    with pytest.raises(PolyDLError, match=r"too few measurements to train on \(0 ok trials"):
        CostModel.train(one_each * 3)  # the same schedule again is not another measurement


def test_without_lightgbm_training_says_what_to_install_and_tuned_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    CostModel.train(measured()).save(tmp_path / "model.txt")
    monkeypatch.setenv("POLYDL_COST_MODEL", str(tmp_path / "model.txt"))
    monkeypatch.setitem(sys.modules, "lightgbm", None)
    with pytest.raises(PolyDLError, match=r"pip install 'polydl\[tune\]'"):
        CostModel.train(measured())
    nest, params = builders.matmul(8, 8, 8)
    choice = tuned_schedule(build_model(nest, params), host_target(),
                            PerfDatabase(tmp_path / "perf.sqlite", system=False))
    assert choice.decided_by == "analytic" and "needs LightGBM" in choice.reason


# ---------------------------------------------------------------------------------- the CLI


def _database(path: Path, trials: list[Trial]) -> str:
    PerfDatabase(path, system=False).add(trials)
    return str(path)


def test_model_train_then_eval_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _database(tmp_path / "perf.sqlite", measured())
    model = tmp_path / "model.txt"
    assert main(["model", "train", "--db", db, "--model", str(model)]) == 0
    out = capsys.readouterr().out
    assert "trained  on 72 trials, 2 features" in out and f"stored   {model}" in out
    assert main(["model", "eval", "--db", db, "--model", str(model)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 7 and "matmul(M=16) float32" in lines[0]
    assert lines[-1].startswith("summary  100% of 6 problems within 5% of the best; mean 100.0%")


def test_model_commands_fail_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    few = _database(tmp_path / "few.sqlite", measured()[:5])
    singles = _database(tmp_path / "singles.sqlite",
                        [t for t in measured() if t.schedule["order"] == ["s0"]])
    model = tmp_path / "model.txt"
    for argv, said in (
        (["train", "--db", few, "--model", str(model)], "too few measurements to train on"),
        (["eval", "--db", few, "--model", str(model)], f"{model}: not a polydl cost model"),
    ):
        assert main(["model", *argv]) == 1
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and said in err
    assert not model.exists()
    CostModel.train(measured()).save(model)
    assert main(["model", "eval", "--db", singles, "--model", str(model)]) == 1
    assert f"no problem in {singles} has two or more ok trials" in capsys.readouterr().err
