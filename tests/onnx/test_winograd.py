"""Winograd's F(m x m, 3 x 3) for a network's 3 x 3 convolutions: the transformed weights'
layout, the choice of tile and images per call, and compiled convolutions (ragged tiles,
channel padding, pads, residual, activations, several images per call) against onnxruntime.
The transforms themselves are checked in tests/schedules/gpu/test_gpu_winograd.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402

import polydl.onnx  # noqa: E402
from polydl.onnx import winograd  # noqa: E402
from polydl.target import presets  # noqa: E402
from tests.onnx.reference import make_model, random, run_onnxruntime  # noqa: E402

# Winograd's rounding error scales with the operands, not with each output: an output near zero
# has the error of its neighbours. So the error is taken relative to the largest output, as the
# network benchmark takes it.
TOLERANCE = 1e-4


def test_transformed_weights_are_laid_out_per_point_and_block() -> None:
    """u[xi][kb][cb][c][k] = (G w[k][c] G^T)[xi], channels padded to blocks of 16 with zeros."""
    w = np.random.default_rng(0).standard_normal((20, 18, 3, 3))
    u = winograd.transform_weights(w, 2)
    assert u.shape == (16, 2, 2, 16, 16)
    G = np.array(winograd.MATRICES[2][1], dtype=np.float64)
    k, c = 17, 3  # block 1, lane 1 of the outputs; block 0, lane 3 of the inputs
    np.testing.assert_allclose(u[:, 1, 0, 3, 1], (G @ w[k, c] @ G.T).reshape(-1))
    assert not u[:, 1, :, :, 4:].any() and not u[:, :, 1, 2:, :].any()  # the padding lanes


# 2 cores with 1 MiB of L2 each and 32 MiB of L3 (the machine the choice was measured on)
MACHINE = replace(presets.CPU_PRESETS["znver4"], cores=2, l2_bytes=1 << 20, l3_bytes=32 << 20)


@pytest.mark.parametrize("size, m", [(56, 4), (28, 4), (14, 2), (7, 2), (15, 2)])
def test_choice_of_tile(size: int, m: int) -> None:
    """F(4x4) where its tiles divide the output, F(2x2) where they would be cut at the edge."""
    shape = winograd.choose(32, 64, 64, size, size, size, size, (1, 1), MACHINE)
    assert shape is not None and shape.m == m


def test_choice_declines_short_reductions_and_few_tiles() -> None:
    assert winograd.choose(1, 16, 64, 56, 56, 56, 56, (1, 1), MACHINE) is None  # 16 channels
    # one 7 x 7 image: 16 tiles read the transformed weights once for too little work
    assert winograd.choose(1, 512, 512, 7, 7, 7, 7, (1, 1), MACHINE) is None


def test_several_images_per_call_where_one_is_small() -> None:
    shape = winograd.choose(32, 512, 512, 7, 7, 7, 7, (1, 1), MACHINE)
    assert shape is not None and shape.images > 1 and 32 % shape.images == 0
    assert shape.T >= winograd.MIN_TILES
    assert shape.scratch_bytes() <= max(MACHINE.l2_bytes * MACHINE.cores, MACHINE.l3_bytes // 4)
    big = replace(MACHINE, cores=8, l2_bytes=2 << 20, l3_bytes=300 << 20)  # a socket's L3
    shape = winograd.choose(32, 64, 64, 56, 56, 56, 56, (1, 1), big)
    assert shape is not None and shape.scratch_bytes() <= 32 << 20


def test_choice_takes_a_whole_socket() -> None:
    """16 cores sharing a large L3: the images of a call still fit the budget it allows."""
    socket = replace(MACHINE, cores=16, l2_bytes=2 << 20, l3_bytes=300 << 20)
    for size in (56, 28, 14, 7):
        shape = winograd.choose(32, 64, 64, size, size, size, size, (1, 1), socket)
        assert shape is not None and 32 % shape.images == 0
        assert shape.scratch_bytes() <= max(socket.l2_bytes * socket.cores, 32 << 20)


def _conv_model(x_shape: tuple[int, ...], K: int, pads: list[int], *, residual: bool,
                activation: str | None, seed: int = 0) -> tuple[Any, dict[str, np.ndarray]]:
    x = random(x_shape, seed)
    C = x_shape[1]
    weights = {"w": random((K, C, 3, 3), seed + 1, -0.2, 0.2), "b": random((K,), seed + 2)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="/conv/Conv",
                              kernel_shape=[3, 3], pads=pads)]
    feeds = {"x": x}
    last = "c"
    if residual:
        P = x_shape[2] + pads[0] + pads[2] - 2
        Q = x_shape[3] + pads[1] + pads[3] - 2
        feeds["r"] = random((x_shape[0], K, P, Q), seed + 3)
        nodes.append(helper.make_node("Add", [last, "r"], ["a"], name="/add/Add"))
        last = "a"
    if activation == "Relu":
        nodes.append(helper.make_node("Relu", [last], ["y"], name="/relu/Relu"))
    elif activation == "Clip":
        weights["lo"], weights["hi"] = np.array(0.0, np.float32), np.array(6.0, np.float32)
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"], name="/clip/Clip"))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"], name="/id/Identity"))
    return make_model(nodes, feeds, ["y"], weights), feeds


def _relative_error(model: Any, feeds: dict[str, np.ndarray], **options: Any) -> tuple[float, str]:
    compiled = polydl.onnx.compile(model, **options)
    got = compiled(*feeds.values())
    (want,) = run_onnxruntime(model, feeds)
    assert got.shape == want.shape and got.dtype == want.dtype
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want))), compiled.explain()


# id, input shape, output channels, pads (top, left, bottom, right), residual, activation, tile
CASES = [
    ("f4_bias_relu", (1, 32, 28, 28), 32, [1, 1, 1, 1], False, "Relu", 4),
    ("f2_ragged_padded_channels_residual", (2, 32, 15, 15), 40, [1, 1, 1, 1], True, "Relu", 2),
    ("f2_asymmetric_pads_clip", (1, 48, 14, 15), 32, [0, 1, 2, 1], False, "Clip", 2),
    ("f4_no_activation_two_images", (2, 32, 20, 20), 32, [1, 1, 1, 1], False, None, 4),
]


@pytest.mark.parametrize("x_shape, K, pads, residual, activation, m", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
@pytest.mark.slow
def test_winograd_convolution_matches_onnxruntime(x_shape: tuple[int, ...], K: int,
                                                  pads: list[int], residual: bool,
                                                  activation: str | None, m: int) -> None:
    model, feeds = _conv_model(x_shape, K, pads, residual=residual, activation=activation)
    error, explain = _relative_error(model, feeds)
    assert f"winograd F({m}x{m},3x3)" in explain, explain
    if residual:
        assert "fused (residual)" in explain, explain
    assert error <= TOLERANCE, error


@pytest.mark.slow
def test_several_images_per_call_match_onnxruntime() -> None:
    """A batch whose images go several to a call: the tile index runs over them."""
    model, feeds = _conv_model((8, 64, 7, 7), 64, [1, 1, 1, 1], residual=True, activation="Relu")
    error, explain = _relative_error(model, feeds)
    assert "winograd F(2x2,3x3)" in explain, explain
    assert error <= TOLERANCE, error


def test_winograd_off_keeps_the_direct_convolution() -> None:
    model, feeds = _conv_model((1, 32, 28, 28), 32, [1, 1, 1, 1], residual=False, activation="Relu")
    error, explain = _relative_error(model, feeds, winograd=False)
    assert "winograd" not in explain, explain
    assert error <= 1e-5, error
