"""Fusion of consumer nests into the producer's loops: legality, level, codegen, numbers."""

from dataclasses import replace

import numpy as np
import pytest

import polydl
from polydl.api import lower
from polydl.driver.explain import explain
from polydl.errors import ScheduleError
from polydl.frontends import builders
from polydl.frontends.c_loopnest import parse_c
from polydl.poly.model import build_model
from polydl.schedules.apply import apply_schedule
from polydl.schedules.cpu.epilogues import choose_fusion
from polydl.schedules.schedule import Schedule
from polydl.target import host_target
from tests.kernels import run_and_check

MATMUL_RELU = """
void mm(int M, int N, int K, float C[M][N], float D[M][N], const float A[M][K], const float B[K][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      D[i][j] = fmaxf(C[i][j], 0.0f);
}
"""

# The consumer reads its row neighbours: it may share the row loop i, never the column loop j.
STENCIL_J = """
void st(int M, int N, int K, float C[M][N], float D[M][N], const float A[M][K], const float B[K][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
  for (int i = 0; i < M; i++)
    for (int j = 1; j < N - 1; j++)
      D[i][j] = C[i][j - 1] + C[i][j] + C[i][j + 1];
}
"""

# ... and this one its column neighbours: no level inside the parallel loop i is legal.
STENCIL_I = STENCIL_J.replace(
    "for (int j = 1; j < N - 1; j++)\n      D[i][j] = C[i][j - 1] + C[i][j] + C[i][j + 1];",
    "for (int j = 0; j < N; j++)\n      D[i][j] = C[i - 1][j] + C[i + 1][j];",
).replace(
    "for (int i = 0; i < M; i++)\n    for (int j = 0; j < N; j++)\n      D",
    "for (int i = 1; i < M - 1; i++)\n    for (int j = 0; j < N; j++)\n      D",
)

SIZES = {"M": 12, "N": 10, "K": 7}
PLAIN = Schedule(order=("i", "j", "k"), parallel=("i",))


def _model(text: str):  # type: ignore[no-untyped-def]
    return build_model(parse_c(text), SIZES)


def test_elementwise_consumer_is_fused_after_the_reduction() -> None:
    model = _model(MATMUL_RELU)
    schedule, decisions = choose_fusion(model, PLAIN, host_target())
    assert schedule.epilogues == ("S1",)
    assert [(d.fused, d.level, d.loop) for d in decisions] == [(True, 2, "j")]
    plan = apply_schedule(model, schedule)
    assert len(plan.groups) == 1 and plan.main.fusion_level == 2
    k = polydl.compile(MATMUL_RELU, SIZES, schedule=schedule)
    # one loop nest: the ReLU sits in the j loop, after the k loop
    assert k.source.count("#pragma omp parallel") == 1
    body = k.source[k.source.index("#pragma omp parallel"):]
    assert body.index("D[") > body.index("C[") and body.count("for (") == 3
    run_and_check(k, lambda a, b: (a @ b, np.maximum(a @ b, 0)))


def test_a_stencil_consumer_is_fused_only_where_legal() -> None:
    model = _model(STENCIL_J)
    schedule, decisions = choose_fusion(model, PLAIN, host_target())
    assert [(d.fused, d.level, d.loop) for d in decisions] == [(True, 1, "i")]
    assert "level 2" in decisions[0].reason  # why not deeper
    with pytest.raises(ScheduleError):
        # fusing at level 2 would read C[i][j + 1] before its reduction ran
        from polydl.schedules.fusion import fuse_at

        plan = apply_schedule(model, PLAIN).main
        s1 = model.statement("S1")
        result = fuse_at(model, plan.statements, plan.instance_map, [s1], 2, plan.parallel_dims)
        assert isinstance(result, str) and "backwards" in result
        raise ScheduleError(result)

    def want(a, b):  # type: ignore[no-untyped-def]
        c = a @ b
        d = np.zeros_like(c)
        d[:, 1:-1] = c[:, :-2] + c[:, 1:-1] + c[:, 2:]
        return c, d

    run_and_check(polydl.compile(STENCIL_J, SIZES, schedule=schedule), want)


def test_a_consumer_that_needs_other_rows_stays_separate() -> None:
    model = _model(STENCIL_I)
    schedule, decisions = choose_fusion(model, PLAIN, host_target())
    assert schedule.epilogues == ()
    assert not decisions[0].fused and "dependence" in decisions[0].reason
    # asked for explicitly, it is refused, not generated
    with pytest.raises(ScheduleError, match="cannot fuse S1"):
        apply_schedule(model, replace(PLAIN, epilogues=("S1",)))
    # without the parallel loop, level 1 is still illegal: the row i+1 is not reduced yet
    with pytest.raises(ScheduleError, match="dependence"):
        apply_schedule(model, Schedule(order=("i", "j", "k"), parallel=(), epilogues=("S1",)))


def test_epilogues_must_follow_the_main_nest() -> None:
    with pytest.raises(ScheduleError, match="do not directly follow"):
        apply_schedule(_model(MATMUL_RELU), replace(PLAIN, epilogues=("S9",)))


CHAINS = [("bias",), ("relu",), ("residual",), ("scale_shift",), ("bias", "relu"),
          ("scale_shift", "residual", "relu"), ("bias", "scale_shift", "residual", "relu")]


def _epilogue_numpy(y, extra, chain, blocked=False):  # type: ignore[no-untyped-def]
    extra = list(extra)
    per_channel = (lambda v: v[None, :, None, None, None]) if blocked else (lambda v: v[None, :, None, None])
    for name in chain:
        if name == "bias":
            b = extra.pop(0)
            y = y + (per_channel(b.reshape(-1, 16)) if blocked else per_channel(b))
        elif name == "scale_shift":
            s, t = extra.pop(0), extra.pop(0)
            if blocked:
                s, t = s.reshape(-1, 16)[None, :, None, None, :], t.reshape(-1, 16)[None, :, None, None, :]
            else:
                s, t = per_channel(s), per_channel(t)
            y = y * s + t
        elif name == "residual":
            y = y + extra.pop(0)
        else:
            y = np.maximum(y, 0)
    return y


@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.slow
def test_conv_epilogue_chains_are_fused_and_correct(chain: tuple[str, ...]) -> None:
    sizes = dict(N=2, C=3, K=5, H=7, W=6, R=3, S=3, stride=1, padding=1)
    fused = polydl.conv2d(**sizes, fuse=chain)
    assert len(fused.schedule.epilogues) == len(chain)
    nest, params = builders.conv2d(**sizes, fuse=chain)
    unfused = polydl.api.build_kernel(nest, params, schedule=replace(fused.schedule, epilogues=()))
    assert not unfused.schedule.epilogues
    from polydl.runtime.inputs import random_inputs

    inputs = random_inputs(fused.arguments, seed=5)
    got = fused(*inputs)
    np.testing.assert_allclose(got, unfused(*inputs), rtol=1e-5, atol=1e-5)
    y = _conv_numpy(inputs[0], inputs[1], 1, 1)
    np.testing.assert_allclose(got, _epilogue_numpy(y, inputs[2:], chain), rtol=1e-4, atol=1e-4)
    run_and_check(fused)


def _epilogue_loop_kernel(sizes: dict, layout: str, fuse: tuple[str, ...]):  # type: ignore[type-arg, no-untyped-def]
    """The automatic schedule on the LIBXSMM backend, whose kernels apply no post-ops: the
    fused epilogue stays a loop after each call."""
    from polydl.codegen.c.microkernels import libxsmm_available

    if not libxsmm_available():
        pytest.skip("needs LIBXSMM")
    auto = polydl.conv2d(**sizes, layout=layout, fuse=fuse)
    mk = auto.schedule.microkernel
    assert mk is not None
    nest, params = builders.conv2d(**sizes, layout=layout, fuse=fuse)
    schedule = replace(auto.schedule, microkernel=replace(mk, backend="libxsmm"))
    return polydl.api.build_kernel(nest, params, schedule=schedule)


def test_blocked_conv_fuses_after_the_microkernel_call() -> None:
    k = _epilogue_loop_kernel(dict(N=1, C=32, K=32, H=6, W=6, R=3, S=3, padding=1), "nchw16c",
                              ("bias", "scale_shift", "relu"))
    assert k.schedule.microkernel is not None and len(k.schedule.epilogues) == 3
    body = k.source[k.source.index("int conv2d("):]
    call = body.index("_pd_brgemm_")
    assert call < body.index("> 0.0f)")  # the ReLU, after the call
    # the padding copy and the main nest, epilogues inside the latter (before them, the
    # loops that zero the copy's border: `for (int c...)`)
    top = [line for line in body.splitlines() if line.startswith("  for (long ")]
    assert len(top) == 2
    run_and_check(k)


def test_explain_says_what_was_fused_and_why() -> None:
    nest, params = builders.conv2d(N=1, C=16, K=16, H=6, W=6, R=3, S=3, padding=1, fuse=("bias", "relu"))
    text = explain(lower(nest, params), ranking=0)
    assert "fusion of the nests after the main one" in text
    assert "fused at level" in text and "working set" in text
    text = explain(lower(parse_c(STENCIL_I), SIZES, schedule=PLAIN), ranking=0)
    assert "not fused" in text and "dependence" in text


def _conv_numpy(x, w, stride, padding):  # type: ignore[no-untyped-def]
    from tests.frontends.test_builders import conv2d_numpy

    return conv2d_numpy(x, w, stride, padding)


@pytest.mark.slow
def test_tuned_candidates_run_with_their_epilogues_fused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from polydl.tuner.measure import Limits
    from polydl.tuner.search import tune
    from polydl.tuning.database import PerfDatabase

    nest, params = builders.conv2d(N=1, C=16, K=16, H=5, W=5, R=3, S=3, padding=1, fuse=("bias", "relu"))
    result = tune(nest, params, target=host_target(), trials=2,
                  db=PerfDatabase(tmp_path / "t.sqlite", system=False),
                  limits=Limits(max_other_load=float("inf"), max_rounds=2, budget_s=0.05))
    assert result.measured and all(tuple(t.schedule["epilogues"]) == ("S2", "S3") for t in result.measured)
    assert all(t.status == "ok" for t in result.measured)


# The consumer is a running sum along j: its own column loop carries a dependence.
RUNNING_SUM_J = STENCIL_J.replace(
    "for (int j = 1; j < N - 1; j++)\n      D[i][j] = C[i][j - 1] + C[i][j] + C[i][j + 1];",
    "for (int j = 1; j < N; j++)\n      C[i][j] = C[i][j] + C[i][j - 1];",
)


def test_fused_epilogue_loop_is_declared_simd_only_where_nothing_is_carried() -> None:
    conv = _epilogue_loop_kernel(dict(N=1, C=32, K=32, H=6, W=6, R=1, S=1), "nchw16c", ("bias", "relu"))
    assert conv.schedule.epilogues and "#pragma omp simd\n" in conv.source
    run_and_check(conv)

    model = _model(RUNNING_SUM_J)
    fused = [s.name for s in model.statements if s.group != model.statements[0].group]
    kernel = polydl.compile(RUNNING_SUM_J, SIZES, schedule=replace(PLAIN, epilogues=tuple(fused)))
    assert kernel.schedule.epilogues == tuple(fused)
    # (the k loop's sum into C[i][j] is a simd reduction; the epilogue loop carries its sum)
    pragmas = [line.strip() for line in kernel.source.splitlines() if "omp simd" in line]
    assert all(p.startswith("#pragma omp simd reduction(") for p in pragmas)
    run_and_check(kernel)
