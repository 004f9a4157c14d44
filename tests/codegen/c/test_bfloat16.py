"""bfloat16 kernels: bf16 inputs (ml_dtypes arrays or uint16 bits), fp32 accumulation and output."""

import ml_dtypes
import numpy as np
import pytest

import polydl
from polydl import layouts
from polydl.errors import ShapeError, SpecError
from polydl.target import host_target
from tests.frontends.test_builders import conv2d_numpy
from tests.kernels import run_and_check

BF16_MATMUL = """
void mm(int M, int N, int K, float C[M][N], const bfloat16 A[M][K], const __bf16 B[K][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
}
"""


def bf16(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1, 1, shape).astype(ml_dtypes.bfloat16)


def f32(x: np.ndarray) -> np.ndarray:
    """The bf16 values as float32 (exact): what the reference multiplies."""
    return x.astype(np.float32)


def blocked(x: np.ndarray) -> np.ndarray:
    """bf16 images in the blocked layout (exact: already bf16 values)."""
    return layouts.to_nchw16c(f32(x)).astype(ml_dtypes.bfloat16)


def blocked_weights(wt: np.ndarray) -> np.ndarray:
    return layouts.to_kcrs16c16k(f32(wt)).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("m, n, k", [(64, 64, 64), (17, 33, 9), (1, 5, 3)])
def test_matmul_bf16_builder(m: int, n: int, k: int) -> None:
    kern = polydl.matmul(M=m, N=n, K=k, dtype="bfloat16")
    assert [(a.name, a.dtype) for a in kern.arguments] == [
        ("C", "float32"), ("A", "bfloat16"), ("B", "bfloat16")]
    rng = np.random.default_rng(1)
    a, b = bf16(rng, m, k), bf16(rng, k, n)
    got = kern(a, b)
    assert got.dtype == np.float32
    # fp32 accumulation of exact bf16 products: close to the float64 product of the same values
    want = f32(a).astype(np.float64) @ f32(b).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * k)
    # raw uint16 bits are the same numbers
    np.testing.assert_array_equal(kern(a.view(np.uint16), b.view(np.uint16)), got)
    run_and_check(kern)


def test_c_spec_spellings_and_argument_checks() -> None:
    kern = polydl.compile(BF16_MATMUL, {"M": 8, "N": 16, "K": 4})
    assert [a.dtype for a in kern.arguments] == ["float32", "bfloat16", "bfloat16"]
    rng = np.random.default_rng(2)
    a, b = bf16(rng, 8, 4), bf16(rng, 4, 16)
    np.testing.assert_allclose(kern(a, b), f32(a) @ f32(b), rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="bfloat16"):
        kern(f32(a), b)
    with pytest.raises(SpecError) as info:
        polydl.compile(BF16_MATMUL.replace("__bf16 B", "half B"), {"M": 8, "N": 16, "K": 4})
    assert info.value.line == 2  # positions count from the spec's first line


@pytest.mark.parametrize("layout", ["nchw", "nchw16c"])
@pytest.mark.slow
def test_conv2d_bf16_with_fused_epilogues(layout: str) -> None:
    n, c, k, h, w = 2, 16, 32, 9, 8
    kern = polydl.conv2d(N=n, C=c, K=k, H=h, W=w, R=3, S=3, padding=1, dtype="bfloat16",
                         layout=layout, fuse=("bias", "relu"))
    assert kern.schedule.microkernel is not None and kern.schedule.epilogues
    rng = np.random.default_rng(3)
    x, wt = bf16(rng, n, c, h, w), bf16(rng, k, c, 3, 3)
    b = rng.uniform(-1, 1, k).astype(np.float32)
    if layout == "nchw16c":
        got = layouts.from_nchw16c(kern(blocked(x), blocked_weights(wt), b), k)
    else:
        got = kern(x, wt, b)
    want = np.maximum(conv2d_numpy(f32(x), f32(wt), 1, 1) + b[None, :, None, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    run_and_check(kern)


def test_bf16_kernels_use_the_machines_bf16_path() -> None:
    kern = polydl.matmul(M=32, N=64, K=32, dtype="bfloat16")
    isa = host_target().isa
    if isa == "avx512bf16":
        assert "_mm512_dpbf16_ps(" in kern.source
    elif isa == "avx2":
        # bf16 -> fp32 by a 16-bit shift on load, then FMA
        assert "_mm256_slli_epi32" in kern.source and "_mm256_fmadd_ps" in kern.source


def test_bf16_conv_sees_weights_changed_in_place_between_calls() -> None:
    """Where a microkernel keeps a packed copy of the weights across calls (AMX), each call of
    the generated function packs them anew: new values at the same address are used."""
    n, c, k, h, w = 2, 32, 16, 7, 7
    kern = polydl.conv2d(N=n, C=c, K=k, H=h, W=w, R=3, S=3, padding=1, dtype="bfloat16",
                         layout="nchw16c")
    if host_target().isa == "avx512amx":
        assert "_tile_dpbf16ps(" in kern.source and "_pd_tile_generation" in kern.source
    rng = np.random.default_rng(5)
    x, wt = bf16(rng, n, c, h, w), bf16(rng, k, c, 3, 3)
    xb, wb = blocked(x), blocked_weights(wt)
    for _ in range(2):
        got = layouts.from_nchw16c(kern(xb, wb), k)
        want = conv2d_numpy(f32(x), f32(wt), 1, 1)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        wt = bf16(rng, k, c, 3, 3)
        wb[...] = blocked_weights(wt)  # same buffer


def test_a_bf16_copy_moves_the_bits() -> None:
    """A bf16 element stored from a bf16 element is a copy: no round trip through float (the
    positions a strided 1 x 1 layer reads, copied together first)."""
    kernel = polydl.conv2d(N=1, C=16, K=16, H=13, W=13, R=1, S=1, stride=2, layout="nchw16c",
                           dtype="bfloat16")
    assert "xs[" in kernel.source
    assert "_pd_f32_to_bf16(_pd_bf16_to_f32(" not in kernel.source


@pytest.mark.parametrize("constant", [(), ("w",)])
@pytest.mark.slow
def test_amx_calls_read_kept_weights_from_one_copy_in_k_pairs(constant: tuple[str, ...]) -> None:
    """Built for Sapphire Rapids, weights the caller keeps between calls are copied in k pairs
    at the first call, on the function's threads, into a copy the library keeps; each call
    reads that copy at its own offset plus its column. Weights given anew at each call are
    copied by the calls themselves."""
    kern = polydl.conv2d(N=8, C=64, K=64, H=8, W=8, R=3, S=3, padding=1, dtype="bfloat16",
                         layout="nchw16c", machine="sapphirerapids", constant=constant)
    source = kern.source
    kept = bool(constant)
    assert ("/* w in k pairs for the AMX calls */" in source) == kept
    assert ("_pd_b = _pd_pairs_w + _pd_o + _pd_o % 16L;" in source) == kept
    assert ("pd_kept_take(_pd_kept_slots_pd_pairs_w" in source) == kept
    assert ("_mm512_permutexvar_epi16" in source) != kept  # the calls' own copies
    assert ("constants_changed" in kern.header) == kept


@pytest.mark.skipif(host_target().isa != "avx512amx", reason="needs a CPU with AMX-BF16")
@pytest.mark.slow
def test_amx_convolution_on_kept_weights_in_k_pairs() -> None:
    """Kept weights read in k pairs give numpy's convolution; changed in place they are
    paired again after `constants_changed()`, a new array at once."""
    n, c, k, h, w = 16, 64, 48, 9, 9
    kern = polydl.conv2d(N=n, C=c, K=k, H=h, W=w, R=3, S=3, padding=1, dtype="bfloat16",
                         layout="nchw16c", constant=("w",))
    assert "_pd_pairs_w" in kern.source
    rng = np.random.default_rng(7)
    x, wt = bf16(rng, n, c, h, w), bf16(rng, k, c, 3, 3)
    xb, wb = blocked(x), blocked_weights(wt)
    for step in range(3):
        got = layouts.from_nchw16c(kern(xb, wb), k)
        np.testing.assert_allclose(got, conv2d_numpy(f32(x), f32(wt), 1, 1), rtol=1e-4, atol=1e-4)
        wt = bf16(rng, k, c, 3, 3)
        if step == 0:  # in place
            wb[...] = blocked_weights(wt)
            kern.constants_changed()
        else:  # another array
            wb = blocked_weights(wt)
    run_and_check(kern)


@pytest.mark.skipif(host_target().isa != "avx512amx", reason="needs a CPU with AMX-BF16")
@pytest.mark.parametrize("m, n, k", [(100, 48, 30), (2, 1000, 256)])
@pytest.mark.slow
def test_amx_matmul_on_a_kept_b_in_k_pairs(m: int, n: int, k: int) -> None:
    kern = polydl.matmul(M=m, N=n, K=k, dtype="bfloat16", constant=("B",))
    assert "_pd_pairs_B" in kern.source
    rng = np.random.default_rng(2)
    a, b = bf16(rng, m, k), bf16(rng, k, n)
    for _ in range(2):
        want = f32(a).astype(np.float64) @ f32(b).astype(np.float64)
        np.testing.assert_allclose(kern(a, b), want, rtol=1e-5, atol=1e-5 * k)
        b = bf16(rng, k, n)
