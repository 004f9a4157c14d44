"""How parallel loops share work and data among the threads, and what the ranking makes of it
on a 16-core target: collapsed loops count all their units, and an array a parallel loop does
not move along is read by every thread that loop splits it over."""

import pytest

from polydl.frontends import builders, conv_backward
from polydl.poly.model import build_model
from polydl.schedules.cpu import candidates as candidates_module
from polydl.schedules.cpu import threads
from polydl.schedules.cpu.cost import (
    copied_arrays,
    copied_elsewhere_bytes,
    evaluate,
    packed_elsewhere,
    shared_read_bytes,
    thread_balance,
)
from polydl.schedules.cpu.distribution import isolate_gemms
from polydl.schedules.cpu.rank import rank
from polydl.schedules.schedule import MicrokernelBinding, Schedule
from polydl.target import CpuTarget

SOCKET = CpuTarget(isa="avx512", cores=16, l3_bytes=300 << 20)
# the lent 16-core host's caches, as `polydl machine` reports them
SAPPHIRE = CpuTarget(isa="avx512", cores=16, l1_bytes=48 << 10, l2_bytes=2 << 20,
                     l3_bytes=300 << 20)
CALL = MicrokernelBinding("S0", m="q", n="k", k="c", batch=("cb", "r", "s"))
GEMM_CALL = MicrokernelBinding("S0", m="i", n="j", k="k", pack_b=True)


def test_static_runs_give_the_first_threads_one_more() -> None:
    assert threads.thread_runs(18, 16) == [(0, 2), (2, 2)] + [(4 + i, 1) for i in range(14)]
    assert threads.thread_runs(3, 16) == [(0, 1), (1, 1), (2, 1)]


def test_balance_counts_collapsed_units_and_ragged_tiles() -> None:
    assert threads.balance([[1] * 2, [1] * 56], 16) == 1.0  # 112 units: 7 a thread
    assert threads.balance([[1] * 2], 16) == 8.0  # two units for 16 threads
    # 14 rows in tiles of 4 on 2 threads: 8 rows against an even 7
    assert threads.balance([[4, 4, 4, 2]], 2) == pytest.approx(8 / 7)


def test_readers_of_an_array_per_parallel_loop_it_does_not_move_along() -> None:
    # images (2) by output-channel blocks (8), one unit a thread: an image's input is read by
    # the 8 threads of its blocks; the weights of a block by the 2 threads of its images
    assert threads.readers((2, 8), (True, False), 16) == 8.0
    assert threads.readers((2, 8), (False, True), 16) == 2.0
    assert threads.readers((2, 56), (True, True), 16) == 1.0
    assert threads.readers((2, 56), (False, False), 16) == 16.0
    # 32 blocks by 7 rows, 14 units a thread: each thread has whole blocks
    assert threads.readers((32, 7), (True, False), 16) == 1.0


def _conv(n: int, c: int, k: int, hw: int, stride: int) -> object:
    nest, params = builders.conv2d(N=n, C=c, K=k, H=hw, W=hw, R=1, S=1, stride=stride,
                                   layout="nchw16c")
    return build_model(nest, params)


def test_shared_reads_of_splitting_output_blocks_over_threads() -> None:
    model = _conv(2, 256, 128, 56, 2)  # ResNet-50's res3_1x1a_s2 at N=2
    inner = ("cb", "r", "s", "q", "k", "c")
    by_blocks = Schedule(order=("n", "kb", "p") + inner, microkernel=CALL, parallel=("n", "kb"))
    by_rows = Schedule(order=("n", "p", "kb") + inner, microkernel=CALL, parallel=("n", "p"))
    x_bytes, w_bytes = 2 * 256 * 56 * 56 * 4, 256 * 128 * 4
    # blocks: 8 threads read each image (x), 2 each block of weights
    assert shared_read_bytes(model, by_blocks, 16) == 7 * x_bytes + w_bytes
    # rows: every thread reads all the weights, each input row one thread
    assert shared_read_bytes(model, by_rows, 16) == 15 * w_bytes
    assert thread_balance(model, by_rows, 16) == pytest.approx(64 / 56)


@pytest.mark.slow
def test_a_socket_ranks_rows_of_both_images_over_splitting_their_blocks() -> None:
    best = rank(_conv(2, 256, 128, 56, 2), SOCKET)[0].schedule
    # 56 units of rows; the weights (128 KiB) are what the threads share, not the images
    assert set(best.parallel) == {"n", "p"}


@pytest.mark.slow
def test_a_stem_on_a_socket_runs_both_images_rows_in_parallel() -> None:
    nest, params = builders.conv2d(N=2, C=3, K=64, H=224, W=224, R=7, S=7, stride=2, padding=3,
                                   layout="nchw")
    best = rank(build_model(nest, params), SOCKET)[0].schedule
    assert best.parallel == ("n", "p")  # 2 x 112 units, not 2 images for 16 threads


@pytest.mark.slow
def test_an_image_of_49_positions_splits_into_tiles_of_nearly_one_size() -> None:
    """960 -> 160 channels at 7 x 7 (mobilenet_v2, one image): 10 output-channel blocks leave
    6 of 16 threads idle; tiles of 16 positions leave a call of 1. The ranking takes 3 tiles
    of 17 (16, 16 and 17 rows would be 48 + 1)."""
    assert candidates_module._m_tiles(49, tall=True)[:5] == [49, 32, 28, 16, 14]
    assert set(candidates_module._m_tiles(49, tall=True)[5:]) == {25, 17, 13}
    assert candidates_module._m_tiles(56, tall=True) == [56, 32, 28, 16, 14]  # 28 splits it
    nest, params = builders.conv2d(N=1, C=960, K=160, H=7, W=7, R=1, S=1, layout="nchw16c")
    ranked = rank(build_model(nest, params), SOCKET)[0]
    assert ranked.schedule.tile_sizes.get("m") in (13, 17, 25), ranked.schedule.describe()
    assert ranked.balance < 1.3



def test_a_small_gemm_of_prime_sizes_on_a_socket_calls_short_row_blocks() -> None:
    """257 x 131 x 509 on 16 cores: among five row sizes the ranking takes calls of 16 rows
    (9 x 5 calls of 32 rows ran 0.89-0.92x as fast on the lent host)."""
    nest, params = builders.matmul(257, 131, 509)
    best = rank(isolate_gemms(build_model(nest, params)), SAPPHIRE)[0].schedule
    assert best.tile_sizes["i"] == 16, best.describe()

def _gemm_over_packed_b(order: tuple[str, ...], parallel: tuple[str, ...]) -> Schedule:
    return Schedule(order=order + ("i", "j", "k"), tiles=(("i", 64), ("j", 64)),
                    microkernel=GEMM_CALL, parallel=parallel)


def test_packed_b_read_from_the_copies_of_other_threads() -> None:
    model = build_model(*builders.matmul(M=1024, N=1024, K=1024))
    # 16 n blocks copied one a thread; n blocks outer: each thread's calls read its own copy
    by_columns = _gemm_over_packed_b(("j.t", "i.t"), ("j.t", "i.t"))
    assert packed_elsewhere(model, by_columns, 16) == 0.0
    # m blocks outer: every thread reads all 16 blocks, 15 of them another thread's copy
    by_rows = _gemm_over_packed_b(("i.t", "j.t"), ("i.t", "j.t"))
    assert packed_elsewhere(model, by_rows, 16) == 15.0
    # a convolution's B follows its images and rows: each thread copies what it reads
    conv = _conv(2, 256, 128, 56, 2)
    packed = Schedule(order=("n", "p", "kb", "cb", "r", "s", "q", "k", "c"), parallel=("n", "p"),
                      microkernel=MicrokernelBinding("S0", m="q", n="k", k="c",
                                                     batch=("cb", "r", "s"), pack_b=True))
    assert packed_elsewhere(conv, packed, 16) == 0.0


def test_a_strided_copy_read_by_every_thread_comes_from_the_cores_that_copied_it() -> None:
    model = _conv(32, 1024, 2048, 14, 2)  # ResNet-50's res5_proj_s2 at N=32
    assert copied_arrays(model) == ("xs",)
    xs_bytes = 32 * 1024 * 7 * 7 * 4
    inner = ("kb", "cb", "m", "k", "c")
    call = MicrokernelBinding("S1", m="m", n="k", k="c", batch=("cb",))
    by_channels = Schedule(order=("kb.t", "n") + inner, tiles=(("kb", 8),), microkernel=call,
                           parallel=("kb.t",))
    by_images = Schedule(order=("n", "kb.t") + inner, tiles=(("kb", 8),), microkernel=call,
                         parallel=("n",))
    # 16 output-channel tiles: every thread reads every image of the copy, 15/16 of it copied
    # by another core; 32 images: each thread reads (and, fused, copies) its own two
    assert copied_elsewhere_bytes(model, by_channels, 16) == pytest.approx(16 * xs_bytes * 15 / 16)
    assert copied_elsewhere_bytes(model, by_images, 16) == 0.0
    # a layer without a copy (stride 1) is charged nothing either way
    assert copied_elsewhere_bytes(_conv(32, 1024, 2048, 7, 1), by_channels, 16) == 0.0


def test_no_copy_is_charged_where_the_weights_are_a_copy_too() -> None:
    # backward data reads its padded dy and its transposed weights, both copied in passes of
    # their own: images or input-channel tiles in parallel, threads read one from other cores
    nest, params = conv_backward.conv2d_backward_data(N=32, C=512, K=512, H=7, W=7, R=3, S=3,
                                                      padding=1, layout="nchw16c")
    assert copied_arrays(build_model(nest, params)) == ()


def test_a_socket_runs_the_images_of_a_strided_layer_in_parallel_at_n32() -> None:
    """Output-channel tiles in parallel ran res5_proj_s2 at 0.88x (the lent 16-core host,
    21 interleaved rounds) of images in parallel, whose threads each copy the strided image
    they read; the L3 charge alone had ranked the tiles first."""
    best = rank(_conv(32, 1024, 2048, 14, 2), SAPPHIRE)[0].schedule
    assert best.parallel == ("n",), best.describe()


def test_the_level_every_thread_shares_sees_the_whole_l3() -> None:
    # 12.6 MB of GEMM: more than a 16th of a 300 MiB L3, far less than all of it; its
    # outermost loop (the parallel one) is all threads' work at once, read once
    model = build_model(*builders.matmul(M=1024, N=1024, K=1024))
    result = evaluate(model, SOCKET, _gemm_over_packed_b(("j.t", "i.t"), ("j.t", "i.t")))
    assert result is not None
    assert result.traffic_bytes["l3"] == result.working_sets[0].bytes(64)


def test_a_socket_ranks_gemm_calls_over_all_of_k_by_column_blocks() -> None:
    """On 16 cores a GEMM's threads own whole tiles of C: calls over all of k, n blocks
    outside m blocks, so each thread reads the packed blocks it copied (measured on a 16-core
    Sapphire Rapids host: 0.58 -> 0.83 of torch.matmul over the GEMM suite). B is copied
    per n block, between the two loops: the n blocks alone are the threads' units."""
    best = rank(build_model(*builders.matmul(M=512, N=3072, K=768)), SOCKET)[0].schedule
    assert best.microkernel is not None and best.microkernel.pack_b
    assert "k" not in best.tile_sizes
    assert best.order[:2] == ("j.t", "i.t") and best.parallel == ("j.t",)


def test_a_socket_reads_a_square_gemms_packed_b_from_its_own_copies() -> None:
    """512^3: m blocks outside n blocks, collapsed, was ranked first though each thread then
    read its 2-4 copied blocks from other cores' caches; at that transfer's measured price the
    pick is n blocks outside m blocks, each thread reading what it copied (16 Sapphire Rapids
    cores: 887 -> 1205 GFLOP/s in one run, torch.matmul 1026)."""
    model = build_model(*builders.matmul(M=512, N=512, K=512))
    best = rank(model, SAPPHIRE)[0].schedule
    assert best.microkernel is not None and best.microkernel.pack_b
    assert best.order[:2] == ("j.t", "i.t") and best.parallel == ("j.t",)
    assert packed_elsewhere(model, best, 16) == 0.0


def test_a_socket_sizes_column_blocks_to_a_multiple_of_its_cores() -> None:
    # n = 768 is 12 blocks of 64 for 16 threads; 16 blocks of 48 give each thread one, copied
    # by the thread that reads it (16 Sapphire Rapids cores: 1.30x over the 64-column blocks)
    model = build_model(*builders.matmul(M=512, N=768, K=3072))
    best = rank(model, SAPPHIRE)[0].schedule
    assert best.tile_sizes.get("j") == 48 and best.parallel == ("j.t",)
    assert best.microkernel is not None and best.microkernel.pack_b
    # two cores have no such blocks to offer: their picks stay as they were
    pair = CpuTarget(isa="avx512", cores=2)
    assert 48 not in {r.schedule.tile_sizes.get("j") for r in rank(model, pair)}


def test_b_rows_that_share_few_cache_sets_are_packed_and_others_read_in_place() -> None:
    # 64 rows of C reuse each B row little; B rows 4000 bytes apart spread over every L1 set
    # and are read in place, rows 4096 bytes apart fall into one set and are packed
    spread = rank(build_model(*builders.matmul(M=64, N=1000, K=2048)), SOCKET)[0].schedule
    aliased = rank(build_model(*builders.matmul(M=64, N=1024, K=2048)), SOCKET)[0].schedule
    assert spread.microkernel is not None and not spread.microkernel.pack_b
    assert aliased.microkernel is not None and aliased.microkernel.pack_b
