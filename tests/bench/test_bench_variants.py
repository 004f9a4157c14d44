"""The A/B suites (fused epilogues, bfloat16): what each row compares, on one tiny real case.

Speed is never asserted here; the benchmark itself reports it.
"""

from __future__ import annotations

import pytest

from polydl.bench.cases import DEFAULT_BUDGET_S, Case, load_suite
from polydl.bench.targets import TARGETS
from polydl.bench.threads import import_torch, thread_environment
from polydl.bench.variants import CASE_RUNNERS, bf16_case, fused_case
from polydl.target import host_target

TINY = Case("tiny", "conv2d", (("N", 1), ("C", 16), ("K", 32), ("H", 6), ("W", 6),
                               ("R", 3), ("S", 3), ("stride", 1), ("padding", 1)))


@pytest.fixture
def prepared_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in thread_environment(host_target().cores).items():
        monkeypatch.setenv(name, value)


def test_suites_are_registered_on_the_resnet50_layers() -> None:
    for suite in CASE_RUNNERS:
        assert suite in TARGETS and suite in DEFAULT_BUDGET_S
        assert [c.name for c in load_suite(suite)] == [c.name for c in load_suite("resnet50")]
    assert TARGETS["resnet50_fused"].prefixes == ("polydl.unfused",)
    assert TARGETS["resnet50_bf16"].geomean_min == 1.6


@pytest.mark.slow
def test_fused_row_compares_with_the_unfused_kernel(prepared_threads: None) -> None:
    row = fused_case(TINY, None, repeat=1, budget_s=0.2, peak_gflops=100.0)
    assert row.status == "ok", row.message
    assert set(row.references) == {"polydl.unfused"}
    assert "fused S" in row.schedule and row.variant in ("nchw16c", "nchw")
    assert row.relative_error is not None and row.relative_error < 1e-4
    assert row.ratio_vs(("polydl.unfused",)) is not None
    assert row.kept == ()


@pytest.mark.slow
def test_fused_and_bf16_rows_keep_the_weights_when_timing_inference(prepared_threads: None) -> None:
    """`kept_weights`: both polydl builds of a row keep w between calls, and still verify."""
    row = fused_case(TINY, None, repeat=1, budget_s=0.1, peak_gflops=100.0,
                     compare_layouts=False, kept_weights=True)
    assert row.status == "ok", row.message
    assert row.kept == ("w",) and "polydl.unfused" in row.references
    row = bf16_case(TINY, None, repeat=1, budget_s=0.1, peak_gflops=100.0,
                    compare_layouts=False, kept_weights=True)
    assert row.status == "ok", row.message
    assert row.kept == ("w",) and "polydl.fp32" in row.references


def test_bf16_row_compares_with_fp32_polydl(prepared_threads: None) -> None:
    torch = import_torch(1)
    row = bf16_case(TINY, torch, repeat=1, budget_s=0.2, peak_gflops=100.0, compare_layouts=False)
    assert row.status == "ok", row.message
    assert "polydl.fp32" in row.references
    if torch is not None:
        # PyTorch's bf16 conv rounds its output to bf16: verified at the bf16 tolerance
        assert row.reference_errors["torch.nchw.bf16"] < 2e-2
    assert row.relative_error is not None and row.relative_error < 1e-4
