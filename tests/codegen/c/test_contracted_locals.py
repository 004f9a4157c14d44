"""C locals held as the chosen schedule allows (schedules/contraction.py): register scalars in
the code, private to each thread where a parallel loop's body writes them, shared where a
parallel loop only reads them; a local the schedule carries from one iteration to the next
stays an array. Every kernel is checked against numpy and the float64 reference; the
assembly of the element-wise and max loops is checked for packed instructions on an AVX2 and
an AVX-512 target."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from polydl.api import lower
from polydl.driver.explain import explain
from polydl.frontends import load_spec
from polydl.target import CPU_PRESETS
from tests.kernels import compile_c, run_and_check

ROOT = Path(__file__).resolve().parents[3]

BIAS_LEAKY_RELU = """
void bias_lrelu(int N, int D, const float x[N][D], const float b[D], float slope, float y[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) {
      float t = x[i][j] + b[j];
      if (t > 0) y[i][j] = t; else y[i][j] = slope * t;
    }
}
"""

# Every form that reads a local: compound assignment, `?:`, fmaxf, a sum and a maximum read
# after the inner loop, and `g`, one value for the whole call that a parallel loop only reads.
FORMS = """
void forms(int N, int D, const float x[N][D], float y[N][D], float z[N], float w[N]) {
  float g = 0.0f;
  for (int i = 0; i < N; i++)
    g += x[i][0];
  for (int i = 0; i < N; i++) {
    float s = 0.0f;
    float m = x[i][0];
    for (int j = 0; j < D; j++) {
      float t = x[i][j] * 2.0f;
      t += 1.0f;
      float u = t > 1.5f ? t : -t;
      y[i][j] = fmaxf(u, 0.25f) + g;
      s += u;
      m = fmaxf(m, x[i][j]);
    }
    z[i] = s;
    w[i] = m;
  }
}
"""

# A local array whose values one time step hands to the next sweep: the schedule carries it.
JACOBI_1D_LOCAL = """
void jacobi(int T, int N, float A[N]) {
  float B[N];
  for (int t = 0; t < T; t++) {
    for (int i = 1; i < N - 1; i++)
      B[i] = (A[i - 1] + A[i] + A[i + 1]) / 3.0f;
    for (int i = 1; i < N - 1; i++)
      A[i] = B[i];
  }
}
"""


def _leaky(x, b, slope):  # type: ignore[no-untyped-def]
    t = x.astype(np.float64) + b
    return np.where(t > 0, t, slope * t)


def test_a_local_of_an_element_wise_nest_is_a_register_scalar() -> None:
    k = compile_c(BIAS_LEAKY_RELU, {"N": 515, "D": 260}, machine="x86-64-v3")
    assert "pd_scratch(" not in k.source.split("int bias_lrelu(")[1]
    assert re.search(r"^\s*float _pd_t_0;$", k.source, re.M)
    # the parallel loop runs iterations of the scalar's life: each thread has its own
    assert re.search(r"#pragma omp parallel for schedule\(static\) private\(_pd_t_0\)", k.source)
    assert "collapse" not in k.source
    run_and_check(k, lambda x, b, slope: _leaky(x, b, slope))


def test_every_form_reading_a_local_keeps_it_a_scalar() -> None:
    k = compile_c(FORMS, {"N": 512, "D": 300}, machine="x86-64-v3")
    body = k.source.split("int forms(")[1]
    assert "pd_scratch(" not in body
    for name in ("_pd_g_0", "_pd_s_1", "_pd_m_2", "_pd_t_3", "_pd_u_4"):
        assert re.search(rf"^\s*float {name};$", body, re.M), name
    parallel = next(line for line in body.splitlines() if "omp parallel for" in line)
    # g is written before the parallel loop and only read in it: shared, not private
    assert "_pd_g_0" not in parallel and "_pd_s_1" in parallel and "_pd_u_4" in parallel
    assert re.search(r"_pd_acc\d+ = \(x\[.*\] > _pd_acc\d+\)", body)  # the maximum in a register

    def expected(x):  # type: ignore[no-untyped-def]
        x = x.astype(np.float64)
        t = x * 2 + 1
        u = np.where(t > 1.5, t, -t)
        return np.maximum(u, 0.25) + x[:, 0].sum(), u.sum(axis=1), x.max(axis=1)

    run_and_check(k, expected)


def test_a_local_the_schedule_carries_stays_an_array() -> None:
    k = compile_c(JACOBI_1D_LOCAL, {"T": 6, "N": 300}, machine="x86-64-v3")
    assert "pd_scratch(300 * sizeof(float)" in k.source
    run_and_check(k)


def test_explain_says_what_each_local_became() -> None:
    c = lower(*load_spec(FORMS, {"N": 64, "D": 100}), machine="x86-64-v3")
    text = explain(c)
    assert "the C local 't' at" in text
    assert re.search(r"'t' at \S+: a register scalar per iteration of \(i, j\): each value is "
                     r"read in the iteration that writes it", text)
    assert re.search(r"'s' at \S+: a register scalar per iteration of \(i\)", text)
    assert "'g' at" in text and "a register scalar for the whole call" in text
    carried = explain(lower(*load_spec(JACOBI_1D_LOCAL, {"T": 20, "N": 300}), machine="x86-64-v3"))
    assert re.search(r"B: float32\[300\] local \(scratch\), the whole array: one iteration of "
                     r"\(t\) touches up to 298 of its 300 cells", carried)
    # the generated source's schedule line says the same
    assert "_pd_t_3: a register scalar per iteration of (i, j)" in c.code.source


def test_a_schedule_that_sweeps_the_rows_apart_keeps_the_row_values_whole() -> None:
    # isl's tiled schedule of a small softmax runs the maxima, the sums and the division as
    # separate sweeps: a row's maximum lives from the first sweep to the second
    c = lower(*load_spec(ROOT / "examples" / "softmax.c", {"N": 64, "D": 64}), machine="x86-64-v3")
    text = explain(c)
    if "sweep" in text:
        assert "the whole array: the schedule writes it in one sweep" in text


def _assembly(source: str, flags: tuple[str, ...], tmp_path: Path) -> str:
    c_file, asm = tmp_path / "kernel.c", tmp_path / "kernel.s"
    c_file.write_text(source)
    subprocess.run(["gcc", "-O3", "-fopenmp", *flags, "-S", str(c_file), "-o", str(asm)],
                   check=True)
    return asm.read_text()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("preset, register", [("x86-64-v3", "ymm"), ("x86-64-v4", "[yz]mm")])
def test_selects_and_maxima_run_in_vectors(preset: str, register: str, tmp_path: Path) -> None:
    for spec, params, wanted in (
        (BIAS_LEAKY_RELU, {"N": 64, "D": 1024}, ("vcmp", "vmulps")),
        (ROOT / "examples" / "softmax.c", {"N": 256, "D": 1024}, ("vmaxps",)),
    ):
        c = lower(*load_spec(spec, params), machine=preset)
        asm = _assembly(c.code.source, CPU_PRESETS[preset].compile_flags() + c.code.compile_flags,
                        tmp_path)
        for mnemonic in wanted:
            assert re.search(rf"\t{mnemonic}\w*ps\s.*%{register}", asm) or re.search(
                rf"\t{mnemonic}\s.*%{register}", asm), (spec, mnemonic)


# a row loop holding a statement and then a loop of two: the tree's map has a dimension for the
# sequence between the bands, which the loops' SIMD decisions must not take for the inner loop's
RECURRENCE_AFTER_A_STATEMENT = """
void scan(int N, int M, float a[N][M], float b[N][M], float c[N], const float x[N][M]) {
  for (int i = 0; i < N; i++) {
    c[i] = 0.0f;
    for (int j = 1; j < M; j++) {
      b[i][j] = x[i][j] * 2.0f;
      a[i][j] = a[i][j - 1] * 0.5f + b[i][j];
    }
  }
}
"""


def test_a_loop_carrying_a_recurrence_below_a_sequence_is_not_declared_simd() -> None:
    k = compile_c(RECURRENCE_AFTER_A_STATEMENT, {"N": 6, "M": 300}, machine="x86-64-v4")
    assert "omp simd" not in k.source.split("int scan(")[1]

    def expected(x):  # type: ignore[no-untyped-def]
        a, b = np.zeros(x.shape), 2.0 * x.astype(np.float64)  # outputs start at zero
        for j in range(1, a.shape[1]):
            a[:, j] = a[:, j - 1] * 0.5 + b[:, j]
        b[:, 0] = 0
        return a, b, np.zeros(a.shape[0])

    run_and_check(k, expected)


SOFTMAX_ONE_SWEEP_SUM = """
#include <math.h>
void softmax(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++) {
    float m = -INFINITY;
    for (int j = 0; j < D; j++) m = fmaxf(m, x[i][j]);
    float s = 0.0f;
    for (int j = 0; j < D; j++) { float e = expf(x[i][j] - m); y[i][j] = e; s += e; }
    float inv = 1.0f / s;
    for (int j = 0; j < D; j++) y[i][j] *= inv;
  }
}
"""


def test_a_sum_beside_stores_is_a_simd_reduction_with_the_loops_locals_private() -> None:
    """softmax's `e = expf(x - m); y = e; s += e`: the loop carries only the sum, which a
    register holds; each lane has its own `e`."""
    k = compile_c(SOFTMAX_ONE_SWEEP_SUM, {"N": 33, "D": 517}, machine="x86-64-v4")
    assert re.search(r"#pragma omp simd reduction\(\+: _pd_acc\d+\) private\(_pd_e_\d+\)", k.source)

    def expected(x):  # type: ignore[no-untyped-def]
        e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    run_and_check(k, expected)
