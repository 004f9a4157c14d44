"""The general-loop-nest suite: every kernel accepted as written and equal to the same C built
by gcc -O3; the harness's pieces (constant-size sources, inputs, the summary). Speed is the
benchmark's business, not asserted here."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

from polydl.bench import general
from polydl.errors import PolyDLError
from polydl.frontends import load_spec

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "general.py"
# isl needs minutes for these even at small sizes (the time limit then keeps the written
# order): checked by the benchmark, not here
SLOW_TO_SCHEDULE = {"heat_3d", "adi"}


def test_every_kernel_file_has_sizes_and_every_size_a_file() -> None:
    files = {p.stem for p in general.KERNEL_DIR.glob("*.c")}
    assert files | set(general.FROM_EXAMPLES) == set(general.SIZES)
    assert not files & set(general.FROM_EXAMPLES)
    assert all(general.kernel_path(name).is_file() for name in general.SIZES)
    assert len(general.CLASSIC) == 30 and len(general.DL_OPERATORS) == 6


@pytest.mark.parametrize("name", [n for n in general.SIZES if n not in SLOW_TO_SCHEDULE])
@pytest.mark.slow
def test_kernel_is_accepted_and_equals_gcc(name: str, tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    result = general.run_kernel(name, general.SIZES[name][1], ("gcc",), 1, tmp_path)
    assert result.status == "ok", result.status
    assert set(result.ms) == {"polydl", "gcc"}
    assert result.errors["polydl"] <= general.tolerance(np.dtype("float32"))


def test_constant_size_source_drops_the_size_parameters() -> None:
    source = "void f(int N, int M, double A[N][M], double s) { A[0][0] = s; }"
    out = general.constant_size_source(source, "f", {"N": 4, "M": 5})
    assert out == "void f(double A[N][M], double s) { A[0][0] = s; }"
    with pytest.raises(PolyDLError, match="size parameter 'int K,' not found in f's signature"):
        general.constant_size_source(source, "f", {"K": 4})
    with pytest.raises(PolyDLError, match="function g not found"):
        general.constant_size_source(source, "g", {"N": 4})


def test_inputs_are_conditioned_for_factorisations() -> None:
    nest, params = load_spec(general.kernel_path("cholesky"), general.SIZES["cholesky"][1])
    args = general.arguments(nest, params)
    a = general.make_inputs("cholesky", args, params)["A"]
    np.testing.assert_allclose(a, a.T)
    assert np.linalg.eigvalsh(a).min() > 0.5


def test_summary_counts_geomeans_and_slow_kernels() -> None:
    spec = importlib.util.spec_from_file_location("general_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = [
        {"kernel": "gemm", "status": "ok", "ms": {"polydl": 1.0, "gcc": 4.0, "polly": 2.0}},
        {"kernel": "atax", "status": "ok", "ms": {"polydl": 2.0, "gcc": 1.0, "polly": 1.0}},
        {"kernel": "lu", "status": "wrong: x", "ms": {"polydl": 1.0, "gcc": 9.0}},
        {"kernel": "softmax", "status": "ok", "ms": {"polydl": 1.0, "gcc": 3.0, "torch": 2.0}},
    ]
    values = module._summary(rows)["values"]
    assert values["classic_accepted_and_correct"] == 2
    assert values["polydl_over_gcc_geomean"] == pytest.approx((4.0 * 0.5) ** 0.5)
    assert values["slower_than_gcc"] == ["atax"]
    assert values["dl_polydl_over_torch_geomean"] == pytest.approx(2.0)
