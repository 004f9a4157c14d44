"""Convolution windows staged channels-last for the Hopper tensor-core kernels: which nests
are rewritten, the rewritten nest, and the plan made of it (results: tests/runtime)."""

from __future__ import annotations

import pytest

from polydl.frontends import builders
from polydl.frontends.c_loopnest import read_c
from polydl.ir import IntVar, Loop, eval_int, walk_statements
from polydl.poly.model import build_model
from polydl.schedules.gpu.planning import gpu_schedule
from polydl.schedules.gpu.staging import stage_channels_last
from polydl.target.gpu import DEFAULT_GPUS, device_for

HOPPER = DEFAULT_GPUS["cuda"]


def test_a_padded_nchw_window_reads_channels_last_copies() -> None:
    nest, params = builders.conv2d(2, 64, 32, 20, 20, 3, 3, 1, 1, dtype="bfloat16", fuse=("bias", "relu"),
                                   accumulate=False)
    staged = stage_channels_last(nest, params, HOPPER)
    # the padded copy only the GEMM reads is laid out channels-last; the weights get a copy
    assert [str(e) for e in staged.array("xp").shape][-1] == str(IntVar("C"))
    w_cl = staged.array("_pd_w_cl")  # generated names begin with _pd_
    assert w_cl.local and w_cl.filled and w_cl.shape[-1] == IntVar("C")
    statements = {s.name: (s, chain) for s, chain in walk_statements(staged.body)}
    gemm, chain = next((s, c) for s, c in statements.values() if s.op == "+=" and "_pd_w_cl" in str(s.value))
    assert [lp.var for lp in chain if isinstance(lp, Loop)][-3:] == ["r", "s", "c"]
    assert list(statements) == [f"S{i}" for i in range(len(statements))]
    plan = gpu_schedule(build_model(nest, params), HOPPER)
    text = plan.describe()
    assert plan.model is not None and "k=(r, s, c)" in text and "gemm[tma]" in text
    assert "S0 writes _pd_w_cl, S1 writes xp" in dict(plan.notes)["staged"]  # explain prints it
    assert "tiles of iw x c through shared memory" in text  # x into the padded channels-last copy
    assert "tiles of _pd_a3 x _pd_a1 through shared memory" in text  # w's 3 x 3 taps: short runs, still tiles
    assert "epilogue" in text and "C starts at 0.0" in text  # the fused start, bias and ReLU kept


def test_a_strided_1x1_gathers_the_cells_it_reads() -> None:
    nest, params = builders.conv2d(2, 64, 32, 40, 40, 1, 1, 2, dtype="bfloat16")
    staged = stage_channels_last(nest, params, HOPPER)
    x_cl = staged.array("_pd_x_cl")  # x[n][c][2p][2q] as x_cl[n][p][q][c]: a quarter of x
    assert [eval_int(e, params) for e in x_cl.shape] == [2, 20, 20, 64] and x_cl.filled
    assert "_pd_w_cl" not in {a.name for a in staged.arrays}  # w[k][c][0][0] runs along c already
    text = gpu_schedule(build_model(nest, params), HOPPER).describe()
    assert "tiles of q x c through shared memory" in text and "gemm[tma] batch=(n); m=(k); n=(p, q); k=(c)" in text


def test_rows_of_7x7_positions_are_gathered_channels_last() -> None:
    # 49 positions: no 16-byte rows of x for TMA or cp.async
    nest, params = builders.conv2d(2, 64, 32, 7, 7, 1, 1, dtype="bfloat16")
    text = gpu_schedule(build_model(nest, params), HOPPER).describe()
    assert "tiles of q x c through shared memory" in text and "gemm[tma]" in text


@pytest.mark.parametrize("case", ["1x1", "float32", "nhwc", "stem", "grouped", "no_wgmma"])
def test_nests_the_tensor_cores_read_in_runs_are_left_alone(case: str) -> None:
    target = HOPPER
    if case == "1x1":  # rows of 256 positions: the input is B of a TMA GEMM as it is
        nest, params = builders.conv2d(2, 64, 32, 16, 16, 1, 1, dtype="bfloat16")
    elif case == "float32":
        nest, params = builders.conv2d(2, 64, 32, 14, 14, 3, 3, 1, 1)
    elif case == "nhwc":
        nest, params = builders.conv2d(2, 64, 32, 14, 14, 3, 3, 1, 1, layout="nhwc", dtype="bfloat16")
    elif case == "stem":  # 3 channels: no 16-byte runs either way
        nest, params = builders.conv2d(2, 3, 32, 30, 30, 7, 7, 2, 3, dtype="bfloat16")
    elif case == "grouped":  # the channel is g * 8 + c in x: not a dimension of its own
        nest, params = builders.conv2d(2, 32, 32, 14, 14, 3, 3, 1, 1, dtype="bfloat16", groups=4)
    else:
        nest, params = builders.conv2d(2, 64, 32, 14, 14, 3, 3, 1, 1, dtype="bfloat16")
        target = device_for("cuda", warpgroup_mma=False, tensor_memory_accelerator=False)
    assert stage_channels_last(nest, params, target) is nest
    assert gpu_schedule(build_model(nest, params), target).model is None


WRITTEN_AROUND = """
void conv(int N, int C, int K, bfloat16 x[N][C][12][12], const bfloat16 w[K][C][3][3],
          float y[N][K][10][10]) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int h = 0; h < 12; h++)
        for (int v = 0; v < 12; v++)
          x[n][c][h][v] = x[n][c][h][v] * 2.0;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++)
      for (int p = 0; p < 10; p++)
        for (int q = 0; q < 10; q++)
          for (int c = 0; c < C; c++)
            for (int r = 0; r < 3; r++)
              for (int s = 0; s < 3; s++)
                y[n][k][p][q] += x[n][c][p + r][q + s] * w[k][c][r][s];
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int h = 0; h < 12; h++)
        for (int v = 0; v < 12; v++)
          x[n][c][h][v] = 0.0;
}
"""


def test_a_copy_reads_its_source_as_the_gemm_would() -> None:
    # x is scaled before the convolution and cleared after it: its copy goes between the
    # scaling and the convolution, not after the clearing
    nest = read_c(WRITTEN_AROUND).nest
    staged = stage_channels_last(nest, {"N": 2, "C": 16, "K": 8}, HOPPER)
    order = [(s.target.array, [a.array for a in s.reads]) for s, _ in walk_statements(staged.body)]
    writes = [target for target, _ in order]
    assert writes == ["_pd_w_cl", "x", "_pd_x_cl", "y", "x"], order  # w is never written: its copy first
    assert order[3][1] == ["y", "_pd_x_cl", "_pd_w_cl"]
