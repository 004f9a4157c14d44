"""Statements that never run at the given sizes: dropped from the model (and skipped by the
reference); a nest in which nothing runs is refused."""

from __future__ import annotations

import numpy as np
import pytest

import polydl
from polydl.errors import SpecError
from tests.kernels import run_and_check

SPEC = """void f(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++)
    y[i] = x[i];
  for (int i = 0; i < N; i++)
    if (i >= 1 && i < N - 1)
      y[i] += 2.0f * x[i - 1];
}
"""


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_a_statement_that_never_runs_is_dropped(n: int) -> None:
    k = polydl.compile(SPEC, {"N": n})
    x = np.arange(1, n + 1, dtype=np.float32)
    want = x.copy()
    want[1:-1] += 2 * x[:-2]
    np.testing.assert_allclose(k(x), want)
    run_and_check(k)


def test_nothing_runs_is_refused_at_the_statement() -> None:
    text = "void g(int N, float y[N]) {\n  for (int i = 1; i < N; i++)\n    y[i] = 1.0f;\n}\n"
    with pytest.raises(SpecError) as info:
        polydl.compile(text, {"N": 1})
    assert (info.value.line, info.value.column) == (3, 5) and "no statement" in info.value.message
