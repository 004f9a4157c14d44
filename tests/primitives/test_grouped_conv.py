"""Grouped, depthwise and dilated convolutions with asymmetric padding, and the clip epilogue:
forward against `torch.nn.functional.conv2d`, backward passes against PyTorch's autograd, in
both layouts (blocked weights through `polydl.layouts.to_conv_weights`), and the argument checks
of each new option."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import polydl
from polydl import layouts
from polydl.api import build_kernel
from polydl.errors import ArgumentError
from polydl.frontends import builders, conv_backward
from polydl.ir import Loop
from polydl.runtime.verify import compare

torch = pytest.importorskip("torch")

LAYOUTS = ("nchw", "nchw16c")
Shape = tuple[int, int, int, int, int, int, int, int, "int | tuple[int, int, int, int]", int]

# N, C, K, H, W, R, S, stride, padding, groups; the blocked form each takes in the comment
FORWARD: list[tuple[Shape, int]] = [  # (shape, dilation)
    ((2, 8, 8, 7, 6, 3, 3, 1, 1, 2), 1),  # in_block: 2 groups of 4 in one block
    ((1, 16, 16, 6, 7, 3, 3, 2, (0, 1, 2, 1), 4), 1),  # in_block, asymmetric padding
    ((1, 24, 24, 7, 7, 3, 3, 1, 1, 24), 1),  # depthwise, a half block
    ((1, 24, 24, 8, 8, 3, 3, 2, 1, 24), 1),  # depthwise, stride 2
    ((1, 8, 16, 6, 6, 3, 3, 1, 1, 8), 1),  # depthwise, multiplier 2 (lanes)
    ((1, 32, 32, 5, 5, 3, 3, 1, 1, 2), 1),  # block_diagonal
    ((1, 16, 20, 5, 5, 3, 3, 1, 1, 4), 1),  # lanes, the lanes past K left out
    ((1, 12, 6, 6, 6, 3, 2, 2, (1, 0, 0, 2), 3), 1),  # lanes, 4 inputs to 2 outputs
    ((1, 3, 5, 6, 5, 3, 3, 2, (2, 0, 1, 1), 1), 1),  # dense, asymmetric padding
    ((1, 6, 6, 9, 9, 3, 3, 1, 2, 1), 2),  # dense, dilation 2
    ((1, 24, 24, 9, 8, 3, 3, 2, (2, 1, 0, 2), 24), 2),  # depthwise, dilated, asymmetric
]

BACKWARD: list[Shape] = [
    (2, 8, 8, 6, 6, 3, 3, 1, 1, 2),  # in_block
    (1, 24, 24, 6, 6, 3, 3, 1, 1, 24),  # depthwise
    (1, 24, 24, 7, 7, 3, 3, 2, 1, 24),  # depthwise, stride 2
    (1, 32, 32, 5, 5, 3, 3, 2, 1, 2),  # block_diagonal, stride 2
    (1, 16, 20, 5, 5, 3, 3, 1, (0, 1, 2, 1), 4),  # lanes past K, asymmetric padding
    (1, 8, 16, 6, 6, 3, 3, 2, 1, 8),  # depthwise, multiplier 2
]


def sizes(shape: Shape) -> dict[str, object]:
    names = ("N", "C", "K", "H", "W", "R", "S", "stride", "padding", "groups")
    return dict(zip(names, shape, strict=True))


def pads(padding: object) -> tuple[int, int, int, int]:
    return (padding,) * 4 if isinstance(padding, int) else padding  # type: ignore[return-value]


def torch_padded(x: np.ndarray, padding: object) -> object:
    """x padded as (top, left, bottom, right): torch.nn.functional.pad takes (left, right, top,
    bottom)."""
    top, left, bottom, right = pads(padding)
    return torch.nn.functional.pad(torch.from_numpy(x).double(), (left, right, top, bottom))


def to_kernel(x: np.ndarray, layout: str) -> np.ndarray:
    return layouts.to_nchw16c(x) if layout == "nchw16c" else x


def from_kernel(y: np.ndarray, channels: int, layout: str) -> np.ndarray:
    return layouts.from_nchw16c(y, channels) if layout == "nchw16c" else y


def call(kernel: polydl.Kernel, inputs: list[np.ndarray]) -> np.ndarray:
    """The kernel's one output."""
    out = kernel(*inputs)
    assert isinstance(out, np.ndarray)
    return out


def check(kernel: polydl.Kernel, inputs: list[np.ndarray], got: np.ndarray, want: np.ndarray) -> None:
    ok, err = compare(got, want, "float32")
    assert ok, f"differs from PyTorch by {err:.2e}"
    reference = kernel.reference(*inputs)
    assert isinstance(reference, np.ndarray)
    ok, err = compare(call(kernel, inputs), reference, "float32")
    assert ok, f"differs from the nest's reference by {err:.2e}"


# ----------------------------------------------------------------------------- forward


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape, dilation", FORWARD)
def test_forward_matches_torch(shape: Shape, dilation: int, layout: str) -> None:
    s = sizes(shape)
    n, c, k, h, w, r, sw, stride, padding, groups = shape
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (n, c, h, w)).astype(np.float32)
    wt = rng.uniform(-1, 1, (k, c // groups, r, sw)).astype(np.float32)
    want = torch.nn.functional.conv2d(torch_padded(x, padding), torch.from_numpy(wt).double(),
                                      stride=stride, dilation=dilation, groups=groups).numpy()
    kernel = polydl.conv2d(**s, dilation=dilation, layout=layout)  # type: ignore[arg-type]
    inputs = [to_kernel(x, layout), layouts.to_conv_weights(wt, groups, layout)]
    check(kernel, inputs, from_kernel(call(kernel, inputs), k, layout), want)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_depthwise_with_bias_and_relu6(layout: str) -> None:
    n, c, h, w = 1, 24, 6, 6
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, (n, c, h, w)).astype(np.float32)
    wt = rng.uniform(-2, 2, (c, 1, 3, 3)).astype(np.float32)
    b = rng.uniform(-2, 2, c).astype(np.float32)
    y = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(wt).double(),
                                   torch.from_numpy(b).double(), padding=1, groups=c)
    want = torch.clamp(y, 0, 6).numpy()
    assert (want == 0).any() and (want == 6).any()  # both bounds bite
    kernel = polydl.conv2d(N=n, C=c, K=c, H=h, W=w, R=3, S=3, padding=1, groups=c,
                           layout=layout, fuse=("bias", "clip(0,6)"))
    bias = np.zeros(layouts.blocks(c) * layouts.BLOCK if layout == "nchw16c" else c, np.float32)
    bias[:c] = b
    inputs = [to_kernel(x, layout), layouts.to_conv_weights(wt, c, layout), bias]
    check(kernel, inputs, from_kernel(call(kernel, inputs), c, layout), want)


def test_clip_keeps_nan_and_takes_negative_bounds() -> None:
    nest, params = builders.conv2d(N=1, C=2, K=2, H=3, W=3, R=1, S=1, groups=2,
                                   fuse=("clip(-0.5, 1.5e0)",))
    kernel = build_kernel(nest, params)
    x = np.array([-3, -0.25, 0, 0.75, 1.5, 9, np.nan, -np.inf, np.inf] * 2, np.float32)
    got = call(kernel, [x.reshape(1, 2, 3, 3), np.ones((2, 1, 1, 1), np.float32)]).ravel()
    want = np.clip(x, -0.5, 1.5)
    np.testing.assert_array_equal(got, want)  # NaN stays NaN, as torch.clamp gives it


# ----------------------------------------------------------------------------- backward


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", BACKWARD)
def test_backward_passes_match_torch_autograd(shape: Shape, layout: str) -> None:
    s = sizes(shape)
    n, c, k, h, w, r, sw, stride, padding, groups = shape
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (n, c, h, w)).astype(np.float32)
    wt = rng.uniform(-1, 1, (k, c // groups, r, sw)).astype(np.float32)
    tx = torch.from_numpy(x).double().requires_grad_()
    tw = torch.from_numpy(wt).double().requires_grad_()
    top, left, bottom, right = pads(padding)
    y = torch.nn.functional.conv2d(torch.nn.functional.pad(tx, (left, right, top, bottom)), tw,
                                   stride=stride, groups=groups)
    dy = rng.uniform(-1, 1, tuple(y.shape)).astype(np.float32)
    dx_want, dw_want = torch.autograd.grad(y, (tx, tw), torch.from_numpy(dy).double())

    data = polydl.conv2d_backward_data(**s, layout=layout)  # type: ignore[arg-type]
    inputs = [to_kernel(dy, layout), layouts.to_conv_weights(wt, groups, layout)]
    check(data, inputs, from_kernel(call(data, inputs), c, layout), dx_want.numpy())

    weights = polydl.conv2d_backward_weights(**s, layout=layout)  # type: ignore[arg-type]
    inputs = [to_kernel(x, layout), to_kernel(dy, layout)]
    dw = call(weights, inputs)
    got = layouts.from_conv_weights(dw, k, c, groups, layout)
    # the cells of the blocked weights that are no weights (between groups, past K) stay zero
    np.testing.assert_array_equal(layouts.to_conv_weights(got, groups, layout), dw)
    check(weights, inputs, got, dw_want.numpy())


# ----------------------------------------------------------------------------- forms, layouts


@pytest.mark.parametrize(
    "c, k, groups, form",
    [(64, 64, 1, "dense"), (96, 96, 96, "depthwise"), (32, 64, 2, "block_diagonal"),
     (128, 128, 32, "in_block"), (24, 24, 6, "in_block"), (8, 16, 8, "lanes"),
     (48, 48, 2, "lanes"), (16, 20, 4, "lanes")],
)
def test_weight_layouts_round_trip(c: int, k: int, groups: int, form: str) -> None:
    assert layouts.grouped_form(c, k, groups) == form
    w = np.random.default_rng(3).uniform(-1, 1, (k, c // groups, 3, 2)).astype(np.float32)
    blocked = layouts.to_conv_weights(w, groups)
    nest, params = builders.conv2d(N=1, C=c, K=k, H=4, W=4, R=3, S=2, groups=groups,
                                   layout="nchw16c")
    assert blocked.shape == nest.array("w").concrete_shape(params)
    np.testing.assert_array_equal(layouts.from_conv_weights(blocked, k, c, groups), w)
    assert layouts.to_conv_weights(w, groups, "nchw").shape == w.shape


def loop_order(nest: object) -> list[str]:
    order, node = [], nest.body[-1]  # type: ignore[attr-defined]
    while isinstance(node, Loop):
        order.append(node.var)
        node = node.body[0]
    return order


def test_blocked_depthwise_reads_x_itself_with_the_lanes_innermost() -> None:
    nest, _ = builders.conv2d(N=1, C=32, K=32, H=6, W=6, R=3, S=3, padding=1, groups=32,
                              layout="nchw16c")
    assert nest.locals == ()  # no padded copy: the taps in the padding are out of the domain
    assert loop_order(nest) == ["n", "kb", "p", "r", "s", "q", "k"]
    assert ("if (p + r - 1 >= 0 && p + r - 1 < H && q + s - 1 >= 0 && q + s - 1 < W) "
            "y[n][kb][p][q][k] += x[n][kb][p + r - 1][q + s - 1][k] * w[kb][r][s][k];"
            in (nest.source or ""))
    assert nest.array("w").concrete_shape({"K": 32, "R": 3, "S": 3}) == (2, 3, 3, 16)


def test_nchw_depthwise_has_the_row_of_outputs_innermost() -> None:
    nest, _ = builders.conv2d(N=1, C=32, K=32, H=6, W=6, R=3, S=3, padding=1, groups=32)
    assert loop_order(nest) == ["n", "g", "p", "r", "s", "q"]
    assert "y[n][g][p][q] += xp[n][g][p + r][q + s] * w[g][0][r][s];" in (nest.source or "")


def test_in_block_groups_bind_the_microkernel() -> None:
    kernel = polydl.conv2d(N=1, C=32, K=32, H=6, W=6, R=3, S=3, padding=1, groups=8,
                           layout="nchw16c")
    assert kernel.schedule.microkernel is not None


def test_defaults_and_their_spellings_build_the_same_nest() -> None:
    base: dict[str, Any] = dict(N=1, C=4, K=6, H=5, W=5, R=3, S=3, stride=2)
    for layout in LAYOUTS:
        plain = builders.conv2d(**base, padding=1, layout=layout)
        assert builders.conv2d(**base, padding=(1, 1, 1, 1), layout=layout, groups=1,
                               dilation=1) == plain
        assert builders.conv2d(**base, padding=[1, 1, 1, 1], layout=layout) == plain
        for build in (conv_backward.conv2d_backward_data, conv_backward.conv2d_backward_weights):
            assert build(**base, padding=(1, 1, 1, 1), layout=layout, groups=1) == build(
                **base, padding=1, layout=layout)


# ----------------------------------------------------------------------------- argument checks

GOOD = dict(N=1, C=4, K=4, H=5, W=5, R=3, S=3)


@pytest.mark.parametrize(
    "changes, argument",
    [
        ({"groups": 3}, "groups"),  # divides neither
        ({"C": 6, "groups": 3, "K": 4}, "groups"),  # divides C, not K
        ({"C": 4, "K": 6, "groups": 4}, "groups"),  # divides C, not K
        ({"groups": 0}, "groups"),
        ({"groups": 2.0}, "groups"),
        ({"padding": (1, 1, 1)}, "padding"),
        ({"padding": (1, -1, 0, 0)}, "padding"),
        ({"padding": (1.5, 0, 0, 0)}, "padding"),
        ({"padding": "1"}, "padding"),
        ({"padding": (0, 0, 0, 0, 0)}, "padding"),
        ({"dilation": 0}, "dilation"),
        ({"dilation": 3, "padding": 0}, "R"),  # a 7-wide window over 5 rows
        ({"padding": (0, 2, 0, 0), "R": 6}, "R"),  # padding on the width alone
        ({"fuse": ("clip(6,0)",)}, "fuse"),
        ({"fuse": ("clip(0)",)}, "fuse"),
        ({"fuse": ("clip(a,b)",)}, "fuse"),
        ({"fuse": ("clip(0,inf)",)}, "fuse"),
        ({"fuse": ("clip(0,1e999)",)}, "fuse"),
        ({"fuse": ("clip(0,nan)",)}, "fuse"),
        ({"fuse": ("clip",)}, "fuse"),
        ({"fuse": ("clip(0,6)", "clip(0,1)")}, "fuse"),
    ],
)
def test_forward_rejects_bad_arguments(changes: dict[str, object], argument: str) -> None:
    with pytest.raises(ArgumentError) as info:
        builders.conv2d(**{**GOOD, **changes})  # type: ignore[arg-type]
    assert info.value.argument == argument
    assert argument in str(info.value)


@pytest.mark.parametrize(
    "changes, argument",
    [({"groups": 3}, "groups"), ({"C": 4, "K": 6, "groups": 4}, "groups"),
     ({"padding": (1, 1)}, "padding"), ({"padding": (0, 0, -2, 0)}, "padding")],
)
def test_backward_rejects_bad_arguments(changes: dict[str, object], argument: str) -> None:
    for build in (conv_backward.conv2d_backward_data, conv_backward.conv2d_backward_weights):
        with pytest.raises(ArgumentError) as info:
            build(**{**GOOD, **changes})  # type: ignore[arg-type]
        assert info.value.argument == argument
        assert argument in str(info.value)
