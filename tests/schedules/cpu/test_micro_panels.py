"""BLIS-like blockings over a packed B: calls one register tile wide (contiguous micro-panels
of B), copies of B per k tile, and C tiles prefetched by the microkernel; each checked against
numpy on ragged shapes and pinned in the generated source."""

import re
from dataclasses import replace

import numpy as np
import pytest

import polydl
from polydl.codegen.c.microkernels import BrgemmSpec, choose_microkernel
from polydl.errors import ScheduleError
from polydl.frontends import builders, load_spec
from polydl.poly.model import build_model
from polydl.schedules.apply import apply_schedule
from polydl.schedules.cpu.candidates import k_tilings, micro_panel_candidates
from polydl.schedules.cpu.cost import evaluate
from polydl.schedules.cpu.rank import rank
from polydl.schedules.microkernel import PackedB
from polydl.schedules.schedule import MicrokernelBinding, Schedule
from polydl.target import CpuTarget
from tests.kernels import run_and_check
from tests.poly.test_model import MATMUL

PACKED = MicrokernelBinding("S0", m="i", n="j", k="k", pack_b=True)
AVX2_1 = CpuTarget(isa="avx2", cores=1)
AVX2_2 = CpuTarget(isa="avx2", cores=2)


def _pack(schedule: Schedule, sizes: dict[str, int]) -> PackedB:
    model = build_model(*load_spec(MATMUL, sizes))
    call = apply_schedule(model, schedule).main.calls["S0"]
    assert call.pack is not None
    return call.pack


@pytest.mark.parametrize(
    "order, parallel, level, k_blocked, parallel_copy",
    [
        # every loop outside the copy picks its slot: one k tile of one n block per copy
        (("j.t", "k.t", "i.t", "i", "j", "k"), ("j.t",), 2, True, False),
        (("k.t", "j.t", "i.t", "i", "j", "k"), (), 2, True, True),
        # the m blocks between k's and n's tile loops would repeat it: the k tile of every
        # n block is copied right inside k's tile loop, on the threads
        (("k.t", "i.t", "j.t", "i", "j", "k"), ("i.t",), 1, True, True),
        # a parallel loop outside k's tile loop that does not pick the slot: all first
        (("i.t", "k.t", "j.t", "i", "j", "k"), ("i.t",), 0, False, True),
    ],
)
def test_packed_b_is_copied_per_k_tile_where_nothing_repeats_it(
    order: tuple[str, ...], parallel: tuple[str, ...], level: int, k_blocked: bool,
    parallel_copy: bool,
) -> None:
    sizes = {"M": 37, "N": 45, "K": 19}
    schedule = Schedule(order=order, tiles=(("i", 12), ("j", 16), ("k", 8)), parallel=parallel,
                        microkernel=PACKED)
    pack = _pack(schedule, sizes)
    assert (pack.level, pack.k_blocked, pack.parallel_copy) == (level, k_blocked, parallel_copy)
    kernel = polydl.compile(MATMUL, sizes, schedule=schedule)
    assert ("_pd_k0" in kernel.source) == k_blocked
    run_and_check(kernel, lambda a, b: a.astype(np.float64) @ b)


@pytest.mark.parametrize("sizes", [{"M": 50, "N": 45, "K": 41}, {"M": 257, "N": 131, "K": 509}])
def test_micro_panel_blockings_match_numpy(sizes: dict[str, int]) -> None:
    model = build_model(*load_spec(MATMUL, sizes))
    candidates = micro_panel_candidates(model, AVX2_2, ("i", "j", "k"),
                                        MicrokernelBinding("S0", m="i", n="j", k="k"))
    assert candidates
    for schedule in candidates[:2]:
        assert schedule.tile_sizes["j"] == 16 and schedule.microkernel.pack_b  # type: ignore[union-attr]
        assert schedule.order[-4:] == ("j.t", "i", "j", "k")  # the n loop right around the call
        kernel = polydl.compile(MATMUL, sizes, schedule=schedule)
        run_and_check(kernel, lambda a, b: a.astype(np.float64) @ b)


def test_micro_panels_need_a_wide_n_and_enough_rows() -> None:
    binding = MicrokernelBinding("S0", m="i", n="j", k="k")
    for sizes in ({"M": 64, "N": 16, "K": 256}, {"M": 12, "N": 512, "K": 256}):
        model = build_model(*load_spec(MATMUL, sizes))
        assert micro_panel_candidates(model, AVX2_2, ("i", "j", "k"), binding) == []


@pytest.mark.parametrize("machine", [AVX2_1, AVX2_2], ids=["1 core", "2 cores"])
def test_ranking_chooses_micro_panels_for_a_large_square_matmul(machine: CpuTarget) -> None:
    best = rank(build_model(*builders.matmul(M=1024, N=1024, K=1024)), machine)[0].schedule
    mk = best.microkernel
    assert mk is not None and mk.pack_b
    # calls one register tile wide over a packed B, over all of k or blocks of 256
    assert best.tile_sizes["j"] == 16 and best.tile_sizes.get("k", 1024) in (256, 1024)
    assert best.parallel


def test_ranking_chooses_micro_panels_for_odd_sizes() -> None:
    # n = 131 is no multiple of the register tile and k = 509 no multiple of the k block
    best = rank(build_model(*builders.matmul(M=257, N=131, K=509)), AVX2_2)[0].schedule
    assert best.tile_sizes.get("j") == 16 and best.microkernel is not None
    assert best.microkernel.pack_b and best.tile_sizes.get("k") == 255


def test_outer_product_kernel_prefetches_its_c_tile_and_adds_it_at_the_end() -> None:
    spec = BrgemmSpec(m=6, n=16, k=32, a_m=32, a_k=1, b_k=16, b_n=1, c_m=100, c_n=1)
    source = choose_microkernel(spec, "avx2", name="mk").source
    # one address in each cache line of each of the 6 rows of C (16 floats may span two)
    assert len(re.findall(r"_mm_prefetch", source)) == 12
    assert "_mm256_add_ps(_mm256_loadu_ps(cp + 500)" in source
    overwrite = choose_microkernel(BrgemmSpec(**{**spec.__dict__, "beta": 0.0}), "avx2", name="mk")
    assert "_mm_prefetch" not in overwrite.source and "_mm256_add_ps" not in overwrite.source


PANELS = MicrokernelBinding("S0", m="i", n="j", k="k", pack_a=True, pack_b=True)


@pytest.mark.parametrize(
    "order, tiles, parallel",
    [
        # the block of one (m tile, k tile), copied inside both tile loops, on each thread
        (("k.t", "i.t", "j.t", "i", "j", "k"), (("i", 12), ("j", 16), ("k", 8)), ("i.t",)),
        (("i.t", "k.t", "j.t", "i", "j", "k"), (("i", 18), ("j", 16), ("k", 16)), ("i.t",)),
        # no m or k tile loop: all of A before the nest
        (("j.t", "i", "j", "k"), (("j", 16),), ("j.t",)),
    ],
)
def test_packed_a_panels_match_numpy(order: tuple[str, ...], tiles: tuple[tuple[str, int], ...],
                                     parallel: tuple[str, ...]) -> None:
    # m 37 leaves a 1-row panel, n 45 a 13-wide tile, k 19 a 3-step block
    schedule = Schedule(order=order, tiles=tiles, parallel=parallel, microkernel=PANELS)
    kernel = polydl.compile(MATMUL, {"M": 37, "N": 45, "K": 19}, schedule=schedule)
    assert "_pd_panels_A" in kernel.source and "A packed" in kernel.schedule.describe()
    run_and_check(kernel, lambda a, b: a.astype(np.float64) @ b)


def test_packed_a_kernel_reads_register_tiles_from_panels() -> None:
    spec = BrgemmSpec(m=14, n=16, k=8, a_m=1, a_k=6, b_k=16, b_n=1, c_m=16, c_n=1,
                      a_panel_rows=6, a_panel_m=8)
    kernel = choose_microkernel(spec, "avx2", name="mk")
    assert (kernel.mr, kernel.form) == (6, "outer-n")
    assert "ap = a + m0 * 8;" in kernel.source  # panel p at p * 6 rows * k 8
    # 14 rows: two full panels and a remainder tile of 2 rows, all at unit row stride
    assert "2 x 16 block of C" in kernel.source and "ak + 7" in kernel.source


@pytest.mark.parametrize(
    "order, tiles, message",
    [
        (("j.t", "i.t", "k.t", "i", "j", "k"), (("i", 12), ("j", 16), ("k", 8)), "would repeat"),
        (("k.t", "i.t", "j.t", "i", "j", "k"), (("i", 10), ("j", 16), ("k", 8)), "no multiple"),
    ],
)
def test_packing_a_is_refused_where_the_copy_would_repeat_or_split_a_panel(
    order: tuple[str, ...], tiles: tuple[tuple[str, int], ...], message: str
) -> None:
    model = build_model(*load_spec(MATMUL, {"M": 37, "N": 45, "K": 19}))
    with pytest.raises(ScheduleError, match=message):
        apply_schedule(model, Schedule(order=order, tiles=tiles, microkernel=PANELS))


def test_packing_a_is_refused_where_the_nest_writes_it() -> None:
    spec = """
    void acc(int N, float A[N][N], const float B[N][N]) {
      for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
          for (int k = 0; k < N; k++)
            A[i][j] += A[i][k] * B[k][j];
    }"""
    model = build_model(*load_spec(spec, {"N": 8}))
    binding = MicrokernelBinding("S0", m="i", n="j", k="k", pack_a=True)
    with pytest.raises(ScheduleError):
        apply_schedule(model, Schedule(order=("i", "j", "k"), microkernel=binding))


def test_packed_a_needs_polydls_simd_kernel() -> None:
    spec = BrgemmSpec(m=12, n=16, k=8, a_m=1, a_k=6, b_k=16, b_n=1, c_m=16, c_n=1,
                      a_panel_rows=6, a_panel_m=8)
    with pytest.raises(ScheduleError, match="LIBXSMM"):
        choose_microkernel(spec, "avx2", name="mk", backend="libxsmm")
    with pytest.raises(ScheduleError, match="SIMD"):
        choose_microkernel(spec, "scalar", name="mk")


def test_micro_panel_blockings_leave_a_in_place() -> None:
    # packed A panels measured slower in these blockings: the ranking does not choose them
    model = build_model(*builders.matmul(M=1024, N=1024, K=1024))
    binding = MicrokernelBinding("S0", m="i", n="j", k="k")
    assert not any(s.microkernel.pack_a  # type: ignore[union-attr]
                   for s in micro_panel_candidates(model, AVX2_2, ("i", "j", "k"), binding))


def test_pack_a_flag_survives_json() -> None:
    schedule = Schedule(order=("j.t", "i", "j", "k"), tiles=(("j", 16),), microkernel=PANELS)
    assert Schedule.from_json(schedule.to_json()) == schedule


ZEN4_PAIR = CpuTarget(isa="avx512", cores=2, l2_bytes=1 << 20, l3_bytes=32 << 20)


def test_a_long_reduction_is_blocked_so_b_panels_stay_in_l2() -> None:
    """A call over all of k = 32768 reads its strip's 8 MiB micro-panel of B from memory for
    every register tile down m; in k blocks the panel stays in L2 (two Zen 4 cores: 42 ->
    136 GFLOP/s; 2 pinned Sapphire Rapids cores: 76 -> 114)."""
    model = build_model(*builders.matmul(M=128, N=128, K=32768))
    best = rank(model, ZEN4_PAIR)[0].schedule
    assert best.tile_sizes.get("k", 32768) <= 2048
    whole_k = Schedule(order=("i.t", "j.t", "i", "j", "k"), tiles=(("i", 64), ("j", 64)),
                       microkernel=MicrokernelBinding("S0", m="i", n="j", k="k"))
    blocked = k_tilings(model, ZEN4_PAIR, whole_k)
    assert [s.order for s in blocked] == [("i.t", "j.t", "k.t", "i", "j", "k")]
    # the panel's re-reads show in the traffic into L2
    assert evaluate(model, ZEN4_PAIR, whole_k).traffic_bytes["l2"] > \
        4 * evaluate(model, ZEN4_PAIR, blocked[0]).traffic_bytes["l2"]
    # a short k keeps its calls whole
    square = build_model(*builders.matmul(M=512, N=512, K=512))
    assert k_tilings(square, ZEN4_PAIR, replace(whole_k, tiles=(("i", 64), ("j", 64)))) == []


def test_k_blocks_of_a_long_reduction_match_numpy() -> None:
    schedule = Schedule(order=("i.t", "j.t", "k.t", "i", "j", "k"),
                        tiles=(("i", 16), ("j", 32), ("k", 300)), parallel=("i.t", "j.t"),
                        microkernel=MicrokernelBinding("S0", m="i", n="j", k="k"))
    kernel = polydl.compile(MATMUL, {"M": 37, "N": 45, "K": 1000}, schedule=schedule)
    run_and_check(kernel, lambda a, b: a.astype(np.float64) @ b)


@pytest.mark.parametrize("machine, shape, offered", [
    (CpuTarget(isa="avx512", cores=16, l2_bytes=2 << 20, l3_bytes=300 << 20), (512, 512, 512), True),
    (CpuTarget(isa="avx2", cores=2), (512, 512, 512), False),
    (CpuTarget(isa="avx512", cores=16, l2_bytes=2 << 20, l3_bytes=300 << 20), (4096, 16, 1024), False),
], ids=["avx512", "avx2", "one-vector-wide-b"])
def test_calls_of_128_rows_where_32_registers_hold_wide_tiles(
        machine: CpuTarget, shape: tuple[int, int, int], offered: bool) -> None:
    """Calls of 128 rows read each block of B for twice the rows; measured faster only with
    AVX-512's 32 registers and a B several vectors wide."""
    from polydl.schedules.cpu.candidates import candidates
    model = build_model(*builders.matmul(*shape))
    rows = {dict(s.tiles).get("i", shape[0]) for s in candidates(model, machine) if s.microkernel}
    assert (128 in rows) == offered
