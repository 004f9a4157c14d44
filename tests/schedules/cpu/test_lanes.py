"""Recurrences across vector lanes: rows whose inner loop carries a value run side by side in
the lanes of a vector, where the work per element pays for the loads a row apart."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl.api import lower
from polydl.driver.explain import explain
from polydl.frontends.c_loopnest import parse_c
from polydl.runtime.c.toolchain import current_toolchain, is_gcc
from polydl.target import CpuTarget
from polydl.target.host import cannot_run_here
from tests.kernels import run_and_check

AVX2 = CpuTarget(name="desktop", isa="avx2", cores=2)

# a running maximum and a sum rescaled to it: the inner loop carries both (the corpus kernel)
ONLINE_SOFTMAX = (Path(__file__).resolve().parents[3] / "benchmarks" / "general"
                  / "softmax_online.c").read_text()

# a recurrence of one addition an element: loading it a row apart costs more than it saves
CUMSUM = """
void cumsum(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++) {
    y[i][0] = x[i][0];
    for (int j = 1; j < D; j++)
      y[i][j] = y[i][j - 1] + x[i][j];
  }
}
"""


# rows from 2 (a first strip in part), a triangle (each lane stops at its own row's end)
TRIANGLE = """
void tri(int N, float s[N], const float x[N][N]) {
  for (int i = 2; i < N - 1; i++) {
    float m = 0.0f;
    for (int j = 0; j < i; j++)
      m = m * expf(-x[i][j]) + tanhf(x[i][j]);
    s[i] = m;
  }
}
"""

# the recurrence through the output itself, stored a row apart
THROUGH_OUTPUT = """
void decay(int N, int D, float y[N][D], const float a[N], const float x[N][D]) {
  for (int i = 0; i < N; i++) {
    y[i][0] = x[i][0];
    for (int j = 1; j < D; j++)
      y[i][j] = y[i][j - 1] * a[i] + expf(x[i][j]);
  }
}
"""

# doubles, a square root and a division, down each column (the lanes run along the rows)
SWEEP = """
void sweep(int N, int M, double p[N][M], const double a[N][M]) {
  for (int j = 0; j < M; j++) {
    double q = a[0][j];
    for (int i = 1; i < N; i++) {
      q = sqrt(a[i][j] + q * q) / (1.0 + a[i][j]);
      p[i][j] = q;
    }
  }
}
"""


def _tri(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    s = np.zeros(n)
    for i in range(2, n - 1):
        m = 0.0
        for j in range(i):
            m = m * np.exp(-float(x[i, j])) + np.tanh(float(x[i, j]))
        s[i] = m
    return s


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("n, d", [(37, 29), (64, 1), (5, 40)])
def test_rows_of_a_running_maximum_run_in_lanes_and_match_numpy(n: int, d: int) -> None:
    """Rows not a multiple of the lanes, one column, and fewer rows than lanes."""
    kernel = polydl.compile(ONLINE_SOFTMAX, {"N": n, "D": d}, target=AVX2)
    laned = n >= 8 and d > 1
    assert ("#pragma omp simd" in kernel.source and "_pd_lane_step" in kernel.source) is laned
    text = explain(lower(parse_c(ONLINE_SOFTMAX), {"N": n, "D": d}, AVX2))
    assert ("strip-mined into 8 vector lanes" in text) is laned
    run_and_check(kernel, lambda x: _softmax(x))


@pytest.mark.parametrize("source, params", [
    (TRIANGLE, {"N": 45}),
    (THROUGH_OUTPUT, {"N": 23, "D": 17}),
    (SWEEP, {"N": 13, "M": 37}),
])
def test_recurrences_of_every_form_run_in_lanes_and_match_the_reference(
        source: str, params: dict[str, int]) -> None:
    kernel = polydl.compile(source, params, target=AVX2)
    assert "_pd_lane_step" in kernel.source
    run_and_check(kernel, _tri if source is TRIANGLE else None)


def test_a_cheap_recurrence_stays_one_element_at_a_time() -> None:
    kernel = polydl.compile(CUMSUM, {"N": 64, "D": 100}, target=AVX2)
    assert "_pd_lane_step" not in kernel.source
    run_and_check(kernel, lambda x: np.cumsum(x.astype(np.float64), axis=1))


def test_exact_math_keeps_scalar_calls_and_no_lanes() -> None:
    """libm's own results: the calls stay scalar in any loop, and the lanes then save little."""
    kernel = polydl.compile(ONLINE_SOFTMAX, {"N": 64, "D": 100}, target=AVX2, exact_math=True)
    assert "_pd_lane_step" not in kernel.source
    run_and_check(kernel, lambda x: _softmax(x))


@pytest.mark.skipif(shutil.which("objdump") is None or not is_gcc(current_toolchain().compiler),
                    reason="needs objdump and gcc")
@pytest.mark.skipif(bool(cannot_run_here(AVX2)), reason="needs a CPU with AVX2")
def test_the_lanes_call_the_vector_exponential() -> None:
    kernel = polydl.compile(ONLINE_SOFTMAX, {"N": 64, "D": 100}, target=replace(AVX2, cores=1))
    assembly = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(kernel.library_path)],
                              capture_output=True, text=True, check=True).stdout
    # the recurrence's two exponentials and the normalising pass's one, each 8 lanes a call
    assert len(re.findall(r"call.*_ZGVdN8v_expf", assembly)) >= 2
