"""The CUDA runtime: argument checks (no GPU needed, only nvcc) and results on a GPU (marked
`gpu`): numpy arrays with copies, PyTorch/CuPy device arrays without, against the numpy
reference of the same loop nest."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl.api import build_kernel
from polydl.errors import ShapeError
from polydl.frontends import builders
from polydl.frontends.c_loopnest import read_c
from polydl.runtime.inputs import random_inputs
from polydl.runtime.verify import compare
from tests.kernels import ROWSUM, WAVEFRONT

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not _has_gpu(), reason="no NVIDIA GPU")

BATCHED = (Path(__file__).resolve().parents[2] / "examples" / "batched_matmul.c").read_text()


def _bf16(nest, names):  # type: ignore[no-untyped-def]
    return replace(nest, arrays=tuple(replace(a, dtype="bfloat16") if a.name in names else a for a in nest.arrays))


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
    "wavefront": lambda: (read_c(WAVEFRONT).nest, {"N": 20}),
    "rowsum": lambda: (read_c(ROWSUM).nest, {"N": 50, "M": 37}),
}


@gpu
@needs_gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_numpy_arrays_match_the_reference(case: str) -> None:
    nest, params = CASES[case]()
    k = build_kernel(nest, params, target="cuda")
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
