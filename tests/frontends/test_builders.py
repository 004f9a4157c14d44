"""Builders: the IR they produce (arrays, inputs, outputs, locals), their argument checks, and
their numbers, evaluated by the numpy reference against independent numpy formulas."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl import layouts
from polydl.api import build_kernel
from polydl.errors import ArgumentError
from polydl.frontends.builders import PRIMITIVES, conv2d, matmul, target_options
from polydl.frontends.c_loopnest import parse_c
from polydl.ir import Loop, LoopNest, walk_statements
from polydl.poly.model import build_model
from polydl.poly.reference import make_reference
from polydl.target import resolve_target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NUMPY_DTYPES = {"float32": np.float32, "float64": np.float64}


def evaluate(nest: LoopNest, params: dict[str, int], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the numpy reference of the nest: outputs start at zero, locals are its own."""
    arrays = dict(inputs)
    for a in nest.outputs:
        arrays[a.name] = np.zeros(a.concrete_shape(params), dtype=NUMPY_DTYPES[a.dtype])
    make_reference(build_model(nest, params))(arrays)
    return arrays


def random_inputs(nest: LoopNest, params: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        a.name: rng.uniform(-1, 1, a.concrete_shape(params)).astype(NUMPY_DTYPES[a.dtype])
        for a in nest.inputs
    }


def conv2d_numpy(x: np.ndarray, w: np.ndarray, stride: int, padding: int) -> np.ndarray:
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    p = (h + 2 * padding - r) // stride + 1
    q = (wd + 2 * padding - s) // stride + 1
    y = np.zeros((n, k, p, q))
    for i in range(r):
        for j in range(s):
            patch = xp[:, :, i : i + stride * (p - 1) + 1 : stride, j : j + stride * (q - 1) + 1 : stride]
            y += np.einsum("ncpq,kc->nkpq", patch, w[:, :, i, j].astype(np.float64))
    return y


# ----------------------------------------------------------------------------- matmul


def test_matmul_builder_is_the_example_spec() -> None:
    nest, params = matmul(M=3, N=4, K=5)
    assert nest == parse_c((EXAMPLES / "matmul.c").read_text())
    assert params == {"M": 3, "N": 4, "K": 5}
    assert [a.name for a in nest.inputs] == ["A", "B"]
    assert [a.name for a in nest.outputs] == ["C"]
    assert nest.locals == ()
    assert PRIMITIVES["matmul"] is matmul and PRIMITIVES["conv2d"] is conv2d


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (3, 5, 7), (17, 2, 9)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_numbers(m: int, n: int, k: int, dtype: str) -> None:
    nest, params = matmul(M=m, N=n, K=k, dtype=dtype)
    assert {a.dtype for a in nest.arrays} == {dtype}
    inputs = random_inputs(nest, params)
    got = evaluate(nest, params, inputs)["C"]
    want = inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- conv2d IR


def test_conv2d_with_padding_has_a_local_padded_copy() -> None:
    nest, params = conv2d(N=2, C=3, K=4, H=5, W=6, R=3, S=3, padding=1, fuse=("bias", "relu"))
    assert params == {"N": 2, "C": 3, "K": 4, "H": 5, "W": 6, "R": 3, "S": 3}
    shapes = {a.name: a.concrete_shape(params) for a in nest.arrays}
    assert shapes == {
        "y": (2, 4, 5, 6),
        "xp": (2, 3, 7, 8),
        "x": (2, 3, 5, 6),
        "w": (4, 3, 3, 3),
        "b": (4,),
    }
    assert [a.name for a in nest.locals] == ["xp"]
    assert [a.name for a in nest.parameters] == ["y", "x", "w", "b"]
    assert [a.name for a in nest.inputs] == ["x", "w", "b"]
    assert [a.name for a in nest.outputs] == ["y"]
    # copy, convolution, bias, relu: four loop nests, the epilogues kept separate
    assert len(nest.body) == 4 and all(isinstance(n, Loop) for n in nest.body)
    conv = nest.body[1]
    order = []
    node = conv
    while isinstance(node, Loop):
        order.append(node.var)
        node = node.body[0]
    assert order == ["n", "k", "p", "q", "c", "r", "s"]


def test_conv2d_without_padding_reads_the_input_directly() -> None:
    nest, params = conv2d(N=1, C=2, K=3, H=4, W=4, R=2, S=2, stride=2)
    assert nest.locals == ()
    assert [a.name for a in nest.arrays] == ["y", "x", "w"]
    assert nest.array("y").concrete_shape(params) == (1, 3, 2, 2)
    (s,) = nest.statements()
    assert s.op == "+=" and [a.array for a in s.reads] == ["y", "x", "w"]


def test_fused_inputs_follow_the_fuse_order() -> None:
    nest, params = conv2d(N=1, C=2, K=3, H=4, W=4, R=3, S=3, padding=1, fuse=["residual", "relu", "bias"])
    assert [a.name for a in nest.inputs] == ["x", "w", "res", "b"]
    assert nest.array("res").concrete_shape(params) == nest.array("y").concrete_shape(params)
    ops = [(s.target.array, s.op) for s in nest.statements()]
    assert ops == [("xp", "="), ("y", "+="), ("y", "+="), ("y", "="), ("y", "+=")]


def test_blocked_layout_shapes() -> None:
    nest, params = conv2d(N=2, C=3, K=20, H=5, W=5, R=3, S=3, padding=1, layout="nchw16c", fuse=("bias", "residual"))
    shapes = {a.name: a.concrete_shape(params) for a in nest.arrays}
    assert shapes == {
        "y": (2, 2, 5, 5, 16),
        "xp": (2, 1, 7, 7, 16),
        "x": (2, 1, 5, 5, 16),
        "w": (2, 1, 3, 3, 16, 16),
        "b": (32,),
        "res": (2, 2, 5, 5, 16),
    }
    assert [a.name for a in nest.locals] == ["xp"]


def test_a_per_channel_vector_fills_whole_blocks_with_zero_lanes() -> None:
    """The bias the blocked kernels above take (b: 32 values for K=20), from K values."""
    bias = np.arange(1, 21, dtype=np.float64)
    blocked = layouts.to_blocked_channels(bias, np.float32)
    assert blocked.dtype == np.float32 and blocked.shape == (32,)
    assert np.array_equal(blocked[:20], bias) and not blocked[20:].any()
    assert layouts.to_blocked_channels(bias[:16]).dtype == np.float64  # v's own type by default
    assert layouts.to_blocked_channels(bias[:16]).shape == (16,)


@pytest.mark.parametrize("layout", ["nchw", "nchw16c"])
def test_generated_names_are_not_reserved(layout: str) -> None:
    nest, _ = conv2d(N=1, C=1, K=1, H=3, W=3, R=3, S=3, padding=1, layout=layout, fuse=("bias", "relu", "residual"))
    names = [nest.name, *nest.params, *(a.name for a in nest.arrays)]
    for _, enclosing in walk_statements(nest.body):
        names += [n.var for n in enclosing if isinstance(n, Loop)]
    assert not any(name.startswith("_") for name in names)
    assert nest.source is not None and nest.filename == "<conv2d>"


# ----------------------------------------------------------------------------- conv2d numbers


CONV_CASES = [
    # n, c, k, h, w, r, s, stride, padding
    (1, 1, 1, 1, 1, 1, 1, 1, 0),
    (2, 3, 5, 7, 7, 3, 3, 1, 1),
    (1, 4, 6, 9, 11, 3, 2, 2, 1),
    (2, 5, 3, 13, 12, 5, 5, 3, 2),
    (1, 3, 2, 6, 5, 2, 3, 2, 0),
]


@pytest.mark.parametrize("n, c, k, h, w, r, s, stride, padding", CONV_CASES)
def test_conv2d_nchw_numbers(n, c, k, h, w, r, s, stride, padding) -> None:  # type: ignore[no-untyped-def]
    nest, params = conv2d(N=n, C=c, K=k, H=h, W=w, R=r, S=s, stride=stride, padding=padding)
    inputs = random_inputs(nest, params)
    got = evaluate(nest, params, inputs)["y"]
    np.testing.assert_allclose(got, conv2d_numpy(inputs["x"], inputs["w"], stride, padding), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_conv2d_fused_epilogues_numbers(dtype: str) -> None:
    nest, params = conv2d(
        N=2, C=3, K=4, H=6, W=5, R=3, S=3, stride=2, padding=1, dtype=dtype, fuse=("bias", "residual", "relu")
    )
    inputs = random_inputs(nest, params, seed=3)
    got = evaluate(nest, params, inputs)["y"]
    y = conv2d_numpy(inputs["x"], inputs["w"], 2, 1) + inputs["b"][None, :, None, None]
    want = np.maximum(y + inputs["res"], 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got.dtype == NUMPY_DTYPES[dtype]


@pytest.mark.parametrize("n, c, k, h, w, r, s, stride, padding", CONV_CASES)
def test_conv2d_nhwc_numbers(n, c, k, h, w, r, s, stride, padding) -> None:  # type: ignore[no-untyped-def]
    """Channels last: x[N][H][W][C], w[K][R][S][C], y[N][P][Q][K], with bias and ReLU."""
    nest, params = conv2d(N=n, C=c, K=k, H=h, W=w, R=r, S=s, stride=stride, padding=padding,
                          layout="nhwc", fuse=("bias", "relu"))
    inputs = random_inputs(nest, params, seed=5)
    got = evaluate(nest, params, inputs)["y"]
    x = inputs["x"].transpose(0, 3, 1, 2)
    wt = inputs["w"].transpose(0, 3, 1, 2)
    want = np.maximum(conv2d_numpy(x, wt, stride, padding) + inputs["b"][None, :, None, None], 0)
    np.testing.assert_allclose(got, want.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "n, c, k, h, w, r, s, stride, padding",
    [(1, 3, 5, 5, 6, 3, 3, 1, 1), (1, 17, 18, 5, 4, 3, 2, 2, 1), (2, 16, 16, 3, 3, 1, 1, 1, 0),
     (2, 20, 33, 5, 6, 1, 1, 1, 0), (1, 16, 16, 9, 9, 1, 1, 1, 0)],
)
def test_conv2d_blocked_numbers(n, c, k, h, w, r, s, stride, padding) -> None:  # type: ignore[no-untyped-def]
    nest, params = conv2d(
        N=n, C=c, K=k, H=h, W=w, R=r, S=s, stride=stride, padding=padding, layout="nchw16c", fuse=("bias", "relu")
    )
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (n, c, h, w)).astype(np.float32)
    wt = rng.uniform(-1, 1, (k, c, r, s)).astype(np.float32)
    b = rng.uniform(-1, 1, k).astype(np.float32)
    bias = np.zeros(layouts.blocks(k) * layouts.BLOCK, dtype=np.float32)
    bias[:k] = b
    inputs = {"x": layouts.to_nchw16c(x), "w": layouts.to_kcrs16c16k(wt), "b": bias}
    got = layouts.from_nchw16c(evaluate(nest, params, inputs)["y"], k)
    want = np.maximum(conv2d_numpy(x, wt, stride, padding) + b[None, :, None, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("halves", [False, True])
@pytest.mark.parametrize(("c", "groups", "stride"), [(32, 8, 1), (48, 6, 2), (24, 12, 1)])
@pytest.mark.slow
def test_conv2d_blocked_narrow_groups_numbers(c: int, groups: int, stride: int, halves: bool) -> None:
    """Groups of 4, 8 and 2 channels in a block: the dense 16 x 16 product and the halves'
    two 8 x 8 products (`half_block_groups`) on the same weights, the nest's reference and
    the compiled kernel, against numpy group by group."""
    nest, params = conv2d(N=2, C=c, K=c, H=6, W=7, R=3, S=3, stride=stride, padding=1,
                          layout="nchw16c", groups=groups, half_block_groups=halves)
    assert ("h * 8 + k" in (nest.source or "")) == halves
    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, (2, c, 6, 7)).astype(np.float32)
    wt = rng.uniform(-1, 1, (c, c // groups, 3, 3)).astype(np.float32)
    g = c // groups
    want = np.concatenate([conv2d_numpy(x[:, i * g:(i + 1) * g], wt[i * g:(i + 1) * g], stride, 1)
                           for i in range(groups)], axis=1)
    inputs = {"x": layouts.to_nchw16c(x), "w": layouts.to_conv_weights(wt, groups)}
    np.testing.assert_allclose(layouts.from_nchw16c(evaluate(nest, params, inputs)["y"], c), want,
                               rtol=1e-5, atol=1e-5)
    kernel = build_kernel(nest, params, "c", "auto")
    assert kernel.schedule.microkernel is not None, kernel.schedule.describe()
    got = kernel(inputs["x"], inputs["w"])
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(layouts.from_nchw16c(got, c), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("machine", "halves"), [("x86-64-v3", True), ("x86-64-v4", False),
                                                 ("generic", True)])
def test_a_target_of_narrow_vectors_sums_narrow_groups_by_half_blocks(machine: str, halves: bool) -> None:
    """An AVX2 FMA of 8 lanes costs what AVX-512's of 16 does: there the dense product of a
    block does twice the FMAs it needs; AVX-512 keeps it (an 8-lane call would not be faster)."""
    lanes = resolve_target("c", machine).vector_lanes("float32")
    nest, _ = conv2d(N=1, C=32, K=32, H=6, W=6, R=3, S=3, padding=1, groups=8, layout="nchw16c",
                     **target_options("conv2d", "c", lanes))
    assert ("h * 8 + k" in (nest.source or "")) == halves


def loop_vars(nest: LoopNest) -> list[list[str]]:
    """The loop variables of each top-level nest, outermost first."""
    out = []
    for node in nest.body:
        found: list[str] = []
        while isinstance(node, Loop):
            found.append(node.var)
            node = node.body[0]
        out.append(found)
    return out


def test_blocked_1x1_over_short_rows_runs_the_image_as_one_loop() -> None:
    """A 1 x 1 stride-1 layer over rows of fewer than 8 outputs indexes its positions as one
    loop m (`[m / W][m % W]`), the epilogues with it; wider rows, strides, padding and windows
    keep their rows and columns."""
    nest, _ = conv2d(N=2, C=32, K=48, H=7, W=6, R=1, S=1, layout="nchw16c",
                     fuse=("bias", "relu"), accumulate=False)
    assert loop_vars(nest) == [["n", "kb", "m", "k"], ["n", "kb", "m", "cb", "c", "k"],
                               ["n", "kb", "m", "k"], ["n", "kb", "m", "k"]]
    m_loop = nest.body[1].body[0].body[0]  # type: ignore[union-attr]
    assert isinstance(m_loop, Loop) and m_loop.upper.value == 42  # type: ignore[attr-defined]
    for sizes in (dict(H=8, W=8), dict(H=16, W=16, stride=2), dict(H=7, W=7, padding=1),
                  dict(H=7, W=7, R=3, S=3, padding=1)):
        args = dict(N=1, C=16, K=16, R=1, S=1, layout="nchw16c") | sizes
        nest, _ = conv2d(**args)  # type: ignore[arg-type]
        assert "m" not in loop_vars(nest)[-1] and "q" in loop_vars(nest)[-1], sizes
    nest, _ = conv2d(N=1, C=16, K=16, H=7, W=7, R=1, S=1)  # NCHW: as written
    assert "m" not in loop_vars(nest)[-1]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_strided_1x1_over_short_rows_reads_a_copy_of_the_positions_it_takes(dtype: str) -> None:
    """A 1 x 1 layer at stride 2 with output rows shorter than 8 (13 x 11 -> 7 x 6) copies the
    input positions it reads into xs (a scratch array written in full: not cleared per call),
    then runs its positions as one loop over it; the nest's numbers match numpy."""
    nest, params = conv2d(N=2, C=24, K=20, H=13, W=11, R=1, S=1, stride=2, layout="nchw16c",
                          dtype=dtype, fuse=("bias",))
    assert loop_vars(nest)[:2] == [["n", "cb", "p", "q", "c"], ["n", "kb", "m", "cb", "c", "k"]]
    (xs,) = [a for a in nest.arrays if a.name == "xs"]
    assert xs.local and xs.filled
    rng = np.random.default_rng(12)
    x = rng.uniform(-1, 1, (2, 24, 13, 11)).astype(np.float32)
    wt = rng.uniform(-1, 1, (20, 24, 1, 1)).astype(np.float32)
    b = rng.uniform(-1, 1, 32).astype(np.float32)
    import ml_dtypes

    if dtype == "bfloat16":
        from tests.codegen.c.test_bfloat16 import f32

        x, wt = f32(x.astype(ml_dtypes.bfloat16)), f32(wt.astype(ml_dtypes.bfloat16))
    inputs = {"x": layouts.to_nchw16c(x), "w": layouts.to_kcrs16c16k(wt), "b": b}
    if dtype == "bfloat16":
        inputs |= {name: inputs[name].astype(ml_dtypes.bfloat16) for name in ("x", "w")}
    got = layouts.from_nchw16c(evaluate(nest, params, inputs)["y"], 20)
    want = conv2d_numpy(x, wt, 2, 0) + b[None, :20, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("stride", "H", "W"), [(2, 13, 11), (3, 9, 10), (1, 7, 9)])
@pytest.mark.slow
def test_an_nchw_1x1_runs_its_positions_as_one_loop(stride: int, H: int, W: int) -> None:
    """NCHW 1 x 1 without padding: the output positions are one loop m, and at a stride the
    positions read are copied into xs first (written in full); a call then reduces over the
    channels along rows of unit stride. The nest's numbers and the compiled kernel's match
    numpy."""
    sizes = dict(N=2, C=24, K=20, H=H, W=W, R=1, S=1, stride=stride)
    nest, params = conv2d(**sizes, fuse=("bias", "relu"), accumulate=False,  # type: ignore[arg-type]
                          merged_positions=True)
    copies = [["n", "c", "p", "q"]] if stride > 1 else []
    assert loop_vars(nest) == [*copies, ["n", "k", "m"], ["n", "k", "m", "c"], *[["n", "k", "m"]] * 2]
    assert [(a.local, a.filled) for a in nest.arrays if a.name == "xs"] == ([(True, True)] if copies else [])
    rng = np.random.default_rng(13)
    x = rng.uniform(-1, 1, (2, 24, H, W)).astype(np.float32)
    wt = rng.uniform(-1, 1, (20, 24, 1, 1)).astype(np.float32)
    b = rng.uniform(-1, 1, 20).astype(np.float32)
    want = np.maximum(conv2d_numpy(x, wt, stride, 0) + b[None, :, None, None], 0.0)
    got = evaluate(nest, params, {"x": x, "w": wt, "b": b})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    kernel = polydl.conv2d(**sizes, fuse=("bias", "relu"), accumulate=False)  # type: ignore[arg-type]
    assert kernel.schedule.microkernel is not None and kernel.schedule.microkernel.k == "c"
    np.testing.assert_allclose(kernel(x, wt, b), want, rtol=1e-5, atol=1e-5)


def test_conv2d_blocked_residual_numbers() -> None:
    nest, params = conv2d(N=1, C=3, K=5, H=4, W=4, R=3, S=3, padding=1, layout="nchw16c", fuse=("residual",))
    rng = np.random.default_rng(11)
    x = rng.uniform(-1, 1, (1, 3, 4, 4)).astype(np.float32)
    wt = rng.uniform(-1, 1, (5, 3, 3, 3)).astype(np.float32)
    res = rng.uniform(-1, 1, (1, 5, 4, 4)).astype(np.float32)
    inputs = {"x": layouts.to_nchw16c(x), "w": layouts.to_kcrs16c16k(wt), "res": layouts.to_nchw16c(res)}
    got = layouts.from_nchw16c(evaluate(nest, params, inputs)["y"], 5)
    np.testing.assert_allclose(got, conv2d_numpy(x, wt, 1, 1) + res, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- argument checks


GOOD = dict(N=1, C=2, K=3, H=5, W=5, R=3, S=3)


@pytest.mark.parametrize(
    "changes, argument",
    [
        ({"N": 0}, "N"),
        ({"C": -1}, "C"),
        ({"H": True}, "H"),
        ({"R": 1.5}, "R"),
        ({"K": "3"}, "K"),
        ({"stride": 0}, "stride"),
        ({"padding": -1}, "padding"),
        ({"dtype": "int8"}, "dtype"),
        ({"layout": "nhwc16c"}, "layout"),
        ({"layout": "nhwc", "C": 4, "K": 4, "groups": 2}, "groups"),
        ({"accumulate": 1}, "accumulate"),
        ({"column_phases": "yes"}, "column_phases"),
        ({"half_block_groups": 1}, "half_block_groups"),
        ({"fuse": ("bias", "bias")}, "fuse"),
        ({"fuse": ("gelu",)}, "fuse"),
        ({"fuse": "relu"}, "fuse"),
        ({"fuse": (1,)}, "fuse"),
        ({"H": 2, "R": 5, "padding": 1}, "R"),
        ({"W": 1, "S": 2}, "S"),
        ({"column_phases": 1}, "column_phases"),
        ({"merged_positions": "yes"}, "merged_positions"),
    ],
)
def test_conv2d_rejects_bad_arguments(changes: dict, argument: str) -> None:
    with pytest.raises(ArgumentError) as info:
        conv2d(**{**GOOD, **changes})
    assert info.value.argument == argument
    assert argument in str(info.value)


@pytest.mark.parametrize(
    "changes, argument",
    [({"M": 0}, "M"), ({"N": False}, "N"), ({"K": 2.0}, "K"), ({"dtype": "float16"}, "dtype")],
)
def test_matmul_rejects_bad_arguments(changes: dict, argument: str) -> None:
    with pytest.raises(ArgumentError) as info:
        matmul(**{"M": 2, "N": 2, "K": 2, **changes})
    assert info.value.argument == argument


def test_numpy_integers_are_accepted() -> None:
    _, params = matmul(M=np.int64(2), N=np.int32(3), K=4)
    assert params == {"M": 2, "N": 3, "K": 4}
    assert all(type(v) is int for v in params.values())


def test_conv2d_bf16_output_is_refused_on_the_cpu_with_a_reason() -> None:
    """A bf16 y from bf16 inputs is for GPU targets (float32 accumulators, one rounding): C
    loops would round the sum at every step."""
    import polydl
    from polydl.errors import ScheduleError

    with pytest.raises(ScheduleError, match="accumulates products into the bfloat16 array 'y'"):
        polydl.conv2d(1, 16, 16, 6, 6, 3, 3, 1, 1, dtype="bfloat16", layout="nhwc", out_dtype="bfloat16")
    with pytest.raises(ArgumentError, match="out_dtype"):
        conv2d(**{**GOOD, "out_dtype": "bfloat16"})  # fp32 inputs give an fp32 output
    nest, params = conv2d(1, 16, 16, 6, 6, 3, 3, 1, 1, dtype="bfloat16", layout="nhwc", out_dtype="bfloat16",
                          fuse=("bias",))
    assert {a.name: a.dtype for a in nest.arrays}["y"] == "bfloat16"
    assert {a.name: a.dtype for a in nest.arrays}["b"] == "bfloat16"


def conv2d_numpy_padded(x: np.ndarray, w: np.ndarray, stride: int,
                        padding: tuple[int, int, int, int]) -> np.ndarray:
    """`conv2d_numpy` with (top, left, bottom, right) padding."""
    top, left, bottom, right = padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    return conv2d_numpy(xp, w, stride, 0)


@pytest.mark.parametrize("fuse, accumulate", [(("bias", "relu"), False), (("bias", "residual"), True)])
@pytest.mark.slow
def test_an_nchw_input_gives_a_blocked_output(fuse: tuple[str, ...], accumulate: bool) -> None:
    """`out_layout="nchw16c"` with an NCHW x (a stem: 3 channels, 7 x 7 at stride 2): y, the
    bias and the residual blocked, the weights w[KB][C][R][S][16]; the nest's numbers and the
    compiled kernel's match numpy, its calls vectors of output channels."""
    sizes = dict(N=2, C=3, K=20, H=17, W=15, R=7, S=7, stride=2, padding=3)
    nest, params = conv2d(**sizes, fuse=fuse, accumulate=accumulate, out_layout="nchw16c")  # type: ignore[arg-type]
    shapes = {a.name: a.concrete_shape(params) for a in nest.arrays}
    assert shapes["y"] == (2, 2, 9, 8, 16) and shapes["x"] == (2, 3, 17, 15)
    assert shapes["w"] == (2, 3, 7, 7, 16) and shapes["b"] == (32,)
    rng = np.random.default_rng(23)
    x = rng.uniform(-1, 1, (2, 3, 17, 15)).astype(np.float32)
    wt = rng.uniform(-1, 1, (20, 3, 7, 7)).astype(np.float32)
    b = np.zeros(32, np.float32)
    b[:20] = rng.uniform(-1, 1, 20)
    res = rng.uniform(-1, 1, (2, 20, 9, 8)).astype(np.float32)
    y0 = rng.uniform(-1, 1, (2, 20, 9, 8)).astype(np.float32)
    want = conv2d_numpy(x, wt, 2, 3) + b[None, :20, None, None] + (y0 if accumulate else 0)
    want = want + res if "residual" in fuse else np.maximum(want, 0.0)
    inputs = {"x": x, "w": layouts.to_kcrs16k(wt), "b": b}
    if "residual" in fuse:
        inputs["res"] = layouts.to_nchw16c(res)
    kernel = build_kernel(nest, params, "c", "auto")
    call = kernel.schedule.microkernel
    assert call is not None and call.n == "k"
    got = kernel(**inputs, y=layouts.to_nchw16c(y0))
    np.testing.assert_allclose(layouts.from_nchw16c(got, 20), want, rtol=1e-5, atol=1e-5)
    if not accumulate:
        got = evaluate(nest, params, inputs)["y"]
        np.testing.assert_allclose(layouts.from_nchw16c(got, 20), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("changes, argument", [
    ({"layout": "nchw16c", "out_layout": "nchw"}, "out_layout"),
    ({"out_layout": "nhwc"}, "out_layout"),
    ({"out_layout": "blocked"}, "out_layout"),
    ({"out_layout": "nchw16c", "groups": 3, "K": 6}, "groups"),
])
def test_out_layout_takes_nchw_in_blocks_out_only(changes: dict, argument: str) -> None:
    with pytest.raises(ArgumentError) as info:
        conv2d(**{**dict(N=1, C=3, K=4, H=6, W=6, R=3, S=3, padding=1), **changes})
    assert info.value.argument == argument


SHORT_ROW_CASES = [
    # c, k, h, w, r, s, (top, left, bottom, right), accumulate
    (20, 24, 7, 7, 3, 3, (1, 1, 1, 1), False),  # ResNet's 7 x 7 3 x 3 layers, smaller
    (17, 9, 6, 9, 3, 2, (0, 1, 2, 0), True),  # a rectangular window, uneven padding
    (16, 4, 5, 4, 1, 1, (1, 1, 1, 1), True),  # a padded 1 x 1 window
]


@pytest.mark.parametrize("c, k, h, w, r, s, padding, accumulate", SHORT_ROW_CASES)
@pytest.mark.slow
def test_nchw_short_rows_run_the_padded_image_as_one_loop(c, k, h, w, r, s, padding, accumulate) -> None:  # type: ignore[no-untyped-def]
    """With `merged_positions`, an NCHW layer at stride 1 over rows of fewer than 16 outputs
    sums along its padded input's flat cells (`yw[n][k][m] += xf[n][c][m + r * width + s]`),
    the cells past each row's end summed for nothing, then copies the rows into y (set, or
    added to the y passed in); the nest's numbers and the compiled kernel's match numpy."""
    nest, params = conv2d(N=2, C=c, K=k, H=h, W=w, R=r, S=s, padding=padding, fuse=("bias",),
                          accumulate=accumulate, merged_positions=True)
    assert {"xf", "yw"} <= {a.name for a in nest.arrays if a.local}
    assert ["n", "k", "m", "c", "r", "s"] in loop_vars(nest)
    rng = np.random.default_rng(17)
    x = rng.uniform(-1, 1, (2, c, h, w)).astype(np.float32)
    wt = rng.uniform(-1, 1, (k, c, r, s)).astype(np.float32)
    b = rng.uniform(-1, 1, k).astype(np.float32)
    want = conv2d_numpy_padded(x, wt, 1, padding) + b[None, :, None, None]
    got = evaluate(nest, params, {"x": x, "w": wt, "b": b})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    kernel = build_kernel(nest, params, "c", "auto")
    call = kernel.schedule.microkernel
    assert call is not None and call.n == "m"
    y = rng.uniform(-1, 1, want.shape).astype(np.float32)
    start = y.copy() if accumulate else np.zeros_like(y)
    np.testing.assert_allclose(kernel(x, wt, b, y=y), start + want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c, w", [(16, 16), (15, 8)])
def test_nchw_rows_of_a_block_or_more_or_few_channels_stay_rows(c: int, w: int) -> None:
    nest, _ = conv2d(N=1, C=c, K=4, H=6, W=w, R=3, S=3, padding=1, merged_positions=True)
    assert not any(a.name == "xf" for a in nest.arrays)


STEM_CASES = [
    # c, k, h, w, r, s, stride, (top, left, bottom, right)
    (3, 8, 20, 22, 7, 7, 2, (3, 3, 3, 3)),  # ResNet's stem, smaller
    (3, 5, 17, 15, 3, 5, 3, (1, 2, 0, 1)),
    (4, 6, 9, 9, 3, 3, 2, (0, 0, 0, 0)),
    (1, 4, 12, 13, 5, 5, 4, (2, 2, 2, 2)),
]


@pytest.mark.parametrize("c, k, h, w, r, s, stride, padding", STEM_CASES)
def test_strided_nchw_stem_reads_its_input_columns_by_phase(c, k, h, w, r, s, stride, padding) -> None:  # type: ignore[no-untyped-def]
    """With `column_phases`, an NCHW layer of fewer input channels than a block at a stride
    copies column iw + left of x into phase (iw + left) % stride of xd and its taps into wd,
    zero-padded to a whole number of taps a phase; the window then moves at unit stride
    along q. Both copies leave cells unwritten (cleared, not `filled`); numbers match numpy."""
    nest, params = conv2d(N=2, C=c, K=k, H=h, W=w, R=r, S=s, stride=stride, padding=padding,
                          column_phases=True)
    taps = -(-s // stride)
    assert loop_vars(nest)[-1] == ["n", "k", "p", "q", "c", "r", "h", "t"]
    xd, wd = (next(a for a in nest.arrays if a.name == name) for name in ("xd", "wd"))
    assert xd.local and wd.local and not xd.filled and not wd.filled
    assert wd.concrete_shape(params) == (k, c, r, stride, taps)
    inputs = random_inputs(nest, params, seed=5)
    got = evaluate(nest, params, inputs)["y"]
    np.testing.assert_allclose(got, conv2d_numpy_padded(inputs["x"], inputs["w"], stride, padding),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("changes", [
    {"column_phases": False}, {"C": 16}, {"stride": 1}, {"dilation": 2}, {"C": 4, "groups": 2},
    {"S": 1, "R": 1}, {"layout": "nchw16c"},
])
def test_column_phases_only_for_strided_stems(changes: dict) -> None:
    args = dict(N=1, C=3, K=8, H=15, W=15, R=3, S=3, stride=2, padding=1, column_phases=True)
    nest, _ = conv2d(**{**args, **changes})  # type: ignore[arg-type]
    assert "xd" not in {a.name for a in nest.arrays}
