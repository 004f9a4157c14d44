"""End to end: C specs and builders compiled, run and checked against numpy on odd shapes."""

import numpy as np
import pytest

import polydl
from polydl.schedules.schedule import MicrokernelBinding, Schedule
from tests.kernels import run_and_check
from tests.poly.test_model import MATMUL, TRIANGLE, WAVEFRONT

SHAPES = [(1, 1, 1), (3, 5, 7), (17, 13, 31), (64, 48, 40), (97, 101, 67)]


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_matmul_spec_matches_numpy(m: int, n: int, k: int) -> None:
    kernel = polydl.compile(MATMUL, {"M": m, "N": n, "K": k})
    run_and_check(kernel, lambda a, b: a.astype(np.float64) @ b)


@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.slow
def test_matmul_builder_matches_numpy(m: int, n: int, k: int) -> None:
    kernel = polydl.matmul(M=m, N=n, K=k)
    run_and_check(kernel, lambda a, b: a.astype(np.float64) @ b)


def test_matmul_float64() -> None:
    spec = MATMUL.replace("float", "double")
    kernel = polydl.compile(spec, {"M": 9, "N": 7, "K": 5})
    run_and_check(kernel, lambda a, b: a @ b)


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule(order=("k", "i", "j"), parallel=("i",)),
        Schedule(order=("i.t", "j.t", "k", "i", "j"), tiles=(("i", 8), ("j", 16)), parallel=("i.t",)),
        Schedule(order=("j.t", "k", "j", "i"), tiles=(("j", 5),), parallel=("j.t",)),
        Schedule(
            order=("i.t", "j.t", "i", "j", "k"),
            tiles=(("i", 6), ("j", 16)),
            parallel=("i.t", "j.t"),
            microkernel=MicrokernelBinding("S0", m="i", n="j", k="k"),
        ),
        Schedule(
            order=("j", "i", "k"),
            parallel=(),
            microkernel=MicrokernelBinding("S0", m="j", n="i", k="k"),
        ),
    ],
    ids=["permuted", "tiled", "tiled-remainder", "microkernel", "microkernel-transposed"],
)
def test_explicit_schedules_compute_the_same_matmul(schedule: Schedule) -> None:
    kernel = polydl.compile(MATMUL, {"M": 37, "N": 45, "K": 19}, schedule=schedule)
    run_and_check(kernel, lambda a, b: a.astype(np.float64) @ b)


@pytest.mark.parametrize("n", [1, 2, 9, 30])
def test_non_rectangular_domain(n: int) -> None:
    kernel = polydl.compile(TRIANGLE, {"N": n})

    def expected(a: np.ndarray) -> np.ndarray:
        out = np.zeros_like(a, dtype=np.float64)
        for i in range(n):
            for j in range(0, i + 1, 2):
                out[i, j] = 2 * a[i, j]
        return out

    run_and_check(kernel, expected)


@pytest.mark.parametrize("n", [2, 7, 33])
def test_loop_carried_dependence_runs_in_order(n: int) -> None:
    kernel = polydl.compile(WAVEFRONT, {"N": n})
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 1, (n, n)).astype(np.float32)
    want = a.astype(np.float64).copy()
    for i in range(1, n):
        for j in range(1, n):
            want[i, j] = want[i - 1, j] + want[i, j - 1]
    got = a.copy()
    kernel(A=got)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert "omp parallel" not in kernel.source


MULTI = """
void mlp_layer(int N, int C, int K, float y[N][K], float t[N][K],
               const float x[N][C], const float w[K][C], const float b[K]) {
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) {
      t[n][k] = b[k];
      for (int c = 0; c < C; c++)
        t[n][k] += x[n][c] * w[k][c];
    }
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++)
      y[n][k] = t[n][k] > 0.0f ? tanhf(t[n][k]) : 0.5f * expf(t[n][k]) - 0.5f;
}
"""


@pytest.mark.parametrize("n, c, k", [(1, 1, 1), (5, 13, 7), (16, 33, 24)])
def test_multi_statement_nests(n: int, c: int, k: int) -> None:
    kernel = polydl.compile(MULTI, {"N": n, "C": c, "K": k})

    def expected(x, w, b):  # type: ignore[no-untyped-def]
        t = x.astype(np.float64) @ w.T.astype(np.float64) + b
        return np.where(t > 0, np.tanh(t), 0.5 * np.exp(t) - 0.5), t

    run_and_check(kernel, expected)


@pytest.mark.parametrize(
    "n, c, k, h, w, r, s, stride, padding",
    [
        (1, 1, 1, 1, 1, 1, 1, 1, 0),
        (2, 3, 5, 7, 7, 3, 3, 1, 1),
        (1, 4, 6, 9, 11, 3, 2, 2, 1),
        (2, 5, 3, 13, 13, 5, 5, 3, 2),
    ],
)
def test_conv2d_builder_matches_numpy(n, c, k, h, w, r, s, stride, padding) -> None:  # type: ignore[no-untyped-def]
    kernel = polydl.conv2d(N=n, C=c, K=k, H=h, W=w, R=r, S=s, stride=stride, padding=padding)
    run_and_check(kernel, lambda x, wt: conv2d_numpy(x, wt, stride, padding))


def conv2d_numpy(x: np.ndarray, w: np.ndarray, stride: int, padding: int) -> np.ndarray:
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.zeros((n, c, h + 2 * padding, wd + 2 * padding))
    xp[:, :, padding : padding + h, padding : padding + wd] = x
    p = (h + 2 * padding - r) // stride + 1
    q = (wd + 2 * padding - s) // stride + 1
    y = np.zeros((n, k, p, q))
    for i in range(r):
        for j in range(s):
            patch = xp[:, :, i : i + stride * p : stride, j : j + stride * q : stride]
            y += np.einsum("ncpq,kc->nkpq", patch, w[:, :, i, j])
    return y


def test_fused_bias_relu_builder() -> None:
    kernel = polydl.conv2d(N=2, C=3, K=4, H=6, W=6, R=3, S=3, padding=1, fuse=("bias", "relu"))

    def expected(x, w, b):  # type: ignore[no-untyped-def]
        return np.maximum(conv2d_numpy(x, w, 1, 1) + b[None, :, None, None], 0)

    run_and_check(kernel, expected)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.slow
def test_blocked_1x1_calls_span_the_image_where_rows_are_short(dtype: str, stride: int) -> None:
    """A layer of 7 x 5 outputs runs its positions as one loop: the call spans them (35 rows of
    C, not 5), with the bias, residual and ReLU fused and y set, not added to; at stride 2
    (13 x 9 inputs) over the copy of the positions it reads."""
    from tests.codegen.c.test_bfloat16 import f32
    from tests.frontends.test_builders import conv2d_numpy

    n, c, k, h, w = 2, 32, 40, 7 * stride - stride + 1, 5 * stride - stride + 1
    kern = polydl.conv2d(N=n, C=c, K=k, H=h, W=w, R=1, S=1, stride=stride, layout="nchw16c",
                         dtype=dtype, fuse=("bias", "residual", "relu"), accumulate=False)
    binding = kern.schedule.microkernel
    assert binding is not None and binding.m == "m", kern.schedule.describe()
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (n, c, h, w)).astype(np.float32)
    wt = rng.uniform(-1, 1, (k, c, 1, 1)).astype(np.float32)
    if dtype == "bfloat16":
        import ml_dtypes

        x, wt = f32(x.astype(ml_dtypes.bfloat16)), f32(wt.astype(ml_dtypes.bfloat16))
    b = rng.uniform(-1, 1, 48).astype(np.float32)
    res = rng.uniform(-1, 1, (n, k, 7, 5)).astype(np.float32)
    xb, wb = polydl.layouts.to_nchw16c(x), polydl.layouts.to_kcrs16c16k(wt)
    if dtype == "bfloat16":
        xb, wb = xb.astype(ml_dtypes.bfloat16), wb.astype(ml_dtypes.bfloat16)
    stale = np.full((n, 3, 7, 5, 16), 7.0, np.float32)  # overwritten, not added to
    got = polydl.layouts.from_nchw16c(kern(xb, wb, b, polydl.layouts.to_nchw16c(res), y=stale), k)
    want = np.maximum(conv2d_numpy(x, wt, stride, 0) + b[None, :k, None, None] + res, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    run_and_check(kern)


def test_two_parallel_loops_run_as_one_on_many_cores() -> None:
    """For 16 cores a convolution of 2 images of 14 rows takes two parallel loops (rows and
    images); the code runs them as one (OpenMP collapse: 14 rows alone would leave 2 threads
    idle), with the same results."""
    from dataclasses import replace

    from polydl.api import target_of

    socket = replace(target_of("c"), cores=16)
    k = polydl.conv2d(N=2, C=64, K=64, H=14, W=14, R=3, S=3, padding=1, layout="nchw16c",
                      fuse=("bias", "relu"), target=socket)
    assert "collapse(2)" in k.source, k.source.splitlines()[2]
    run_and_check(k)


SIBLINGS = """
void siblings(float a[8][65536], float b[8][65536], const float x[8][65536]) {
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 65536; j++) {
      a[i][j] = x[i][j] * 2.0f;
      b[i][j] = x[i][j] + 1.0f;
    }
}
"""


def test_no_pragma_comes_between_the_loops_of_a_collapse() -> None:
    """Loops collapsed into one parallel loop must nest perfectly: the inner one, which would
    get `omp simd` on its own, is printed bare (gcc rejects a pragma between them)."""
    from dataclasses import replace

    from polydl.api import target_of

    socket = replace(target_of("c"), cores=16)  # 8 rows alone would leave threads idle
    k = polydl.compile(SIBLINGS, target=socket)
    lines = [line.strip() for line in k.source.splitlines()]
    at = next(i for i, line in enumerate(lines) if "collapse(2)" in line)
    assert lines[at + 1].startswith("for") and lines[at + 2].startswith("for"), lines[at:at + 3]
    run_and_check(k, lambda x: (x * 2.0, x + 1.0))
