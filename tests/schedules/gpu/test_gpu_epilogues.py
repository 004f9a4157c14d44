"""GPU GEMM plans on Hopper: which operands the tensor-memory accelerator can address, and the
neighbouring statements fused into the GEMM kernel (starting value and epilogue)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from polydl.frontends import builders
from polydl.frontends.c_loopnest import read_c
from polydl.poly.model import build_model
from polydl.schedules.gpu.operands import tma_operands, wgmma_b_major
from polydl.schedules.gpu.planning import gpu_schedule
from polydl.schedules.gpu.plans import WindowMap
from polydl.schedules.gpu.variants import FmaTiling, MmaTiling, TmaTiling, WgmmaTiling
from polydl.target.gpu import DEFAULT_GPUS
from tests.kernels import with_bf16 as _bf16

HOPPER = DEFAULT_GPUS["cuda"]

INIT_BIAS_RELU = """
void dense(int M, int N, int K, float C[M][N], const float A[M][K], const float B[K][N],
           const float bias[N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      C[i][j] = bias[j];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      C[i][j] = fmaxf(C[i][j], 0.0f);
}
"""

# The statement after the GEMM reads C at a cell the same block does not own: not an epilogue.
TRANSPOSED_READ = """
void mmt(int M, int K, float C[M][M], float D[M][M], const float A[M][K], const float B[K][M]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < M; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < M; j++)
      D[i][j] = C[j][i] + 1.0f;
}
"""

LINEAR = """
void linear(int N, int C, int K, float y[N][K], const float x[N][C], const float w[K][C]) {
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++)
      for (int c = 0; c < C; c++)
        y[n][k] += x[n][c] * w[k][c];
}
"""



def _plans(nest, params):  # type: ignore[no-untyped-def]
    return gpu_schedule(build_model(nest, params), HOPPER).kernels


# ----------------------------------------------------------------------------- TMA operands


def test_row_major_bf16_operands_are_tensor_maps() -> None:
    nest, params = builders.matmul(1000, 2048, 520)
    (plan,) = _plans(_bf16(nest, {"A", "B"}), params)
    g = plan.gemm
    assert isinstance(g.tiling, TmaTiling) and g.tma is not None
    # A K-major (k innermost, rows 520 elements = 1040 bytes apart); B N-major
    assert g.tma.a.extents == (520, 1000) and g.tma.a.strides == (1040,)
    assert g.tma.a.roles == ("k", "m") and g.tma.a.box == (64, g.tiling.block_m)
    assert g.tma.b_major == "n" and g.tma.b.extents == (2048, 520) and g.tma.b.box == (64, 64)


def test_weights_read_along_k_are_a_k_major_tensor_map() -> None:
    nest = _bf16(read_c(LINEAR).nest, {"x", "w"})
    (plan,) = _plans(nest, {"N": 256, "C": 512, "K": 384})
    tma = plan.gemm.tma
    assert tma is not None and tma.b_major == "k"
    assert tma.b.roles == ("k", "n") and tma.b.extents == (512, 384) and tma.b.strides == (1024,)


def test_batched_operands_gain_a_tensor_map_dimension() -> None:
    text = (Path(__file__).resolve().parents[3] / "examples" / "batched_matmul.c").read_text()
    nest = _bf16(read_c(text).nest, {"X", "Y"})
    (plan,) = _plans(nest, {"B": 4, "M": 256, "N": 128, "K": 64})
    tma = plan.gemm.tma
    assert tma is not None and tma.a.rank == 3 and tma.a.roles[2] == f"z_{plan.gemm.batch[0].var}"
    assert tma.a.strides == (128, 256 * 64 * 2)


def test_operands_tma_cannot_address_fall_back() -> None:
    nest, params = builders.matmul(64, 36, 64)  # rows of B 72 bytes apart: not 16-byte aligned
    (plan,) = _plans(_bf16(nest, {"A", "B"}), params)
    assert tma_operands(plan.gemm) is None and isinstance(plan.gemm.tiling, MmaTiling)
    fp32, fp32_params = builders.matmul(256, 256, 256)
    (plan,) = _plans(fp32, fp32_params)
    assert plan.gemm.tma is None and isinstance(plan.gemm.tiling, FmaTiling)
    (plan,) = gpu_schedule(build_model(_bf16(fp32, {"A", "B"}), fp32_params),
                           replace(HOPPER, tensor_memory_accelerator=False)).kernels
    assert isinstance(plan.gemm.tiling, WgmmaTiling)


def test_channels_last_convolutions_feed_tensor_cores_in_16_byte_runs() -> None:
    # 3x3 over 48 channels: the im2col rows of x are runs of c; the weights w[k][r][s][c] are
    # K-major
    nest, params = builders.conv2d(32, 48, 64, 56, 56, 3, 3, 1, 1, layout="nhwc", dtype="bfloat16")
    conv = next(p for p in _plans(nest, params) if p.gemm is not None)
    assert isinstance(conv.gemm.tiling, WgmmaTiling) and wgmma_b_major(conv.gemm) == "k"
    assert [d.var for d in conv.gemm.k] == ["r", "s", "c"]
    # 1x1 at stride 1: (n, p, q) is one strided dimension of x, so the whole layer is a TMA GEMM
    nest, params = builders.conv2d(32, 256, 64, 56, 56, 1, 1, layout="nhwc", dtype="bfloat16")
    (conv,) = _plans(nest, params)
    assert isinstance(conv.gemm.tiling, TmaTiling) and conv.gemm.tma.a.extents == (256, 32 * 56 * 56)
    # 3x3 with whole 64-channel steps: x is a window TMA reads, a 2-D tile of output positions
    nest, params = builders.conv2d(32, 128, 128, 28, 28, 3, 3, 1, 1, layout="nhwc", dtype="bfloat16")
    (conv,) = _plans(nest, params)
    window = conv.gemm.tma.a
    assert isinstance(conv.gemm.tiling, TmaTiling) and isinstance(window, WindowMap)
    assert [(a.m, a.k) for a in window.axes] == [(None, "c"), ("q", "s"), ("p", "r"), ("n", None)]
    # x itself, not its zero-padded copy: the boxes start one row and column before the edge
    assert window.source == "x" and window.copy == "S0" and window.extents == (128, 28, 28, 32)
    assert window.offsets == (0, -1, -1, 0)
    assert [p.name for p in _plans(nest, params)] == ["S1"]  # no launch for the copy
    assert "reads x through TMA boxes zero-filled at its edges (S0, its padded copy, dropped)" in conv.describe()
    tile = dict(window.tile_m)
    assert tile["n"] == 1 and tile["p"] * tile["q"] == conv.gemm.tiling.block_m
    # at stride 2 the boxes take every second element along p and q
    nest, params = builders.conv2d(32, 128, 128, 28, 28, 3, 3, 2, 1, layout="nhwc", dtype="bfloat16")
    (conv,) = _plans(nest, params)
    window = conv.gemm.tma.a
    assert window.element_strides == (1, 2, 2, 1)
    assert window.box[1] == 2 * dict(window.tile_m)["q"] and window.box[2] == 2 * dict(window.tile_m)["p"]
    # NCHW windows: staged channels-last (`gpu_staging`), the same TMA window GEMM; without
    # the staging (a device without wgmma) they are gathered element by element
    nest, params = builders.conv2d(32, 64, 64, 56, 56, 3, 3, 1, 1, dtype="bfloat16")
    conv = next(p for p in _plans(nest, params) if p.gemm is not None)
    assert isinstance(conv.gemm.tiling, TmaTiling) and [d.var for d in conv.gemm.k] == ["r", "s", "c"]
    ampere = replace(HOPPER, warpgroup_mma=False, tensor_memory_accelerator=False)
    conv = next(p for p in gpu_schedule(build_model(nest, params), ampere).kernels if p.gemm is not None)
    assert wgmma_b_major(conv.gemm) is None and isinstance(conv.gemm.tiling, MmaTiling)


def test_tf32_is_an_opt_in_for_k_major_float32_operands() -> None:
    nest, params = builders.conv2d(32, 64, 64, 56, 56, 3, 3, 1, 1, layout="nhwc")
    plain = gpu_schedule(build_model(nest, params), HOPPER).kernels
    assert isinstance(next(p for p in plain if p.gemm is not None).gemm.tiling, FmaTiling)
    tf32 = replace(HOPPER, allow_tf32=True)
    (conv,) = gpu_schedule(build_model(nest, params), tf32).kernels
    t = conv.gemm.tiling
    assert isinstance(t, TmaTiling) and t.operand_bytes == 4 and t.block_k == 32
    assert conv.gemm.tma.a.box[0] == 32 and conv.gemm.tma.a.strides[0] == 64 * 4
    assert "float32 operands as TF32" in conv.describe()
    # TF32 wgmma reads B K-major only: a row-major B[K][N] keeps the FMA kernel
    mm, mm_params = builders.matmul(1024, 1024, 1024)
    (plan,) = gpu_schedule(build_model(mm, mm_params), tf32).kernels
    assert isinstance(plan.gemm.tiling, FmaTiling)
    assert tf32.key() != HOPPER.key()


# ----------------------------------------------------------------------------- epilogues


def test_initial_value_and_activation_fuse_into_one_launch() -> None:
    nest = _bf16(read_c(INIT_BIAS_RELU).nest, {"A", "B"})
    (plan,) = _plans(nest, {"M": 512, "N": 512, "K": 256})
    e = plan.gemm.epilogue
    assert e is not None and e.initializer == "S0" and e.statements == ("S2",)
    assert [o.array for o in e.operands] == ["bias"]
    assert dict(e.operands[0].strides) == {"j": 1}
    text = plan.describe()
    assert "C starts at e0 (S0 fused)" in text and "acc = fmax(acc, 0.0)" in text


def test_conv_bias_relu_is_one_kernel_at_batch_32() -> None:
    nest, params = builders.conv2d(32, 256, 64, 56, 56, 1, 1, fuse=("bias", "relu"))
    (conv,) = _plans(nest, params)
    assert conv.gemm.epilogue is not None
    assert conv.gemm.epilogue.statements == ("S1", "S2")
    assert "epilogue S1, S2 in the kernel" in conv.describe()


def test_split_reduction_keeps_its_neighbours() -> None:
    # a 7x7 output with 4608-long reductions: K is split over blocks meeting in atomics, so no
    # block sees a final cell (stride 2: a stride-1 3 x 3 here would run as Winograd)
    nest, params = builders.conv2d(32, 512, 512, 14, 14, 3, 3, 2, 1, fuse=("bias", "relu"))
    plans = _plans(nest, params)
    conv = next(p for p in plans if p.gemm is not None)
    assert conv.gemm.tiling.splits > 1 and conv.gemm.epilogue is None
    assert len(plans) == 4  # padding copy, conv, bias, relu


def test_reading_another_cell_of_c_is_not_an_epilogue() -> None:
    plans = _plans(read_c(TRANSPOSED_READ).nest, {"M": 512, "K": 512})
    assert len(plans) == 2 and plans[0].gemm.epilogue is None
