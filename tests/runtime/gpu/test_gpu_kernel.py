"""The CUDA runtime: argument checks (no GPU needed, only nvcc) and results on a GPU (marked
`gpu`): numpy arrays with copies, PyTorch/CuPy device arrays without, against the numpy
reference of the same loop nest."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl.api import build_kernel
from polydl.errors import PolyDLError, ShapeError
from polydl.frontends import builders
from polydl.frontends.c_loopnest import read_c
from polydl.runtime.inputs import random_inputs
from polydl.runtime.verify import compare
from tests.kernels import ROWSUM, WAVEFRONT
from tests.kernels import with_bf16 as _bf16
from tests.schedules.gpu.test_gpu_epilogues import INIT_BIAS_RELU as DENSE
from tests.schedules.gpu.test_gpu_epilogues import LINEAR

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not _has_gpu(), reason="no NVIDIA GPU")

BATCHED = (Path(__file__).resolve().parents[3] / "examples" / "batched_matmul.c").read_text()



@needs_nvcc
def test_arguments_are_checked_before_any_device_call() -> None:
    k = polydl.matmul(16, 8, 4, target="cuda")
    a, b = np.ones((16, 4), np.float32), np.ones((4, 8), np.float32)
    with pytest.raises(ShapeError, match="'A'.*wrong shape"):
        k(np.ones((16, 5), np.float32), b)
    with pytest.raises(ShapeError, match="'B'.*wrong dtype"):
        k(a, b.astype(np.float64))
    with pytest.raises(ShapeError, match="missing input B"):
        k(a)
    with pytest.raises(ShapeError, match="no argument 'D'"):
        k(a, b, D=a)
    with pytest.raises(ShapeError, match="C-contiguous"):
        k(np.ones((4, 16), np.float32).T, b)


CASES = {
    "matmul": lambda: builders.matmul(130, 70, 33),
    "matmul_bf16": lambda: (_bf16(builders.matmul(128, 256, 64)[0], {"A", "B"}), {"M": 128, "N": 256, "K": 64}),
    "matmul_bf16_ragged": lambda: (_bf16(builders.matmul(100, 36, 20)[0], {"A", "B"}), {"M": 100, "N": 36, "K": 20}),
    "batched": lambda: (read_c(BATCHED).nest, {"B": 3, "M": 40, "N": 72, "K": 24}),
    "batched_bf16": lambda: (_bf16(read_c(BATCHED).nest, {"X", "Y"}), {"B": 2, "M": 64, "N": 64, "K": 64}),
    "conv_fused": lambda: builders.conv2d(2, 5, 7, 9, 11, 3, 3, 2, 1, fuse=("bias", "relu", "residual")),
    "conv_1x1": lambda: builders.conv2d(1, 16, 24, 8, 8, 1, 1),
    "conv_blocked": lambda: builders.conv2d(1, 16, 16, 6, 6, 3, 3, 1, 1, layout="nchw16c"),
    # TMA-fed persistent kernels: ragged edges by the tensor maps' bounds, B read along K,
    # the starting value and ReLU fused with a bf16 output, batched tensor maps
    "tma_ragged": lambda: (_bf16(builders.matmul(200, 136, 72)[0], {"A", "B"}), {"M": 200, "N": 136, "K": 72}),
    "tma_linear": lambda: (_bf16(read_c(LINEAR).nest, {"x", "w"}), {"N": 300, "C": 136, "K": 264}),
    "tma_dense_bf16_out": lambda: (_bf16(read_c(DENSE).nest, {"A", "B", "C", "bias"}), {"M": 384, "N": 520, "K": 200}),
    "tma_matmul_bf16_out_staged": lambda: (_bf16(builders.matmul(200, 264, 72)[0], {"A", "B", "C"}),
                                           {"M": 200, "N": 264, "K": 72}),
    "tma_batched": lambda: (_bf16(read_c(BATCHED).nest, {"X", "Y"}), {"B": 3, "M": 192, "N": 264, "K": 136}),
    "conv_fused_in_kernel": lambda: builders.conv2d(16, 64, 64, 16, 16, 1, 1, fuse=("bias", "relu", "residual")),
    "conv_bf16_fused_in_kernel": lambda: builders.conv2d(4, 16, 32, 20, 20, 3, 3, 1, 1, dtype="bfloat16",
                                                         fuse=("bias", "relu", "residual")),
    # channels last, bf16: the 3x3 gather through wgmma with K-major weights, the 1x1 a TMA GEMM
    "wgmma_conv_nhwc": lambda: builders.conv2d(2, 16, 32, 12, 12, 3, 3, 1, 1, layout="nhwc", dtype="bfloat16",
                                               fuse=("bias", "relu", "residual")),
    "wgmma_conv_nhwc_strided": lambda: builders.conv2d(2, 24, 40, 11, 11, 3, 3, 2, 1, layout="nhwc",
                                                       dtype="bfloat16"),
    "tma_conv_nhwc_1x1": lambda: builders.conv2d(2, 32, 72, 10, 10, 1, 1, layout="nhwc", dtype="bfloat16",
                                                 fuse=("bias", "relu")),
    "wgmma_conv_nhwc_overwrite": lambda: builders.conv2d(2, 16, 64, 12, 12, 3, 3, 1, 1, layout="nhwc",
                                                         dtype="bfloat16", fuse=("bias",), accumulate=False),
    # 3x3 channels last with whole 64-channel steps: x read as a window by TMA (2-D tiles of
    # output positions, ragged on both edges, several channel steps per tap)
    "tma_conv_nhwc_window": lambda: builders.conv2d(2, 64, 64, 10, 9, 3, 3, 1, 1, layout="nhwc", dtype="bfloat16",
                                                    fuse=("bias", "relu", "residual"), accumulate=False),
    "tma_conv_nhwc_window_wide": lambda: builders.conv2d(3, 128, 72, 7, 13, 3, 3, 1, (0, 1, 2, 1), layout="nhwc",
                                                         dtype="bfloat16"),
    "tma_conv_nhwc_window_strided": lambda: builders.conv2d(2, 64, 48, 11, 9, 3, 3, 2, 1, layout="nhwc",
                                                            dtype="bfloat16", accumulate=False),
    "tma_conv_nhwc_1x1_strided": lambda: builders.conv2d(2, 128, 64, 14, 13, 1, 1, 2, 0, layout="nhwc",
                                                         dtype="bfloat16", fuse=("bias",)),
    "tma_conv_nhwc_bf16_out": lambda: builders.conv2d(2, 64, 64, 9, 10, 3, 3, 1, 1, layout="nhwc", dtype="bfloat16",
                                                      fuse=("bias", "relu"), accumulate=False, out_dtype="bfloat16"),
    "tma_conv_nhwc_window_unpadded": lambda: builders.conv2d(2, 64, 32, 9, 8, 3, 3, layout="nhwc", dtype="bfloat16",
                                                             accumulate=False),
    # NCHW 1 x 1: the weights are A, the images a batch of B = x[n] (positions along N), C
    # stored along its rows of positions; ragged tiles within each image
    "tma_conv_nchw_1x1": lambda: builders.conv2d(2, 64, 48, 16, 16, 1, 1, dtype="bfloat16",
                                                 fuse=("bias", "relu", "residual")),
    "tma_conv_nchw_1x1_ragged": lambda: builders.conv2d(3, 32, 40, 12, 10, 1, 1, dtype="bfloat16",
                                                        accumulate=False, out_dtype="bfloat16"),
    # 7 x 7 positions (no 16-byte rows): gathered channels-last first
    "tma_conv_nchw_1x1_gathered": lambda: builders.conv2d(2, 64, 32, 7, 7, 1, 1, dtype="bfloat16"),
    "wavefront": lambda: (read_c(WAVEFRONT).nest, {"N": 20}),
    "rowsum": lambda: (read_c(ROWSUM).nest, {"N": 50, "M": 37}),
    # fp32 3 x 3 by Winograd: F(4x4) with bias, residual and ReLU in the output transform;
    # F(2x2) over 7 x 7 (tiles cut at the edge) adding into y
    "winograd_fused": lambda: builders.conv2d(16, 32, 32, 28, 28, 3, 3, 1, 1, fuse=("bias", "residual", "relu"),
                                              accumulate=False),
    "winograd_cut": lambda: builders.conv2d(32, 16, 24, 7, 7, 3, 3, 1, 1),
}


@gpu
@needs_gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_numpy_arrays_match_the_reference(case: str) -> None:
    nest, params = CASES[case]()
    k = build_kernel(nest, params, target="cuda")
    describe = k.schedule.describe()
    for kind in ("tma", "wgmma"):
        if case.startswith(kind + "_"):
            assert f"gemm[{kind}]" in describe, describe
    if "in_kernel" in case or case == "tma_dense_bf16_out":
        assert " in the kernel" in describe, describe
    if case.startswith("winograd"):
        assert "batch=(wino_xi)" in describe, describe
    for seed in (1, 2):  # fresh inputs each time: the kernel must compute the same function
        inputs = random_inputs(k.arguments, seed=seed)
        out = k(*inputs)
        ref = k.reference(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        refs = ref if isinstance(ref, tuple) else (ref,)
        for arg, got, want in zip(k.outputs, outs, refs, strict=True):
            ok, err = compare(got, want, arg.dtype)
            assert ok, f"{case}: {arg.name} relative error {err:.2e}"


@gpu
@needs_gpu
def test_outputs_passed_by_name_accumulate_in_place() -> None:
    k = polydl.matmul(64, 32, 16, target="cuda")
    a, b = (np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in ((64, 16), (16, 32)))
    c = np.ones((64, 32), np.float32)
    assert k(a, b, C=c) is c
    np.testing.assert_allclose(c, 1 + a @ b, rtol=1e-4, atol=1e-4)


@gpu
@needs_gpu
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_torch_tensors_are_used_without_copies() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no GPU")
    k = polydl.matmul(96, 80, 48, target="cuda")
    a = torch.randn(96, 48, device="cuda")
    b = torch.randn(48, 80, device="cuda")
    c = torch.zeros(96, 80, device="cuda")
    assert k(a, b, C=c) is c
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
    fresh = k(a, b)
    assert isinstance(fresh, torch.Tensor) and fresh.is_cuda
    torch.testing.assert_close(fresh, a @ b, rtol=1e-4, atol=1e-4)
    # bfloat16 tensors refuse __cuda_array_interface__: they come through DLPack
    nest, params = builders.matmul(64, 64, 64)
    kb = build_kernel(_bf16(nest, {"A", "B"}), params, target="cuda")
    ab = torch.randn(64, 64, device="cuda").bfloat16()
    bb = torch.randn(64, 64, device="cuda").bfloat16()
    cb = torch.zeros(64, 64, device="cuda")
    kb(ab, bb, C=cb)
    want = ab.double() @ bb.double()
    assert (torch.linalg.norm(cb.double() - want) / torch.linalg.norm(want)).item() < 1e-2
    with pytest.raises(ShapeError, match="'A'.*wrong shape"):
        k(a[:, :47].contiguous(), b)
    with pytest.raises(ShapeError, match="C-contiguous"):
        k(torch.randn(48, 96, device="cuda").t(), b)
    with pytest.raises(ShapeError, match="mixes host and device"):
        k(a, b.cpu().numpy())
    # the checks of the short path for tensors: each refusal is the general path's error
    with pytest.raises(ShapeError, match="'C'.*wrong dtype"):
        k(a, b, C=torch.zeros(96, 80, device="cuda", dtype=torch.float64))
    shared = torch.zeros(96 * 48 + 96 * 80, device="cuda")
    with pytest.raises(ShapeError, match="'C'.*overlaps argument 'A'"):
        k(shared[:96 * 48].view(96, 48), b, C=shared[96 * 48 - 16:-16].view(96, 80))
    with pytest.raises(ShapeError, match="has no argument 'D'"):
        k(a, b, D=c)
    c.zero_()
    assert k(a, B=b, C=c) is c  # an input by name: the general path
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)


@gpu
@needs_gpu
@pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="CuPy is not installed")
def test_cupy_arrays_are_used_without_copies() -> None:
    import cupy

    k = polydl.matmul(64, 48, 32, target="cuda")
    a = cupy.random.standard_normal((64, 32), dtype=cupy.float32)
    b = cupy.random.standard_normal((32, 48), dtype=cupy.float32)
    c = k(a, b)
    assert isinstance(c, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(c), cupy.asnumpy(a) @ cupy.asnumpy(b), rtol=1e-4, atol=1e-4)


def _torch_cuda():  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no GPU")
    return torch


@gpu
@needs_gpu
def test_one_kernel_on_two_streams_at_once() -> None:
    """The padded convolution's scratch copy is per call: two calls in flight on two streams
    each read their own input."""
    torch = _torch_cuda()
    nest, params = builders.conv2d(4, 32, 32, 28, 28, 3, 3, 1, 1)
    k = build_kernel(nest, params, target="cuda")
    streams = [torch.cuda.Stream() for _ in range(2)]
    xs = [torch.randn(4, 32, 28, 28, device="cuda") * (i + 1) for i in range(2)]
    w = torch.randn(32, 32, 3, 3, device="cuda")
    torch.cuda.synchronize()
    for _ in range(20):  # many rounds, so the two calls overlap
        ys = [torch.zeros(4, 32, 28, 28, device="cuda") for _ in range(2)]
        torch.cuda.synchronize()
        for stream, x, y in zip(streams, xs, ys, strict=True):
            with torch.cuda.stream(stream):
                k(x, w, y=y)  # on the current stream
        torch.cuda.synchronize()
        for x, y in zip(xs, ys, strict=True):
            want = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
            assert (torch.linalg.norm(y.double() - want) / torch.linalg.norm(want)).item() < 1e-5


@gpu
@needs_gpu
def test_misaligned_device_arrays_are_refused() -> None:
    torch = _torch_cuda()
    nest, params = builders.matmul(128, 128, 64)
    k = build_kernel(_bf16(nest, {"A", "B"}), params, target="cuda")
    assert k.code.pointer_alignment == 16
    storage = torch.zeros(128 * 64 + 1, device="cuda", dtype=torch.bfloat16)
    a = storage[1:].view(128, 64)  # contiguous, 2 bytes past an aligned address
    b = torch.zeros(64, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ShapeError, match="'A'.*16-byte aligned"):
        k(a, b)


@gpu
@needs_gpu
def test_a_convolution_without_accumulation_overwrites_its_output() -> None:
    """accumulate=False: the zero start is fused into the kernel's store, which never reads y
    (NaN there must not survive)."""
    torch = _torch_cuda()
    nest, params = builders.conv2d(4, 32, 64, 14, 14, 1, 1, layout="nhwc", dtype="bfloat16",
                                   fuse=("bias", "relu"), accumulate=False)
    k = build_kernel(nest, params, target="cuda")
    assert "C starts at 0.0" in k.schedule.describe()
    assert "one aligned pair of C" in k.source or "through shared memory" in k.source
    x = torch.randn(4, 14, 14, 32, device="cuda").bfloat16()
    w = torch.randn(64, 1, 1, 32, device="cuda").bfloat16()
    b = torch.randn(64, device="cuda")
    y = torch.full((4, 14, 14, 64), float("nan"), device="cuda")
    k(x, w, b, y=y)
    want = torch.relu(torch.einsum("nhwc,kc->nhwk", x.double(), w[:, 0, 0].double()) + b.double())
    assert (torch.linalg.norm(y.double() - want) / torch.linalg.norm(want)).item() < 1e-2


@gpu
@needs_gpu
@pytest.mark.parametrize("case", ["linear", "conv_nhwc"])
def test_tf32_kernels_are_within_tf32_error(case: str) -> None:
    """A target with allow_tf32 runs float32 products on the tensor cores: 10-bit mantissas,
    float32 sums (relative error about 1e-3 against float64)."""
    from polydl.target.gpu import device_for

    if case == "linear":
        nest, params = read_c(LINEAR).nest, {"N": 200, "C": 96, "K": 264}
    else:
        nest, params = builders.conv2d(2, 64, 40, 9, 11, 3, 3, 1, 1, layout="nhwc", fuse=("bias", "relu"),
                                       accumulate=False)
    k = build_kernel(nest, params, target=device_for("cuda", allow_tf32=True))
    assert "float32 operands as TF32" in k.schedule.describe()
    inputs = random_inputs(k.arguments, seed=3)
    got, want = k(*inputs), k.reference(*inputs)
    err = float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))
    assert err < 5e-3, err


TRANSPOSED_BF16 = """
void at_bt(int M, int N, int K, bfloat16 A[K][M], bfloat16 B[N][K], float C[M][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[k][i] * B[j][k];
}
"""
# Hopper without its asynchronous units: the warp-level mma.sync kernel for every bf16 GEMM
WARP_MMA_ONLY = {"tensor_memory_accelerator": False, "warpgroup_mma": False}
MMA_CASES = {
    # NCHW: C runs along the output positions, so the weights are A (along K) and the input B
    # (along N: Bs[k][n]); 16-byte runs where the positions come in aligned eights
    "nchw_1x1": (lambda: builders.conv2d(2, 32, 40, 8, 8, 1, 1, dtype="bfloat16", fuse=("bias", "relu")),
                 WARP_MMA_ONLY, "VEC_A = 8, VEC_B = 8"),
    "nchw_1x1_bf16_out": (lambda: builders.conv2d(2, 32, 40, 16, 16, 1, 1, dtype="bfloat16", accumulate=False,
                                                  out_dtype="bfloat16"), WARP_MMA_ONLY, "VEC_A = 8, VEC_B = 8"),
    "nchw_1x1_7x7": (lambda: builders.conv2d(3, 48, 24, 7, 7, 1, 1, dtype="bfloat16", accumulate=False,
                                             out_dtype="bfloat16"), WARP_MMA_ONLY, "VEC_A = 8, VEC_B = 1"),
    # a window stays A (its taps move along C's rows): gathered element by element
    "nchw_3x3": (lambda: builders.conv2d(2, 24, 40, 10, 9, 3, 3, 1, 1, dtype="bfloat16", accumulate=False),
                 WARP_MMA_ONLY, "VEC_A = 1, VEC_B = 8"),
    "nchw_stem": (lambda: builders.conv2d(2, 3, 16, 15, 15, 3, 3, 2, 1, dtype="bfloat16"), WARP_MMA_ONLY,
                  "VEC_A = 1, VEC_B = 1"),
    "gemm_ragged_n": (lambda: (_bf16(builders.matmul(64, 36, 64)[0], {"A", "B"}), {"M": 64, "N": 36, "K": 64}),
                      {}, "VEC_A = 8, VEC_B = 1"),
    "gemm": (lambda: (_bf16(builders.matmul(96, 80, 72)[0], {"A", "B"}), {"M": 96, "N": 80, "K": 72}),
             WARP_MMA_ONLY, "VEC_A = 8, VEC_B = 8"),
    # A[k][i] along M (As[k][m], read back transposed), B[j][k] along K (Bs[n][k])
    "gemm_transposed": (lambda: (read_c(TRANSPOSED_BF16).nest, {"M": 72, "N": 48, "K": 88}),
                        WARP_MMA_ONLY, "VEC_A = 8, VEC_B = 8"),
}


@gpu
@needs_gpu
@pytest.mark.parametrize("case", sorted(MMA_CASES))
def test_warp_mma_kernel_reads_each_operand_along_its_run(case: str) -> None:
    from polydl.target.gpu import device_for

    build, overrides, vectors = MMA_CASES[case]
    nest, params = build()
    k = build_kernel(nest, params, target=device_for("cuda", **overrides))
    assert "gemm[mma]" in k.schedule.describe() and vectors in k.source
    for seed in (1, 2):
        inputs = random_inputs(k.arguments, seed=seed)
        outs, refs = k(*inputs), k.reference(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        refs = refs if isinstance(refs, tuple) else (refs,)
        for arg, got, want in zip(k.outputs, outs, refs, strict=True):
            ok, err = compare(got, want, arg.dtype)
            assert ok, f"{case}: {arg.name} relative error {err:.2e}"


TRANSPOSE = """
void transpose(int M, int N, const float A[M][N], float B[N][M]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      B[j][i] = 2.0f * A[i][j];
}
"""
STAGED_CASES = {
    "wgmma": lambda: builders.conv2d(2, 24, 40, 10, 9, 3, 3, 1, 1, dtype="bfloat16", accumulate=False),
    "window_strided_fused": lambda: builders.conv2d(2, 64, 48, 11, 9, 3, 3, 2, 1, dtype="bfloat16",
                                                    fuse=("bias", "relu", "residual"), out_dtype="bfloat16"),
    "window_ragged_padding": lambda: builders.conv2d(3, 128, 72, 7, 13, 3, 3, 1, (0, 1, 2, 1), dtype="bfloat16"),
    "unpadded": lambda: builders.conv2d(2, 64, 32, 18, 20, 3, 3, dtype="bfloat16", accumulate=False),
    # a strided 1 x 1: only the cells it reads, gathered channels-last; the weights as they are
    "gathered_1x1_strided": lambda: builders.conv2d(2, 64, 48, 14, 13, 1, 1, 2, 0, dtype="bfloat16",
                                                    fuse=("bias", "relu"), out_dtype="bfloat16"),
}


@gpu
@needs_gpu
@pytest.mark.parametrize("case", sorted(STAGED_CASES))
def test_nchw_windows_read_channels_last_copies(case: str) -> None:
    """bf16 NCHW 3 x 3 (and strided 1 x 1) convolutions: the input (or its padded copy) and
    the weights copied channels-last by shared-memory tiles, the window GEMM on the tensor
    cores; checked against the reference of the user's NCHW nest."""
    nest, params = STAGED_CASES[case]()
    k = build_kernel(nest, params, target="cuda")
    describe = k.schedule.describe()
    reduction = "k=(c)" if "1x1" in case else "k=(r, s, c)"
    assert reduction in describe and ("gemm[tma]" in describe or "gemm[wgmma]" in describe), describe
    assert "through shared memory" in describe, describe
    for seed in (1, 2):
        inputs = random_inputs(k.arguments, seed=seed)
        ok, err = compare(k(*inputs), k.reference(*inputs), k.outputs[0].dtype)
        assert ok, f"{case}: relative error {err:.2e}"


@gpu
@needs_gpu
def test_a_transposing_copy_goes_through_shared_memory_tiles() -> None:
    nest = read_c(TRANSPOSE).nest
    k = build_kernel(nest, {"M": 70, "N": 45}, target="cuda")
    assert "tiles of j x i through shared memory" in k.schedule.describe()
    a = np.random.default_rng(0).standard_normal((70, 45)).astype(np.float32)
    np.testing.assert_array_equal(k(a), 2.0 * a.T)


@gpu
@needs_gpu
def test_kernels_are_timed_on_the_device_in_graphs() -> None:
    from polydl.runtime.gpu.timing import device_seconds

    small = build_kernel(*builders.matmul(512, 512, 512), target="cuda")
    assert small.has_device()
    one, again = device_seconds([small, small])
    assert 0 < one < 1e-2 and 0 < again < 1e-2 and 0.5 < one / again < 2.0
    # 64 times the work takes several times as long (a 512^3 product is mostly latency)
    large = build_kernel(*builders.matmul(2048, 2048, 2048), target="cuda")
    (big,) = device_seconds([large])
    assert big > 4 * one


@needs_nvcc
@pytest.mark.skipif(_has_gpu(), reason="checks the machine without a GPU")
def test_numpy_calls_and_device_copies_without_a_device_are_clear_errors() -> None:
    k = polydl.matmul(16, 8, 4, target="cuda")
    a, b = np.ones((16, 4), np.float32), np.ones((4, 8), np.float32)
    assert not k.has_device()
    with pytest.raises(PolyDLError, match="no CUDA device is available"):
        k(a, b)
    with pytest.raises(PolyDLError, match="cannot allocate .* on the device for 'C'"), \
            k.device_copies({"C": np.zeros((16, 8), np.float32), "A": a, "B": b}):
        pass
