"""The general scheduler prices every parallel loop and wavefront with the target's fork and
barrier costs against the work it counts exactly, hoists the forks of parallel loops inside
sequential ones into one parallel region, and keeps the written order unless its model puts
isl's order ahead."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import islpy as isl
import pytest

from polydl.frontends.c_loopnest import parse_c
from polydl.poly.dependences import dependences_of
from polydl.poly.model import build_model
from polydl.schedules.cpu.forks import price_loop, vectorised_statements
from polydl.schedules.cpu.nests import plan_nests
from polydl.schedules.cpu.written_tree import written_order_tree
from polydl.target import resolve_target
from tests.kernels import compile_c, run_and_check
from tests.schedules.cpu.test_general_scheduler import JACOBI_2D as JACOBI
from tests.schedules.cpu.test_general_scheduler import SYRK_AAT

ROOT = Path(__file__).resolve().parents[3]
TWO_CORES = replace(resolve_target("c", "x86-64-v3"), cores=2)
# forks and barriers for free: every parallel loop pays, whatever its size
FREE_FORKS = replace(TWO_CORES, fork_join_cycles=1.0, barrier_cycles=1.0)

FLOYD = (ROOT / "benchmarks" / "general" / "floyd_warshall.c").read_text()
FDTD = (ROOT / "benchmarks" / "general" / "fdtd_2d.c").read_text()


def _model(source: str, **params: int):  # type: ignore[no-untyped-def]
    return build_model(parse_c(source), params)


def test_a_loop_is_priced_per_start_with_its_iterations_counted() -> None:
    domain = isl.UnionSet("{ S[k, i] : 0 <= k < 10 and 0 <= i < 100 }")
    loop = price_loop(domain, isl.UnionMap("{ S[k, i] -> [k] }"), isl.UnionMap("{ S[k, i] -> [i] }"),
                      2, lambda name: 1.0)
    assert (loop.entries, loop.units, loop.work_cycles, loop.busiest_share) == (10, 1000, 1000, 0.5)
    # 500 cycles saved against twice 10 starts
    assert loop.pays(20.0) and not loop.pays(30.0)


def test_a_triangle_split_over_threads_counts_each_rows_work() -> None:
    """Rows of 1, 2, 3 and 4 instances: OpenMP's static split gives one thread 3 + 4 of 10."""
    domain = isl.UnionSet("{ S[i, j] : 0 <= j <= i < 4 }")
    loop = price_loop(domain, isl.UnionMap("{ S[i, j] -> [] }"), isl.UnionMap("{ S[i, j] -> [i] }"),
                      2, lambda name: 1.0)
    assert (loop.entries, loop.units) == (1, 4)
    assert abs(loop.busiest_share - 0.7) < 1e-9


def test_vectorised_statements_follow_the_innermost_loops_strides_and_dependences() -> None:
    jacobi = _model(JACOBI, T=2, N=20)
    deps = dependences_of(jacobi).all
    assert vectorised_statements(jacobi, written_order_tree(jacobi).get_map(), deps) == {"S0", "S1"}
    # j walks A[j][k] a row at a time
    syrk = _model(SYRK_AAT, N=20, M=10)
    assert vectorised_statements(syrk, written_order_tree(syrk).get_map(),
                                 dependences_of(syrk).all) == frozenset()
    recurrence = _model("""
    void sweep(int N, double A[N][N]) {
      for (int i = 1; i < N; i++)
        for (int j = 1; j < N; j++)
          A[i][j] = 0.5 * (A[i-1][j] + A[i][j-1]);
    }""", N=20)
    assert vectorised_statements(recurrence, written_order_tree(recurrence).get_map(),
                                 dependences_of(recurrence).all) == frozenset()


def test_floyd_warshall_at_500_forks_no_threads_per_k() -> None:
    """7 tile diagonals of 128 x 128 tiles per k: a barrier each costs more than two threads
    save on 1, 2, 3, 4, 3, 2, 1 tiles."""
    source = compile_c(FLOYD, {"N": 500}, target=TWO_CORES).source
    assert "#pragma omp" not in source


def test_floyd_warshall_at_2800_forks_once_and_waits_at_a_barrier_per_diagonal() -> None:
    source = compile_c(FLOYD, {"N": 2800}, target=TWO_CORES).source
    body = source[source.index("int floyd_warshall("):]
    assert body.count("#pragma omp parallel\n") == 1 and "parallel for" not in body
    # the region holds the k loop: one fork for the whole nest
    assert body.index("#pragma omp parallel\n") < body.index("for (")
    assert "#pragma omp for schedule(static)" in body


@pytest.mark.slow
def test_a_parallel_region_computes_what_the_reference_does() -> None:
    k = compile_c(FLOYD, {"N": 70}, target=FREE_FORKS)
    assert "#pragma omp parallel\n" in k.source and "#pragma omp for" in k.source
    run_and_check(k)
    k = compile_c(JACOBI, {"T": 3, "N": 40}, target=FREE_FORKS)
    assert "#pragma omp parallel\n" in k.source
    run_and_check(k)


def test_a_small_nest_runs_sequentially() -> None:
    k = compile_c(JACOBI, {"T": 3, "N": 30}, target=TWO_CORES)
    assert "#pragma omp" not in k.source
    run_and_check(k)


def test_the_written_order_is_kept_where_isl_only_reorders() -> None:
    """fdtd-2d at PolyBench's MINI size: too small for threads; isl's tiles and interchange
    gain nothing the model sees over the written order's vectorised rows."""
    model = _model(FDTD, TMAX=20, NX=20, NY=30)
    plans = plan_nests(model, TWO_CORES, with_main=True)
    assert all(p.how.startswith("written order") for p in plans.values())
    run_and_check(compile_c(FDTD, {"TMAX": 4, "NX": 20, "NY": 30}, target=TWO_CORES))


def test_loops_of_one_time_step_run_parallel_together_in_one_region() -> None:
    """fdtd-2d at PolyBench's MEDIUM size: alone, only hz's rows pay their fork, and running
    them beside sequential ex and ey updates moves half of all three fields between the cores
    each step (4x slower than one thread on a 2-core Xeon). Together every loop of a step is
    parallel: one region, a barrier per loop, each thread's rows staying on its core."""
    kernel = compile_c(FDTD, {"TMAX": 100, "NX": 200, "NY": 240}, target=TWO_CORES)
    body = kernel.source[kernel.source.index("int fdtd_2d("):]
    assert body.count("#pragma omp parallel\n") == 1 and "parallel for" not in body
    assert body.count("#pragma omp for") == 4
    assert body.index("#pragma omp parallel\n") < body.index("for (")
    run_and_check(compile_c(FDTD, {"TMAX": 3, "NX": 20, "NY": 24}, target=FREE_FORKS))


BESIDE_A_RECURRENCE = """
void step(int T, int N, float A[N][N], float B[N][N]) {
  for (int t = 0; t < T; t++) {
    for (int i = 1; i < N; i++)
      for (int j = 0; j < N; j++)
        A[i][j] = 0.5f * A[i - 1][j] + A[i][j];
    for (int i = 0; i < N; i++)
      for (int j = 0; j < N; j++)
        B[i][j] = B[i][j] + A[i][j];
  }
}
"""


def test_a_parallel_loop_beside_sequential_code_pays_for_the_cells_that_move() -> None:
    """B's rows would pay their fork, but each step the threads read A's rows, which the
    sequential recurrence wrote on the first core: they move over and back every step."""
    model = _model(BESIDE_A_RECURRENCE, T=10, N=512)
    (plan,) = plan_nests(model, TWO_CORES, with_main=True).values()
    assert not any("parallel" in b and "sequential" not in b for b in plan.bands), plan.bands
    free = replace(TWO_CORES, core_transfer_bytes_per_cycle=1e9)
    (plan,) = plan_nests(_model(BESIDE_A_RECURRENCE, T=10, N=512), free, with_main=True).values()
    assert any(b.endswith("parallel loop 0") for b in plan.bands), plan.bands
    run_and_check(compile_c(BESIDE_A_RECURRENCE, {"T": 2, "N": 9}, target=FREE_FORKS))
