"""The vector width a kernel asks the C compiler for: 512-bit vectors for long rectangular
loops on AVX-512 targets, the CPU tuning's 256-bit ones otherwise."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace

import islpy as isl
import numpy as np
import pytest

import polydl
from polydl.runtime.c.toolchain import current_toolchain, is_gcc
from polydl.schedules.cpu.vector_width import rectangular_trip
from polydl.target import CpuTarget
from polydl.target.host import cannot_run_here

AVX512 = CpuTarget(name="server", isa="avx512", cores=1)
WIDE = '__attribute__((target("prefer-vector-width=512")))'

SMOOTH = """void smooth(int T, int N, double A[N], double B[N]) {
  for (int t = 0; t < T; t++) {
    for (int i = 1; i < N - 1; i++)
      B[i] = 0.33333 * (A[i - 1] + A[i] + A[i + 1]);
    for (int i = 1; i < N - 1; i++)
      A[i] = 0.33333 * (B[i - 1] + B[i] + B[i + 1]);
  }
}
"""

TRIANGLE = """void lower(int N, double L[N][N], const double x[N]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j <= i; j++)
      L[i][j] = L[i][j] * x[j];
}
"""


STREAM = """void leaky(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++)
      y[i][j] = x[i][j] > 0.0f ? x[i][j] : 0.01f * x[i][j];
}
"""

SWISH = """void swish(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++)
      y[i][j] = x[i][j] / (1.0f + expf(-x[i][j]));
}
"""


@pytest.mark.parametrize("source, wide", [(STREAM, False), (SWISH, True)])
def test_arrays_past_the_caches_take_wide_vectors_only_for_math(source: str, wide: bool) -> None:
    """8 MiB of arrays against the target's L2: plain arithmetic streams from memory (256-bit
    vectors), math calls keep the cores busy (512-bit)."""
    kernel = polydl.compile(source, {"N": 1024, "D": 1024}, target=AVX512)
    assert (WIDE in kernel.source) is wide
    small = polydl.compile(source, {"N": 16, "D": 1024}, target=AVX512)
    assert WIDE in small.source


def test_the_innermost_loop_is_measured_where_each_start_runs_as_far() -> None:
    assert rectangular_trip(isl.Set("{ [t, 0, i] : 0 <= t < 5 and 1 <= i < 399 }")) == 398
    assert rectangular_trip(isl.Set("{ [i, j] : 0 <= i < 9 and 0 <= j <= i }")) == 0
    assert rectangular_trip(isl.Set("{ [3, 0] }")) is None
    assert rectangular_trip(isl.Set("{ [i, 0] : 0 <= i < 64 }")) == 64


@pytest.mark.parametrize("source, params, wide", [
    (SMOOTH, {"T": 3, "N": 400}, True),   # 398 doubles a start: 50 vectors of 512 bits
    (SMOOTH, {"T": 3, "N": 30}, False),   # 28: under four
    (TRIANGLE, {"N": 400}, False),        # every start runs a different remainder
])
def test_long_rectangular_loops_ask_for_512_bit_vectors(source: str, params: dict[str, int],
                                                        wide: bool) -> None:
    kernel = polydl.compile(source, params, target=AVX512)
    assert (WIDE in kernel.source) is wide
    avx2 = polydl.compile(source, params, target=replace(AVX512, isa="avx2"))
    assert WIDE not in avx2.source


@pytest.mark.skipif(shutil.which("objdump") is None or not is_gcc(current_toolchain().compiler),
                    reason="needs objdump and gcc")
@pytest.mark.skipif(bool(cannot_run_here(AVX512)), reason="needs a CPU with AVX-512")
def test_a_wide_kernel_runs_zmm_registers_under_a_256_bit_tuning() -> None:
    target = replace(AVX512, tune="icelake-server")  # gcc prefers 256-bit vectors for it
    kernel = polydl.compile(SMOOTH, {"T": 3, "N": 400}, target=target)
    assembly = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(kernel.library_path)],
                              capture_output=True, text=True, check=True).stdout
    assert re.search(r"vaddpd\s.*%zmm", assembly), "the long loop runs in 256-bit vectors"
    rng = np.random.default_rng(0)
    a, b = rng.random(400), np.zeros(400)
    want_a, want_b = a.copy(), b.copy()
    for _ in range(3):
        want_b[1:-1] = 0.33333 * (want_a[:-2] + want_a[1:-1] + want_a[2:])
        want_a[1:-1] = 0.33333 * (want_b[:-2] + want_b[1:-1] + want_b[2:])
    kernel(A=a, B=b)
    np.testing.assert_allclose(a, want_a, rtol=1e-12)
    np.testing.assert_allclose(b, want_b, rtol=1e-12)
