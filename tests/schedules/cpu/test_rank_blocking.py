"""The ranking's blocking choices: register-tile efficiency of full and remainder calls, and
the outer-loop tilings it tries on its winner (checked for legality and for results)."""

from dataclasses import replace

import numpy as np
import pytest

import polydl
from polydl.errors import ScheduleError
from polydl.frontends import builders
from polydl.poly.model import build_model
from polydl.schedules.cpu.candidates import outer_tilings, window_calls
from polydl.schedules.cpu.rank import rank
from polydl.schedules.cpu.register_blocking import VECTOR_UNITS, rows_step_cycles
from polydl.schedules.schedule import MicrokernelBinding, Schedule
from polydl.target import CpuTarget
from tests.kernels import run_and_check

AVX2 = CpuTarget(isa="avx2", cores=2)


def test_step_cycles_prefer_even_register_tiles() -> None:
    avx2 = VECTOR_UNITS["avx2"]
    # 14 rows x 2 vectors: 5 + 5 + 4 rows (14 cycles) beats 6 + 6 + 2 (6 + 6 + latency 4)
    assert rows_step_cycles(avx2, 14, 2) == 14.0
    assert rows_step_cycles(avx2, 12, 2) + rows_step_cycles(avx2, 2, 2) == 16.0
    # one row alone waits for the FMA latency
    assert rows_step_cycles(avx2, 1, 1) == 4.0


def test_ranking_and_codegen_share_one_register_model() -> None:
    """The tile the code generator chooses for a call is one the ranking's model counts."""
    from polydl.codegen.c.microkernels.blocking import choose_outer_product
    from polydl.codegen.c.microkernels.spec import BrgemmSpec
    from polydl.schedules.cpu import register_blocking

    for isa in ("avx2", "avx512"):
        unit = VECTOR_UNITS[isa]
        spec = BrgemmSpec(m=6, n=register_blocking.panel_vectors(unit) * unit.lanes("float32"),
                          k=64, a_m=64, a_k=1, b_k=64, b_n=1, c_m=64, c_n=1)
        chosen = choose_outer_product(spec.normalized(), unit)
        assert (chosen.rows, chosen.vectors) == (register_blocking.PANEL_ROWS,
                                                 register_blocking.panel_vectors(unit))
        assert chosen.rows <= register_blocking.max_rows(unit, chosen.vectors)


def test_a_short_m_extent_is_not_split_into_a_ragged_tile() -> None:
    nest, params = builders.conv2d(N=2, C=64, K=64, H=28, W=28, R=1, S=1, stride=2,
                                   layout="nchw16c")
    best = rank(build_model(nest, params), AVX2)[0].schedule
    assert best.microkernel is not None and best.microkernel.m == "q"
    assert "q" not in best.tile_sizes  # Q = 14: one call of 14 rows, not 12 + 2


def test_outer_tilings_move_the_point_loop_next_to_the_call() -> None:
    # 3 x 3 without padding: rows and columns of 6 (a 1 x 1 over 6 x 6 runs them as one loop)
    nest, params = builders.conv2d(N=2, C=32, K=128, H=8, W=8, R=3, S=3, layout="nchw16c")
    model = build_model(nest, params)
    binding = MicrokernelBinding("S0", m="q", n="k", k="c", batch=("cb", "r", "s"))
    base = Schedule(order=("n", "kb", "p", "cb", "r", "s", "q", "k", "c"), microkernel=binding)
    variants = outer_tilings(model, base)
    # kb (8 blocks) is not indexed by x; n and p (extent < 8) are left alone
    assert [v.order[:4] for v in variants] == [("n", "kb.t", "p", "kb")] * 2
    assert sorted(v.tile_sizes["kb"] for v in variants) == [4, 8]
    for variant in variants:
        kernel = polydl.conv2d(N=2, C=32, K=128, H=8, W=8, R=3, S=3, layout="nchw16c",
                               schedule=variant)
        run_and_check(kernel)


def test_outer_tilings_leave_a_schedule_without_microkernel_alone() -> None:
    model = build_model(*builders.matmul(M=64, N=64, K=64))
    assert outer_tilings(model, Schedule(order=("i", "j", "k"))) == []


def test_tiled_outer_loop_result_matches_numpy_for_gemm_batches() -> None:
    spec = """
    void bmm(int B, int M, int N, int K, float C[B][M][N], const float X[B][M][K],
             const float Y[K][N]) {
      for (int b = 0; b < B; b++)
        for (int i = 0; i < M; i++)
          for (int j = 0; j < N; j++)
            for (int k = 0; k < K; k++)
              C[b][i][j] += X[b][i][k] * Y[k][j];
    }"""
    kernel = polydl.compile(spec, {"B": 9, "M": 10, "N": 24, "K": 7})
    run_and_check(kernel, lambda x, y: np.einsum("bik,kj->bij", x.astype(np.float64), y))


def test_a_small_gemm_on_many_cores_keeps_its_microkernel() -> None:
    """Forking 16 threads costs more than a 32 x 64 x 32 GEMM: plain loops split over all cores
    must not outrank one microkernel call on one core."""
    many = CpuTarget(isa="avx512", cores=16, l1_bytes=48 * 1024, l2_bytes=2 * 1024 * 1024)
    for m, n, k in ((16, 16, 16), (32, 64, 32)):
        nest, params = builders.matmul(m, n, k)
        best = rank(build_model(nest, params), many)[0].schedule
        assert best.microkernel is not None, (m, n, k)
    # a large GEMM still runs on every core
    nest, params = builders.matmul(512, 512, 512)
    best = rank(build_model(nest, params), many)[0].schedule
    assert best.microkernel is not None and best.parallel


# --- calls over several output-channel blocks ------------------------------------------------

SPR = CpuTarget(isa="avx512", cores=16, l1_bytes=48 * 1024, l2_bytes=2 * 1024 * 1024,
                l3_bytes=64 * 1024 * 1024)
BLOCKS = MicrokernelBinding("S1", m="q", n="k", k="c", batch=("cb", "r", "s"), blocks="kb")


def _blocks_schedule(tile: int, epilogues: tuple[str, ...] = (), statement: str = "S1") -> Schedule:
    return Schedule(order=("n", "kb.t", "p", "kb", "cb", "r", "s", "q", "k", "c"),
                    tiles=(("kb", tile),), parallel=("n", "kb.t"),
                    microkernel=replace(BLOCKS, statement=statement), epilogues=epilogues)


@pytest.mark.slow
def test_a_call_over_output_channel_blocks_matches_numpy() -> None:
    """K = 80: 5 blocks in calls of 2 (a remainder call of one block), with bias, residual and
    ReLU applied in the kernel to the vectors of every block; 7 x 7 outputs."""
    from tests.schedules.test_postops import _check_conv, _uses_postops

    sizes = dict(N=2, C=32, K=80, H=7, W=7, R=3, S=3, stride=1, padding=1)
    chain = ("bias", "residual", "relu")
    kernel = polydl.conv2d(**sizes, layout="nchw16c", fuse=chain,
                           schedule=_blocks_schedule(2, ("S2", "S3", "S4"), "S1"))
    assert "blocks(kb)" in kernel.schedule.describe()
    assert "n=16x2 blocks" in kernel.source and _uses_postops(kernel)
    _check_conv(kernel, sizes, chain, blocked=True)


def test_blocks_round_trip_and_refuse_a_loop_that_moves_a() -> None:
    schedule = _blocks_schedule(4)
    assert Schedule.from_json(schedule.to_json()) == schedule
    # a schedule without blocks keeps the JSON form stored before blocks existed
    assert "blocks" not in Schedule(microkernel=replace(BLOCKS, blocks=None)).to_json()
    bad = replace(schedule, order=("n", "kb", "p.t", "p", "cb", "r", "s", "q", "k", "c"),
                  tiles=(("p", 2),), parallel=("n",), microkernel=replace(BLOCKS, blocks="p"))
    with pytest.raises(ScheduleError, match="blocks loop 'p' must move C and B and not A"):
        polydl.conv2d(N=2, C=32, K=32, H=7, W=7, R=3, S=3, padding=1, layout="nchw16c",
                      schedule=bad)


def test_blocks_that_would_sum_into_one_cell_are_refused() -> None:
    """A stride-2 backward-data scatters filter column s to input columns 2q + s: calls over 2
    columns interleave their rows, over 4 they share cells (column 2 of row q is column 0
    of row q + 1), which one call cannot sum."""
    binding = MicrokernelBinding("S1", m="q", n="c", k="k", batch=("kb",), blocks="s")
    sizes = dict(N=1, C=3, K=32, H=16, W=16, R=7, S=7, stride=2, padding=3, layout="nchw16c")
    kernels = {}
    for tile in (2, 4):
        schedule = Schedule(order=("n", "cb", "p", "r", "s.t", "s", "kb", "q", "c", "k"),
                            tiles=(("s", tile),), parallel=("r",), microkernel=binding)
        if tile == 4:
            with pytest.raises(ScheduleError, match="blocks along 's' would sum into the same cells"):
                polydl.conv2d_backward_data(**sizes, schedule=schedule)
        else:
            kernels[tile] = polydl.conv2d_backward_data(**sizes, schedule=schedule)
    assert "blocks(s)" in kernels[2].schedule.describe()
    run_and_check(kernels[2])


def test_seven_by_seven_layers_run_calls_over_several_blocks() -> None:
    """ResNet-50's res5 3 x 3 layer (512 channels, 7 x 7): one block's call is 7 rows x one
    16-lane vector; the ranking takes calls over several blocks on a 16-core AVX-512 host."""
    nest, params = builders.conv2d(N=32, C=512, K=512, H=7, W=7, R=3, S=3, padding=1,
                                   layout="nchw16c")
    best = rank(build_model(nest, params), SPR)[0].schedule
    assert best.microkernel is not None and best.microkernel.blocks == "kb"
    assert best.tile_sizes["kb"] >= 2
    one = replace(best, microkernel=replace(best.microkernel, blocks=None))
    model = build_model(nest, params)
    from polydl.schedules.cpu.cost import microkernel_efficiency
    assert microkernel_efficiency(best, model, SPR) > microkernel_efficiency(one, model, SPR)


@pytest.mark.slow
def test_a_one_vector_register_tile_runs_over_several_blocks_on_avx512() -> None:
    """res4's 1 x 1 layer from 256 to 1024 channels at 14 x 14: one block's call is 14 rows x
    one 16-lane vector on AVX-512, a load of A for every FMA; the ranking takes calls over
    several blocks there (two cores or sixteen). On AVX2 a block is two vectors and each call
    keeps one. A stem's call, 7 taps a batch step, keeps one block on AVX-512 too."""
    from polydl.schedules.cpu.candidates import block_variants

    nest, params = builders.conv2d(N=2, C=256, K=1024, H=14, W=14, R=1, S=1, layout="nchw16c")
    model = build_model(nest, params)
    two = CpuTarget(isa="avx512", cores=2, l1_bytes=48 * 1024, l2_bytes=1024 * 1024)
    for target in (two, SPR):
        best = rank(model, target)[0].schedule
        assert best.microkernel.blocks == "kb" and best.tile_sizes["kb"] >= 2, best.describe()
    assert rank(model, AVX2)[0].schedule.microkernel.blocks is None
    stem_model = build_model(*builders.conv2d(N=2, C=3, K=64, H=224, W=224, R=7, S=7, stride=2,
                                              padding=3, out_layout="nchw16c"))
    stem_best = rank(stem_model, two)[0].schedule
    assert stem_best.microkernel.k == "s" and stem_best.microkernel.blocks is None
    assert block_variants(stem_model, stem_best, two) == []


# --- calls over a tile of the input-channel blocks ------------------------------------------

def _window_schedule(cb_tile: int, kb_tile: int = 2, epilogues: tuple[str, ...] = (),
                     blocks: bool = True, statement: str = "S1") -> Schedule:
    """Input-channel blocks tiled, their tile loop outside the output rows: each call reduces
    `cb_tile` blocks' 3 x 3 windows into partial sums."""
    return Schedule(order=("n", "kb.t", "cb.t", "p", "kb", "cb", "r", "s", "q", "k", "c"),
                    tiles=(("cb", cb_tile), ("kb", kb_tile)), parallel=("n", "kb.t"),
                    microkernel=replace(BLOCKS, statement=statement, blocks="kb" if blocks else None),
                    epilogues=epilogues)


@pytest.mark.parametrize("cb_tile", [1, 2])
@pytest.mark.slow
def test_calls_over_a_tile_of_input_channel_blocks_match_numpy(cb_tile: int) -> None:
    """4 input-channel blocks reduced 1 or 2 at a time, the rows inside the tile loop: the
    bias, residual and ReLU apply once, after the last tile's call (K = 80: a call of one
    block after those of two)."""
    from tests.schedules.test_postops import _check_conv, _uses_postops

    sizes = dict(N=2, C=64, K=80, H=7, W=7, R=3, S=3, stride=1, padding=1)
    chain = ("bias", "residual", "relu")
    kernel = polydl.conv2d(**sizes, layout="nchw16c", fuse=chain,
                           schedule=_window_schedule(cb_tile, epilogues=("S2", "S3", "S4")))
    assert f"cb={cb_tile}" in kernel.schedule.describe() and _uses_postops(kernel)
    _check_conv(kernel, sizes, chain, blocked=True)
    run_and_check(kernel)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_calls_over_one_input_channel_block_overwrite_y(dtype: str) -> None:
    """`accumulate=False`: the first tile's calls start from zero, not from y's old values
    (bf16 inputs on one block's calls, as the AMX and vdpbf16ps kernels take them)."""
    import ml_dtypes

    from tests.codegen.c.test_bfloat16 import f32
    from tests.frontends.test_builders import conv2d_numpy

    n, c, k, h = 2, 48, 32, 6
    schedule = _window_schedule(1, 2, blocks=dtype == "float32", statement="S2")  # S1 sets y
    kern = polydl.conv2d(N=n, C=c, K=k, H=h, W=h, R=3, S=3, padding=1, layout="nchw16c",
                         dtype=dtype, accumulate=False, schedule=schedule)
    assert "cb=1" in kern.schedule.describe()
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (n, c, h, h)).astype(np.float32)
    w = rng.uniform(-1, 1, (k, c, 3, 3)).astype(np.float32)
    xb, wb = polydl.layouts.to_nchw16c(x), polydl.layouts.to_kcrs16c16k(w)
    if dtype == "bfloat16":
        x, w = f32(x.astype(ml_dtypes.bfloat16)), f32(w.astype(ml_dtypes.bfloat16))
        xb, wb = xb.astype(ml_dtypes.bfloat16), wb.astype(ml_dtypes.bfloat16)
    stale = np.full((n, 2, h, h, 16), 7.0, np.float32)
    got = polydl.layouts.from_nchw16c(kern(xb, wb, y=stale), k)
    np.testing.assert_allclose(got, conv2d_numpy(x, w, 1, 1), rtol=1e-4, atol=1e-4)


def test_a_batch_tile_must_divide_its_loop_and_pack_nothing() -> None:
    with pytest.raises(ScheduleError, match="batch loop 'cb' of the microkernel is tiled by 3"):
        polydl.conv2d(N=1, C=64, K=32, H=7, W=7, R=3, S=3, padding=1, layout="nchw16c",
                      schedule=_window_schedule(3))
    packed = _window_schedule(2, 1, blocks=False)
    packed = replace(packed, microkernel=replace(packed.microkernel, pack_b=True))
    with pytest.raises(ScheduleError, match="is tiled by 2: .* packs no operand"):
        polydl.conv2d(N=1, C=64, K=32, H=7, W=7, R=3, S=3, padding=1, layout="nchw16c",
                      schedule=packed)


@pytest.mark.slow
def test_res5_3x3_calls_keep_one_window_of_weights_in_l1() -> None:
    """res5's 3 x 3 layer at N=32: a call over all 32 input-channel blocks of 4 output blocks
    streams 1.2 MiB of weights from L2 for 7 rows; the ranking takes calls over one block's
    window (18 KiB for 2 output blocks) with the tile loop outside the rows. A layer whose
    calls' weights fit L1 gets no such variant."""
    nest, params = builders.conv2d(N=32, C=512, K=512, H=7, W=7, R=3, S=3, padding=1,
                                   layout="nchw16c")
    model = build_model(nest, params)
    best = rank(model, SPR)[0].schedule
    assert best.tile_sizes.get("cb") == 1, best.describe()
    assert best.order.index("cb.t") < best.order.index("p") and best.microkernel.blocks == "kb"
    small, small_params = builders.conv2d(N=2, C=16, K=32, H=7, W=7, R=3, S=3, padding=1,
                                          layout="nchw16c")
    small_model = build_model(small, small_params)
    assert window_calls(small_model, rank(small_model, SPR)[0].schedule, SPR) == []


# --- a 1 x 1 call's input-channel blocks tiled next to it -----------------------------------

def _cb_tile(best: Schedule) -> int | None:
    """The tile of the call's input-channel blocks, its tile loop right outside the call."""
    if "cb" not in best.tile_sizes:
        return None
    calls = len(best.microkernel.loops)
    assert best.order[-calls - 1] == "cb.t", best.describe()
    return best.tile_sizes["cb"]


@pytest.mark.slow
def test_a_1x1_call_reads_no_more_input_blocks_than_an_l1_set_keeps() -> None:
    """At 56 x 56 one input-channel block is 49 pages: a row's lines of all 16 blocks of 256
    channels share one L1 set of 8 ways, so each call reduces 8 of them; 128 channels (8
    blocks) and 28 x 28 (blocks 12.25 pages apart, 4 sets) stay whole."""
    def best(c: int, h: int, target: CpuTarget = AVX2) -> Schedule:
        nest, params = builders.conv2d(N=2, C=c, K=64, H=h, W=h, R=1, S=1, layout="nchw16c")
        return rank(build_model(nest, params), target)[0].schedule

    assert _cb_tile(best(256, 56)) == 8
    assert _cb_tile(best(256, 56, SPR)) is None  # 12 ways: measured not to pay there
    assert _cb_tile(best(128, 56)) is None and _cb_tile(best(256, 28)) is None


@pytest.mark.slow
def test_a_1x1_call_over_more_weights_than_an_eighth_of_l2_reduces_fewer_blocks() -> None:
    """res5's 1 x 1 layer from 2048 channels: a call over all 128 input-channel blocks and
    its output-channel blocks reads MiBs of weights once per register tile of rows; tiled so
    that a call's weights take at most an eighth of L2; not a call whose rows are two register
    tiles. A 3 x 3 layer, whose call reuses its input window, keeps its batch whole."""
    from polydl.schedules.cpu.candidates import batch_tiled_call

    nest, params = builders.conv2d(N=2, C=2048, K=512, H=7, W=7, R=1, S=1, layout="nchw16c")
    best = rank(build_model(nest, params), AVX2)[0].schedule
    blocks = best.tile_sizes.get("kb", 1) if best.microkernel.blocks else 1
    block_weights = 16 * 16 * 4 * blocks  # bytes of one input-channel block's weights a call reads
    assert _cb_tile(best) * block_weights <= AVX2.l2_bytes // 8 < 128 * block_weights
    # 512 to 1024 at stride 2: calls over 8 of 14 output columns, two register tiles of rows
    few, few_params = builders.conv2d(N=32, C=512, K=1024, H=28, W=28, R=1, S=1, stride=2,
                                      layout="nchw16c")
    l2 = replace(AVX2, l2_bytes=512 * 1024)
    few_best = rank(build_model(few, few_params), l2)[0].schedule
    assert few_best.tile_sizes.get("q", 14) <= 12 and _cb_tile(few_best) is None, few_best.describe()
    nest3, params3 = builders.conv2d(N=2, C=256, K=256, H=14, W=14, R=3, S=3, padding=1,
                                     layout="nchw16c")
    model3 = build_model(nest3, params3)
    for ranked in rank(model3, AVX2)[:3]:
        assert batch_tiled_call(model3, AVX2, ranked.schedule) is ranked.schedule


@pytest.mark.slow
def test_a_1x1_call_over_a_tile_of_input_blocks_matches_numpy() -> None:
    """8 x 8 images: 16 input-channel blocks 4 KiB apart, reduced 8 at a time by the ranked
    schedule; the bias, residual and ReLU apply once, after the last tile's call."""
    from tests.schedules.test_postops import _check_conv, _uses_postops

    sizes = dict(N=1, C=256, K=48, H=8, W=8, R=1, S=1, stride=1, padding=0)
    chain = ("bias", "residual", "relu")
    kernel = polydl.conv2d(**sizes, layout="nchw16c", fuse=chain, machine=AVX2)
    assert _cb_tile(kernel.schedule) == 8 and _uses_postops(kernel)
    assert dict(kernel.schedule.notes)["batch_tiled"].startswith("cb by 8: a row's lines of A")
    _check_conv(kernel, sizes, chain, blocked=True)
    run_and_check(kernel)
