"""The numpy reference of a nest: the batched evaluation agrees with plain loops, repeated cells
of a reduction included."""

from __future__ import annotations

import numpy as np
import pytest

from polydl.frontends import load_spec
from polydl.poly.model import build_model
from polydl.poly.reference import make_reference, vector_loops

SPEC = """void f(int N, float s[2], float t[N][N], const float x[N][N]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j <= i; j++) {
      s[0] += x[i][j];
      s[1] -= 2.0f * x[j][i];
    }
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < N; k++)
        if (k >= i && j != 2)
          t[i][j] += x[i][k] * x[k][j];
}
"""


@pytest.mark.parametrize("n", [1, 3, 8])
def test_batched_reductions_match_plain_loops(n: int) -> None:
    nest, params = load_spec(SPEC, {"N": n})
    run = make_reference(build_model(nest, params))
    x = np.random.default_rng(n).uniform(-1, 1, (n, n)).astype(np.float32)
    s, t = np.array([1.0, 2.0], np.float32), np.zeros((n, n), np.float32)
    run({"x": x, "s": s, "t": t})
    xd = x.astype(np.float64)
    lower = np.tril(np.ones((n, n), dtype=bool))
    want_s = [1.0 + xd[lower].sum(), 2.0 - 2.0 * xd.T[lower].sum()]
    want_t = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if j != 2:
                want_t[i, j] = xd[i, i:] @ xd[i:, j]
    np.testing.assert_allclose(s, want_s, rtol=1e-5)
    np.testing.assert_allclose(t, want_t, rtol=1e-5, atol=1e-6)


ROWS = """void rows(int N, int D, float y[N][D], const float x[N][D], float c[N]) {
  for (int i = 0; i < N; i++) {
    float top = x[i][0];
    for (int j = 1; j < D; j++)
      if (x[i][j] > top) top = x[i][j];
    for (int j = 0; j < D; j++)
      y[i][j] = x[i][j] - top;
  }
  for (int i = 1; i < N; i++)
    c[i] = c[i - 1] + x[i][0];
  for (int i = 0; i < N; i++)
    for (int j = 0; j < i; j++)
      y[i][j] += 1.0f;
}
"""


def test_independent_rows_run_as_one_vector_and_agree_with_numpy() -> None:
    """The row loop is evaluated once for all rows; the prefix sum (a dependence between rows)
    and the triangle (a bound reads the row) run row by row."""
    nest, params = load_spec(ROWS, {"N": 5, "D": 7})
    model = build_model(nest, params)
    assert vector_loops(model) == frozenset({0})
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    arrays = {"y": np.zeros((5, 7), np.float32), "x": x, "c": np.zeros(5, np.float32)}
    make_reference(model)(arrays)
    want = x - x.max(axis=1, keepdims=True) + np.tril(np.ones((5, 7)), -1)
    np.testing.assert_allclose(arrays["y"], want, rtol=1e-6)
    np.testing.assert_allclose(arrays["c"], np.concatenate([[0], np.cumsum(x[1:, 0].astype(np.float64))]), atol=1e-6)


def test_a_statement_outside_every_loop_runs_once() -> None:
    nest, params = load_spec("void c(float y[2], const float x[2]) { y[0] = x[1] + 1.0f; }")
    model = build_model(nest, params)
    y, x = np.zeros(2, dtype=np.float32), np.array([3.0, 4.0], dtype=np.float32)
    make_reference(model)({"y": y, "x": x})
    np.testing.assert_array_equal(y, [5.0, 0.0])
