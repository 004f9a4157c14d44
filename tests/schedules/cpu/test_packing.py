"""Packing B into n blocks and tiling k: schedules that copy an operand before the calls
that read it, checked against numpy on ragged shapes; the copy is refused where illegal."""

import numpy as np
import pytest

import polydl
from polydl.api import build_kernel
from polydl.errors import ScheduleError
from polydl.frontends import builders, load_spec
from polydl.poly.model import build_model
from polydl.schedules.apply import apply_schedule
from polydl.schedules.cpu.rank import rank
from polydl.schedules.schedule import MicrokernelBinding, Schedule
from polydl.target import CpuTarget
from tests.kernels import run_and_check
from tests.poly.test_model import MATMUL

PACKED = MicrokernelBinding("S0", m="i", n="j", k="k", pack_b=True)
TILES = (("i", 12), ("j", 16), ("k", 8))


@pytest.mark.parametrize(
    "order, parallel",
    [
        (("j.t", "k.t", "i.t", "i", "j", "k"), ("j.t",)),  # copy per n block, in the thread
        (("j.t", "i.t", "k.t", "i", "j", "k"), ("i.t",)),  # copy per n block, before i.t
        (("i.t", "j.t", "k.t", "i", "j", "k"), ("i.t",)),  # i.t would repeat it: all first
        (("k.t", "j.t", "i.t", "i", "j", "k"), ()),
    ],
    ids=["n-block-parallel", "inner-parallel", "whole-before-nest", "serial"],
)
def test_packed_and_k_tiled_matmul_matches_numpy(order: tuple[str, ...], parallel: tuple[str, ...]) -> None:
    schedule = Schedule(order=order, tiles=TILES, parallel=parallel, microkernel=PACKED)
    # every extent leaves a remainder tile: m 37 = 3*12 + 1, n 45 = 2*16 + 13, k 19 = 2*8 + 3
    kernel = polydl.compile(MATMUL, {"M": 37, "N": 45, "K": 19}, schedule=schedule)
    assert "_pd_packed_B" in kernel.source
    run_and_check(kernel, lambda a, b: a.astype(np.float64) @ b)


def test_whole_n_extent_is_one_packed_block() -> None:
    schedule = Schedule(order=("i.t", "i", "j", "k"), tiles=(("i", 6),), parallel=("i.t",),
                        microkernel=PACKED)
    kernel = polydl.compile(MATMUL, {"M": 20, "N": 21, "K": 9}, schedule=schedule)
    run_and_check(kernel, lambda a, b: a.astype(np.float64) @ b)


def test_transposed_b_is_packed_into_unit_stride() -> None:
    spec = """
    void mt(int M, int N, int K, float C[M][N], const float A[M][K], const float B[N][K]) {
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
          for (int k = 0; k < K; k++)
            C[i][j] += A[i][k] * B[j][k];
    }"""
    schedule = Schedule(order=("j.t", "i", "j", "k"), tiles=(("j", 8),), parallel=("j.t",),
                        microkernel=PACKED)
    kernel = polydl.compile(spec, {"M": 13, "N": 19, "K": 11}, schedule=schedule)
    run_and_check(kernel, lambda a, b: a.astype(np.float64) @ b.T)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("q_tile", [None, 4])
def test_strided_convolution_packs_an_im2col_copy(q_tile: int | None, dtype: str) -> None:
    """Plain layout, stride 2: x is read with stride 2 along q; the copy per (n, p) makes it
    unit stride and merges the (c, r, s) reduction into one call. A bfloat16 x is copied as
    bfloat16 (the output accumulates in float32). (The builder's form that reads x in place:
    `polydl.conv2d` splits such a stem's columns by phase on the C target instead.)"""
    binding = MicrokernelBinding("S1", m="k", n="q", k="s", batch=("c", "r"), pack_b=True)
    order = ("n", "p") + (("q.t",) if q_tile else ()) + ("c", "r", "k", "q", "s")
    schedule = Schedule(order=order, tiles=(("q", q_tile),) if q_tile else (),
                        parallel=("n",), microkernel=binding)
    nest, params = builders.conv2d(N=2, C=3, K=10, H=15, W=17, R=3, S=3, stride=2, padding=1,
                                   dtype=dtype)
    kernel = build_kernel(nest, params, schedule=schedule)
    packed_type = "uint16_t" if dtype == "bfloat16" else "float"
    assert f"{packed_type} *restrict _pd_packed_xp" in kernel.source
    run_and_check(kernel)


@pytest.mark.parametrize("dtype, isa, cores", [("float32", "avx2", 2), ("bfloat16", "avx512amx", 16)])
def test_ranking_packs_the_first_resnet_layer(dtype: str, isa: str, cores: int) -> None:
    nest, params = builders.conv2d(N=2, C=3, K=64, H=224, W=224, R=7, S=7, stride=2, padding=3,
                                   dtype=dtype)
    best = rank(build_model(nest, params), CpuTarget(isa=isa, cores=cores))[0].schedule
    mk = best.microkernel
    assert mk is not None and mk.pack_b and (mk.m, mk.n, mk.k) == ("k", "q", "s")


def test_packing_needs_n_and_k_from_zero() -> None:
    spec = MATMUL.replace("for (int k = 0;", "for (int k = 1;")
    model = build_model(*load_spec(spec, {"M": 8, "N": 8, "K": 8}))
    schedule = Schedule(order=("i", "j", "k"), microkernel=PACKED)
    with pytest.raises(ScheduleError, match="does not start at 0"):
        apply_schedule(model, schedule)


def test_batch_loops_cannot_be_tiled() -> None:
    nest, params = builders.conv2d(N=1, C=2, K=16, H=6, W=6, R=3, S=3, layout="nchw16c")
    model = build_model(nest, params)
    binding = MicrokernelBinding("S0", m="q", n="k", k="c", batch=("cb", "r", "s"))
    order = ("n", "kb", "p", "r.t", "cb", "r", "s", "q", "k", "c")
    with pytest.raises(ScheduleError, match="batch loop 'r'"):
        apply_schedule(model, Schedule(order=order, tiles=(("r", 2),), microkernel=binding))


def test_ranking_packs_a_large_matmul_and_not_a_vector_product() -> None:
    machine = CpuTarget(isa="avx2", cores=2)
    large = build_model(*builders.matmul(M=384, N=512, K=1024))
    best = rank(large, machine)[0].schedule
    assert best.microkernel is not None and best.microkernel.pack_b
    # calls over all of k, each thread's n blocks copied by itself: on two AVX2 cores 1.03-1.09x
    # the k blocks of 256 with both block loops parallel, whose threads read each other's copies
    assert "k" not in best.tile_sizes and best.parallel == ("j.t",)
    row = build_model(*builders.matmul(M=2, N=512, K=1024))
    mk = rank(row, machine)[0].schedule.microkernel
    assert mk is not None and not mk.pack_b


def test_pack_flag_survives_json() -> None:
    schedule = Schedule(order=("j.t", "i", "j", "k"), tiles=(("j", 8),), microkernel=PACKED)
    assert Schedule.from_json(schedule.to_json()) == schedule
    assert "B packed" in schedule.describe()


def test_copy_between_parallel_loops_leaves_the_outer_one_parallel() -> None:
    # n blocks outside m blocks, B copied per n block: the copy is the body of j.t before i.t,
    # so OpenMP can only run j.t on the threads; the plan, the description and the code agree
    schedule = Schedule(order=("j.t", "i.t", "i", "j", "k"), tiles=(("i", 16), ("j", 16)),
                        parallel=("j.t", "i.t"), microkernel=PACKED)
    model = build_model(*builders.matmul(M=64, N=64, K=16))
    main = apply_schedule(model, schedule).main
    assert [main.order[d] for d in main.parallel_dims] == ["j.t"]
    kernel = polydl.compile(MATMUL, {"M": 64, "N": 64, "K": 16}, schedule=schedule)
    assert kernel.schedule.parallel == ("j.t",)
    assert "collapse" not in kernel.source
    run_and_check(kernel, lambda a, b: a.astype(np.float64) @ b)
    # without the copy both loops run, collapsed
    plain = Schedule(order=("j.t", "i.t", "i", "j", "k"), tiles=(("i", 16), ("j", 16)),
                     parallel=("j.t", "i.t"), microkernel=MicrokernelBinding("S0", m="i", n="j", k="k"))
    assert polydl.compile(MATMUL, {"M": 64, "N": 64, "K": 16}, schedule=plain).schedule.parallel == ("j.t", "i.t")


def test_ranking_counts_the_threads_a_copy_leaves() -> None:
    # 512^3 on 16 cores, n blocks of 64 outside m blocks of 128, B copied per n block: the
    # copy leaves 8 units of j.t for 16 threads, or i.t's 4 inside each block, never 32
    target = CpuTarget(isa="avx512", cores=16, l1_bytes=48 << 10, l2_bytes=2 << 20,
                       l3_bytes=60 << 20)
    model = build_model(*builders.matmul(M=512, N=512, K=512))
    ranked = rank(model, target)
    copied_per_block = [
        r for r in ranked
        if r.schedule.microkernel is not None and r.schedule.microkernel.pack_b
        and r.schedule.order[:2] == ("j.t", "i.t") and r.schedule.tile_sizes.get("j") == 64
        and r.schedule.tile_sizes.get("i") == 128
    ]
    assert copied_per_block
    for r in copied_per_block:
        assert len(r.schedule.parallel) == 1
        assert r.balance >= 2.0
