"""C as people write it: pragmas, static/inline functions, restrict arrays, `/=`, and loop
variables declared before their loops; each accepted spec matches numpy, each refusal keeps its
position."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl.errors import SpecError
from polydl.frontends.c_loopnest import parse_c
from polydl.ir import expr_loads, walk_statements

ROOT = Path(__file__).resolve().parents[2]

PRE_C99 = """
static inline void lower_update(int N, float C[restrict N][N], const float A[restrict N][N],
                                const float d[N]) {
  int i, j, k;
#pragma scop
  for (i = 0; i < N; i++)
    for (j = 0; j <= i; j++) {
      for (k = 0; k < N; k++)
        C[i][j] += A[i][k] * A[j][k];
      C[i][j] /= d[i];
    }
#pragma endscop
}
"""


def test_a_pre_c99_kernel_with_pragmas_matches_numpy() -> None:
    n = 19
    kernel = polydl.compile(PRE_C99, {"N": n})
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    d = rng.uniform(1, 2, n).astype(np.float32)
    c0 = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    c = c0.copy()
    kernel(a, d, C=c)
    expected = c0.astype(np.float64)
    full = (c0 + a.astype(np.float64) @ a.T.astype(np.float64)) / d[:, None]
    lower = np.tril(np.ones((n, n), dtype=bool))
    expected[lower] = full[lower]
    np.testing.assert_allclose(c, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(kernel.reference(a, d, C=c0.copy()), expected, rtol=1e-6)


def test_divide_assign_divides_in_place() -> None:
    kernel = polydl.compile(
        "void f(int N, float y[N], const float x[N]) { for (int i = 0; i < N; i++) y[i] /= x[i]; }",
        {"N": 37},
    )
    x = np.linspace(1, 2, 37, dtype=np.float32)
    y = np.linspace(-3, 3, 37, dtype=np.float32)
    expected = y / x
    kernel(x, y=y)
    np.testing.assert_allclose(y, expected, rtol=1e-6)


@pytest.mark.parametrize(
    "text, line, column, says",
    [
        ("void f(int N, float y[N]) { int i;\n  for (i = 0; i < N; i++)\n"
         "    for (i = 0; i < N; i++) y[i] += 1.0f; }", 3, 10, "enclosing loop"),
        ("void f(int N, float y[N]) {\n  char c;\n}", 2, 8, "an integer with a value"),
        ("void f(int N, float y[N]) {\n  unsigned i = 0;\n}", 2, 12, "without a value"),
        ("void f(int N, float y[N]) { int i;\n  y[i] = 1.0f; }", 2, 5, "declared loop variable"),
        ("void f(int N, float y[N]) { int N2, N2; }", 1, 37, "shadows the declared loop"),
        ("void f(int N, float y[N]) {\n  int y; }", 2, 7, "shadows the array 'y'"),
    ],
)
def test_refusals_keep_their_positions(text: str, line: int, column: int, says: str) -> None:
    with pytest.raises(SpecError, match=says) as info:
        polydl.compile(text, {"N": 4})
    assert (info.value.line, info.value.column) == (line, column), info.value.message


OPS = """void scale(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++) y[i] = 2.0f * x[i];
}

void shift(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++) y[i] = x[i] + 1.0f;
}
"""


def test_one_function_of_several_is_chosen_by_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from polydl.cli import main

    x = np.arange(5, dtype=np.float32)
    np.testing.assert_allclose(polydl.compile(OPS, {"N": 5}, function="shift")(x), x + 1)
    np.testing.assert_allclose(polydl.compile(OPS, {"N": 5}, function="scale")(x), 2 * x)
    with pytest.raises(SpecError, match=r"defines 2 functions \(scale, shift\); choose one") as e:
        polydl.compile(OPS, {"N": 5})
    assert (e.value.line, e.value.column) == (5, 6)
    with pytest.raises(SpecError, match="has no function 'norm'; it defines scale, shift"):
        polydl.compile(OPS, {"N": 5}, function="norm")
    path = tmp_path / "ops.c"
    path.write_text(OPS)
    assert main(["run", str(path), "-p", "N=64", "--function", "shift", "--repeat", "1"]) == 0


BRANCHES = """void f(int N, float y[N][N], const float x[N][N]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      if (i == j) y[i][j] = 1.0f;
      else if (!(i < j) || j == 0) y[i][j] = x[i][j];
      else y[i][j] = -x[i][j];
      if (i < 3 || i < 5) y[i][j] += 10.0f;
      if (i != j && (j < 2 || j >= N - 2)) y[i][j] *= 2.0f;
    }
}
"""


def test_else_or_not_and_not_equal_on_affine_conditions() -> None:
    """Each iteration runs exactly what C runs: overlapping `||` branches run once."""
    n = 9
    kernel = polydl.compile(BRANCHES, {"N": n})
    x = np.arange(n * n, dtype=np.float32).reshape(n, n) + 1
    i, j = np.indices((n, n))
    y = np.where(i == j, 1.0, np.where((i >= j) | (j == 0), x, -x))
    y = y + np.where(i < 5, 10.0, 0.0)
    y = y * np.where((i != j) & ((j < 2) | (j >= n - 2)), 2.0, 1.0)
    np.testing.assert_allclose(kernel(x), y)
    np.testing.assert_allclose(kernel.reference(x), y)


DOWN = """void f(int N, float y[N], float z[N][N], const float x[N]) {
  for (int i = N - 1; i >= 1; i--)
    y[i] = y[i - 1] + x[i];
  for (int i = N - 1; i > 0; i -= 2)
    for (int j = i; j >= 0; j = j - 3)
      z[i][j] += x[j] * (float)1 + i;
}
"""


def test_loops_that_count_down_keep_their_order() -> None:
    """Counting down, y[i] reads the old y[i - 1] (counting up would give prefix sums)."""
    n = 10
    kernel = polydl.compile(DOWN.replace("(float)1", "1.0f"), {"N": n})
    x = np.arange(1, n + 1, dtype=np.float32)
    y0 = np.linspace(-1, 1, n).astype(np.float32)
    y, z = y0.copy(), np.zeros((n, n), np.float32)
    kernel(x, y=y, z=z)
    want_y = y0.copy()
    want_y[1:] = y0[:-1] + x[1:]
    want_z = np.zeros((n, n))
    for i in range(n - 1, 0, -2):
        for j in range(i, -1, -3):
            want_z[i, j] += x[j] + i
    np.testing.assert_allclose(y, want_y, rtol=1e-6)
    np.testing.assert_allclose(z, want_z, rtol=1e-6)


@pytest.mark.parametrize(
    "loop, says",
    [
        ("for (int i = N - 1; i < N; i--)", "counts down needs the condition"),
        ("for (int i = N - 1; i >= i; i--)", "must not depend on the loop variable"),
        ("for (int i = min(N, 4); i >= 0; i--)", "must be affine"),
    ],
)
def test_down_counting_refusals(loop: str, says: str) -> None:
    with pytest.raises(SpecError, match=says):
        polydl.compile(f"void f(int N, float y[N]) {{ {loop} y[0] += 1.0f; }}", {"N": 4})


def test_conditions_on_data_select_values() -> None:
    """`if` on data (a leaky ReLU with a call-time slope, and a mixed condition): each branch's
    assignments take their values only where the condition holds or fails."""
    spec = """void leaky(int N, float y[N], const float x[N], float slope) {
      for (int i = 0; i < N; i++) {
        if (x[i] > 0.0f) y[i] = x[i];
        else y[i] = slope * x[i];
        if (!(x[i] < -0.5f) && i % 2 == 0 || x[i] == 1.0f) {
          y[i] += 10.0f;
          if (i < 3) y[i] *= 2.0f;
        }
      }
    }"""
    k = polydl.compile(spec, {"N": 16})
    x = np.linspace(-1, 1, 16).astype(np.float32)
    i = np.arange(16)
    chosen = (~(x < -0.5) & (i % 2 == 0)) | (x == 1.0)
    want = np.where(x > 0, x, 0.1 * x) + np.where(chosen, 10.0, 0.0)
    want = want * np.where(chosen & (i < 3), 2.0, 1.0)
    np.testing.assert_allclose(k(x, 0.1), want, rtol=1e-6)
    np.testing.assert_allclose(k.reference(x, 0.1), want, rtol=1e-6)


def test_a_chain_of_cases_that_each_set_one_cell_is_one_select_that_never_reads_it() -> None:
    """`if / else if / else`, each case assigning y[i]: one statement, whose value does not
    read y (an output the cases write is not read first: a fresh output's pages were faulted
    in twice, a read and then a write)."""
    spec = """void hs(int N, float y[N], const float x[N]) {
      for (int i = 0; i < N; i++) {
        float v = x[i];
        if (v <= -3.0f) y[i] = 0.0f;
        else if (v >= 3.0f) y[i] = v;
        else y[i] = v * (v + 3.0f) / 6.0f;
      }
    }"""
    nest = parse_c(spec)
    (write,) = [s for s, _ in walk_statements(nest.body) if s.target.array == "y"]
    assert all(load.array != "y" for load in expr_loads(write.value))
    k = polydl.compile(spec, {"N": 40})
    x = np.linspace(-5, 5, 40).astype(np.float32)
    want = np.where(x <= -3, 0.0, np.where(x >= 3, x, x * (x + 3) / 6))
    np.testing.assert_allclose(k(x), want, rtol=1e-6)


@pytest.mark.parametrize(
    "body, says",
    [
        ("if (x[0] > 0.0f) for (int i = 0; i < N; i++) y[i] = 1.0f;", "a loop under a condition"),
        ("for (int i = 0; i < N; i++) if (x[i]) y[i] = 0.0f;", "compares values"),
    ],
)
def test_conditions_on_data_refusals(body: str, says: str) -> None:
    with pytest.raises(SpecError, match=says):
        polydl.compile(f"void f(int N, float y[N], const float x[N]) {{ {body} }}", {"N": 4})


def test_local_scalars_layernorm_and_softmax_examples() -> None:
    """Locals declared in a loop body get one cell per iteration: the rows stay independent."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 40)).astype(np.float32)
    g, b = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    ln = polydl.compile(ROOT / "examples" / "layernorm.c", {"N": 6, "D": 40})
    xd = x.astype(np.float64)
    want = (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(ln(x, g, b, 1e-5), want, rtol=1e-4, atol=1e-5)
    sm = polydl.compile(ROOT / "examples" / "softmax.c", {"N": 6, "D": 40})
    e = np.exp(xd - xd.max(1, keepdims=True))
    np.testing.assert_allclose(sm(x), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert ln.schedule.scheduler == "affine"


def test_locals_follow_block_scope() -> None:
    spec = """void f(int N, float y[N], const float x[N]) {
      float total = 0.0f;
      for (int i = 0; i < N; i++) total += x[i];
      for (int i = 0; i < N; i++) { float t = x[i] * 2.0f; y[i] = t + total; }
      for (int i = 0; i < N; i++) { float t = 1.0f; y[i] += t; }
    }"""
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_allclose(polydl.compile(spec, {"N": 5})(x), 2 * x + x.sum() + 1)


def test_a_condition_may_read_a_local() -> None:
    """`float t = x[i][j]; if (t > 0) y = t; else y = slope * t;`: the local is data."""
    spec = """void leaky_relu(int N, int D, float y[N][D], const float x[N][D], float slope) {
      for (int i = 0; i < N; i++)
        for (int j = 0; j < D; j++) {
          float t = x[i][j];
          if (t > 0) y[i][j] = t; else y[i][j] = slope * t;
        }
    }"""
    k = polydl.compile(spec, {"N": 5, "D": 7})
    x = np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_allclose(k(x, 0.01), np.where(x > 0, x, 0.01 * x), rtol=1e-6)


def test_locals_inside_triangular_loops() -> None:
    """A local declared in a loop whose bounds move with an outer loop (forward substitution):
    that loop's iterations share the cell, in order, and the answer is the solve's."""
    spec = """void fwd(int N, const double L[N][N], const double b[N], double y[N]) {
      for (int i = 0; i < N; i++) {
        double w = b[i];
        for (int j = 0; j < i; j++)
          w -= L[i][j] * y[j];
        y[i] = w / L[i][i];
      }
      for (int i = 0; i < N; i++)
        for (int j = 0; j <= i; j++) {
          double s = L[i][j] * 2.0;
          y[i] += s * 0.0;
        }
    }"""
    rng = np.random.default_rng(2)
    L = np.tril(rng.random((9, 9))) + 3 * np.eye(9)
    b = rng.random(9)
    k = polydl.compile(spec, {"N": 9})
    np.testing.assert_allclose(k(L, b), np.linalg.solve(L, b), rtol=1e-12)
    np.testing.assert_allclose(k.reference(L, b), np.linalg.solve(L, b), rtol=1e-12)


@pytest.mark.parametrize(
    "body, says",
    [
        ("for (int i = 0; i < N; i++) { float t; } y[0] = t;", "'t'"),
        ("float x2 = 1.0f; float x2 = 2.0f;", "already declared"),
    ],
)
def test_local_refusals(body: str, says: str) -> None:
    with pytest.raises(SpecError, match=says):
        polydl.compile(f"void f(int N, float y[N]) {{ {body} }}", {"N": 4})


HISTOGRAM = """#include <stdint.h>
#include "bins.h"
#define CLAMP(v) ((v) < 0 ? 0 : (v) >= BINS ? BINS - 1 : (v))
/* counts of quantised values per row, and the rows' means of the codes */
void histogram(int _N, int32_t _count[_N][BINS], float _mean[_N],
               const unsigned char _codes[_N][WIDTH]) {
  for (int _i = 0; _i < _N; _i++)
    for (int _b = 0; _b < BINS; _b++)
      for (int _j = 0; _j < WIDTH; _j++)
        _count[_i][_b] += CLAMP(_codes[_i][_j] / STEP) == _b ? 1 : 0;
  for (int _i = 0; _i < _N; _i++)
    for (int _j = 0; _j < WIDTH; _j++)
      _mean[_i] += _codes[_i][_j] / (float)WIDTH;
}
"""


def test_the_subset_together_preprocessor_underscores_and_integers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A histogram of byte codes: macros from a header and from -D, names that begin with
    '_', int and unsigned char arrays, integer division; checked against numpy."""
    (tmp_path / "bins.h").write_text("#define BINS 8\n#define WIDTH 24\n")
    spec = tmp_path / "histogram.c"
    spec.write_text(HISTOGRAM)
    k = polydl.compile(spec, {"_N": 5}, defines={"STEP": 32})
    codes = np.random.default_rng(5).integers(0, 256, (5, 24)).astype(np.uint8)
    count, mean = k(codes)
    want = np.stack([np.bincount(row // 32, minlength=8) for row in codes.astype(np.int64)])
    np.testing.assert_array_equal(count, want.astype(np.int32))
    np.testing.assert_allclose(mean, codes.mean(axis=1), rtol=1e-5)
    assert count.dtype == np.int32 and k.schedule.microkernel is None
    with pytest.raises(SpecError) as info:
        polydl.compile(spec, {"_N": 5})  # STEP undefined
    assert [(e.line, e.column) for e in info.value.errors] == [(10, 50)]
    assert "undeclared identifier 'STEP'" in info.value.message


ARG_MAX = """void amax(int N, int D, float m[N], long k[N], int first[N], const float x[N][D]) {
  for (int i = 0; i < N; i++) {
    float v = x[i][0];
    long arg = 0;
    int seen = -1;
    for (int j = 1; j < D; j++)
      if (x[i][j] > v) { v = x[i][j]; arg = j; }
    for (int j = 0; j < D; j++)
      if (x[i][j] >= v && seen < 0) { seen = j; v = v; }
    m[i] = v;
    k[i] = arg;
    first[i] = seen;
  }
}
"""


@pytest.mark.parametrize("n, d", [(1, 1), (5, 9), (3, 64)])
def test_arg_max_with_integer_locals_compares_with_the_value_before_the_if(n: int, d: int) -> None:
    """`if (x > v) { v = x; arg = j; }`: both selects compare with v as it was before the if
    (the condition's operands are copied first); `int`/`long` locals with a value hold
    integers. Ties keep the first position, as numpy's argmax does."""
    k = polydl.compile(ARG_MAX, {"N": n, "D": d})
    x = np.random.default_rng(n * d).random((n, d)).astype(np.float32)
    x[0, :] = x[0, 0]  # a row of ties
    m, arg, first = k(x)
    assert arg.dtype == np.int64 and first.dtype == np.int32
    np.testing.assert_array_equal(m, x.max(axis=1))
    np.testing.assert_array_equal(arg, x.argmax(axis=1))
    np.testing.assert_array_equal(first, x.argmax(axis=1))
    for got, want in zip(k.reference(x), (m, arg, first), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_branch_that_rewrites_what_its_condition_read_sees_the_value_before_the_if() -> None:
    spec = """void f(int N, float y[N], const float x[N]) {
      for (int i = 0; i < N; i++)
        if (y[i] > 0.0f) { y[i] = x[i]; y[i] += 1.0f; } else { y[i] = -x[i]; y[i] -= 1.0f; }
    }"""
    k = polydl.compile(spec, {"N": 41})
    x = np.random.default_rng(3).random(41).astype(np.float32)
    y0 = np.random.default_rng(4).standard_normal(41).astype(np.float32)
    y = k(x, y=y0.copy())
    np.testing.assert_array_equal(y, np.where(y0 > 0, x + np.float32(1), -x - np.float32(1)))
