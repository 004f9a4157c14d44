"""CUDA/HIP code generation: the GPU schedule's choices, the generated text, and real compiles
with nvcc (sm_90) and hipcc (gfx90a, gfx942) where those compilers are installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from polydl.api import lower
from polydl.cli import main as cli_main
from polydl.errors import PolyDLError, ScheduleError
from polydl.frontends import builders
from polydl.frontends.c_loopnest import read_c
from polydl.poly.model import build_model
from polydl.runtime.gpu.toolchain import compile_gpu_library
from polydl.schedules.gpu.planning import gpu_schedule
from polydl.schedules.gpu.tiling import ranked_tilings
from polydl.schedules.gpu.variants import FmaTiling, MmaTiling, TmaTiling, WgmmaTiling
from polydl.target.gpu import DEFAULT_GPUS, device_for
from tests.kernels import ROWSUM, WAVEFRONT
from tests.kernels import with_bf16 as _bf16
from tests.schedules.gpu.test_gpu_epilogues import INIT_BIAS_RELU as DENSE
from tests.schedules.gpu.test_gpu_epilogues import LINEAR

BACKWARD = """
void back(int N, float a[N], float b[N]) {
  for (int i = 1; i < N; i++) {
    a[i] = b[i - 1] + 1.0f;
    b[i] = a[i] * 2.0f;
  }
}
"""



def test_matmul_becomes_a_tiled_gemm() -> None:
    nest, params = builders.matmul(4096, 4096, 4096)
    plan = gpu_schedule(build_model(nest, params), DEFAULT_GPUS["cuda"])
    (kernel,) = plan.kernels
    assert kernel.gemm is not None
    assert [d.var for d in kernel.gemm.m] == ["i"] and [d.var for d in kernel.gemm.k] == ["k"]
    t = kernel.gemm.tiling
    assert isinstance(t, FmaTiling) and (t.block_m, t.block_n) == (128, 128)
    # float4 operands and a grid of many blocks: warp tiles of 16 x 8 a thread in K steps of 16
    assert (t.thread_m, t.thread_n, t.block_k, t.threads) == (16, 8, 16, 128)


def test_a_gemm_too_small_for_two_blocks_a_multiprocessor_keeps_8x8_thread_tiles() -> None:
    # 16 x 4 x 4 blocks of 128 x 128 on 132 multiprocessors: twice the warps a block
    batched = read_c("""
void bmm(float X[16][512][512], float Y[16][512][512], float Z[16][512][512]) {
  for (int b = 0; b < 16; b++)
    for (int i = 0; i < 512; i++)
      for (int j = 0; j < 512; j++)
        for (int k = 0; k < 512; k++)
          Z[b][i][j] += X[b][i][k] * Y[b][k][j];
}""", "<bmm>").nest
    plan = gpu_schedule(build_model(batched, {}), DEFAULT_GPUS["cuda"])
    t = plan.kernels[0].gemm.tiling
    assert (t.thread_m, t.thread_n, t.block_k, t.threads, t.splits) == (8, 8, 8, 256, 1)
    source = lower(batched, {}, "cuda").code.source
    assert "PD_ROW0(g) ((g) * (BM / 2) + ty * 4)" in source
    # held to 128 registers a thread, two blocks a multiprocessor, as the ranking assumed
    assert t.blocks_per_sm == 2 and "PD_LAUNCH_BOUNDS(256, 2)" in source
    assert "256 threads, 2 blocks a multiprocessor" in plan.describe()


def test_8x8_tiles_of_256_threads_come_held_to_two_blocks_and_as_ptxas_chooses() -> None:
    # the timed check (POLYDL_GPU_TILES) decides between the two: a gathered operand's
    # offsets may spill at 128 registers
    nest, params = builders.conv2d(32, 1024, 2048, 14, 14, 1, 1, stride=2, accumulate=False)
    model = build_model(nest, params)
    (kernel,) = [k for k in gpu_schedule(model, DEFAULT_GPUS["cuda"]).kernels if k.gemm is not None]
    statement, plan = kernel.statement, kernel.gemm
    ranked = [t for _, t, _, _ in ranked_tilings(model, statement, plan, DEFAULT_GPUS["cuda"])]
    big = [(t.blocks_per_sm, t.splits) for t in ranked
           if isinstance(t, FmaTiling) and (t.block_m, t.block_n) == (128, 128)]
    assert [b for b, _ in big] == [2, 1] and big[0][1] == big[1][1]
    assert all(t.blocks_per_sm == 1 for t in ranked if t.threads != 256)
    # HIP's launch bound counts waves, not blocks: nothing to choose between there
    hip = ranked_tilings(model, statement, plan, DEFAULT_GPUS["hip"])
    assert all(t.blocks_per_sm == 1 for _, t, _, _ in hip)
    assert ("#define PD_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads)\n"
            in lower(nest, params, "hip").code.source)


def test_warp_tiles_step_k_by_8_where_16_would_copy_over_8_float4s_a_thread() -> None:
    # Winograd's batched GEMMs of a 64-channel layer: 64 x 128 tiles of 64 threads copying 12
    # float4s a step in K steps of 16 spilled beside the 128 accumulators
    nest, params = builders.matmul(4096, 4096, 4096)
    model = build_model(nest, params)
    (kernel,) = gpu_schedule(model, DEFAULT_GPUS["cuda"]).kernels
    ranked = [t for _, t, _, _ in ranked_tilings(model, kernel.statement, kernel.gemm, DEFAULT_GPUS["cuda"])]
    warp = {(t.block_m, t.block_n): t.block_k for t in ranked if (t.thread_m, t.thread_n) == (16, 8)}
    assert warp[(128, 128)] == 16 and warp[(64, 128)] == warp[(128, 64)] == warp[(64, 64)] == 8
    for (bm, bn), bk in warp.items():
        assert (bm + bn) * bk // (4 * (bm // 16) * (bn // 8)) <= 8


def test_bf16_gemm_uses_tensor_cores_on_cuda_only() -> None:
    nest, params = builders.matmul(512, 512, 512)
    nest = _bf16(nest, {"A", "B"})
    cuda = lower(nest, params, "cuda")
    assert isinstance(cuda.schedule.kernels[0].gemm.tiling, TmaTiling)
    assert "wgmma.mma_async" in cuda.code.source and "cp.async.bulk.tensor" in cuda.code.source
    assert cuda.code.compile_flags == ("-gencode=arch=compute_90a,code=sm_90a",)
    assert cuda.code.pointer_alignment == 16  # TMA addresses 16-byte units
    # without the tensor-memory accelerator: wgmma fed by cp.async
    no_tma = device_for("cuda", tensor_memory_accelerator=False)
    plan = gpu_schedule(build_model(nest, params), no_tma)
    assert isinstance(plan.kernels[0].gemm.tiling, WgmmaTiling)
    # rows of 36 elements are not 16-byte runs: warp-level mma.sync with scalar loads
    ragged, ragged_params = builders.matmul(64, 36, 64)
    mma = lower(_bf16(ragged, {"A", "B"}), ragged_params, "cuda")
    assert isinstance(mma.schedule.kernels[0].gemm.tiling, MmaTiling)
    assert "mma.sync.aligned.m16n8k16" in mma.code.source and "VEC_A = 8, VEC_B = 1" in mma.code.source
    hip = lower(nest, params, "hip")
    assert isinstance(hip.schedule.kernels[0].gemm.tiling, FmaTiling)
    assert "pd_mma_bf16(acc" not in hip.code.source and "hip/hip_runtime.h" in hip.code.source


def test_tma_kernel_is_persistent_and_warp_specialised() -> None:
    nest, params = builders.matmul(1000, 2048, 520)
    code = lower(_bf16(nest, {"A", "B"}), params, "cuda").code
    # one tensor map per operand, encoded by the launcher through the driver's entry point,
    # again only when the operand's address changes
    assert code.launcher.count("CUtensorMap matmul_S0_") == 2
    assert code.launcher.count("if (base != encoded_base)") == 2
    assert "cudaGetDriverEntryPoint" in code.launcher and "-lcuda" not in " ".join(code.compile_flags)
    # as many blocks as multiprocessors (or tiles), a producer warpgroup giving up registers
    assert "pd_sms < 128 ? pd_sms : 128" in code.launcher  # 8 x 16 tiles of 128 x 128
    assert "setmaxnreg.dec" in code.source and "setmaxnreg.inc" in code.source
    assert "mbarrier.try_wait.parity" in code.source


def test_tma_tiles_of_a_short_reduction_run_two_blocks_a_multiprocessor() -> None:
    # a 1 x 1 layer of 64 channels: one K step a tile, so a tile's store is as long as its
    # products; two blocks of one consumer warpgroup share a multiprocessor and overlap them
    nest, params = builders.conv2d(32, 64, 64, 56, 56, 1, 1, layout="nhwc", dtype="bfloat16", accumulate=False)
    short = lower(nest, params, "cuda")
    t = short.schedule.kernels[0].gemm.tiling
    assert isinstance(t, TmaTiling) and (t.block_m, t.blocks_per_sm) == (64, 2)
    assert "__launch_bounds__(256, 2)" in short.code.source
    # ptxas fits every thread in half the register file; the consumer may take 216 of it
    assert "setmaxnreg.dec.sync.aligned.u32 40" in short.code.source
    assert "setmaxnreg.inc.sync.aligned.u32 216" in short.code.source
    assert "pd_sms * 2 < " in short.code.launcher and "PreferredSharedMemoryCarveout" in short.code.launcher
    assert "256 threads, 2 blocks a multiprocessor" in short.schedule.describe()
    # 64 K steps a tile: one block of two consumer warpgroups, as before
    nest, params = builders.matmul(4096, 4096, 4096)
    long = lower(_bf16(nest, {"A", "B"}), params, "cuda")
    t = long.schedule.kernels[0].gemm.tiling
    assert isinstance(t, TmaTiling) and t.blocks_per_sm == 1 and t.block_m == 128
    assert "__launch_bounds__(384, 1)" in long.code.source and "u32 232" in long.code.source
    assert "PreferredSharedMemoryCarveout" not in long.code.launcher


def test_an_operand_of_one_tile_is_counted_once() -> None:
    # NCHW 1 x 1, 64 -> 64 channels: the weights (A, 64 rows) are one tile along M and come
    # from memory once, so only the input's tile counts and 64 x 64 tiles (twice the grid of
    # 64 x 128, the same bytes moved) win
    nest, params = builders.conv2d(32, 64, 64, 56, 56, 1, 1, dtype="bfloat16", accumulate=False)
    (gemm,) = [k.gemm for k in lower(nest, params, "cuda").schedule.kernels if k.gemm is not None]
    assert (gemm.size(gemm.m), gemm.tiling.block_m, gemm.tiling.block_n) == (64, 64, 64)
    # 256 output channels: four M tiles, both operands re-read, the wider tile again
    nest, params = builders.conv2d(32, 64, 256, 56, 56, 1, 1, dtype="bfloat16", accumulate=False)
    (gemm,) = [k.gemm for k in lower(nest, params, "cuda").schedule.kernels if k.gemm is not None]
    assert (gemm.size(gemm.m), gemm.tiling.block_m, gemm.tiling.block_n) == (256, 64, 128)


def test_two_blocks_a_multiprocessor_only_where_both_fit() -> None:
    hopper = DEFAULT_GPUS["cuda"]
    assert TmaTiling(64, 128, 64, stages=4, blocks_per_sm=2).blocks_fit(hopper)
    assert TmaTiling(64, 64, 64, stages=6, blocks_per_sm=2).blocks_fit(hopper)
    # 64 x 256: 160 registers a consumer thread, over the 128 of two 256-thread blocks
    assert not TmaTiling(64, 256, 64, stages=2, blocks_per_sm=2).blocks_fit(hopper)
    # two 64 x 128 blocks of 8 stages: over the multiprocessor's 228 KiB of shared memory
    assert not TmaTiling(64, 128, 64, stages=8, blocks_per_sm=2).blocks_fit(hopper)
    assert TmaTiling(128, 128, 64, stages=6).register_split(hopper) == (40, 232)


def test_fp32_operands_contiguous_in_runs_of_4_load_as_float4() -> None:
    nest, params = builders.matmul(512, 256, 128)
    code = lower(nest, params, "cuda").code
    assert "VEC_A = 4, VEC_B = 4" in code.source and code.pointer_alignment == 16
    ragged, ragged_params = builders.matmul(64, 36, 66)  # K = 66: rows of A are not runs of 4
    code = lower(ragged, ragged_params, "cuda").code
    assert "VEC_A = 1, VEC_B = 4" in code.source


def test_conv_operands_load_as_float4_along_whichever_index_runs_in_memory() -> None:
    # NCHW 1 x 1: A (the input) runs along the output positions M, B (the weights) along K; a
    # 7 x 7 image's rows continue one another, 49 positions: no aligned fours
    nest, params = builders.conv2d(N=8, C=64, K=128, H=14, W=14, R=1, S=1, accumulate=False)
    code = lower(nest, params, "cuda").code
    assert "VEC_A = 4, VEC_B = 4" in code.source and "along A's M, along B's K" in code.source
    # C runs along M too: no warp tiles, whose lanes span C's columns; the lanes go along M and
    # each thread stores 4 rows of a column as one float4
    assert "PD_ROW0(g) ((g) * (BM / 2) + ty * 4)" in code.source
    assert "a warp's lanes along M" in code.source and "make_float4(pd_q0, pd_q1, pd_q2, pd_q3)" in code.source
    seven, seven_params = builders.conv2d(N=8, C=64, K=128, H=7, W=7, R=1, S=1, accumulate=False)
    assert "VEC_A = 1, VEC_B = 4" in lower(seven, seven_params, "cuda").code.source
    # 3 x 3: the gathered windows element by element, the weights' (c, r, s) one run along K
    window, window_params = builders.conv2d(N=8, C=64, K=64, H=14, W=14, R=3, S=3, padding=1,
                                            accumulate=False)
    source = lower(window, window_params, "cuda").code.source
    assert "VEC_A = 1, VEC_B = 4" in source
    # each load decodes its K index (c, r, s) on int; M's offsets (once a thread) stay on long
    decode_k = next(line for line in source.splitlines() if "_ak(long idx)" in line)
    decode_m = next(line for line in source.splitlines() if "_am(long idx)" in line)
    assert "const int i = (int)idx;" in decode_k and "(i / 9)" in decode_k
    assert "(int)" not in decode_m


def test_loops_that_continue_one_another_index_without_division() -> None:
    # a bf16 NCHW 1 x 1 at 56 x 56: C's positions (p, q) are one run of 3136, stored as `n`;
    # channels-last, the images and positions (n, p, q) are one run of rows, stored as `m * K`
    def index_line(source: str, name: str) -> str:
        return next(line for line in source.splitlines() if f"_{name}(long idx)" in line)

    for layout, name, body in (("nchw", "cn", "idx * 1L"), ("nhwc", "cm", "idx * 256L")):
        nest, params = builders.conv2d(N=4, C=64, K=256, H=56, W=56, R=1, S=1, dtype="bfloat16",
                                       out_dtype="bfloat16", layout=layout, accumulate=False)
        source = lower(nest, params, "cuda").code.source
        line = index_line(source, name)
        assert "/" not in line and "%" not in line and f"return {body};" in line
        # the staged tile goes out 8 bf16 (16 bytes) a thread at a time
        assert "uint4 q;" in source and "*(uint4 *)cell = q;" in source
    # rows of 36 output channels are runs of 4, not of 8: 4 cells (8 bytes) a store
    narrow, narrow_params = builders.conv2d(N=4, C=64, K=36, H=56, W=56, R=1, S=1, dtype="bfloat16",
                                            out_dtype="bfloat16", layout="nhwc", accumulate=False)
    source = lower(narrow, narrow_params, "cuda").code.source
    assert "uint2 q;" in source and "uint4 q;" not in source


def test_k_is_split_only_where_the_grid_leaves_multiprocessors_idle() -> None:
    # fp32 NCHW 1 x 1s: 32 images at 14 x 14 into 256 channels make 98 tiles of 128 x 128 on
    # 132 multiprocessors: whole (split in two it ran 1.6x slower on an H100); two images make
    # 8 tiles: K split, the slices adding 4 neighbouring cells at once (one Hopper atomic)
    def gemm(n: int) -> str:
        nest, params = builders.conv2d(N=n, C=1024, K=256, H=14, W=14, R=1, S=1, accumulate=False)
        low = lower(nest, params, "cuda")
        return low.schedule.describe(), low.code.source

    whole, _ = gemm(32)
    assert "K split" not in whole and "C starts at 0.0" in whole
    split, source = gemm(2)
    assert "K split 16 ways" in split
    assert "PD_ATOMIC_ADD4(cell, value0, value1, value2, value3);" in source
    assert "atomicAdd((float4 *)(cell)" in source  # the dialect's spelling on CUDA


def test_scratch_is_allocated_per_call_on_the_stream() -> None:
    nest, params = builders.conv2d(2, 16, 32, 14, 14, 3, 3, 2, 1)
    launcher = lower(nest, params, "cuda").code.launcher
    assert "static float *" not in launcher  # no buffer shared by concurrent calls
    assert "pdMallocAsync((void **)&xp" in launcher and "pdFreeAsync(xp, stream)" in launcher


def test_gpu_lowerings_are_stored_and_read_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from polydl.driver import pipeline
    from polydl.schedules.gpu.plans import StoredGpuSchedule

    monkeypatch.setenv("POLYDL_CACHE_DIR", str(tmp_path))
    nest, params = builders.conv2d(32, 64, 64, 28, 28, 1, 1, fuse=("bias", "relu"))
    target = DEFAULT_GPUS["cuda"]
    assert pipeline.stored_lowering(nest, params, target) is None
    fresh = pipeline.lower_and_store(nest, params, target)
    stored = pipeline.stored_lowering(nest, params, target)
    assert stored is not None
    code, schedule, flops = stored
    assert code == fresh.code and flops == fresh.flops
    assert isinstance(schedule, StoredGpuSchedule) and schedule.describe() == fresh.schedule.describe()
    assert "epilogue S1, S2 in the kernel" in schedule.describe()
    # a record whose schedule is not a list of descriptions is lowered again, not trusted
    from polydl.runtime.cache import read_lowering, write_lowering

    key = pipeline.lowering_key(nest, params, target, "auto")
    record = read_lowering(key)
    write_lowering(key, {**record, "schedule": {**record["schedule"], "kernels": "S0"}})
    assert pipeline.stored_lowering(nest, params, target) is None
    # another target is another key
    other = device_for("cuda", multiprocessors=114)
    assert pipeline.lowering_key(nest, params, other, "auto") != pipeline.lowering_key(nest, params, target, "auto")


def test_conv_is_an_implicit_gemm_after_the_padding_copy() -> None:
    nest, params = builders.conv2d(2, 64, 64, 56, 56, 3, 3, 1, 1, fuse=("bias", "relu"))
    plan = gpu_schedule(build_model(nest, params), DEFAULT_GPUS["cuda"])
    copy, conv, bias, relu = plan.kernels
    assert copy.gemm is None and {t.var for t in copy.threads} == {"n", "c", "ih", "iw"}
    assert conv.gemm is not None
    assert {d.var for d in conv.gemm.k} == {"c", "r", "s"}
    assert {d.var for d in conv.gemm.m + conv.gemm.n} == {"n", "k", "p", "q"}
    assert bias.gemm is None and relu.gemm is None


def test_tiles_fit_the_shared_memory_of_the_target() -> None:
    nest, params = builders.matmul(4096, 4096, 4096)
    small = device_for("cuda", shared_memory_bytes=12 * 1024)
    t = gpu_schedule(build_model(nest, params), small).kernels[0].gemm.tiling
    assert 2 * t.block_k * (t.block_m + t.block_n + 8) * 4 <= 12 * 1024
    with pytest.raises(ScheduleError, match="fits the shared memory"):
        gpu_schedule(build_model(nest, params), device_for("cuda", shared_memory_bytes=256))


def test_loops_carrying_dependences_stay_sequential() -> None:
    nest = read_c(WAVEFRONT).nest
    (kernel,) = gpu_schedule(build_model(nest, {"N": 64}), DEFAULT_GPUS["cuda"]).kernels
    assert kernel.threads == () and kernel.sequential == ("i", "j")


def test_reduction_is_sequential_per_thread_in_a_register() -> None:
    nest = read_c(ROWSUM).nest
    (kernel,) = gpu_schedule(build_model(nest, {"N": 100, "M": 37}), DEFAULT_GPUS["cuda"]).kernels
    assert [t.var for t in kernel.threads] == ["i"] and kernel.sequential == ("j",)
    assert kernel.register_accumulator
    code = lower(nest, {"N": 100, "M": 37}, "cuda").code
    assert "_pd_acc +=" in code.source and "s[i] += _pd_acc;" in code.source


def test_statements_that_depend_backwards_are_refused() -> None:
    nest = read_c(BACKWARD).nest
    with pytest.raises(ScheduleError, match="cannot be distributed"):
        gpu_schedule(build_model(nest, {"N": 32}), DEFAULT_GPUS["cuda"])


def test_dialect_differences_live_in_one_place() -> None:
    nest, params = builders.matmul(64, 64, 64)
    cuda, hip = (lower(nest, params, t).code for t in ("cuda", "hip"))
    strip = [line for line in cuda.source.splitlines() if "cuda" not in line.lower()]
    assert all("hip" not in line.lower() for line in strip)
    assert "cudaMalloc" not in cuda.launcher and "pdMalloc" in cuda.launcher
    assert "hipMalloc" in hip.source and "cudaMalloc" in cuda.source


def test_hip_runtime_calls_are_refused_with_a_clear_error() -> None:
    from polydl.api import build_kernel

    nest, params = builders.matmul(8, 8, 8)
    with pytest.raises(PolyDLError, match="generates source only"):
        build_kernel(nest, params, target="hip")


def test_cli_writes_kernels_launcher_and_header(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = Path(__file__).parents[3] / "examples" / "matmul.c"
    for target, suffix in (("cuda", ".cu"), ("hip", ".hip.cpp")):
        out = tmp_path / target
        assert cli_main(["compile", str(spec), "-p", "M=32", "-p", "N=32", "-p", "K=32",
                         "--target", target, "-o", str(out)]) == 0
        assert (out / f"matmul{suffix}").is_file()
        assert (out / f"matmul_launch{suffix}").is_file()
        assert "int matmul(float *C, const float *A, const float *B, void *stream);" in (out / "matmul.h").read_text()


# ----------------------------------------------------------------------------- real compiles

COMPILE_CASES = {
    "matmul": lambda: builders.matmul(256, 192, 100),
    "matmul_warp_tiles": lambda: builders.matmul(4096, 4096, 100),
    "conv_1x1_float4": lambda: builders.conv2d(N=8, C=64, K=128, H=14, W=14, R=1, S=1, accumulate=False,
                                               fuse=("bias", "residual", "relu")),
    "matmul_bf16": lambda: (_bf16(builders.matmul(256, 256, 256)[0], {"A", "B"}), {"M": 256, "N": 256, "K": 256}),
    "conv": lambda: builders.conv2d(2, 16, 32, 14, 14, 3, 3, 2, 1, fuse=("bias", "relu")),
    "dense_bf16_out": lambda: (_bf16(read_c(DENSE).nest, {"A", "B", "C", "bias"}), {"M": 200, "N": 136, "K": 72}),
    "linear_bf16": lambda: (_bf16(read_c(LINEAR).nest, {"x", "w"}), {"N": 64, "C": 128, "K": 96}),
    "conv_nhwc_bf16": lambda: builders.conv2d(2, 16, 32, 12, 12, 3, 3, 1, 1, layout="nhwc", dtype="bfloat16"),
    "conv_nhwc_window": lambda: builders.conv2d(2, 64, 64, 12, 12, 3, 3, 1, 1, layout="nhwc", dtype="bfloat16",
                                                fuse=("bias", "relu"), accumulate=False),
    "wavefront": lambda: (read_c(WAVEFRONT).nest, {"N": 33}),
    # NCHW bf16 3 x 3: channels-last copies by shared-memory tiles, then the TMA window GEMM
    "conv_nchw_bf16_staged": lambda: builders.conv2d(2, 64, 64, 12, 12, 3, 3, 1, 1, dtype="bfloat16",
                                                     fuse=("bias", "relu"), accumulate=False),
    # NCHW bf16 1 x 1: the input copied along M, the weights along K, by 16-byte cp.async
    "conv_nchw_bf16_1x1": lambda: builders.conv2d(2, 64, 64, 16, 16, 1, 1, dtype="bfloat16"),
    # bf16 1 x 1 of one K step a tile: TMA blocks two a multiprocessor, within 128 registers
    "conv_nhwc_bf16_paired": lambda: builders.conv2d(32, 64, 64, 56, 56, 1, 1, layout="nhwc", dtype="bfloat16",
                                                     accumulate=False),
    # fp32 1 x 1 on two images, K split over blocks: slices add 4 cells at a time into C
    "conv_split": lambda: builders.conv2d(2, 1024, 256, 14, 14, 1, 1, accumulate=False),
    # fp32 3 x 3 by Winograd F(4x4): transforms of 36 statements a launch, batched GEMMs
    "conv_winograd": lambda: builders.conv2d(16, 32, 32, 28, 28, 3, 3, 1, 1, fuse=("bias", "relu"),
                                             accumulate=False),
}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("case", ["matmul", "matmul_warp_tiles", "conv_1x1_float4", "matmul_bf16", "conv",
                                  "wavefront", "dense_bf16_out",
                                  "linear_bf16", "conv_nhwc_bf16", "conv_nhwc_window", "conv_nchw_bf16_staged",
                                  "conv_nchw_bf16_1x1", "conv_nhwc_bf16_paired", "conv_split", "conv_winograd"])
@pytest.mark.slow
def test_nvcc_compiles_for_sm90(case: str, tmp_path: Path) -> None:
    nest, params = COMPILE_CASES[case]()
    code = lower(nest, params, "cuda").code
    library = compile_gpu_library(code, tmp_path)
    assert library.stat().st_size > 0
    if case in ("matmul_bf16", "dense_bf16_out", "linear_bf16", "conv_nhwc_bf16", "conv_nhwc_window",
                "conv_nchw_bf16_staged") \
            and shutil.which("cuobjdump"):
        sass = subprocess.run(["cuobjdump", "--dump-sass", str(library)], capture_output=True, text=True).stdout
        assert "HGMMA" in sass


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_nvcc_compiles_tf32_wgmma(tmp_path: Path) -> None:
    nest, params = builders.conv2d(2, 64, 64, 12, 12, 3, 3, 1, 1, layout="nhwc")
    code = lower(nest, params, device_for("cuda", allow_tf32=True)).code
    assert "m64n" in code.source and ".tf32.tf32" in code.source and "DATA_TYPE_FLOAT32" in code.launcher
    library = compile_gpu_library(code, tmp_path)
    if shutil.which("cuobjdump"):
        sass = subprocess.run(["cuobjdump", "--dump-sass", str(library)], capture_output=True, text=True).stdout
        assert "HGMMA" in sass


def _hipcc_knows(arch: str, tmp_path: Path) -> bool:
    probe = tmp_path / "probe.hip.cpp"
    probe.write_text("#include <hip/hip_runtime.h>\n__global__ void k(float *x) { x[0] = 1; }\n")
    result = subprocess.run(
        ["hipcc", f"--offload-arch={arch}", "-c", str(probe), "-o", str(tmp_path / "probe.o")],
        capture_output=True, text=True,
        env={**__import__("os").environ, "HIP_PLATFORM": "amd", "TMPDIR": str(tmp_path)},
    )
    return result.returncode == 0


@pytest.mark.skipif(shutil.which("hipcc") is None, reason="hipcc is not installed (apt-get install hipcc)")
@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
@pytest.mark.parametrize("case", ["matmul", "matmul_warp_tiles", "matmul_bf16", "conv", "wavefront",
                                  "conv_split", "conv_winograd"])
@pytest.mark.slow
def test_hipcc_compiles_for_cdna(case: str, arch: str, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    if not _hipcc_knows(arch, tmp_path):
        pytest.skip(f"this hipcc's clang does not know {arch} (Debian 12's clang 15 predates gfx942)")
    nest, params = COMPILE_CASES[case]()
    code = lower(nest, params, "hip").code
    # clang's HIP driver leaves folders in TMPDIR; the build must not leave them in the user's
    user_tmp = tmp_path / "user-tmp"
    user_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(user_tmp))
    library = compile_gpu_library(code, tmp_path / "out", architectures=(arch,))
    assert library.stat().st_size > 0
    assert list(user_tmp.iterdir()) == []


def test_gpu_arguments_keep_the_names_the_spec_writes() -> None:
    """A parameter polydl respells inside (`_fict_`) is `_fict_` to callers of a GPU kernel, and
    the launcher and header name it as the kernels do."""
    from polydl.api import lower
    from polydl.frontends import load_spec

    spec = """void shift(int N, float ey[N], const float _fict_[N]) {
  for (int i = 0; i < N; i++) ey[i] = _fict_[i] + 1.0f;
}"""
    nest, params = load_spec(spec, {"N": 64})
    for kind in ("cuda", "hip"):
        code = lower(nest, params, target=kind).code
        assert [a.name for a in code.arguments] == ["ey", "_fict_"]
        assert [a.identifier for a in code.arguments] == ["ey", "_pd___fict_"]
        assert "_pd___fict_" in code.launcher and "_pd___fict_" in code.header
