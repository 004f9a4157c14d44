"""Fused epilogues as post-ops inside the microkernel: legal only where one call completes a
tile's reduction, exact against numpy for every epilogue and chain, both layouts, ragged tiles."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl.api import build_kernel, lower
from polydl.driver.explain import explain
from polydl.frontends import builders, layers
from polydl.poly.model import build_model
from polydl.runtime.inputs import random_inputs
from polydl.schedules.cpu.epilogues import choose_fusion
from polydl.schedules.postops import postop_plan
from polydl.schedules.schedule import MicrokernelBinding, Schedule
from polydl.target import host_target
from tests.kernels import run_and_check
from tests.schedules.test_fusion import CHAINS, _conv_numpy, _epilogue_numpy

POSTOPS = "post-ops before the store"
RELU_LOOP = "> 0.0f) ?"  # the fused loop's ReLU select, after the call


def _uses_postops(kernel: polydl.runtime.c.kernel.Kernel) -> bool:  # type: ignore[name-defined]
    body = kernel.source[kernel.source.index(f"int {kernel.code.function}("):]
    return POSTOPS in kernel.source and RELU_LOOP not in body and "#pragma omp simd\n" not in body


def _check_conv(kernel, sizes, chain, blocked, seed=3):  # type: ignore[no-untyped-def]
    """The kernel against numpy on plain-layout data (converted to blocks with zero padding
    where the kernel is blocked), and against the nest's reference on random inputs."""
    from polydl import layouts

    rng = np.random.default_rng(seed)
    n, c, k = sizes["N"], sizes["C"], sizes["K"]
    x = rng.uniform(-1, 1, (n, c, sizes["H"], sizes["W"])).astype(np.float32)
    w = rng.uniform(-1, 1, (k, c, sizes["R"], sizes["S"])).astype(np.float32)
    y = _conv_numpy(x, w, sizes["stride"], sizes["padding"])
    extra = []
    for name in chain:
        if name in ("bias", "scale_shift"):
            extra += [rng.uniform(-1, 1, k).astype(np.float32) for _ in range(1 + (name == "scale_shift"))]
        elif name == "residual":
            extra.append(rng.uniform(-1, 1, y.shape).astype(np.float32))
    want = _epilogue_numpy(y, extra, chain)
    if blocked:
        x, w = layouts.to_nchw16c(x), layouts.to_kcrs16c16k(w)
        padded = []
        for e in extra:
            if e.ndim == 1:
                e = np.concatenate([e, np.zeros(layouts.blocks(k) * layouts.BLOCK - k, np.float32)])
            else:
                e = layouts.to_nchw16c(e)
            padded.append(e)
        extra = padded
    got = kernel(x, w, *extra)
    if blocked:
        got = layouts.from_nchw16c(got, k)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    run_and_check(kernel, seed=seed)


@pytest.mark.parametrize("layout", ["nchw", "nchw16c"])
@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.slow
def test_conv_epilogue_chains_run_as_postops(chain: tuple[str, ...], layout: str) -> None:
    # K=20: a ragged block of 16 channels; W=7, stride 2: ragged rows of the tile
    sizes = dict(N=2, C=5, K=20, H=9, W=7, R=3, S=3, stride=2, padding=1)
    kernel = polydl.conv2d(**sizes, layout=layout, fuse=chain)
    assert len(kernel.schedule.epilogues) == len(chain)
    assert _uses_postops(kernel), kernel.source
    _check_conv(kernel, sizes, chain, layout == "nchw16c")


def _split_reduction(kernel):  # type: ignore[no-untyped-def]
    """The kernel's schedule with the first batch loop of its call moved out of the call:
    every tile is then reduced over several calls."""
    mk = kernel.schedule.microkernel
    assert mk is not None and mk.batch
    return replace(kernel.schedule, microkernel=replace(mk, batch=mk.batch[1:]))


@pytest.mark.parametrize("layout", ["nchw", "nchw16c"])
@pytest.mark.slow
def test_a_reduction_split_over_calls_applies_postops_on_the_last(layout: str) -> None:
    # NCHW rows of 16 outputs: shorter ones run as one flat loop, its epilogues loops after
    # the calls (`builders.short_rows`)
    sizes = dict(N=1, C=32, K=20, H=6, W=16 if layout == "nchw" else 5, R=3, S=3, stride=1, padding=1)
    chain = ("bias", "scale_shift", "residual", "relu")
    auto = polydl.conv2d(**sizes, layout=layout, fuse=chain)
    nest, params = builders.conv2d(**sizes, layout=layout, fuse=chain)
    split = build_kernel(nest, params, schedule=_split_reduction(auto))
    assert split.schedule.epilogues
    assert _uses_postops(split)
    body = split.source[split.source.index("int conv2d("):]
    assert " else _pd_brgemm_" in body  # the other calls of a tile store plain sums
    _check_conv(split, sizes, chain, layout == "nchw16c")
    compilation = lower(nest, params, schedule=split.schedule)
    plan = postop_plan(compilation.model, compilation.scheduled.main)
    assert not isinstance(plan, str) and plan.last_call is not None
    assert "on the last of the calls" in explain(compilation, ranking=0)


@pytest.mark.slow
def test_the_libxsmm_backend_keeps_the_epilogue_loop() -> None:
    from polydl.codegen.c.microkernels import libxsmm_available

    if not libxsmm_available():
        pytest.skip("needs LIBXSMM")
    sizes = dict(N=1, C=32, K=32, H=6, W=6, R=3, S=3, stride=1, padding=1)
    chain = ("bias", "relu")
    auto = polydl.conv2d(**sizes, layout="nchw16c", fuse=chain)
    mk = auto.schedule.microkernel
    assert mk is not None
    nest, params = builders.conv2d(**sizes, layout="nchw16c", fuse=chain)
    schedule = replace(auto.schedule, microkernel=replace(mk, backend="libxsmm"))
    kernel = build_kernel(nest, params, schedule=schedule)
    assert POSTOPS not in kernel.source and RELU_LOOP in kernel.source
    _check_conv(kernel, sizes, chain, True)
    text = explain(lower(nest, params, schedule=schedule), ranking=0)
    assert "after the call: its microkernel applies no post-ops" in text


def test_explain_says_the_epilogue_runs_as_postops() -> None:
    nest, params = builders.conv2d(N=1, C=16, K=16, H=6, W=6, R=3, S=3, padding=1, fuse=("bias", "relu"))
    text = explain(lower(nest, params), ranking=0)
    assert "as post-ops in the microkernel" in text
    assert "acc = max(acc, 0.0)" in text


@pytest.mark.parametrize("chain", [("bias",), ("bias", "relu"), ("residual", "relu")])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.slow
def test_linear_epilogues_run_as_postops(chain: tuple[str, ...], dtype: str) -> None:
    kernel = polydl.linear(N=13, C=19, K=37, dtype=dtype, fuse=chain)
    assert kernel.schedule.epilogues and POSTOPS in kernel.source, kernel.source
    inputs = random_inputs(kernel.arguments, seed=1)
    got = kernel(*inputs)
    x, w, *extra = inputs
    want = x.astype(np.float64) @ w.astype(np.float64).T
    for name in chain:
        if name == "bias":
            want = want + extra.pop(0)[None, :]
        elif name == "residual":
            want = want + extra.pop(0)
        else:
            want = np.maximum(want, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    run_and_check(kernel)


# A consumer with a general select, a negation, a division and a literal: every post-op form.
SELECT = """
void mm(int M, int N, int K, float C[M][N], const float A[M][K], const float B[K][N],
        const float s[N], const float t[M]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      C[i][j] = C[i][j] <= s[j] ? -C[i][j] / 2.0f : C[i][j] - t[i];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      C[i][j] = t[i] < C[i][j] ? t[i] : C[i][j];
}
"""


def _gemm_schedule(epilogues: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """i tiled by 4 around a microkernel over (i, j, k): the epilogues fuse into the i tiles."""
    from polydl.schedules.schedule import MicrokernelBinding, Schedule

    return Schedule(order=("i.t", "i", "j", "k"), tiles=(("i", 4),), parallel=("i.t",),
                    epilogues=epilogues, microkernel=MicrokernelBinding("S0", m="i", n="j", k="k"))


SELECT_SCHEDULE = _gemm_schedule(("S1", "S2"))


def _select_numpy(a, b, s, t):  # type: ignore[no-untyped-def]
    c = a.astype(np.float64) @ b.astype(np.float64)
    c = np.where(c <= s[None, :], -c / 2.0, c - t[:, None])
    return np.minimum(c, t[:, None])


@pytest.mark.parametrize("isa", ["native", "scalar"])
def test_general_consumers_run_as_postops(isa: str) -> None:
    machine = None if isa == "native" else replace(host_target(), isa=isa, march="")
    kernel = polydl.compile(SELECT, {"M": 11, "N": 21, "K": 9}, schedule=SELECT_SCHEDULE,
                            machine=machine)
    assert POSTOPS in kernel.source
    assert "C[(i) * 21L + j] <=" not in kernel.source  # no epilogue loop
    run_and_check(kernel, expected=lambda a, b, s, t: _select_numpy(a, b, s, t))


def test_a_consumer_of_another_array_keeps_the_loop() -> None:
    from tests.schedules.test_fusion import MATMUL_RELU, SIZES

    kernel = polydl.compile(MATMUL_RELU, SIZES)
    if kernel.schedule.epilogues:
        assert POSTOPS not in kernel.source
        compilation = lower(*_nest(MATMUL_RELU, SIZES))
        reason = postop_plan(compilation.model, compilation.scheduled.main)
        assert isinstance(reason, str) and "writes D" in reason
    run_and_check(kernel, expected=lambda a, b: (a @ b, np.maximum(a @ b, 0)))


def _nest(text, sizes):  # type: ignore[no-untyped-def]
    from polydl.frontends.c_loopnest import parse_c

    return parse_c(text), sizes


@pytest.mark.parametrize("isa", ["avx512", "avx2", "scalar"])
@pytest.mark.slow
def test_postop_kernels_compile_for_every_isa(isa: str, tmp_path: Path) -> None:
    """AVX-512 may not run here: its post-op kernels are compiled (for both forms)."""
    machine = replace(host_target(), isa=isa, march="")
    for layout in ("nchw", "nchw16c"):
        nest, params = builders.conv2d(N=1, C=16, K=20, H=5, W=5, R=3, S=3, padding=1,
                                       layout=layout, fuse=("bias", "scale_shift", "residual", "relu"))
        source = lower(nest, params, machine=machine).code.source
        assert POSTOPS in source
        path = tmp_path / f"{layout}.c"
        path.write_text(source)
        done = subprocess.run(["cc", "-O1", "-fopenmp", "-c", str(path), "-o", str(tmp_path / "k.o")],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    compiled = lower(*_nest(SELECT, {"M": 11, "N": 21, "K": 9}), schedule=SELECT_SCHEDULE,
                     machine=machine).code.source
    assert POSTOPS in compiled
    (tmp_path / "select.c").write_text(compiled)
    done = subprocess.run(["cc", "-O1", "-c", str(tmp_path / "select.c"), "-o", str(tmp_path / "s.o")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# B read along k in both operands: only the dot-product form fits, whose cells are summed
# horizontally and then take the post-ops as scalars.
DOT = """
void mm(int M, int N, int K, float C[M][N], const float A[M][K], const float B[N][K],
        const float b[N], const float r[M][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[j][k];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      C[i][j] = (C[i][j] + b[j]) * 0.5f + r[i][j];
}
"""


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_dot_product_kernels_apply_postops_to_summed_cells(dtype: str) -> None:
    schedule = _gemm_schedule(("S1",))
    kernel = polydl.compile(DOT.replace("float", dtype), {"M": 7, "N": 5, "K": 37}, schedule=schedule)
    assert POSTOPS in kernel.source and " dot-k," in kernel.source
    run_and_check(kernel, expected=lambda a, bt, b, r: (a.astype(np.float64) @ bt.T + b) * 0.5 + r)


@pytest.mark.parametrize("H, W", [(6, 18), (5, 5)])
@pytest.mark.slow
def test_bfloat16_conv_applies_postops_in_fp32(H: int, W: int) -> None:
    """Rows of a vector or more: the post-ops in the microkernel, before the store (or in
    AVX-512 BF16's dot-product kernel). Shorter rows (`builders.short_rows`, an AVX2 machine's
    form of this NCHW layer): on the fp32 wide sums as they are copied out."""
    kernel = polydl.conv2d(N=1, C=16, K=24, H=H, W=W, R=3, S=3, padding=1, dtype="bfloat16",
                           fuse=("bias", "residual", "relu"))
    source = kernel.source
    assert POSTOPS in source or "vdpbf16ps" in source or (W < 16 and "yw[" in source)
    run_and_check(kernel)


# C's rows along the call's n: the kernel vectorises along m (A and B swapped), so the
# post-op operands, too, are read along m.
SWAPPED = """
void mm(int M, int N, int K, float C[M][N], const float A[M][K], const float B[K][N],
        const float b[N], const float s[M]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      C[i][j] = C[i][j] * s[i] + b[j];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      C[i][j] = C[i][j] > 0.0f ? C[i][j] : 0.0f;
}
"""


def test_swapped_kernels_apply_postops_along_m() -> None:
    from polydl.schedules.schedule import MicrokernelBinding, Schedule

    schedule = Schedule(order=("i.t", "i", "j", "k"), tiles=(("i", 5),), parallel=("i.t",),
                        epilogues=("S1", "S2"),
                        microkernel=MicrokernelBinding("S0", m="j", n="i", k="k"))
    kernel = polydl.compile(SWAPPED, {"M": 13, "N": 19, "K": 6}, schedule=schedule)
    assert POSTOPS in kernel.source and "A and B swapped" in kernel.source
    run_and_check(kernel, expected=lambda a, bm, b, s: np.maximum(
        (a.astype(np.float64) @ bm) * s[:, None] + b[None, :], 0))


def test_a_nest_that_is_one_call_fuses_its_epilogue_as_postops() -> None:
    """With no loop outside the microkernel call (a small GEMM kept on one core), the epilogue
    fuses at level 0 and runs inside that one call."""
    nest, params = layers.linear(N=13, C=19, K=37, fuse=("bias", "relu"))
    model = build_model(nest, params)
    one_call = Schedule(
        order=("n", "k", "c"),
        microkernel=MicrokernelBinding(statement="S1", m="n", n="k", k="c"),
    )
    schedule, decisions = choose_fusion(model, one_call, host_target())
    assert schedule.epilogues == ("S2", "S3")
    assert [d.level for d in decisions] == [0, 0]
    kernel = build_kernel(nest, params, schedule=schedule)
    assert _uses_postops(kernel), kernel.source
    x, w, b = random_inputs(kernel.arguments, seed=2)
    want = np.maximum(x.astype(np.float64) @ w.astype(np.float64).T + b, 0.0)
    np.testing.assert_allclose(kernel(x, w, b), want, rtol=1e-5, atol=1e-5)
    text = explain(lower(nest, params, schedule=schedule), ranking=0)
    assert "the whole nest: one microkernel call" in text
    assert "as post-ops in the microkernel" in text


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
@pytest.mark.slow
def test_fmaxf_consumers_run_as_postops_with_c_nan_rules(isa: str) -> None:
    """`fmaxf(y + b, 0)` is a post-op with C's semantics: a NaN argument gives the other one
    (the vector max instructions would give their second operand)."""
    machine = None if isa == "native" else replace(host_target(), isa=isa, march="")
    path = Path(__file__).resolve().parents[2] / "examples" / "linear_bias_relu.c"
    kernel = polydl.compile(str(path), {"N": 24, "C": 40, "K": 36}, machine=machine)
    assert POSTOPS in kernel.source
    x, w, b = random_inputs(kernel.arguments, seed=4)
    b[3] = np.nan  # fmaxf(NaN, 0) is 0: column 3 is all zeros
    x[5, 0] = np.nan  # row 5: NaN + b is NaN, fmaxf gives 0 again
    want = np.fmax(x.astype(np.float64) @ w.astype(np.float64).T + b, 0.0)
    got = kernel(x, w, b)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
