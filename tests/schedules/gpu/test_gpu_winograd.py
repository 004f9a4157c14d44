"""Winograd's F(m x m, 3 x 3) for the GPU's FMA kernels: which window nests it takes, the
rewritten nest computing what the user's computes (compiled for the CPU here, against the
user's nest's own reference), and the GPU launches it becomes."""

from __future__ import annotations

import numpy as np
import pytest

from polydl.api import build_kernel, lower
from polydl.frontends import builders
from polydl.poly.model import build_model
from polydl.runtime.inputs import random_inputs
from polydl.schedules.gpu import winograd as gpu_winograd
from polydl.schedules.gpu.planning import gpu_schedule
from polydl.schedules.gpu.winograd import window_3x3, winograd_convolutions
from polydl.schedules.winograd import MATRICES
from polydl.target.gpu import DEFAULT_GPUS, device_for

CUDA = DEFAULT_GPUS["cuda"]


def _correlate(d: np.ndarray, g: np.ndarray, m: int) -> np.ndarray:
    return np.array([[np.sum(d[i:i + 3, j:j + 3] * g) for j in range(m)] for i in range(m)])


@pytest.mark.parametrize("m", sorted(MATRICES))
def test_transforms_compute_a_correlation(m: int) -> None:
    """A^T [(G g G^T) . (B^T d B)] A is the m x m correlation of the (m+2) x (m+2) tile d with
    the 3 x 3 filter g, in exact arithmetic (float64 here)."""
    BT, G, AT = (np.array(matrix, dtype=np.float64) for matrix in MATRICES[m])
    rng = np.random.default_rng(m)
    d, g = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
    got = AT @ ((G @ g @ G.T) * (BT @ d @ BT.T)) @ AT.T
    np.testing.assert_allclose(got, _correlate(d, g, m), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_3x3_correlation_of_stride_1_is_found_in_either_layout(layout: str) -> None:
    nest, params = builders.conv2d(2, 16, 24, 8, 8, 3, 3, 1, 1, layout=layout)
    found = [window_3x3(nest, params, i) for i in range(len(nest.body))]
    (g,) = [f for f in found if f is not None]
    assert g.extent == {"n": 2, "k": 24, "p": 8, "q": 8, "c": 16, "r": 3, "s": 3}
    assert (g.x.array, g.w.array, g.statement.target.array) == ("xp", "w", "y")


@pytest.mark.parametrize("sizes", [
    dict(R=3, S=3, stride=2, padding=1),  # strided
    dict(R=1, S=1, stride=1, padding=0),  # no window
    dict(R=5, S=5, stride=1, padding=2),  # 5 x 5
    dict(R=3, S=3, stride=1, padding=2, dilation=2),  # dilated
])
def test_other_windows_are_left_alone(sizes: dict) -> None:
    nest, params = builders.conv2d(2, 16, 24, 8, 8, **sizes)
    assert all(window_3x3(nest, params, i) is None for i in range(len(nest.body)))


def test_bfloat16_is_left_to_the_tensor_cores() -> None:
    nest, params = builders.conv2d(2, 16, 24, 8, 8, 3, 3, 1, 1, dtype="bfloat16")
    assert all(window_3x3(nest, params, i) is None for i in range(len(nest.body)))


CASES = {
    # F(4x4), y set from zero, bias and ReLU folded into the output transform
    "nchw_fused": dict(N=2, C=16, K=24, H=8, W=8, padding=1, fuse=("bias", "relu"), accumulate=False),
    # 7 x 7: F(2x2) tiles cut at the edge, the padded copy grown to whole tiles
    "nchw_cut_residual": dict(N=2, C=16, K=16, H=7, W=7, padding=1, fuse=("bias", "residual", "relu"),
                              accumulate=False),
    # y += conv: nothing to fold, the transform adds into y
    "nchw_accumulate": dict(N=1, C=16, K=16, H=6, W=6, padding=1),
    "nhwc_bias": dict(N=2, C=16, K=16, H=8, W=8, padding=1, layout="nhwc", fuse=("bias",), accumulate=False),
    # no padding: the tiles read the input itself (10 x 10 -> 8 x 8, F(4x4))
    "unpadded": dict(N=2, C=16, K=16, H=10, W=10, padding=0, accumulate=False),
    # 16 x 16 unpadded -> 14 x 14: F(4x4)'s last tiles would read past x, F(2x2)'s fit
    "unpadded_f2": dict(N=2, C=16, K=16, H=16, W=16, padding=0, accumulate=False),
    # uneven pads (1 above and left, 0 below and right) and a rectangle: 8 x 5
    "rectangle": dict(N=2, C=16, K=16, H=9, W=6, padding=(1, 1, 0, 0), fuse=("scale_shift",), accumulate=False),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.slow
def test_the_rewritten_nest_computes_the_convolution(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_winograd, "MIN_TILES", 1)
    sizes = dict(CASES[case])
    nest, params = builders.conv2d(R=3, S=3, stride=1, **sizes)
    rewritten = winograd_convolutions(nest, params, CUDA)
    assert rewritten is not nest and not any(window_3x3(rewritten, params, i) for i in range(len(rewritten.body)))
    original = build_kernel(nest, params, "c")
    kernel = build_kernel(rewritten, params, "c")
    inputs = random_inputs(original.inputs, seed=1)
    expected = np.asarray(original.reference(*inputs))
    got = np.asarray(kernel(*inputs))
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() <= 1e-5 * scale, case


def test_few_tiles_or_tf32_keep_the_direct_kernel() -> None:
    nest, params = builders.conv2d(1, 64, 64, 8, 8, 3, 3, 1, 1)  # 4 tiles
    assert winograd_convolutions(nest, params, CUDA) is nest
    nest, params = builders.conv2d(32, 128, 128, 28, 28, 3, 3, 1, 1)
    assert winograd_convolutions(nest, params, device_for("cuda", allow_tf32=True)) is nest


def test_the_gpu_runs_five_launches_with_the_epilogue_in_the_last() -> None:
    nest, params = builders.conv2d(32, 128, 128, 28, 28, 3, 3, 1, 1, fuse=("bias", "relu"), accumulate=False)
    plan = gpu_schedule(build_model(nest, params), CUDA)
    # the padded copy, U (36 statements, one launch), V (36), the 36 GEMMs from zero, Y (16)
    kinds = [(len(k.statements), k.gemm is not None) for k in plan.kernels]
    assert kinds == [(1, False), (36, False), (36, False), (1, True), (16, False)]
    assert "Winograd" in dict(plan.notes)["staged"]
    source = lower(nest, params, "cuda").code.source
    y_kernel = source[source.rindex("__global__"):]
    assert "b[wino_k]" in y_kernel and "> 0.0f" in y_kernel  # bias and ReLU applied before the store


def _points(nest) -> int:
    """(m+2)^2: the statements writing the transformed input."""
    return sum(1 for s in nest.statements() if s.target.array.startswith("_pd_wino_v"))


def test_the_tile_is_f4_from_12_outputs_a_side_where_its_reads_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_winograd, "MIN_TILES", 1)
    for sizes, points in ((dict(H=14, W=14, padding=1), 36),  # padded copy grown to 18 x 18
                          (dict(H=7, W=7, padding=1), 16),
                          (dict(H=16, W=16, padding=0), 16),  # x itself: 4 x 4 tiles would not fit
                          (dict(H=14, W=14, padding=0), 36)):  # 12 x 12 from 14 x 14: they do
        nest, params = builders.conv2d(2, 16, 16, R=3, S=3, **sizes)
        assert _points(winograd_convolutions(nest, params, CUDA)) == points, sizes
