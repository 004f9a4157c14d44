"""The benchmark harness: suites, report fields, ratio and target logic, one tiny real run.

Speed is never asserted here; the benchmark itself reports it.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polydl import bench
from polydl.bench import (
    backward,
    builds,
    cases,
    forward,
    measure,
    peak,
    report,
    targets,
    threads,
    timing,
)
from polydl.bench.cases import Case
from polydl.bench.report import Environment
from polydl.bench.results import Row
from polydl.target import CpuTarget, host_target
from polydl.tuning.records import Problem, Trial


# ------------------------------------------------------------------------------ suites
def test_resnet50_suite_has_every_conv_layer_at_batch_2() -> None:
    layers = cases.load_suite("resnet50")
    assert len(layers) == 20
    names = [c.name for c in layers]
    assert names[0] == "conv1" and "res2_3x3" in names and names[-1] == "res5_1x1c"
    assert all(c.primitive == "conv2d" and c.dtype == "float32" for c in layers)
    assert all(c.size["N"] == 2 for c in layers)
    conv1 = layers[0]
    assert conv1.output_hw == (112, 112)
    assert conv1.flops == 2 * 2 * 64 * 3 * 7 * 7 * 112 * 112


def test_gemm_suite_has_the_issue_shapes() -> None:
    shapes = {c.name: c for c in cases.load_suite("gemm")}
    assert {"square_512", "square_1024", "square_2048", "fc_resnet50", "bert_ffn2",
            "skinny_tall", "odd_primes"} <= set(shapes)
    assert shapes["odd_primes"].size == {"M": 257, "N": 131, "K": 509}
    assert shapes["odd_primes"].flops == 2 * 257 * 131 * 509
    assert shapes["odd_primes"].shape == "257x131x509"


def test_the_reductions_suite_sums_long_k_into_small_outputs() -> None:
    shapes = cases.load_suite("gemm_reductions")
    assert all(c.primitive == "matmul" for c in shapes)
    # each output is at most 1 MiB (a private copy per thread) and k at least 4096
    assert all(c.size["M"] * c.size["N"] * 4 <= 1 << 20 and c.size["K"] >= 4096 for c in shapes)
    with pytest.raises(cases.BenchError, match="the gemm_reductions suite has no minibatch"):
        cases.load_suite("gemm_reductions", 4)


def test_suite_data_is_a_copy_of_the_shared_files() -> None:
    shared = Path(__file__).resolve().parents[3] / "shared" / "bench"
    if not shared.is_dir():
        pytest.skip("no shared bench folder beside the checkout")
    for name in ("gemm.json", "resnet50_conv.json"):
        package = json.loads((cases.SUITES_DIR / name).read_text())
        assert package == json.loads((shared / name).read_text())


def test_unknown_suite_and_case_are_bench_errors() -> None:
    with pytest.raises(cases.BenchError, match="unknown suite"):
        cases.load_suite("vgg")
    with pytest.raises(cases.BenchError, match="schedule 'fastest'"):
        bench.main("gemm", None, ["odd_primes"], 1, schedule="fastest")
    with pytest.raises(cases.BenchError, match="unknown case 'nope'"):
        cases.select_cases(cases.load_suite("gemm"), ["square_512", "nope"])
    picked = cases.select_cases(cases.load_suite("gemm"), ["odd_primes", "square_512"])
    assert [c.name for c in picked] == ["odd_primes", "square_512"]


# ------------------------------------------------------------------------------ references
@pytest.mark.parametrize("stride, padding, r", [(1, 0, 1), (1, 1, 3), (2, 3, 7), (2, 0, 1)])
def test_numpy_conv2d_matches_the_loop_definition(stride: int, padding: int, r: int) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 9, 11))
    w = rng.standard_normal((4, 3, r, r))
    got = forward.numpy_conv2d(x, w, stride, padding)
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    p = (9 + 2 * padding - r) // stride + 1
    q = (11 + 2 * padding - r) // stride + 1
    want = np.zeros((2, 4, p, q))
    for i in range(p):
        for j in range(q):
            patch = xp[:, :, i * stride:i * stride + r, j * stride:j * stride + r]
            want[:, :, i, j] = np.einsum("ncrs,kcrs->nk", patch, w)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("isa, lanes, accumulators", [
    ("avx512amx", 16, 24), ("avx512bf16", 16, 24), ("avx512", 16, 24), ("avx2", 8, 12), ("scalar", 1, 12),
])
def test_peak_loop_source_per_isa(isa: str, lanes: int, accumulators: int) -> None:
    source, got_lanes, got_accs, _ = peak.peak_source(isa)
    assert (got_lanes, got_accs) == (lanes, accumulators)
    assert f"acc{accumulators - 1}" in source and f"acc{accumulators}" not in source
    assert "omp parallel" in source


def test_peak_loop_runs_on_this_machine() -> None:
    fma = peak.FmaPeak(host_target().isa)
    try:
        samples = fma.measure(samples=1)
    finally:
        fma.close()
    assert fma.threads >= 1 and len(samples) == 1 and samples[0] > 0


def test_plan_stays_within_repeat_and_budget() -> None:
    rounds, inner = timing.plan({"polydl": 0.01, "numpy": 0.01}, repeat=100, budget_s=1.0)
    # one round: 2 runners x (1 untimed + 3 samples) x 10 ms = 80 ms
    assert rounds == 12 and inner == {"polydl": 1, "numpy": 1}
    rounds, inner = timing.plan({"polydl": 1e-5}, repeat=4, budget_s=100.0)
    assert rounds == 4 and inner["polydl"] == 100
    assert timing.plan({"polydl": 10.0}, repeat=10, budget_s=1.0)[0] == 1


def test_interleaved_timing_alternates_runners() -> None:
    calls: list[str] = []

    def runner(name: str) -> timing.Runner:
        return timing.Runner(name, lambda: calls.append(name), lambda: np.zeros(1))

    runners = [runner("a"), runner("b")]
    samples = timing.time_interleaved(runners, rounds=2, inner={"a": 1, "b": 2})
    assert {n: len(v) for n, v in samples.items()} == {"a": 6, "b": 6}
    per_round = 1 + timing.SAMPLES_PER_ROUND * 1 + 1 + timing.SAMPLES_PER_ROUND * 2
    assert calls[0] == "a" and calls[per_round] == "b"  # the second round starts with b


def test_slow_references_are_timed_in_the_first_round_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference far slower than the fastest one (the numpy convolution at N=32) takes one
    round; the rest of the budget goes to the rounds of the runners that decide the ratio."""
    clock = {"now": 0.0}
    cost = {"polydl": 0.010, "fast": 0.012, "numpy": 0.500}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(timing, "quiesce", lambda: 0.0)

    def runner(name: str) -> timing.Runner:
        return timing.Runner(name, lambda: clock.__setitem__("now", clock["now"] + cost[name]),
                             lambda: np.zeros(1))

    runners = [runner(n) for n in cost]
    rounds, samples = timing.time_runners(runners, repeat=50, budget_s=5.0)
    n = timing.SAMPLES_PER_ROUND
    assert len(samples["numpy"]) == n  # its first round only
    assert rounds > 20 and len(samples["polydl"]) == len(samples["fast"]) == rounds * n
    # all three timed in every round, the budget allows 2
    assert timing.plan(cost, 50, 5.0)[0] == 2

    # polydl itself is never left out, however slow; a lone reference neither
    cost.update(polydl=0.5, fast=0.01, numpy=0.012)
    rounds, samples = timing.time_runners(runners, repeat=5, budget_s=100.0)
    assert rounds == 5 and all(len(v) == 5 * n for v in samples.values())
    assert timing.slow_references({"polydl": 0.01, "numpy": 1.0}, {"polydl": [0.01], "numpy": [1.0]},
                                  "polydl") == set()


def test_one_slow_call_does_not_drop_a_reference() -> None:
    """Slow in its planning call but not in its first round (a burst on the machine): kept."""
    single = {"polydl": 0.01, "a": 0.01, "b": 0.2}
    assert timing.slow_references(single, {"polydl": [0.01], "a": [0.01], "b": [0.011]}, "polydl") == set()
    assert timing.slow_references(single, {"polydl": [0.01], "a": [0.01], "b": [0.05]}, "polydl") == {"b"}


def test_quiesce_waits_until_the_process_stops_spinning(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"wall": 0.0}

    def cpu() -> float:  # 16 workers spin for 0.1 s after their call, then sleep
        return 16 * min(clock["wall"], 0.1)

    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(timing.time, "process_time", cpu)
    monkeypatch.setattr(timing.time, "sleep", lambda s: clock.__setitem__("wall", clock["wall"] + s))
    waited = timing.quiesce()
    assert 0.1 <= waited <= 0.1 + 2 * timing.QUIET_WINDOW_S
    clock["wall"] = 5.0  # a quiet process: one window
    assert timing.quiesce() == pytest.approx(timing.QUIET_WINDOW_S)


def test_every_turn_starts_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(timing, "quiesce", lambda: calls.append("quiet") or 0.0)
    runners = [timing.Runner(n, lambda n=n: calls.append(n), lambda: np.zeros(1)) for n in "ab"]
    timing.time_interleaved(runners, rounds=2, inner={"a": 1, "b": 1})
    turns = [i for i, c in enumerate(calls) if c == "quiet"]
    assert len(turns) == 4 and all(calls[i + 1] != "quiet" for i in turns)


def test_speeds_keep_each_rounds_median_in_order() -> None:
    n = timing.SAMPLES_PER_ROUND
    samples = {"polydl": [1.0] * n + [2.0] * (n - 1) + [9.0] + [4.0] * n}
    speeds = timing.Speeds.of(8e9, samples)
    assert speeds.rounds["polydl"] == pytest.approx([8.0, 4.0, 2.0])
    assert speeds.fastest["polydl"] == pytest.approx(8.0)
    assert speeds.median["polydl"] == pytest.approx(8.0 / 2.0)


def test_layouts_are_chosen_by_the_median_the_row_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """One fast call of an erratic layout does not win the choice over a steadier, faster one."""
    case = Case("c", "matmul", (("M", 1000), ("N", 1000), ("K", 1000)))  # 2e9 flops
    erratic = [1.0] + [3.0] * 14  # fastest sample 1 s, median 3 s
    steady = [2.0] * 15
    monkeypatch.setattr(builds, "time_runners",
                        lambda runners, repeat, budget: (5, {"nchw": erratic, "nchw16c": steady}))
    made = [builds.PolydlBuild(timing.Runner("polydl", lambda: None, lambda: np.zeros(1)), 0.0, "", v)
            for v in ("nchw", "nchw16c")]
    speeds = builds.variant_speeds(case, made, repeat=5)
    assert speeds == pytest.approx({"nchw": 2e9 / 3.0 / 1e9, "nchw16c": 1.0})
    assert max(speeds, key=speeds.__getitem__) == "nchw16c"


# ------------------------------------------------------------------------------ rows, targets
def _row(case: str, polydl: float | None, status: str = "ok", **refs: float) -> Row:
    return Row(case=case, shape="2x3x4", flops=48, polydl_gflops=polydl,
               references={k.replace("_", "."): v for k, v in refs.items()}, status=status,
               relative_error=1e-7, compile_s=1.5, variant="nchw16c", schedule="order n > k",
               peak_gflops=200.0)


def test_row_ratio_is_against_the_best_reference() -> None:
    row = _row("a", 90.0, numpy=30.0, torch_nchw=100.0, torch_mkldnn=120.0)
    assert row.best_reference == ("torch.mkldnn", 120.0)
    assert row.ratio == pytest.approx(0.75)
    assert row.ratio_vs(("numpy",)) == pytest.approx(3.0)
    assert row.peak_percent == pytest.approx(45.0)
    assert _row("b", 90.0, status="FAILED", numpy=30.0).ratio is None
    assert _row("c", None, status="ERROR").ratio is None


def test_round_ratios_pair_polydl_with_the_ratios_reference_round_by_round() -> None:
    row = replace(_row("a", 90.0, numpy=30.0, torch_nchw=100.0),
                  round_gflops={"polydl": [80.0, 90.0, 99.0], "torch.nchw": [100.0, 90.0, 110.0],
                                "numpy": [40.0, 30.0, 20.0]})
    assert row.round_ratios() == pytest.approx([0.8, 1.0, 0.9])
    assert row.round_ratios(("numpy",)) == pytest.approx([2.0, 3.0, 4.95])
    assert _row("b", 90.0, torch_nchw=100.0).round_ratios() == []
    low = targets.evaluate_target(targets.TARGETS["resnet50"], [row])
    assert low.minimum_rounds == pytest.approx((0.8, 1.0, 0.9))
    text = report.format_report("resnet50", _environment(), [row])
    assert "0.80-1.00" in text and "its rounds 0.80-1.00" in text


def test_geometric_mean() -> None:
    assert targets.geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert targets.geometric_mean([]) is None


def test_resnet50_target_needs_geomean_and_every_layer() -> None:
    target = targets.TARGETS["resnet50"]
    met = targets.evaluate_target(target, [_row("a", 110.0, torch_nchw=100.0),
                                         _row("b", 95.0, torch_nchw=100.0, numpy=200.0)])
    assert met.met is True and met.geomean == pytest.approx(math.sqrt(1.1 * 0.95))
    low_layer = targets.evaluate_target(target, [_row("a", 200.0, torch_nchw=100.0),
                                               _row("b", 70.0, torch_nchw=100.0)])
    assert low_layer.met is False and low_layer.minimum_case == "b"
    low_mean = targets.evaluate_target(target, [_row("a", 90.0, torch_nchw=100.0)])
    assert low_mean.met is False
    failed = targets.evaluate_target(target, [_row("a", 200.0, torch_nchw=100.0),
                                            _row("b", 300.0, "FAILED", torch_nchw=100.0)])
    assert failed.met is False and "failed" in failed.note
    no_torch = targets.evaluate_target(target, [_row("a", 200.0, numpy=100.0)])
    assert no_torch.met is None and "not evaluated" in no_torch.note


def test_gemm_target_is_numpy_on_every_shape() -> None:
    target = targets.TARGETS["gemm"]
    rows = [_row("a", 100.0, numpy=100.0, torch_matmul=150.0), _row("b", 120.0, numpy=110.0)]
    assert targets.evaluate_target(target, rows).met is True
    rows.append(_row("c", 99.0, numpy=100.0))
    result = targets.evaluate_target(target, rows)
    assert result.met is False and result.minimum_case == "c"


def _environment(torch_version: str | None = "2.13.0+cpu") -> Environment:
    target = CpuTarget(isa="avx2", cores=2, model="Test CPU")
    return Environment(target, 2, 200.0, [199.0, 200.0, 201.0], torch_version)


def test_report_table_and_json_fields(tmp_path: Path) -> None:
    rows = [
        _row("conv1", 80.0, numpy=20.0, torch_nchw=100.0, torch_mkldnn=90.0),
        _row("res2_3x3", 120.0, numpy=30.0, torch_nchw=100.0, torch_mkldnn=110.0),
        Row(case="res5_3x3", shape="s", flops=1, polydl_gflops=None, references={},
            status="ERROR", message="ScheduleError: no legal schedule"),
    ]
    text = report.format_report("resnet50", _environment(), rows)
    for word in ("case", "shape", "layout", "polydl", "best ref", "ratio", "%peak", "compile s",
                 "check", "torch.nchw", "torch.mkldnn", "0.80", "40", "ok 1e-07", "ERROR",
                 "ScheduleError: no legal schedule", "geomean ratio", "MISSED", "200.0 GFLOP/s"):
        assert word in text, word

    document = report.report_json("resnet50", _environment(), rows, {"repeat": 3})
    path = tmp_path / "out" / "report.json"
    report.write_json(path, document)
    data = json.loads(path.read_text())
    assert set(data) == {"suite", "time", "environment", "settings", "rows", "summary"}
    assert data["environment"]["machine"]["isa"] == "avx2"
    assert data["environment"]["peak_gflops"] == 200.0
    row = data["rows"][0]
    for key in ("case", "shape", "flops", "polydl_gflops", "references", "best_reference",
                "best_reference_gflops", "ratio", "peak_percent", "compile_s", "status",
                "relative_error", "variant", "schedule", "rounds", "samples", "kept"):
        assert key in row, key
    assert row["best_reference"] == "torch.nchw" and row["ratio"] == pytest.approx(0.8)
    summary = data["summary"]
    assert summary["geomean_ratio"] == pytest.approx(math.sqrt(0.8 * 120 / 110))
    assert summary["failed"] == ["res5_3x3"] and summary["target"]["met"] is False


def test_report_says_when_the_weights_were_kept() -> None:
    rows = [_row("a", 10.0, numpy=5.0)]
    assert "weights  kept" not in report.format_report("gemm", _environment(), rows)
    kept = replace(_environment(), kept_weights=True)
    assert "weights  kept between calls (inference)" in report.format_report("gemm", kept, rows)


def test_report_marks_the_references_timed_in_one_round() -> None:
    n = timing.SAMPLES_PER_ROUND
    row = replace(_row("a", 100.0, numpy=20.0, torch_nchw=90.0), rounds=9,
                  samples={"polydl": 9 * n, "torch.nchw": 9 * n, "numpy": n})
    text = report.format_report("resnet50", _environment(), [row])
    assert "20.0*" in text and "90.0*" not in text and "timed in the first round only" in text
    every_round = replace(row, samples={"polydl": 9 * n, "torch.nchw": 9 * n, "numpy": 9 * n})
    assert "first round only" not in report.format_report("resnet50", _environment(), [every_round])


def test_report_without_torch_says_numpy_only() -> None:
    text = report.format_report("gemm", _environment(None), [_row("a", 10.0, numpy=5.0)])
    assert "PyTorch not installed: numpy only" in text and "MET" in text


# ------------------------------------------------------------------------------ real runs
@pytest.fixture
def prepared_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in this process (the harness would otherwise start a child with these set)."""
    for name, value in threads.thread_environment(host_target().cores).items():
        monkeypatch.setenv(name, value)


@pytest.mark.slow
def test_tiny_real_gemm_run(
    prepared_threads: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gemm.json"
    assert bench.main("gemm", str(path), ["odd_primes"], 1, budget_s=0.2) == 0
    out = capsys.readouterr().out
    assert "odd_primes" in out and "numpy" in out and "geomean ratio" in out
    data = json.loads(path.read_text())
    (row,) = data["rows"]
    assert row["status"] == "ok" and row["relative_error"] < 1e-4
    assert row["polydl_gflops"] > 0 and row["references"]["numpy"] > 0
    assert row["schedule"] and row["compile_s"] > 0


def test_tiny_real_conv_case_compares_layouts(prepared_threads: None) -> None:
    case = Case("tiny", "conv2d", (("N", 1), ("C", 16), ("K", 32), ("H", 6), ("W", 6),
                                   ("R", 3), ("S", 3), ("stride", 1), ("padding", 1)))
    row = measure.bench_case(case, None, repeat=1, budget_s=0.2, peak_gflops=100.0,
                           compare_layouts=True)
    assert row.status == "ok", row.message
    assert set(row.variants) == {"nchw16c", "nchw"} and row.variant in row.variants
    assert set(row.references) == {"numpy"}
    assert row.relative_error is not None and row.relative_error < 1e-4


@pytest.mark.slow
def test_a_stem_case_also_compares_nchw_in_blocks_out(prepared_threads: None) -> None:
    """A layer of fewer than 16 input channels is built a third way, NCHW in and blocks out
    (`polydl.conv2d(out_layout="nchw16c")`), verified through the same conversion."""
    case = Case("stem", "conv2d", (("N", 1), ("C", 3), ("K", 16), ("H", 12), ("W", 12),
                                   ("R", 7), ("S", 7), ("stride", 2), ("padding", 3)))
    row = measure.bench_case(case, None, repeat=1, budget_s=0.2, peak_gflops=100.0,
                           compare_layouts=True)
    assert row.status == "ok", row.message
    assert set(row.variants) == {"nchw16c", "nchw", "nchw-nchw16c"}
    assert row.relative_error is not None and row.relative_error < 1e-4


def test_a_tuned_case_builds_the_databases_schedule(
    prepared_threads: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polydl.driver.pipeline import lower
    from polydl.frontends import builders
    from polydl.poly.model import build_model
    from polydl.target import host_target
    from polydl.tuning import records
    from polydl.tuning.database import PerfDatabase
    from polydl.tuning.space import search_space

    sizes = dict(N=1, C=16, K=32, H=6, W=6, R=3, S=3, stride=1, padding=1)
    case = Case("tiny", "conv2d", tuple(sizes.items()))
    nest, params = builders.conv2d(**sizes, layout="nchw16c")
    target = host_target()
    space = search_space(build_model(nest, params), target, limit=30)
    analytic = lower(nest, params, target).schedule.describe()
    other = next(c.schedule for c in space[1:]
                 if lower(nest, params, target, c.schedule).schedule.describe() != analytic)
    monkeypatch.setenv("POLYDL_TUNING_DB", str(tmp_path / "perf.sqlite"))
    monkeypatch.setenv("POLYDL_SYSTEM_DB", "")
    PerfDatabase().add([records.Trial(records.Problem.of(nest, params), target.key(),
                                      other.to_dict(), records.OK, (1e-6,))])
    rows = {schedule: measure.bench_case(case, None, repeat=1, budget_s=0.1, peak_gflops=100.0,
                                         layouts=("nchw16c",), compare_layouts=False,
                                         schedule=schedule)
            for schedule in ("auto", "tuned")}
    assert all(row.status == "ok" for row in rows.values())
    assert rows["auto"].schedule == analytic
    assert rows["tuned"].schedule == lower(nest, params, target, other).schedule.describe()


def test_kept_weights_build_kernels_that_keep_w_or_b(prepared_threads: None) -> None:
    """Timing inference, the forward passes build with `constant=` on their weights (and
    still verify against the float64 result); per call, nothing is kept."""
    conv = Case("tiny", "conv2d", (("N", 1), ("C", 16), ("K", 32), ("H", 6), ("W", 6),
                                   ("R", 3), ("S", 3), ("stride", 1), ("padding", 1)))
    gemm = Case("tiny", "matmul", (("M", 8), ("N", 40), ("K", 24)))
    for case, kept in ((conv, ("w",)), (gemm, ("B",))):
        for kept_weights in (False, True):
            row = measure.bench_case(case, None, repeat=1, budget_s=0.1, peak_gflops=100.0,
                                     compare_layouts=False, kept_weights=kept_weights)
            assert row.status == "ok", row.message
            assert row.kept == (kept if kept_weights else ())


def test_kept_weights_are_refused_for_the_backward_suites() -> None:
    with pytest.raises(bench.BenchError, match="--kept-weights: the resnet50_bwd_data suite"):
        bench.main("resnet50_bwd_data", None, ["res2_1x1a"], 1, kept_weights=True)
    # the pass itself keeps nothing, and its builder refuses to
    case = Case("tiny", "conv2d_backward_data", (("N", 1), ("C", 16), ("K", 16), ("H", 4),
                                                 ("W", 4), ("R", 1), ("S", 1), ("stride", 1),
                                                 ("padding", 0)))
    assert backward.BACKWARD.constant(True) == ()
    with pytest.raises(bench.BenchError, match="keep no input between calls"):
        backward.build_polydl(case, [], "nchw", "auto", ("w",))


def test_backward_suites_run_the_resnet50_layers() -> None:
    for suite, primitive in (("resnet50_bwd_data", "conv2d_backward_data"),
                             ("resnet50_bwd_weights", "conv2d_backward_weights")):
        layers = cases.load_suite(suite)
        assert [c.name for c in layers] == [c.name for c in cases.load_suite("resnet50")]
        assert all(c.primitive == primitive for c in layers)
        assert targets.TARGETS[suite].geomean_min == 0.9


@pytest.mark.parametrize("primitive", ["conv2d_backward_data", "conv2d_backward_weights"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.slow
def test_tiny_real_backward_case(prepared_threads: None, primitive: str, stride: int) -> None:
    case = Case("tiny", primitive, (("N", 1), ("C", 16), ("K", 20), ("H", 7), ("W", 6),
                                    ("R", 3), ("S", 3), ("stride", stride), ("padding", 1)))
    torch = threads.import_torch(1)
    row = measure.bench_case(case, torch, repeat=1, budget_s=0.2, peak_gflops=100.0,
                           compare_layouts=True)
    assert row.status == "ok", row.message
    assert set(row.variants) == {"nchw16c", "nchw"}
    assert row.relative_error is not None and row.relative_error < 1e-4
    if torch is not None:
        assert set(row.references) == {"torch.nchw", "torch.channels_last"}


def test_backward_numpy_gradient_matches_torch() -> None:
    torch = pytest.importorskip("torch")

    for primitive in ("conv2d_backward_data", "conv2d_backward_weights"):
        case = Case("tiny", primitive, (("N", 2), ("C", 3), ("K", 4), ("H", 7), ("W", 6),
                                        ("R", 3), ("S", 2), ("stride", 2), ("padding", 1)))
        rng = np.random.default_rng(0)
        inputs = [rng.uniform(-1, 1, s).astype(np.float32)
                  for s in backward.input_shapes(case)]
        got = backward.numpy_gradient(case, inputs)
        np.testing.assert_allclose(got, backward.expected(case, inputs, torch), atol=1e-10)


# ------------------------------------------------------------------------------ batch and threads
def test_a_convolution_suite_at_another_batch() -> None:
    at_32 = cases.load_suite("resnet50", 32)
    at_2 = cases.load_suite("resnet50")
    assert [c.name for c in at_32] == [c.name for c in at_2]
    assert all(c.size["N"] == 32 for c in at_32)
    assert at_32[0].flops == 16 * at_2[0].flops
    assert at_32[0].shape.startswith("N32 C3 K64 224x224")
    with pytest.raises(cases.BenchError, match="no minibatch"):
        cases.load_suite("gemm", 4)
    with pytest.raises(cases.BenchError, match="positive minibatch"):
        cases.load_suite("resnet50", 0)


def test_pinned_cores_are_the_first_of_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    available = sorted(__import__("os").sched_getaffinity(0))
    assert threads.pinned_cores(1) == available[:1]
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.pinned_cores(None) == available
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.pinned_cores(None) == available[:1]
    with pytest.raises(cases.BenchError, match="threads must be between 1 and"):
        threads.pinned_cores(len(available) + 1)
    # a forced count wins over the environment's (OMP_NUM_THREADS=1 here)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    forced = threads.thread_environment(3, forced=True)
    assert forced["OMP_NUM_THREADS"] == forced["OPENBLAS_NUM_THREADS"] == "3"
    assert threads.thread_environment(3)["OMP_NUM_THREADS"] == "1"


def test_a_process_runs_on_its_cores_only_with_their_thread_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    available = sorted(__import__("os").sched_getaffinity(0))
    for name, value in threads.thread_environment(len(available), forced=True).items():
        monkeypatch.setenv(name, value)
    assert threads.runs_on(available)
    assert not threads.runs_on(available[:1] + [max(available) + 1])
    monkeypatch.setenv("OMP_NUM_THREADS", str(len(available) + 1))
    assert not threads.runs_on(available)
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT")
    monkeypatch.setenv("OMP_NUM_THREADS", str(len(available)))
    assert not threads.runs_on(available)


@pytest.mark.slow
def test_one_thread_run_at_batch_1_schedules_for_one_core(tmp_path: Path) -> None:
    """`threads` pins a child process to that many cores: polydl's target has that many cores,
    every side that many threads, and the layers run at `batch`."""
    path = tmp_path / "r.json"
    assert bench.main("resnet50", str(path), ["res5_1x1c"], 1, budget_s=0.1,
                      layouts=("nchw16c",), compare_layouts=False, batch=1, threads=1) == 0
    data = json.loads(path.read_text())
    assert data["environment"]["threads"] == 1
    assert data["environment"]["machine"]["cores"] == 1
    assert data["settings"]["batch"] == 1
    assert data["settings"]["thread_env"]["OMP_NUM_THREADS"] == "1"
    (row,) = data["rows"]
    assert row["status"] == "ok" and row["shape"].startswith("N1 C2048 K512 7x7")


def _load_benchmark(name: str) -> Any:
    """The script benchmarks/NAME.py as a module."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scaling_table_speedups_and_plot(tmp_path: Path) -> None:
    scaling = _load_benchmark("scaling")
    assert scaling.powers_of_two(16) == [1, 2, 4, 8, 16]
    assert scaling.powers_of_two(6) == [1, 2, 4, 6]

    def run(polydl: float, ref: float, peak_gflops: float) -> dict[str, object]:
        samples = [peak_gflops * 0.8, peak_gflops * 0.9, peak_gflops]  # median 0.9 of the best
        return {"environment": {"peak_gflops": peak_gflops, "peak_samples": samples},
                "rows": [{"case": "res2_3x3", "polydl_gflops": polydl,
                          "best_reference_gflops": ref, "best_reference": "torch.mkldnn",
                          "variant": "nchw16c", "status": "ok"}]}

    lines, summary = scaling.scaling_table(
        {1: run(100.0, 120.0, 150.0), 4: run(360.0, 300.0, 600.0)})
    one, four = summary["res2_3x3"]
    assert one["speedup_over_1"] == 1.0 and four["speedup_over_1"] == pytest.approx(3.6)
    assert four["ratio"] == pytest.approx(1.2) and four["peak_percent"] == pytest.approx(60.0)
    # the FMA loop's own speed-up, from its medians: what the machine lets any kernel reach
    assert one["fma_speedup_over_1"] == 1.0 and four["fma_speedup_over_1"] == pytest.approx(4.0)
    assert "FMA x" in lines[0]
    assert any("torch.mkldnn" in line for line in lines)
    pytest.importorskip("matplotlib")
    png = tmp_path / "s.png"
    assert scaling.plot(summary, str(png), "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_script_reports_bench_errors_as_usage_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = _load_benchmark("run")
    for argv, message in ((["--suite", "gemm", "--batch", "4"], "has no minibatch"),
                          (["--suite", "gemm", "--threads", "100000"], "threads must be between"),
                          (["--suite", "gemm", "--case", "nope"], "unknown case 'nope'"),
                          (["--suite", "resnet50_fused", "--schedule", "tuned"],
                           "'tuned' for the gemm, resnet50 and backward suites")):
        with pytest.raises(SystemExit) as exit_info:
            run.main([*argv, "--no-json"])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_kept_benchmark_checks_both_kernels_and_pairs_rounds() -> None:
    kept = _load_benchmark("kept")
    result = kept.measure(2, 96, 64, rounds=2)
    assert set(result["errors"]) == {"per call", "kept"} and max(result["errors"].values()) < 1e-5
    assert len(result["round_speedups"]) == 2 and result["speedup"] > 0
    assert all(len(v) == 2 for v in result["round_seconds"].values())
    assert any(line.startswith("2x96x64 ") for line in kept.table([result]))
    assert kept._shape("1x1000x2048") == (1, 1000, 2048)
    with pytest.raises(argparse.ArgumentTypeError, match="MxNxK"):
        kept._shape("1000x2048")


def test_tuning_benchmark_reports_how_noisy_the_labels_are() -> None:
    tuning = _load_benchmark("tuning")
    problem = Problem("p", "matmul", (("M", 16),), "float32")

    def trial(samples: tuple[float, ...], reference: tuple[float, ...]) -> Trial:
        return Trial(problem, "{}", {"order": [str(samples)]}, "ok", samples=samples,
                     reference_samples=reference)

    steady = trial((1.0, 2.0, 1.0, 2.0), (1.0, 2.0, 1.0, 2.0))  # ratios 1, 1, 1, 1
    shaky = trial((1.0, 1.0, 1.0, 1.0), (1.0, 0.5, 1.0, 0.5))  # ratios 1, 2, 1, 2
    other = trial((3.0, 3.0), (3.0, 3.0))  # a second request: its reference took 2x as long
    noise = tuning.label_noise([steady, shaky, other])
    assert noise["ratio_spread_median"] == pytest.approx(0.0)
    assert noise["ratio_spread_p90"] == pytest.approx(1.0 / 1.5)  # (2 - 1) / 1.5
    assert noise["rounds_median"] == 4
    # the reference's medians per request: 1.5, 0.75, 3.0 -> slowest / fastest 4
    assert noise["reference_apart_median"] == pytest.approx(4.0)
    assert noise["problems_with_requests"] == 1


@pytest.mark.slow
def test_tuning_benchmark_times_the_tuned_kernel_against_the_analytic_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`versus`: a layer the database has nothing for builds the analytic schedule twice
    (1.0, untimed); with a faster trial stored, the tuned kernel is built from it, verified
    and timed beside the analytic one."""
    from polydl.poly.model import build_model
    from polydl.tuner.suites import suite_problems
    from polydl.tuning.database import PerfDatabase
    from polydl.tuning.space import search_space

    tuning = _load_benchmark("tuning")
    db = tmp_path / "perf.sqlite"
    monkeypatch.setenv("POLYDL_TUNING_DB", str(db))
    monkeypatch.setenv("POLYDL_COST_MODEL", str(tmp_path / "none.txt"))
    sizes = {"N": 1, "C": 16, "K": 32, "H": 6, "W": 6, "R": 3, "S": 3, "stride": 1, "padding": 1}
    suite = tmp_path / "one.json"
    suite.write_text(json.dumps({"N": 1, "layers": [{"name": "tiny", **{k: v for k, v in sizes.items()
                                                                       if k != "N"}}]}))
    (problem,) = suite_problems(str(suite))
    case = Case("tiny", "conv2d", tuple(sizes.items()), "float32")
    target = host_target()
    row = tuning.versus_row(case, problem, target, None, 2, 0.2)
    assert (row["decided_by"], row["same"], row["ratio"]) == ("analytic", True, 1.0)
    other = next(c for c in search_space(build_model(problem.nest, problem.params), target)
                 if not c.analytic)
    PerfDatabase(db, system=False).add([Trial(
        Problem.of(problem.nest, problem.params), target.key(), other.schedule.to_dict(), "ok",
        samples=(1e-6,))])
    row = tuning.versus_row(case, problem, target, None, 2, 0.2)
    assert row["decided_by"] == "database" and not row["same"]
    assert row["tuned_schedule"] == other.schedule.describe() != row["analytic_schedule"]
    assert row["rounds"] >= 1 and row["ratio"] > 0 and row["tuned_gflops"] > 0
