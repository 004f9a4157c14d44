"""Networks with `schedule="tuned"`: each layer's schedule from the performance database where
`polydl tune MODEL.onnx` measured it, the rest as the analytic ranking chose them."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx  # noqa: E402

import polydl.onnx  # noqa: E402
from polydl.cli import main  # noqa: E402
from polydl.driver.pipeline import generated_code  # noqa: E402
from polydl.errors import ShapeError  # noqa: E402
from polydl.poly.model import build_model  # noqa: E402
from polydl.target import host_target  # noqa: E402
from polydl.tuner.measure import Limits  # noqa: E402
from polydl.tuning import records  # noqa: E402
from polydl.tuning.database import PerfDatabase  # noqa: E402
from polydl.tuning.records import Problem, Trial  # noqa: E402
from polydl.tuning.space import search_space  # noqa: E402
from tests.onnx.reference import random, run_onnxruntime  # noqa: E402
from tests.onnx.test_library import _small_model  # noqa: E402


@pytest.fixture
def tuning_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh user database, no system database and no cost model."""
    db = tmp_path / "perf.sqlite"
    monkeypatch.setenv("POLYDL_TUNING_DB", str(db))
    monkeypatch.setenv("POLYDL_SYSTEM_DB", "")
    monkeypatch.setenv("POLYDL_COST_MODEL", str(tmp_path / "none.txt"))
    return db


def _kernel_lines(explain: str) -> dict[str, str]:
    """Each kernel step's label (its node) -> its kernel line."""
    lines = explain.splitlines()
    return {lines[i].strip(): lines[i + 1] for i in range(len(lines) - 1)
            if re.match(r"\s+\d+\s\s", lines[i]) and "kernel " in lines[i + 1]}


def _schedule_text(source: str) -> str:
    return next(line.split("schedule:", 1)[1].strip() for line in source.splitlines()[:4]
                if "schedule:" in line)


def test_a_tuned_network_takes_each_layers_fastest_trial(tuning_files: Path) -> None:
    model = _small_model()
    target = host_target()
    problems = polydl.onnx.network_problems(model)
    assert [label.split(" [")[0] for label, _, _ in problems] == [
        "Conv 'conv', Relu 'relu' fused", "layout nchw16c -> plain"]
    _, nest, params = problems[0]
    space = search_space(build_model(nest, params), target, limit=40)
    analytic_text = _schedule_text(generated_code(nest, params, target).source)
    other = next(c for c in space if not c.analytic and _schedule_text(
        generated_code(nest, params, target, c.schedule).source) != analytic_text)
    problem = Problem.of(nest, params)
    PerfDatabase(tuning_files).add([
        Trial(problem, target.key(), other.schedule.to_dict(), records.OK, (1e-6,)),
        Trial(problem, target.key(), space[0].schedule.to_dict(), records.OK, (1e-3,))])

    tuned = polydl.onnx.compile(model, schedule="tuned")
    conv, layout = _kernel_lines(tuned.explain()).values()
    assert conv.endswith("(tuned: the database decided)")
    assert _schedule_text(generated_code(nest, params, target, other.schedule).source) in conv
    assert layout.endswith("(tuned: the analytic decided)")  # never measured
    auto_conv = next(iter(_kernel_lines(polydl.onnx.compile(model).explain()).values()))
    assert analytic_text in auto_conv and "tuned" not in auto_conv
    x = random((1, 8, 6, 6), seed=3)
    np.testing.assert_allclose(tuned(x), run_onnxruntime(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_a_tuned_network_is_lowered_again_once_the_database_changes(
    tuning_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _small_model()
    import polydl.onnx as package

    lowered = []
    real = package._lowered

    def counted(*args: object, **kwargs: object) -> object:
        lowered.append(kwargs.get("schedule", args[-1] if args else None))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(package, "_lowered", counted)
    polydl.onnx.compile(model, schedule="tuned")
    polydl.onnx.compile(model, schedule="tuned")
    assert len(lowered) == 1  # the second from the cache
    (_, nest, params), _ = polydl.onnx.network_problems(model)
    target = host_target()
    space = search_space(build_model(nest, params), target, limit=8)
    PerfDatabase(tuning_files).add([Trial(Problem.of(nest, params), target.key(),
                                          space[-1].schedule.to_dict(), records.OK, (1e-6,))])
    polydl.onnx.compile(model, schedule="tuned")
    assert len(lowered) == 2


def test_an_unknown_schedule_request_is_refused() -> None:
    with pytest.raises(ShapeError, match="'auto'.*'tuned'"):
        polydl.onnx.compile(_small_model(), schedule="fastest")


@pytest.mark.slow
def test_tune_a_network_then_run_and_compile_it_tuned(
    tuning_files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # measured beside the other test workers: their load would flag every trial noisy, and
    # a kernel without an ok trial is not the database's to decide
    monkeypatch.setattr("polydl.tuner.search.Limits", lambda: Limits(
        max_other_load=math.inf, min_rounds=2, max_rounds=3, budget_s=0.05))
    path = tmp_path / "small.onnx"
    onnx.save(_small_model(), path)
    assert main(["tune", str(path), "--trials", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "network  2 distinct kernels, 2 with schedules to choose from" in out
    assert "Conv 'conv', Relu 'relu' fused" in out and f"stored   {tuning_files}" in out
    stored = {t.problem.primitive for t in PerfDatabase(tuning_files).trials()}
    assert len(stored) == 2 and all(name.startswith("pd_") for name in stored)
    assert main(["run", str(path), "--schedule", "tuned", "--repeat", "2"]) == 0
    assert "verify   ok" in capsys.readouterr().out
    assert main(["compile", str(path), "--schedule", "tuned"]) == 0
    explain = capsys.readouterr().out
    assert explain.count("(tuned: the database decided)") == 2
