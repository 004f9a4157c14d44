"""Loops that carry only sums into arrays run parallel, each thread summing into a zeroed copy
of its own that OpenMP adds into the array at the loop's end."""

from __future__ import annotations

import re

import numpy as np
import pytest

import polydl
from polydl.target import CpuTarget
from tests.kernels import run_and_check

TWO_CORES = CpuTarget(name="desktop", isa="avx2", cores=2)

# dbias over the rows of a batch beside the rows' own output: the row loop carries the sum
BIAS_GRAD = """
void bias_grad(int N, int D, float dx[N][D], float db[D], const float dy[N][D],
               const float w[D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) {
      db[j] += dy[i][j];
      dx[i][j] = dy[i][j] * w[j];
    }
}
"""

# set to zero in a loop of its own first, then summed over the rows
ZEROED_FIRST = """
void col_sums(int N, int D, float s[D], float q[N], const float A[N][D], const float r[N]) {
  for (int j = 0; j < D; j++)
    s[j] = 0.0f;
  for (int i = 0; i < N; i++) {
    q[i] = 0.0f;
    for (int j = 0; j < D; j++) {
      s[j] += r[i] * A[i][j];
      q[i] += A[i][j];
    }
  }
}
"""

# the running sum is read by another statement in the loop: a thread's copy holds a part of it
READ_BACK = """
void read_back(int N, int D, float y[N][D], float s[D], const float x[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) {
      s[j] += x[i][j];
      y[i][j] = s[j];
    }
}
"""

# the addend reads the array summed into: no sum of independent parts
PREFIX = """
void prefix(int N, int D, float s[D], const float x[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 1; j < D; j++)
      s[j] += s[j - 1] * x[i][j];
}
"""


def test_a_loop_that_carries_only_sums_runs_parallel_with_a_copy_per_thread() -> None:
    kernel = polydl.compile(BIAS_GRAD, {"N": 4000, "D": 64}, target=TWO_CORES)
    assert re.search(r"#pragma omp parallel for .*reduction\(\+: db\[0:64\]\)", kernel.source)
    run_and_check(kernel, lambda dy, w: (dy.astype(np.float64) * w, dy.sum(axis=0)))


def test_an_array_zeroed_before_the_loop_is_summed_with_a_copy_per_thread() -> None:
    kernel = polydl.compile(ZEROED_FIRST, {"N": 4000, "D": 64}, target=TWO_CORES)
    assert "reduction(+: s[0:64])" in kernel.source
    run_and_check(kernel, lambda A, r: ((r[:, None].astype(np.float64) * A).sum(axis=0),
                                        A.astype(np.float64).sum(axis=1)))


@pytest.mark.parametrize("source, params", [(READ_BACK, {"N": 4000, "D": 64}),
                                            (PREFIX, {"N": 4000, "D": 64})])
def test_a_sum_read_inside_the_loop_keeps_it_sequential(source: str,
                                                        params: dict[str, int]) -> None:
    kernel = polydl.compile(source, params, target=TWO_CORES)
    assert "reduction(+: s[" not in kernel.source
    run_and_check(kernel)
