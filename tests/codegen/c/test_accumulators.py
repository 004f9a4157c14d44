"""Sums along an innermost loop held in a register (codegen/c/accumulators.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.kernels import compile_c, run_and_check

# Two dot products per row: the loop writes nothing but the sums, so it is a simd reduction.
GESUMMV = """
void gesummv(int N, const double A[N][N], const double B[N][N], const double x[N],
             double tmp[N], double y[N]) {
  for (int i = 0; i < N; i++) {
    tmp[i] = 0.0;
    y[i] = 0.0;
    for (int j = 0; j < N; j++) {
      tmp[i] = A[i][j] * x[j] + tmp[i];
      y[i] += B[i][j] * x[j];
    }
  }
}
"""

# A sum of what the loop also stores: in a register, and the loop a SIMD reduction (it carries
# nothing else).
SUM_AND_SCALE = """
void sum_scale(int N, const float A[N][N], float s[N], float B[N][N]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      B[i][j] = 2.0f * A[i][j];
      s[i] -= B[i][j];
    }
}
"""

# Forward substitution: the addend reads other cells of x (j < i), never x[i].
TRISOLV = (Path(__file__).resolve().parents[3] / "benchmarks" / "general" / "trisolv.c").read_text()

# The addend reads the cell it adds to: stays a store per iteration.
OWN_CELL = """
void grow(int N, float x[N], const float A[N][N]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      x[i] += x[i] * A[i][j];
}
"""


def test_dot_products_run_as_a_simd_reduction_in_registers() -> None:
    k = compile_c(GESUMMV, {"N": 37})
    # both sums in registers under simd reductions (one loop or two, as the schedule fuses them)
    pragmas = [line for line in k.source.splitlines() if "#pragma omp simd reduction(+: " in line]
    assert pragmas and all(any(f"_pd_acc{n}" in p for p in pragmas) for n in (0, 1))
    run_and_check(k, lambda a, b, x: (a @ x, b @ x))


def test_a_sum_beside_other_stores_is_a_simd_reduction_in_a_register() -> None:
    k = compile_c(SUM_AND_SCALE, {"N": 33})
    assert "_pd_acc0 -= " in k.source and "#pragma omp simd reduction(+: _pd_acc0)\n" in k.source
    run_and_check(k)


def test_a_triangular_solve_accumulates_and_skips_empty_rows() -> None:
    n = 40
    k = compile_c(TRISOLV, {"N": n})
    assert "_pd_acc0 -= " in k.source
    rng = np.random.default_rng(1)
    lower = np.tril(rng.random((n, n))) + n * np.eye(n)
    b = rng.random(n)
    x = np.zeros(n)
    k(L=lower, x=x, b=b)
    np.testing.assert_allclose(lower @ x, b, rtol=1e-12)
    run_and_check(k)


def test_an_addend_that_reads_its_own_cell_stays_in_memory() -> None:
    k = compile_c(OWN_CELL, {"N": 9})
    assert "_pd_acc" not in k.source
    run_and_check(k)
