"""A Conv whose fused residual Add sums into the residual's own buffer when nothing reads the
residual after the Add, and into a fresh output when something does; both against
onnxruntime, with the layout copies of the overwritten buffer not reused afterwards."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import numpy as np  # noqa: E402
from onnx import helper  # noqa: E402

from tests.onnx.reference import check, make_model, random  # noqa: E402

CHANNELS = 32


def weights(seed: int, k: int = CHANNELS, c: int = CHANNELS, r: int = 1) -> np.ndarray:
    return random((k, c, r, r), seed=seed, low=-0.3, high=0.3)


def block(late_reader: bool, flatten_first: bool, last: int = 1) -> tuple:
    """x -> a = relu(conv0 x) -> conv1 -> conv2 (+ bias) + a -> relu -> y: a residual block,
    conv2 `last` x `last` (3: by Winograd's algorithm).
    `late_reader`: a Mul reads `a` after the Add (so the Add cannot overwrite it);
    `flatten_first`: `a` is also flattened (a plain copy of it) before the block's convolutions,
    and the block's output is flattened again after."""
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a0"], name="conv0"),
        helper.make_node("Relu", ["a0"], ["a"], name="relu0"),
    ]
    outputs = ["y"]
    if flatten_first:
        nodes.append(helper.make_node("Flatten", ["a"], ["a_flat"], name="flatten_a"))
        outputs.append("a_flat")
    nodes += [
        helper.make_node("Conv", ["a", "w1"], ["b1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b1", "w2", "bias2"], ["b2"], name="conv2",
                         pads=[last // 2] * 4),
        helper.make_node("Add", ["b2", "a"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r"], name="relu1"),
    ]
    if late_reader:
        nodes.append(helper.make_node("Mul", ["r", "a"], ["y"], name="late"))
    elif flatten_first:
        nodes.append(helper.make_node("Flatten", ["r"], ["y"], name="flatten_y"))
    else:
        nodes.append(helper.make_node("Identity", ["r"], ["y"], name="out"))
    x = random((2, 16, 10, 10), seed=1)
    model = make_model(nodes, {"x": x}, outputs, {
        "w0": weights(2, c=16), "w1": weights(3, r=3), "w2": weights(4, r=last),
        "bias2": random((CHANNELS,), seed=5)})
    return model, {"x": x}


@pytest.mark.parametrize("flatten_first", [False, True], ids=["blocked", "with_plain_copies"])
@pytest.mark.slow
def test_a_dead_residual_is_summed_into_in_place(flatten_first: bool) -> None:
    model, feeds = block(late_reader=False, flatten_first=flatten_first)
    compiled = check(model, feeds)
    explain = compiled.explain()
    assert "Add 'add' fused (residual) in place" in explain, explain


def test_a_residual_read_after_the_add_gets_a_fresh_output() -> None:
    model, feeds = block(late_reader=True, flatten_first=False)
    compiled = check(model, feeds)
    explain = compiled.explain()
    assert "Add 'add' fused (residual)" in explain, explain
    assert "in place" not in explain, explain


def test_a_graph_input_is_never_overwritten() -> None:
    x = random((2, CHANNELS, 6, 6), seed=1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Add", ["c", "x"], ["y"], name="add")]
    model = make_model(nodes, {"x": x}, ["y"], {"w": weights(2)})
    before = x.copy()
    compiled = check(model, {"x": x})
    assert "in place" not in compiled.explain()
    np.testing.assert_array_equal(x, before)


@pytest.mark.slow
def test_a_winograd_convolution_sums_into_its_residual_in_place() -> None:
    model, feeds = block(late_reader=False, flatten_first=True, last=3)
    compiled = check(model, feeds, rtol=1e-4, atol=1e-4)
    explain = compiled.explain()
    assert "Add 'add' fused (residual) in place" in explain, explain
    assert "winograd F(2x2,3x3)" in explain.split("Add 'add'")[1].splitlines()[0], explain
