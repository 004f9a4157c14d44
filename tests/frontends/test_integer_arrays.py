"""Arrays of integers (char, short, int, long, signed and unsigned) as data: computed as C
computes them (division toward zero, `%` with the dividend's sign, conversion to float where
mixed with float, conversion to the element type on every store), each kernel checked against
numpy written independently and against the reference, which must agree exactly."""

from __future__ import annotations

import numpy as np
import pytest

import polydl
from polydl.cli import main
from polydl.errors import ShapeError, SpecError

RNG = np.random.default_rng(7)


def _c_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C's a / b on integers, written without polydl's helpers: the truncated real quotient."""
    return np.trunc(a.astype(np.float64) / b).astype(np.int64)


def _same(got: object, want: object) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and np.array_equal(got, want), (got, want)


COUNT = """void count(int N, int M, int cnt[N], const float x[N][M], const int seq[M], float y[N]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++) {
      cnt[i] = cnt[i] + (x[i][j] > 0 ? 1 : 0);
      y[i] += x[i][j] * seq[j] + seq[j] / 4;
    }
}
"""


@pytest.mark.parametrize("n, m", [(1, 1), (7, 13), (33, 5)])
def test_counts_and_int_inputs_in_float_arithmetic(n: int, m: int) -> None:
    k = polydl.compile(COUNT, {"N": n, "M": m})
    x = RNG.standard_normal((n, m)).astype(np.float32)
    seq = RNG.integers(-20, 20, m).astype(np.int32)
    cnt, y = k(x, seq)
    _same(cnt, (x > 0).sum(axis=1).astype(np.int32))
    want_y = x.astype(np.float64) @ seq + _c_div(seq, 4).sum()
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    ref_cnt, ref_y = k.reference(x, seq)
    _same(ref_cnt, cnt)
    np.testing.assert_allclose(ref_y, want_y, rtol=1e-6, atol=1e-6)
    assert k.schedule.microkernel is None


ARITHMETIC = """void arith(int N, int q[N], int r[N], long w[N], const int a[N], const int b[N]) {
  for (int i = 0; i < N; i++) {
    q[i] = a[i] / b[i];
    r[i] = a[i] % b[i];
    w[i] = (a[i] - 3 * b[i]) / 2 - -a[i] % 3 + (i - 5) / 2;
  }
}
"""


def test_division_and_remainder_round_toward_zero_as_in_c() -> None:
    n = 40
    k = polydl.compile(ARITHMETIC, {"N": n})
    a = RNG.integers(-50, 50, n).astype(np.int32)
    b = RNG.choice([-7, -3, -2, -1, 1, 2, 5, 9], n).astype(np.int32)
    q, r, w = k(a, b)
    a64, b64, i = a.astype(np.int64), b.astype(np.int64), np.arange(n)
    _same(q, _c_div(a64, b64).astype(np.int32))
    _same(r, np.fmod(a64, b64).astype(np.int32))
    want_w = _c_div(a64 - 3 * b64, 2) - np.fmod(-a64, 3) + _c_div(i - 5, 2)
    _same(w, want_w.astype(np.int64))
    for got, ref in zip((q, r, w), k.reference(a, b), strict=True):
        _same(ref, got)


def test_division_by_zero_gives_zero_instead_of_trapping() -> None:
    """C leaves x / 0 undefined and x86 traps: a kernel gives 0 (and 0 for x % 0)."""
    k = polydl.compile(ARITHMETIC, {"N": 4})
    a = np.array([7, -7, 0, 5], np.int32)
    b = np.array([0, 0, 0, -1], np.int32)
    q, r, _ = k(a, b)
    _same(q, np.array([0, 0, 0, -5], np.int32))
    _same(r, np.zeros(4, np.int32))
    _same(k.reference(a, b)[0], q)


NARROW = """void narrow(int N, unsigned char u[N], signed char s[N], short h[N], char c[N],
            int8_t s8[N], uint16_t w[N], const float x[N], const unsigned char v[N]) {
  for (int i = 0; i < N; i++) {
    u[i] = v[i] * 3 - 10;
    s[i] = v[i] * 3;
    h[i] = v[i] * v[i] * v[i];
    c[i] = x[i] * 10.0f;
    s8[i] = (unsigned char)(v[i] + 200) / 2;
    w[i] = (int)(x[i] * 1000.0f) + v[i];
  }
}
"""


def test_narrow_types_wrap_and_floats_truncate_on_store() -> None:
    n = 57
    k = polydl.compile(NARROW, {"N": n})
    x = RNG.uniform(-9, 9, n).astype(np.float32)
    v = RNG.integers(0, 256, n).astype(np.uint8)
    u, s, h, c, s8, w = k(x, v)
    v64 = v.astype(np.int64)
    _same(u, (v64 * 3 - 10).astype(np.uint8))
    _same(s, (v64 * 3).astype(np.int8))
    _same(h, (v64 ** 3).astype(np.int16))
    tens = x * np.float32(10)  # float arithmetic, as the kernel's
    _same(c, np.trunc(tens).astype(np.int8))
    _same(s8, (((v64 + 200) % 256) // 2).astype(np.int8))
    _same(w, (np.trunc(x * np.float32(1000)).astype(np.int64) + v64).astype(np.uint16))
    for got, ref in zip((u, s, h, c, s8, w), k.reference(x, v), strict=True):
        _same(ref, got)


def test_long_arithmetic_is_exact_beyond_double_precision() -> None:
    spec = """void big(int N, long y[N], const long x[N]) {
      for (int i = 0; i < N; i++) y[i] = x[i] * 3 + 1 - x[i] / 7;
    }"""
    k = polydl.compile(spec, {"N": 9})
    x = (np.arange(9, dtype=np.int64) + 2**55) * np.array([1, -1] * 4 + [1])
    _same(k(x), x * 3 + 1 - _c_div(x, 7) + (x - x))  # x / 7 below 2**53 after division
    _same(k.reference(x), k(x))


def test_a_float_accumulated_into_an_int_truncates_at_every_step() -> None:
    """`cnt[i] += x[i][j]` is `cnt[i] = (int)(cnt[i] + x[i][j])`: halves never add up, in
    whatever order the kernel would like to sum them; and `if` on data updates in place."""
    spec = """void acc(int N, int M, int cnt[N], int pos[N], const float x[N][M]) {
      for (int i = 0; i < N; i++)
        for (int j = 0; j < M; j++) {
          cnt[i] += x[i][j];
          if (x[i][j] > 0.0f) pos[i] += 1;
        }
    }"""
    k = polydl.compile(spec, {"N": 6, "M": 64})
    x = np.full((6, 64), 0.5, np.float32)
    x[1] = 1.5  # each step: trunc(c + 1.5) = c + 1
    x[2, ::2] = -0.75
    cnt, pos = k(x)
    want = np.zeros(6, np.int32)
    for j in range(64):  # C, step by step
        want = np.trunc(want + x[:, j].astype(np.float64)).astype(np.int32)
    _same(cnt, want)
    assert cnt[0] == 0 and cnt[1] == 64
    _same(pos, (x > 0).sum(axis=1).astype(np.int32))
    _same(k.reference(x)[0], cnt)


@pytest.mark.parametrize("ctype, dtype", [("int", np.int32), ("short", np.int16),
                                          ("long", np.int64)])
def test_an_integer_matmul_takes_no_microkernel(ctype: str, dtype: type) -> None:
    spec = f"""void imm(int M, int N, int K, {ctype} C[M][N], const {ctype} A[M][K],
                       const {ctype} B[K][N]) {{
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
          for (int k = 0; k < K; k++)
            C[i][j] += A[i][k] * B[k][j];
    }}"""
    k = polydl.compile(spec, {"M": 24, "N": 40, "K": 16})
    assert k.schedule.microkernel is None
    a = RNG.integers(-9, 10, (24, 16)).astype(dtype)
    b = RNG.integers(-9, 10, (16, 40)).astype(dtype)
    _same(k(a, b), (a.astype(np.int64) @ b.astype(np.int64)).astype(dtype))


def test_mixed_matmuls_take_no_microkernel_and_a_float_one_still_does() -> None:
    mixed = """void mm(int M, int N, int K, float C[M][N], const int A[M][K], const float B[K][N]) {
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
          for (int k = 0; k < K; k++)
            C[i][j] += A[i][k] * B[k][j];
    }"""
    k = polydl.compile(mixed, {"M": 32, "N": 32, "K": 32})
    assert k.schedule.microkernel is None
    a = RNG.integers(-4, 5, (32, 32)).astype(np.int32)
    b = RNG.standard_normal((32, 32)).astype(np.float32)
    np.testing.assert_allclose(k(a, b), a @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    into_int = mixed.replace("float C[M][N], const int A", "int C[M][N], const float A")
    assert polydl.compile(into_int, {"M": 32, "N": 32, "K": 32}).schedule.microkernel is None
    floats = mixed.replace("const int A", "const float A")
    assert polydl.compile(floats, {"M": 32, "N": 32, "K": 32}).schedule.microkernel is not None


def test_casts_between_integer_and_float() -> None:
    spec = """void casts(int N, float y[N], int t[N], const float x[N], const int a[N]) {
      for (int i = 0; i < N; i++) {
        y[i] = (float)a[i] / 4 + (double)(a[i] / 4);
        t[i] = (int)(x[i] * 2.5f) + (char)(a[i] * 100) + (long)x[i];
      }
    }"""
    k = polydl.compile(spec, {"N": 31})
    x = RNG.uniform(-5, 5, 31).astype(np.float32)
    a = RNG.integers(-99, 99, 31).astype(np.int32)
    y, t = k(x, a)
    a64 = a.astype(np.int64)
    np.testing.assert_allclose(y, a / 4 + _c_div(a64, 4), rtol=1e-6)
    want_t = (np.trunc(x * np.float32(2.5)) + (a64 * 100).astype(np.int8) + np.trunc(x))
    _same(t, want_t.astype(np.int32))
    _same(k.reference(x, a)[1], t)


@pytest.mark.parametrize("n, d", [(1, 8), (7, 8), (13, 3)])
def test_a_cast_of_a_loop_variable_or_size_divides_in_floating_point(n: int, d: int) -> None:
    """`(float)k / D` is a float division in C, also where the cast is a helper's parameter."""
    spec = """float half(float v) { return v / 2; }
    void ramp(int N, int D, float y[N], float z[N], double w[N]) {
      for (int k = 0; k < N; k++) {
        y[k] = (float)k / D;
        z[k] = half(k) + (float)(2 * k) / (float)D;
        w[k] = (double)k / 3;
      }
    }"""
    k = polydl.compile(spec, {"N": n, "D": d})
    y, z, w = k()
    i = np.arange(n, dtype=np.float64)
    np.testing.assert_allclose(y, i / d, rtol=1e-6)
    np.testing.assert_allclose(z, i / 2 + 2 * i / d, rtol=1e-6)
    np.testing.assert_allclose(w, i / 3, rtol=1e-12)
    for got, want in zip(k.reference(), (y, z, w), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_arguments_are_checked_against_their_integer_dtype() -> None:
    k = polydl.compile(COUNT, {"N": 3, "M": 4})
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ShapeError) as info:
        k(x, np.zeros(4, np.int64))
    assert info.value.array == "seq" and info.value.expected == "int32"
    assert "argument 'seq': input has the wrong dtype (expected int32, got int64)" in str(info.value)
    with pytest.raises(ShapeError, match="'cnt'.*expected int32, got float32"):
        k(x, np.zeros(4, np.int32), cnt=np.zeros(3, np.float32))


def test_polydl_run_verifies_an_integer_kernel(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "arith.c"
    path.write_text(ARITHMETIC)
    assert main(["run", str(path), "-p", "N=100", "--repeat", "1"]) == 0
    assert "verify   ok (max relative error 0.00e+00" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text, says",
    [
        ("void f(int N, unsigned int $y[N]) { }", "unsigned int and unsigned long are not"),
        ("void f(int N, unsigned long $y[N]) { }", "unsigned int and unsigned long are not"),
        ("void f(int N, int y[N], const float x[N]) { y[0] = $x[0] % 2; }", "'%' needs integer"),
        ("void f(int N, int y[N]) { unsigned $t = 0; }", "without a value"),
        ("void f(int N, int y[N]) { y[0] = $(unsigned)y[1]; }", "cast"),
        ("void f(int N, int y[N], const int a[N]) { y[$a[0] * 2] = 1; }", "indirect indexing"),
        ("void f(int N, int y[N]) { y[0] = $'a'; }", "char constants"),
    ],
)
def test_integer_refusals_keep_their_position(text: str, says: str) -> None:
    column = text.index("$") + 1
    with pytest.raises(SpecError, match=says) as info:
        polydl.compile(text.replace("$", ""), {"N": 4})
    assert (info.value.line, info.value.column) == (1, column), info.value.message


def test_cuda_lowering_of_integer_arrays() -> None:
    """The GPU targets print the same integer arithmetic, with the same helpers on the device;
    an integer matmul is no GPU GEMM either."""
    from polydl.api import lower
    from polydl.frontends import load_spec

    nest, params = load_spec(ARITHMETIC, {"N": 64})
    source = lower(nest, params, "cuda").code.source
    assert "long _pd_idiv(long a, long b)" in source and "_pd_idiv(((long)a[" in source
    assert "int32_t *__restrict__ q" in source
    gemm = """void imm(int N, int C[N][N], const int A[N][N], const int B[N][N]) {
      for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
          for (int k = 0; k < N; k++)
            C[i][j] += A[i][k] * B[k][j];
    }"""
    nest, params = load_spec(gemm, {"N": 256})
    assert all(k.gemm is None for k in lower(nest, params, "cuda").schedule.kernels)
