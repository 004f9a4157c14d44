"""Call-time scalar parameters (`float alpha`, `double eps`): inputs passed by value, positional
in declaration order or by name, checked like arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl.errors import PolyDLError, ShapeError

ROOT = Path(__file__).resolve().parents[2]

AXPBY = """void axpby(int N, double y[N], const double x[N], const double alpha, double beta) {
  for (int i = 0; i < N; i++)
    y[i] = alpha * x[i] + beta * y[i];
}
"""

EPILOGUE = """void lin(int M, int N, int K, float C[M][N], const float A[M][K], const float B[K][N],
         float scale, float shift) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      C[i][j] = C[i][j] * scale + shift;
}
"""


def test_scalars_are_inputs_by_position_or_name() -> None:
    k = polydl.compile(AXPBY, {"N": 11})
    assert "const double alpha, const double beta" in k.source
    assert "alpha: float64 scalar (input, by value)" in k.header
    x, y0 = np.linspace(0, 1, 11), np.linspace(-1, 1, 11)
    y = y0.copy()
    k(x, 2.5, -0.5, y=y)
    np.testing.assert_allclose(y, 2.5 * x - 0.5 * y0)
    y = y0.copy()
    k(x, beta=np.float32(3), alpha=np.array(1.0), y=y)
    np.testing.assert_allclose(y, x + 3 * y0)
    np.testing.assert_allclose(k.reference(x, 2.0, 0.0), 2 * x)


@pytest.mark.parametrize("value", ["2", True, np.ones(1), None])
def test_a_scalar_must_be_a_number(value: object) -> None:
    k = polydl.compile(AXPBY, {"N": 4})
    with pytest.raises(ShapeError, match="scalar input must be a number") as info:
        k(np.zeros(4), value, 1.0)
    assert info.value.array == "alpha"


def test_the_blas_gemm_example() -> None:
    k = polydl.compile(ROOT / "examples" / "gemm_blas.c", {"M": 40, "N": 72, "K": 24})
    rng = np.random.default_rng(7)
    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((40, 24), (24, 72)))
    c0 = rng.uniform(-1, 1, (40, 72)).astype(np.float32)
    c = c0.copy()
    k(a, b, alpha=1.5, beta=0.25, C=c)
    want = 1.5 * (a.astype(np.float64) @ b) + 0.25 * c0
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("machine", ["native", "x86-64-v3", "generic"])
def test_scalars_reach_a_fused_epilogue(machine: str) -> None:
    from polydl.target import resolve_target
    from polydl.target.host import cannot_run_here

    if cannot_run_here(resolve_target("c", machine)):  # type: ignore[arg-type]
        pytest.skip(f"this CPU cannot run {machine}")
    k = polydl.compile(EPILOGUE, {"M": 32, "N": 48, "K": 16}, machine=machine)
    rng = np.random.default_rng(1)
    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((32, 16), (16, 48)))
    out = k(a, b, 0.5, -2.0)
    np.testing.assert_allclose(out, 0.5 * (a.astype(np.float64) @ b) - 2.0, rtol=1e-4, atol=1e-5)


def test_gpu_targets_refuse_scalars_clearly() -> None:
    with pytest.raises(PolyDLError, match="no scalar parameters yet .*alpha, beta"):
        polydl.api.lower(*polydl.frontends.load_spec(AXPBY, {"N": 4}), target="cuda")
