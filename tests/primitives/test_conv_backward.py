"""Convolution backward passes: built, compiled, run, and checked against the nest's numpy
reference, an independent numpy formula, and PyTorch's autograd; a microkernel is bound."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polydl
from polydl import layouts
from polydl.errors import ArgumentError
from polydl.runtime.verify import compare
from polydl.target.host import host_target

# N, C, K, H, W, R, S, stride, padding: odd channels (partial blocks), strides that leave rows
# of x out of every window, padding larger than R-1, rectangular windows.
SHAPES = [
    (2, 5, 7, 7, 6, 3, 3, 1, 1),
    (1, 4, 3, 8, 7, 3, 2, 2, 1),
    (2, 3, 5, 9, 9, 1, 1, 2, 0),
    (1, 2, 3, 5, 5, 1, 1, 1, 2),
    (1, 3, 2, 8, 8, 3, 3, 3, 0),
    (1, 17, 18, 6, 6, 3, 3, 1, 0),
    (2, 20, 33, 7, 5, 1, 1, 1, 0),  # blocked: the 35 positions as one loop
]
LAYOUTS = ("nchw", "nchw16c")


def sizes(shape: tuple[int, ...]) -> dict[str, int]:
    return dict(zip(("N", "C", "K", "H", "W", "R", "S", "stride", "padding"), shape, strict=True))


def gradients_numpy(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, stride: int, padding: int
) -> tuple[np.ndarray, np.ndarray]:
    """dx and dw of y = conv(x, w) for the output gradient dy, by scattering each window."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    p, q = dy.shape[2:]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    dxp = np.zeros_like(xp)
    dw = np.zeros(w.shape)
    for i in range(r):
        for j in range(s):
            rows = slice(i, i + stride * (p - 1) + 1, stride)
            cols = slice(j, j + stride * (q - 1) + 1, stride)
            dxp[:, :, rows, cols] += np.einsum("nkpq,kc->ncpq", dy, w[:, :, i, j].astype(np.float64))
            dw[:, :, i, j] = np.einsum("nkpq,ncpq->kc", dy, xp[:, :, rows, cols])
    return dxp[:, :, padding : padding + h, padding : padding + wd], dw


def operands(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = sizes(shape)
    p = (s["H"] + 2 * s["padding"] - s["R"]) // s["stride"] + 1
    q = (s["W"] + 2 * s["padding"] - s["S"]) // s["stride"] + 1
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (s["N"], s["C"], s["H"], s["W"])).astype(np.float32)
    w = rng.uniform(-1, 1, (s["K"], s["C"], s["R"], s["S"])).astype(np.float32)
    dy = rng.uniform(-1, 1, (s["N"], s["K"], p, q)).astype(np.float32)
    return x, w, dy


def check(kernel: polydl.Kernel, inputs: list[np.ndarray], got: np.ndarray, want: np.ndarray) -> None:
    ok, err = compare(got, want, "float32")
    assert ok, f"differs from numpy by {err:.2e}"
    ref = kernel.reference(*inputs)
    raw = kernel(*inputs)
    ok, err = compare(raw, ref, "float32")
    assert ok, f"differs from the nest's reference by {err:.2e}"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.slow
def test_backward_data_matches_numpy(shape: tuple[int, ...], layout: str) -> None:
    s = sizes(shape)
    x, w, dy = operands(shape)
    kernel = polydl.conv2d_backward_data(**s, layout=layout)
    blocked = layout == "nchw16c"
    inputs = [layouts.to_nchw16c(dy), layouts.to_kcrs16c16k(w)] if blocked else [dy, w]
    got = kernel(*inputs)
    got = layouts.from_nchw16c(got, s["C"]) if blocked else got
    check(kernel, inputs, got, gradients_numpy(x, w, dy, s["stride"], s["padding"])[0])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.slow
def test_backward_weights_matches_numpy(shape: tuple[int, ...], layout: str) -> None:
    s = sizes(shape)
    x, w, dy = operands(shape)
    kernel = polydl.conv2d_backward_weights(**s, layout=layout)
    blocked = layout == "nchw16c"
    inputs = [layouts.to_nchw16c(x), layouts.to_nchw16c(dy)] if blocked else [x, dy]
    got = kernel(*inputs)
    got = layouts.from_kcrs16c16k(got, s["K"], s["C"]) if blocked else got
    check(kernel, inputs, got, gradients_numpy(x, w, dy, s["stride"], s["padding"])[1])


@pytest.mark.slow
def test_a_stem_scatter_on_many_cores_runs_its_filter_rows_in_parallel() -> None:
    """A 7 x 7 stride-2 backward-data scatters rows 2p + r: the output rows and images carry
    its dependences or give 1 x 1 units (3 input channels: one block), so on 16 cores the
    filter rows inside the output rows are the parallel loop; checked against numpy."""
    shape = (1, 3, 64, 112, 112, 7, 7, 2, 3)  # ResNet-50's stem at half size
    s = sizes(shape)
    x, w, dy = operands(shape)
    socket = replace(host_target(), cores=16)  # this machine's ISA, a socket's cores
    kernel = polydl.conv2d_backward_data(**s, layout="nchw16c", target=socket)
    assert kernel.schedule.parallel == ("r",)
    order = kernel.schedule.order
    assert order.index("p") < order.index("r")
    inputs = [layouts.to_nchw16c(dy), layouts.to_kcrs16c16k(w)]
    got = layouts.from_nchw16c(kernel(*inputs), s["C"])
    check(kernel, inputs, got, gradients_numpy(x, w, dy, s["stride"], s["padding"])[0])


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[1], SHAPES[3]])
def test_backward_passes_match_torch_autograd(shape: tuple[int, ...]) -> None:
    torch = pytest.importorskip("torch")
    s = sizes(shape)
    x, w, dy = operands(shape, seed=1)
    tx = torch.from_numpy(x).double().requires_grad_()
    tw = torch.from_numpy(w).double().requires_grad_()
    torch.nn.functional.conv2d(tx, tw, None, s["stride"], s["padding"]).backward(
        torch.from_numpy(dy).double()
    )
    for layout in LAYOUTS:
        blocked = layout == "nchw16c"
        data = polydl.conv2d_backward_data(**s, layout=layout)
        weights = polydl.conv2d_backward_weights(**s, layout=layout)
        if blocked:
            dx = layouts.from_nchw16c(data(layouts.to_nchw16c(dy), layouts.to_kcrs16c16k(w)), s["C"])
            dw = layouts.from_kcrs16c16k(
                weights(layouts.to_nchw16c(x), layouts.to_nchw16c(dy)), s["K"], s["C"]
            )
        else:
            dx, dw = data(dy, w), weights(x, dy)
        assert compare(dx, tx.grad.numpy(), "float32")[0], layout
        assert compare(dw, tw.grad.numpy(), "float32")[0], layout


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.slow
def test_blocked_backward_passes_bind_a_microkernel(stride: int) -> None:
    s = sizes((2, 32, 32, 8, 8, 3, 3, stride, 1))
    for build in (polydl.conv2d_backward_data, polydl.conv2d_backward_weights):
        kernel = build(**s, layout="nchw16c")
        assert kernel.schedule.microkernel is not None, build.__name__


# NCHW layers of a block of input channels or more: a strided 1 x 1 window (only the positions
# read), a padded 3 x 3 one at a stride, a 1 x 1 one at stride 1, a padded 1 x 1 one
CHANNELS_LAST = [(2, 16, 9, 9, 9, 1, 1, 2, 0), (1, 16, 5, 9, 8, 3, 3, 2, 1), (2, 20, 33, 7, 5, 1, 1, 1, 0),
                 (1, 16, 5, 5, 6, 1, 1, 1, 1)]


@pytest.mark.parametrize(("shape", "vector"), [*((shape, "c") for shape in CHANNELS_LAST),
                                               ((1, 3, 16, 20, 20, 7, 7, 2, 3), "s")])
@pytest.mark.slow
def test_nchw_backward_weights_run_their_calls_along_the_input_channels(
        shape: tuple[int, ...], vector: str) -> None:
    """x is copied channels-last first, so the calls' vectors run over c at unit stride (read
    in place, a 1 x 1 layer had no vector loop at all); a stem's 3 channels make no vector, so
    it reads x in place, its calls along the filter's columns."""
    s = sizes(shape)
    x, w, dy = operands(shape)
    kernel = polydl.conv2d_backward_weights(**s)
    call = kernel.schedule.microkernel
    assert call is not None and call.n == vector
    check(kernel, [x, dy], kernel(x, dy), gradients_numpy(x, w, dy, s["stride"], s["padding"])[1])


def test_nchw_strided_1x1_backward_data_is_a_gemm_over_the_positions_read() -> None:
    """The gradients of the positions a strided 1 x 1 layer reads come from one GEMM per image
    along dy's positions, then land in dx at the stride; the rest of dx stays zero."""
    shape = CHANNELS_LAST[0]
    s = sizes(shape)
    x, w, dy = operands(shape)
    kernel = polydl.conv2d_backward_data(**s)
    call = kernel.schedule.microkernel
    assert call is not None and (call.m, call.n, call.k) == ("c", "m", "k")
    got = kernel(dy, w)
    check(kernel, [dy, w], got, gradients_numpy(x, w, dy, s["stride"], s["padding"])[0])
    assert not got[:, :, 1::2].any() and not got[:, :, :, 1::2].any()


@pytest.mark.parametrize("shape", [(2, 5, 16, 7, 6, 3, 3, 1, 1), (1, 4, 17, 5, 6, 3, 2, 1, 2)])
def test_nchw_backward_data_over_short_rows_runs_the_padded_image_as_one_loop(shape: tuple[int, ...]) -> None:
    """At stride 1 over rows of fewer than 16 positions (and at least 16 output channels to
    sum), backward data sums along the padded dy's flat cells (as the forward layer,
    `builders.short_rows`), then copies dx out by row."""
    s = sizes(shape)
    x, w, dy = operands(shape)
    kernel = polydl.conv2d_backward_data(**s)
    assert {"dyf", "dxw"} <= {a.name for a in kernel.nest.arrays if a.local}
    call = kernel.schedule.microkernel
    assert call is not None and call.n == "m"
    check(kernel, [dy, w], kernel(dy, w), gradients_numpy(x, w, dy, s["stride"], s["padding"])[0])


def test_float64() -> None:
    s = sizes(SHAPES[1])
    x, w, dy = (a.astype(np.float64) for a in operands(SHAPES[1]))
    dx, dw = gradients_numpy(x, w, dy, s["stride"], s["padding"])
    got = polydl.conv2d_backward_data(**s, dtype="float64")(dy, w)
    assert compare(got, dx, "float64")[0]
    got = polydl.conv2d_backward_weights(**s, dtype="float64")(x, dy)
    assert compare(got, dw, "float64")[0]


@pytest.mark.parametrize(
    "argument, overrides",
    [
        ("stride", {"stride": 0}),
        ("padding", {"padding": -1}),
        ("R", {"R": 12}),
        ("layout", {"layout": "nhwc"}),
        ("dtype", {"dtype": "int8"}),
        ("C", {"C": 2.5}),
    ],
)
def test_bad_arguments_name_the_argument(argument: str, overrides: dict[str, object]) -> None:
    s: dict[str, object] = {**sizes(SHAPES[0]), **overrides}
    for build in (polydl.conv2d_backward_data, polydl.conv2d_backward_weights):
        with pytest.raises(ArgumentError) as info:
            build(**s)
        assert info.value.argument == argument


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    data=st.data(),
    stride=st.integers(1, 3),
    padding=st.integers(0, 2),
    layout=st.sampled_from(LAYOUTS),
)
@pytest.mark.slow
def test_any_stride_and_padding(data: st.DataObject, stride: int, padding: int, layout: str) -> None:
    r = data.draw(st.integers(1, 4), label="R")
    s = data.draw(st.integers(1, 4), label="S")
    h = data.draw(st.integers(max(1, r - 2 * padding), 9), label="H")
    w = data.draw(st.integers(max(1, s - 2 * padding), 9), label="W")
    shape = (1, data.draw(st.integers(1, 5), label="C"), data.draw(st.integers(1, 5), label="K"),
             h, w, r, s, stride, padding)
    test_backward_data_matches_numpy(shape, layout)
    test_backward_weights_matches_numpy(shape, layout)


def test_blocked_1x1_backward_calls_span_the_image_where_rows_are_short() -> None:
    """Both passes of a 1 x 1 layer over rows of 5 run the 35 positions as one loop: backward
    data's calls take them as rows of C, backward weights' as the sum (k), batched over n."""
    s = sizes((2, 20, 33, 7, 5, 1, 1, 1, 0))
    data = polydl.conv2d_backward_data(**s, layout="nchw16c").schedule.microkernel
    weights = polydl.conv2d_backward_weights(**s, layout="nchw16c").schedule.microkernel
    assert data is not None and data.m == "m"
    assert weights is not None and weights.k == "m" and weights.batch == ("n",)
