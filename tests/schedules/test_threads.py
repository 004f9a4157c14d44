"""How parallel loops share work and data among the threads, and what the ranking makes of it
on a 16-core target: collapsed loops count all their units, and an array a parallel loop does
not move along is read by every thread that loop splits it over."""

import pytest

from polydl.frontends import builders
from polydl.poly.model import build_model
from polydl.schedules import threads
from polydl.schedules.rank import rank, shared_read_bytes, thread_balance
from polydl.schedules.schedule import MicrokernelBinding, Schedule
from polydl.target import CpuTarget

SOCKET = CpuTarget(isa="avx512", cores=16, l3_bytes=300 << 20)
CALL = MicrokernelBinding("S0", m="q", n="k", k="c", batch=("cb", "r", "s"))


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


def test_a_socket_ranks_rows_of_both_images_over_splitting_their_blocks() -> None:
    best = rank(_conv(2, 256, 128, 56, 2), SOCKET)[0].schedule
    # 56 units of rows; the weights (128 KiB) are what the threads share, not the images
    assert set(best.parallel) == {"n", "p"}


def test_a_stem_on_a_socket_runs_both_images_rows_in_parallel() -> None:
    nest, params = builders.conv2d(N=2, C=3, K=64, H=224, W=224, R=7, S=7, stride=2, padding=3,
                                   layout="nchw")
    best = rank(build_model(nest, params), SOCKET)[0].schedule
    assert best.parallel == ("n", "p")  # 2 x 112 units, not 2 images for 16 threads
