"""The statement that sets a GEMM's cells before its nest (`C = 0`, `C = bias[k]`) fused as
the start of its microkernel calls: the calls that begin a tile's reduction overwrite C (beta
0), so the output is written once and never cleared or read first. Checked with outputs
filled with NaN, which any pass that reads C before writing it would carry into the result."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

import polydl
from polydl.api import build_kernel, lower
from polydl.driver.explain import explain
from polydl.frontends import builders
from polydl.schedules.postops import postop_plan
from polydl.schedules.schedule import Schedule

CONV = dict(N=2, C=32, K=20, H=6, W=5, R=3, S=3, stride=1, padding=1)
GEMM = """
void gemm(int M, int N, int K, const float A[M][K], const float B[K][N], const float bias[N],
          float C[M][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      C[i][j] = bias[j];
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
    }
}
"""


def _nan_output(kernel):  # type: ignore[no-untyped-def]
    (out,) = kernel.outputs
    return {out.name: np.full(out.shape, np.nan, np.float32)}


def _inputs(kernel, seed=0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    return {a.name: rng.uniform(-1, 1, a.shape).astype(np.float32) for a in kernel.inputs}


def _check(kernel) -> None:  # type: ignore[no-untyped-def]
    given = _inputs(kernel)
    got = kernel(**given, **_nan_output(kernel))
    want = kernel.reference(**given)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _body(kernel) -> str:  # type: ignore[no-untyped-def]
    return kernel.source[kernel.source.index(f"int {kernel.code.function}("):]


def _one_call_per_tile(schedule: Schedule) -> Schedule:
    """`schedule` with its calls' batch loops untiled: one call reduces a whole tile of y."""
    mk = schedule.microkernel
    assert mk is not None
    tiled = {v for v in mk.batch if v in schedule.tile_sizes}
    return replace(schedule, order=tuple(o for o in schedule.order if o not in {v + ".t" for v in tiled}),
                   tiles=tuple((v, t) for v, t in schedule.tiles if v not in tiled), parallel=())


@pytest.mark.parametrize("layout", ["nchw", "nchw16c"])
@pytest.mark.parametrize("fuse", [(), ("bias", "relu")])
@pytest.mark.slow
def test_a_convolution_that_sets_its_output_overwrites_it_in_the_microkernel(
        layout: str, fuse: tuple[str, ...]) -> None:
    # NCHW rows of fewer than 16 outputs run as one flat loop whose start is a loop
    # (`builders.short_rows`): rows of 16 here
    sizes = {**CONV, "W": 16} if layout == "nchw" else CONV
    auto = polydl.conv2d(**sizes, layout=layout, fuse=fuse, accumulate=False)
    nest, params = builders.conv2d(**sizes, layout=layout, fuse=fuse, accumulate=False)
    kernel = build_kernel(nest, params, schedule=_one_call_per_tile(auto.schedule))
    # (the zero-padded copy of x is placed as well: inside the image loop)
    (placement,) = [p for p in kernel.code.placements if not p.describe().startswith("copy ")]
    assert placement.as_postops and "C starts at 0" in placement.reason
    assert "beta=0" in kernel.source and "beta=1" not in kernel.source
    assert "= 0.0f;" not in _body(kernel)  # no clearing loop
    _check(kernel)


def test_a_reduction_split_over_calls_overwrites_on_the_first_and_finishes_on_the_last() -> None:
    chain = ("bias", "relu")
    auto = polydl.conv2d(**CONV, layout="nchw16c", fuse=chain, accumulate=False)
    mk = auto.schedule.microkernel
    assert mk is not None and mk.batch
    nest, params = builders.conv2d(**CONV, layout="nchw16c", fuse=chain, accumulate=False)
    split = replace(auto.schedule, microkernel=replace(mk, batch=mk.batch[1:]))
    kernel = build_kernel(nest, params, schedule=split)
    assert "beta=0" in kernel.source and "beta=1" in kernel.source
    compilation = lower(nest, params, schedule=split)
    groups = compilation.scheduled.groups
    main = groups.index(compilation.scheduled.main)
    plan = postop_plan(compilation.model, groups[main], groups[main - 1].statements[0])
    assert not isinstance(plan, str)
    assert plan.first_call is not None and plan.last_call is not None
    text = explain(compilation, ranking=0)
    assert "on the first of the calls" in text and "on the last of the calls" in text
    _check(kernel)


def test_a_gemm_whose_cells_start_at_the_bias_adds_it_as_a_post_op() -> None:
    kernel = polydl.compile(GEMM, {"M": 37, "N": 48, "K": 29})
    (placement,) = kernel.code.placements
    assert "C starts at e0" in placement.reason, placement
    assert "beta=0" in kernel.source
    _check(kernel)


def test_a_start_that_reads_the_output_is_not_fused() -> None:
    source = GEMM.replace("C[i][j] = bias[j];", "C[i][j] = C[i][j] * bias[j];")
    kernel = polydl.compile(source, {"M": 16, "N": 32, "K": 8})
    assert "beta=0" not in kernel.source
    assert all("starts" not in p.reason for p in kernel.code.placements)
    given = _inputs(kernel)
    c0 = np.random.default_rng(1).uniform(-1, 1, (16, 32)).astype(np.float32)
    np.testing.assert_allclose(kernel(**given, C=c0.copy()), kernel.reference(**given, C=c0),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["nchw", "nchw16c"])
def test_a_nest_without_microkernel_sets_each_tile_right_before_summing_into_it(layout: str) -> None:
    # depthwise: no sum over channels to make a GEMM of; the start joins the band at the
    # epilogues' level, before the taps
    kernel = polydl.conv2d(2, 32, 32, 9, 7, 3, 3, stride=1, padding=1, layout=layout, groups=32,
                           fuse=("bias", "relu"), accumulate=False)
    assert kernel.schedule.microkernel is None
    starts = [p for p in kernel.code.placements if p.describe().startswith("start ")]
    # blocked: the output row is tiled outside the taps (a register tile), the start inside it
    loop = "q.t" if layout == "nchw16c" else "p"
    assert len(starts) == 1 and f"before the reduction (inside loop {loop})" in starts[0].describe()
    body = _body(kernel)
    # no pass of its own over the output (NCHW keeps its zero-padded copy of x): the nests at
    # the function's top level (parallel or not, as their work pays for forks)
    assert len(re.findall(r"^  for \(long _t0 ", body, re.M)) == (2 if layout == "nchw" else 1)
    _check(kernel)


def test_a_start_is_not_moved_inside_a_loop_that_reduces_into_its_cell() -> None:
    # the sum over r runs outside q: a cell of y is summed into at every r, so a start fused
    # inside r would clear the partial sums; it stays before the band's reduction loops
    source = """
void rows(const float x[8][10], const float w[3], float y[8][8]) {
  for (int p = 0; p < 8; p++)
    for (int q = 0; q < 8; q++)
      y[p][q] = 0.0f;
  for (int p = 0; p < 8; p++)
    for (int r = 0; r < 3; r++)
      for (int q = 0; q < 8; q++)
        y[p][q] += x[p][q + r] * w[r];
}
"""
    kernel = polydl.compile(source)
    _check(kernel)
