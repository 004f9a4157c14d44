"""Sums split among the threads: parallel loops that carry a statement's sum into its output,
each thread summing into a private copy (OpenMP's array reduction), checked against numpy and
refused wherever a loop carries anything but that sum; what the ranking makes of them on 16
cores and on 2."""

from dataclasses import replace

import numpy as np
import pytest

import polydl
from polydl.errors import ScheduleError
from polydl.frontends import builders, conv_backward, load_spec
from polydl.poly.model import build_model
from polydl.schedules.apply import PRIVATE_SUM_MAX_BYTES, apply_schedule
from polydl.schedules.cpu.candidates import private_sum_splits
from polydl.schedules.cpu.epilogues import choose_fusion
from polydl.schedules.cpu.rank import rank
from polydl.schedules.schedule import MicrokernelBinding, Schedule
from polydl.target import CpuTarget
from tests.kernels import run_and_check
from tests.poly.test_model import MATMUL
from tests.schedules.test_fusion import MATMUL_RELU

SOCKET = CpuTarget(isa="avx512", cores=16, l2_bytes=2 << 20, l3_bytes=300 << 20)
PAIR = CpuTarget(isa="avx512", cores=2, l2_bytes=1 << 20, l3_bytes=32 << 20)
CALL = MicrokernelBinding("S0", m="i", n="j", k="k")
SPLIT_K = Schedule(order=("k.t", "i.t", "i", "j", "k"), tiles=(("i", 16), ("k", 100)),
                   parallel=("k.t", "i.t"), microkernel=CALL, private_sums=True)


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b


@pytest.mark.parametrize("schedule", [
    SPLIT_K,
    Schedule(order=("k.t", "i", "j", "k"), tiles=(("k", 64),), parallel=("k.t",), private_sums=True),
], ids=["calls", "loops"])
def test_k_split_among_threads_matches_numpy(schedule: Schedule) -> None:
    # ragged everywhere: m 37 = 2*16 + 5, k 1000 = 10*100, 1000 = 15*64 + 40
    kernel = polydl.compile(MATMUL, {"M": 37, "N": 45, "K": 1000}, schedule=schedule)
    assert "reduction(+: C[0:1665])" in kernel.source
    assert "a private sum per thread" in kernel.schedule.describe()
    run_and_check(kernel, _matmul)


def test_the_private_sums_add_to_what_the_output_held() -> None:
    kernel = polydl.compile(MATMUL, {"M": 20, "N": 16, "K": 400}, schedule=SPLIT_K)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((20, 400), np.float32), rng.standard_normal((400, 16), np.float32)
    c = np.full((20, 16), 3.0, np.float32)
    kernel(a, b, C=c)
    np.testing.assert_allclose(c, 3.0 + _matmul(a, b), rtol=1e-4, atol=1e-3)


def test_a_weight_gradient_sums_its_images_per_thread() -> None:
    """The stem's weight gradient on 16 cores: the images leave the calls' batch and run
    among the threads beside the output's own loops."""
    sizes = dict(N=3, C=3, K=16, H=12, W=12, R=3, S=3, stride=2, padding=1)
    model = build_model(*conv_backward.conv2d_backward_weights(**sizes))
    base = Schedule(order=("c", "k.t", "r", "n", "p", "k", "s", "q"), tiles=(("k", 16),),
                    parallel=("k.t", "r"),
                    microkernel=MicrokernelBinding("S1", m="k", n="s", k="q", batch=("n", "p")))
    split = private_sum_splits(model, SOCKET, base)[0]
    assert split.parallel == ("n", "k.t", "r") and split.microkernel.batch == ("p",)
    kernel = polydl.conv2d_backward_weights(**sizes, schedule=split)
    assert "reduction(+: dw[0:432])" in kernel.source

    def gradient(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        return np.stack([np.stack([np.einsum("nkpq,ncpq->kc", dy, xp[:, :, r:r + 11:2, s:s + 11:2])
                                   for s in range(3)], -1) for r in range(3)], -2)

    run_and_check(kernel, gradient)


@pytest.mark.parametrize("text, params, schedule, message", [
    (MATMUL, {"M": 8, "N": 8, "K": 64},
     Schedule(order=("k.t", "i", "j", "k"), tiles=(("k", 8),), parallel=("k.t",)),
     "carries a dependence and cannot run in parallel"),
    (MATMUL, {"M": 1024, "N": 1024, "K": 8}, SPLIT_K, f"over the {PRIVATE_SUM_MAX_BYTES}"),
    ("""void acc(int N, float y[N], const float x[N]) {
      for (int t = 0; t < 4; t++)
        for (int i = 1; i < N; i++)
          y[i] += y[i - 1] * x[i];
    }""", {"N": 64}, Schedule(order=("t", "i"), parallel=("t",), private_sums=True),
     "reads y beside summing into it"),
    ("""void two(int N, float y[N], float z[N], const float x[N]) {
      for (int t = 0; t < 4; t++)
        for (int i = 0; i < N; i++) {
          y[i] += x[i];
          z[i] += y[i];
        }
    }""", {"N": 64}, Schedule(order=("t", "i"), parallel=("t",), private_sums=True),
     "more than one statement"),
    (MATMUL, {"M": 16, "N": 16, "K": 64},
     Schedule(order=("k.t", "i", "j", "k"), tiles=(("k", 8),), parallel=("k.t",),
              microkernel=MicrokernelBinding("S0", m="i", n="j", k="k", pack_b=True),
              private_sums=True),
     "no private sums with fused epilogues or packed operands"),
], ids=["no-private-sums", "output-too-large", "reads-its-output", "two-statements", "packed-b"])
def test_private_sums_are_refused_where_illegal(text: str, params: dict[str, int],
                                                schedule: Schedule, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        polydl.compile(text, params, schedule=schedule)


def test_consumers_stay_after_a_nest_of_private_sums() -> None:
    model = build_model(*load_spec(MATMUL_RELU, {"M": 20, "N": 16, "K": 400}))
    fused, decisions = choose_fusion(model, SPLIT_K, SOCKET)
    assert fused.epilogues == () and "complete only after the nest" in decisions[0].reason
    with pytest.raises(ScheduleError, match="fused epilogues"):
        apply_schedule(model, replace(SPLIT_K, epilogues=("S1",)))


def test_a_socket_splits_a_long_sum_into_a_small_output() -> None:
    """64 x 64 outputs over k = 65536: 4 blocks of rows for 16 cores, or k's blocks among the
    threads as well (the 16-core Sapphire Rapids host: 264 -> 840 GFLOP/s, 1.19x torch.matmul).
    On 2 cores too, with calls of 14 rows: 1.05-1.18x two 32-row blocks without the split on
    two Zen 5 cores."""
    model = build_model(*builders.matmul(M=64, N=64, K=65536))
    best = rank(model, SOCKET)[0].schedule
    assert best.private_sums and best.parallel[0] == "k.t"
    pair = rank(model, PAIR)[0].schedule
    assert pair.private_sums and pair.tile_sizes["i"] == 14, pair.describe()


def test_private_sums_round_trip_and_stay_out_of_other_schedules_json() -> None:
    assert Schedule.from_json(SPLIT_K.to_json()) == SPLIT_K
    assert "private_sums" not in Schedule(order=("i", "j", "k")).to_dict()
