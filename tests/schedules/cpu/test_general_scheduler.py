"""Every nest is scheduled: GEMM statements distributed out of imperfect nests, the others by
isl's affine scheduler (fusion, skewing, tiles, parallel loops or a wavefront of tiles)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

import polydl
from polydl.api import lower
from polydl.driver.explain import explain
from polydl.frontends.c_loopnest import parse_c
from polydl.frontends.loading import load_spec
from polydl.poly.model import build_model
from polydl.schedules.apply import group_statements
from polydl.schedules.cpu import affine
from polydl.schedules.cpu.affine import affine_schedule, written_order_schedule
from polydl.schedules.cpu.distribution import isolate_gemms
from polydl.schedules.cpu.isl_time_limit import ScheduleTimeout, compute_schedule
from polydl.schedules.cpu.nests import _parallel_outermost, plan_nests
from polydl.schedules.cpu.written_tree import written_order_tree
from polydl.target import resolve_target
from tests.kernels import compile_c, run_and_check

ROOT = Path(__file__).resolve().parents[3]
TARGET = resolve_target("c", "x86-64-v3")


def _model(source: str, **params: int):
    return build_model(parse_c(source), params)


def test_blas_gemm_is_distributed_and_reads_a_scaled_copy() -> None:
    model = build_model(*load_spec(ROOT / "examples" / "gemm_blas.c", {"M": 24, "N": 40, "K": 16}))
    isolated = isolate_gemms(model)
    groups = group_statements(isolated)
    assert [[s.name for s in g] for g in groups.values()] == [["S0"], ["S2"], ["S1"]]
    assert isolated.statement("S1").statement.value.left.access.array == "_pd_A_scaled"

    k = polydl.compile(ROOT / "examples" / "gemm_blas.c", {"M": 24, "N": 40, "K": 16})
    assert k.schedule.microkernel is not None and k.schedule.microkernel.statement == "S1"
    rng = np.random.default_rng(0)
    a, b = rng.random((24, 16), np.float32), rng.random((16, 40), np.float32)
    c = rng.random((24, 40), np.float32)
    want = 1.5 * (a.astype(np.float64) @ b) + 0.5 * c
    np.testing.assert_allclose(k(a, b, alpha=1.5, beta=0.5, C=c.copy()), want, rtol=1e-5)


TWO_MM = """
void k2mm(int NI, int NJ, int NK, int NL, double alpha, double beta, double tmp[NI][NJ],
          const double A[NI][NK], const double B[NK][NJ], const double C[NJ][NL],
          double D[NI][NL]) {
  for (int i = 0; i < NI; i++)
    for (int j = 0; j < NJ; j++) {
      tmp[i][j] = 0.0;
      for (int k = 0; k < NK; ++k)
        tmp[i][j] += alpha * A[i][k] * B[k][j];
    }
  for (int i = 0; i < NI; i++)
    for (int j = 0; j < NL; j++) {
      D[i][j] *= beta;
      for (int k = 0; k < NJ; ++k)
        D[i][j] += tmp[i][k] * C[k][j];
    }
}
"""


def test_2mm_binds_a_microkernel_in_both_gemms() -> None:
    model = isolate_gemms(_model(TWO_MM, NI=20, NJ=24, NK=28, NL=32))
    assert len(group_statements(model)) == 5  # init, copy of A, GEMM, scale, GEMM
    plans = plan_nests(model, TARGET, with_main=False)
    assert sum(bool(p.calls) for p in plans.values()) == 1  # the GEMM that is not the main one
    k = compile_c(TWO_MM, {"NI": 20, "NJ": 24, "NK": 28, "NL": 32})
    assert k.schedule.microkernel is not None

    def numpy_2mm(alpha, beta, a, b, c):  # type: ignore[no-untyped-def]
        t = alpha * a @ b
        return t, t @ c  # outputs start zeroed: beta * D is 0

    run_and_check(k, numpy_2mm)


def test_the_nests_around_the_main_one_are_planned_once_per_model_and_target(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every schedule of a model gets the same plans for its other nests: the tuner plans
    dozens of schedules of one model, and each would rank them again."""
    from polydl.schedules.cpu import nests

    model = isolate_gemms(_model(TWO_MM, NI=20, NJ=24, NK=28, NL=32))
    ranked: list[object] = []
    real = nests._band_plan

    def counted(sub, target):  # type: ignore[no-untyped-def]
        ranked.append(sub)
        return real(sub, target)

    monkeypatch.setattr(nests, "_band_plan", counted)
    first = plan_nests(model, TARGET, with_main=False)
    once = len(ranked)
    assert once >= 1
    again = plan_nests(model, TARGET, with_main=False)
    assert len(ranked) == once and again == first and again is not first
    other = replace(TARGET, cores=TARGET.cores + 1)
    plan_nests(model, other, with_main=False)
    assert len(ranked) == 2 * once  # another target ranks them for itself
    fresh = isolate_gemms(_model(TWO_MM, NI=20, NJ=24, NK=28, NL=32))
    plan_nests(fresh, TARGET, with_main=False)
    assert len(ranked) == 3 * once  # and another model


def test_a_gemm_in_a_dependence_cycle_stays_in_its_nest() -> None:
    source = """
    void f(int N, double C[N][N], double A[N][N], const double B[N][N]) {
      for (int i = 0; i < N - 1; i++) {
        for (int k = 0; k < N; k++)
          for (int j = 0; j < N; j++)
            C[i][j] += A[i][k] * B[k][j];
        for (int j = 0; j < N; j++)
          A[i + 1][j] = C[i][j];
      }
    }"""
    model = _model(source, N=12)
    assert isolate_gemms(model) is model  # S1 feeds S0's next row: one component


def test_no_scaled_copy_of_an_operand_the_nest_writes() -> None:
    source = """
    void f(int N, double C[N][N], double A[N][N], const double B[N][N], double alpha) {
      for (int i = 0; i < N; i++)
        for (int k = 0; k < N; k++)
          for (int j = 0; j < N; j++)
            C[i][j] += alpha * A[i][k] * B[k][j];
      for (int i = 0; i < N; i++)
        A[i][i] = 0.0;
    }"""
    model = _model(source, N=8)
    assert isolate_gemms(model) is model



def test_a_sum_of_squares_is_no_gemm_to_isolate() -> None:
    """`v += d * d` over three loops has the loads of a GEMM but no m or n loop (both operands
    are one cell): no microkernel takes it, so its nest stays whole and `d` a scalar."""
    source = """
    void f(int N, int C, int H, const float x[N][C][H], float v[N]) {
      for (int n = 0; n < N; n++) {
        float s = 0.0f;
        for (int c = 0; c < C; c++)
          for (int h = 0; h < H; h++) {
            float d = x[n][c][h] - 1.0f;
            s += d * d;
          }
        v[n] = s;
      }
    }"""
    model = _model(source, N=4, C=3, H=5)
    assert isolate_gemms(model) is model

JACOBI_2D = """
void jacobi2d(int T, int N, double A[N][N], double B[N][N]) {
  for (int t = 0; t < T; t++) {
    for (int i = 1; i < N - 1; i++)
      for (int j = 1; j < N - 1; j++)
        B[i][j] = 0.2 * (A[i][j] + A[i][j-1] + A[i][j+1] + A[i+1][j] + A[i-1][j]);
    for (int i = 1; i < N - 1; i++)
      for (int j = 1; j < N - 1; j++)
        A[i][j] = 0.2 * (B[i][j] + B[i][j-1] + B[i][j+1] + B[i+1][j] + B[i-1][j]);
  }
}"""


def test_stencil_runs_its_space_loops_in_parallel_tiles() -> None:
    k = compile_c(JACOBI_2D, {"T": 3, "N": 600})
    assert k.schedule.scheduler == "affine"
    assert "#pragma omp parallel" in k.source
    run_and_check(k)
    bands = affine_schedule(_model(JACOBI_2D, T=3, N=150), replace(TARGET, cores=64)).bands
    # both tile loops of a space nest carry no dependence: where the first alone has too few
    # iterations for the cores, they run as one parallel loop
    assert any(b.tiles and b.parallel == "loops 0, 1" for b in bands)


RECURRENCE = """
void sweep(int N, double A[N][N]) {
  for (int i = 1; i < N; i++)
    for (int j = 1; j < N; j++)
      A[i][j] = 0.5 * (A[i-1][j] + A[i][j-1]);
}"""


@pytest.mark.slow
def test_no_parallel_loop_gives_a_wavefront_of_tiles() -> None:
    bands = affine_schedule(_model(RECURRENCE, N=700), TARGET).bands
    assert [b.parallel for b in bands] == ["wavefront"] and bands[0].tiles
    # one fork and join per tile diagonal pays at N = 2000 on 2 cores; the diagonals' loop
    # then holds one parallel region, a barrier per diagonal
    source = compile_c(RECURRENCE, {"N": 2000}, target=replace(TARGET, cores=2)).source
    assert "#pragma omp parallel\n" in source and "#pragma omp for schedule(static)" in source
    cheap = replace(TARGET, fork_join_cycles=1.0, barrier_cycles=1.0)
    run_and_check(compile_c(RECURRENCE, {"N": 300}, target=cheap))


SEIDEL = """
void seidel(int T, int N, double A[N][N]) {
  for (int t = 0; t < T; t++)
    for (int i = 1; i < N - 1; i++)
      for (int j = 1; j < N - 1; j++)
        A[i][j] = (A[i-1][j-1] + A[i-1][j] + A[i-1][j+1] + A[i][j-1] + A[i][j]
                   + A[i][j+1] + A[i+1][j-1] + A[i+1][j] + A[i+1][j+1]) / 9.0;
}"""


def test_time_loop_stencil_is_skewed_and_correct() -> None:
    bands = affine_schedule(_model(SEIDEL, T=20, N=1000), TARGET).bands
    assert any(b.skewed for b in bands) and any(b.parallel for b in bands)
    run_and_check(compile_c(SEIDEL, {"T": 3, "N": 60}))


FLOYD = """
void floyd(int N, double path[N][N]) {
  for (int k = 0; k < N; k++)
    for (int i = 0; i < N; i++)
      for (int j = 0; j < N; j++)
        path[i][j] = path[i][j] < path[i][k] + path[k][j] ? path[i][j]
                                                          : path[i][k] + path[k][j];
}"""


@pytest.mark.slow
def test_parallelism_too_fine_to_pay_falls_back_to_the_written_order() -> None:
    model = _model(FLOYD, N=40)
    plan = plan_nests(model, TARGET, with_main=True)[0]
    assert plan.how.startswith("written order") and plan.bands[0] == "band (k) of S0; sequential"
    k = compile_c(FLOYD, {"N": 40})
    assert "#pragma omp parallel" not in k.source
    run_and_check(k)


@pytest.mark.parametrize("example", ["layernorm.c", "softmax.c"])
def test_row_operators_run_rows_in_parallel(example: str) -> None:
    k = polydl.compile(ROOT / "examples" / example, {"N": 256, "D": 256})
    assert k.schedule.scheduler == "affine" and "#pragma omp parallel for" in k.source
    run_and_check(k)


def test_row_operators_keep_their_written_rows_and_streaming_inner_loops() -> None:
    """isl fuses LayerNorm's three sweeps one after the other into a tiled band; the written
    order (rows in parallel, each sweep a unit-stride loop) is taken instead."""
    model = build_model(*load_spec(ROOT / "examples" / "layernorm.c", {"N": 256, "D": 768}))
    plan = plan_nests(model, TARGET, with_main=True)[0]
    assert plan.how.startswith("written order (its outermost loop is parallel")
    assert plan.bands[0].startswith("band (i) of S0") and plan.bands[0].endswith("parallel loop 0")


TRISOLV = (ROOT / "benchmarks" / "general" / "trisolv.c").read_text()


def test_a_triangular_solve_keeps_its_dot_products_instead_of_a_wavefront() -> None:
    model = _model(TRISOLV, N=600)
    # a wavefront of tiles, where it pays at all, would split the sums
    assert {b.parallel for b in affine_schedule(model, TARGET).bands} <= {"", "wavefront"}
    plan = plan_nests(model, TARGET, with_main=True)[0]
    assert plan.how.startswith("written order (")
    k = compile_c(TRISOLV, {"N": 600})
    assert "#pragma omp simd reduction" in k.source
    run_and_check(k)


DOITGEN = (ROOT / "benchmarks" / "general" / "doitgen.c").read_text()


def test_an_initialisation_in_a_band_does_not_stop_the_unit_stride_interchange() -> None:
    """`sum[p] = 0` sits at s = 0 of the (p, s) band: p, along which sum and C4 move at unit
    stride, still goes innermost in each tile."""
    model = _model(DOITGEN, NR=3, NQ=4, NP=140)
    (tiled,) = [b for b in affine_schedule(model, TARGET).bands if b.tiles]
    assert tiled.innermost == "p"
    run_and_check(compile_c(DOITGEN, {"NR": 3, "NQ": 4, "NP": 140}))


def test_an_initialisation_in_a_band_runs_in_a_loop_of_its_own_not_behind_a_guard() -> None:
    """`sum[p] = 0` at s = 0 of the (s, p) loops: the iterations at s = 0 run apart, so no
    loop below s tests s on every iteration (a guard that kept the p loop scalar, 5x slower at
    PolyBench's MINI size)."""
    kernel = compile_c(DOITGEN, {"NR": 10, "NQ": 8, "NP": 12})
    body = kernel.source[kernel.source.index("int doitgen("):]
    assert not re.search(r"if \(_t\d+ == 0\)", body)
    run_and_check(kernel)


def test_a_tile_loop_that_runs_once_is_never_marked_parallel() -> None:
    """64 rows in tiles of 128: the row-tile loop is left out of the code, and a mark on it
    would have run the next loop (a sweep along the row, which carries the sums) in parallel."""
    model = build_model(*load_spec(ROOT / "examples" / "layernorm.c", {"N": 64, "D": 256}))
    tiled = [b for b in affine_schedule(model, TARGET).bands if b.tiles]
    assert tiled and not any(b.parallel for b in tiled)
    run_and_check(polydl.compile(ROOT / "examples" / "layernorm.c", {"N": 64, "D": 256}))


def test_explain_lists_each_band_of_the_general_scheduler() -> None:
    text = explain(lower(parse_c(SEIDEL), {"T": 20, "N": 1000}))
    summary = text.split("details:")[0]
    assert "general scheduler" in summary and "skewed" in summary and "parallel" in summary


HEAT = """
void heat(int T, int N, double A[N][N], double B[N][N]) {
  for (int t = 0; t < T; t++) {
    for (int i = 1; i < N - 1; i++)
      for (int j = 1; j < N - 1; j++)
        B[i][j] = 0.25 * (A[i-1][j] + A[i+1][j] + A[i][j-1] + A[i][j+1]);
    for (int i = 1; i < N - 1; i++)
      for (int j = 1; j < N - 1; j++)
        A[i][j] = 0.25 * (B[i-1][j] + B[i+1][j] + B[i][j-1] + B[i][j+1]);
  }
}"""


def test_written_order_tree_keeps_the_source_order() -> None:
    model = _model(HEAT, T=2, N=6)
    tree = written_order_tree(model).get_map()
    written = model.original_schedule.intersect_domain(model.domains)
    assert tree.lex_lt_union_map(tree).is_equal(written.lex_lt_union_map(written))


def test_isl_out_of_time_keeps_the_written_order_with_parallel_rows(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Where isl's scheduler takes too long (minutes on a 3-d heat stencil), the written order
    is kept, each space nest's outer loop parallel."""
    monkeypatch.setattr(affine, "SCHEDULE_SECONDS", 0.0)
    model = _model(HEAT, T=4, N=400)
    chosen = affine.affine_schedule(model, TARGET)
    assert chosen.origin.startswith("written order (isl's scheduler took more than")
    # the written order has a band per loop: each space nest's rows run in parallel (398 rows
    # feed 8 cores alone: no collapse, the columns stay a loop gcc vectorises)
    assert [b.parallel for b in chosen.bands] == ["", "loop 0", "", "loop 0", ""]
    k = compile_c(HEAT, {"T": 4, "N": 40})
    run_and_check(k)


def test_isl_schedule_in_a_child_comes_back_with_its_flags() -> None:
    domain = isl.UnionSet("{ S[i, j] : 0 <= i < 10 and 0 <= j < 99 }")
    dep = isl.UnionMap("{ S[i, j] -> S[i, j + 1] : 0 <= i < 10 and 0 <= j < 98 }")
    constraints = (isl.ScheduleConstraints.on_domain(domain).set_validity(dep)
                   .set_proximity(dep).set_coincidence(dep))
    band = compute_schedule(constraints, 30.0).get_root().child(0)
    assert band.band_get_permutable() and band.band_member_get_coincident(0)
    with pytest.raises(ScheduleTimeout):
        compute_schedule(constraints, 0.0)


def test_isl_schedule_in_process_where_there_is_no_fork(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delattr("os.fork")
    domain = isl.UnionSet("{ S[i] : 0 <= i < 10 }")
    dep = isl.UnionMap("{ S[i] -> S[i + 1] : 0 <= i < 9 }")
    constraints = isl.ScheduleConstraints.on_domain(domain).set_validity(dep)
    assert compute_schedule(constraints, 0.0).get_map().is_equal(isl.UnionMap("{ S[i] -> [i] }"))


SYRK_AAT = """
void syrk(int N, int M, double C[N][N], const double A[N][M]) {
  for (int i = 0; i < N; i++)
    for (int k = 0; k < M; k++)
      for (int j = 0; j <= i; j++)
        C[i][j] += A[i][k] * A[j][k];
}
"""


def test_a_strided_innermost_loop_is_ranked_below_tiles_that_stream() -> None:
    """j walks A[j][k] a row at a time; with k innermost every access streams (a dot
    product in a register), in tiles."""
    k = compile_c(SYRK_AAT, {"N": 150, "M": 140})
    assert k.schedule.order[-1] == "k" and k.schedule.tiles
    assert "#pragma omp simd reduction" in k.source
    run_and_check(k)


TWO_STREAMS = """
void two(float y[4][64][512], float z[4][64][512], const float x[4][64][512]) {
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 64; j++)
      for (int k = 0; k < 512; k++) {
        y[i][j][k] = x[i][j][k] * 2.0f;
        z[i][j][k] = x[i][j][k] + 1.0f;
      }
}"""


@pytest.mark.slow
def test_written_order_runs_two_dependence_free_loops_as_one() -> None:
    """The written order of a nest whose two outer loops carry no dependence runs both as one
    parallel loop (4 rows alone would leave cores idle), and still counts as parallel from its
    outermost loop (what keeps a streaming nest's written order over isl's tiles)."""
    model = _model(TWO_STREAMS)
    written = written_order_schedule(model, TARGET, "test")
    assert written.bands[0].parallel == "loops 0, 1", written.bands
    assert _parallel_outermost(written, model)
    k = compile_c(TWO_STREAMS, {}, target=TARGET)
    assert "collapse(2)" in k.source
    run_and_check(k)
