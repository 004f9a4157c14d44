"""A network run a few images at a time (`polydl.onnx.batching`): which graphs keep their images
apart, how many images a pass takes, and passes against onnxruntime, from Python and from C."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402

import polydl.onnx  # noqa: E402
from polydl.cli import main  # noqa: E402
from polydl.errors import ShapeError  # noqa: E402
from polydl.onnx import _lowered, batching  # noqa: E402
from polydl.onnx.constants import fold_constants  # noqa: E402
from polydl.onnx.graph import read_graph  # noqa: E402
from polydl.target.cpu import CpuTarget  # noqa: E402
from polydl.target.host import host_target  # noqa: E402
from tests.onnx.reference import check, make_model, random, run_onnxruntime  # noqa: E402
from tests.onnx.test_library import _program, _run  # noqa: E402

BATCH = 8


def _net(tail: list | None = None, tail_inits: dict | None = None, size: int = 12) -> object:
    """conv 3x3 + bias + ReLU -> depthwise 3x3 -> residual add -> global pool -> flatten -> gemm,
    then `tail` on "logits" (its last output is "y"); images of `size` x `size`."""
    x = random((BATCH, 8, size, size))
    inits = {"w1": random((16, 8, 3, 3), 1, -0.3, 0.3), "b1": random((16,), 2),
             "w2": random((16, 1, 3, 3), 3, -0.3, 0.3), "fc": random((10, 16), 4), "fb": random((10,), 5),
             **(tail_inits or {})}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="/conv1", kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], name="/relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="/dw", kernel_shape=[3, 3], pads=[1] * 4, group=16),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="/add"),
        helper.make_node("GlobalAveragePool", ["s"], ["g"], name="/pool"),
        helper.make_node("Flatten", ["g"], ["f"], name="/flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["logits" if tail else "y"], name="/fc", transB=1),
        *(tail or []),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits), x


def _graph(model: object) -> object:
    return fold_constants(read_graph(model, BATCH))


@pytest.mark.slow
def test_passes_of_a_few_images_match_onnxruntime_from_python_and_from_c(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model, x = _net()
    assert batching.images_apart(_graph(model)) is None
    net = check(model, {"x": x}, images_per_pass=2)
    assert "every step in 4 passes of 2 images" in net.explain()
    whole = polydl.onnx.compile(model, images_per_pass=BATCH)
    assert "passes" not in whole.explain()
    np.testing.assert_allclose(net(x), whole(x), rtol=1e-6, atol=1e-6)
    # the ahead-of-time library takes the whole batch too, its passes inside
    paths = polydl.onnx.write_library(model, tmp_path, name="passes", images_per_pass=2)
    assert "in0_all + pass * 2304L" in paths["source"].read_text()  # 2 images of 8 x 12 x 12
    program = _program(tmp_path, "passes", x, BATCH * 10)
    status, y = _run(program, x, tmp_path, BATCH * 10)
    assert status == 0
    want = run_onnxruntime(model, {"x": x})[0]
    np.testing.assert_allclose(y.reshape(BATCH, 10), want, rtol=1e-4, atol=1e-5)



@pytest.mark.slow
def test_a_classifier_with_large_weights_runs_after_the_passes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # 16 -> 4096 logits (256 KiB of weights) and a ReLU on them, after layers of 128 KiB a pass:
    # in the passes' loop each pass would read the weights from memory again; after it, pass by
    # pass, from the cache
    tail = [helper.make_node("Relu", ["logits"], ["y"], name="/relu_out")]
    model, x = _net(tail, {"fc": random((4096, 16), 4), "fb": random((4096,), 5)}, size=32)
    net = check(model, {"x": x}, images_per_pass=2)
    steps = net.explain().splitlines()
    last = len([line for line in steps if line[:4].strip().isdigit()]) - 1
    pool = next(int(line.split()[0]) for line in steps if "GlobalAveragePool '/pool'" in line)
    assert (f"steps 0-{pool} in 4 passes of 2 images (each pass's activations stay in cache), "
            f"then steps {pool + 1}-{last} in 4 passes (their weights stay in cache)") in net.explain()
    # the flattened pool, written in the first loop and read in the second: 2 images of 16
    paths = polydl.onnx.write_library(model, tmp_path, name="tail", images_per_pass=2)
    source = paths["source"].read_text()
    assert source.count("for (long pass = 0; pass < 4") == 2 and "pass * 128L)" in source
    program = _program(tmp_path, "tail", x, BATCH * 4096)
    status, y = _run(program, x, tmp_path, BATCH * 4096)
    assert status == 0
    np.testing.assert_allclose(y.reshape(BATCH, 4096), run_onnxruntime(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    # small weights after the pool stay in the passes' loop (the test above)
    small, x = _net()
    assert "every step in 4 passes of 2 images" in check(small, {"x": x}, images_per_pass=2).explain()


@pytest.mark.parametrize("tail, inits, culprit", [
    # a softmax over the images, a mean over the images, a reshape that folds them into rows
    ([helper.make_node("Softmax", ["logits"], ["y"], name="/softmax0", axis=0)], {}, "/softmax0"),
    ([helper.make_node("ReduceMean", ["logits"], ["y"], name="/mean", axes=[0], keepdims=1)], {}, "/mean"),
    ([helper.make_node("Reshape", ["logits", "shape"], ["y"], name="/fold")],
     {"shape": np.array([BATCH // 2, 20], np.int64)}, "/fold"),
    # a constant with a row per image added to the logits
    ([helper.make_node("Add", ["logits", "rows"], ["y"], name="/rows")],
     {"rows": np.ones((BATCH, 10), np.float32)}, "/rows"),
])
@pytest.mark.slow
def test_a_graph_that_mixes_its_images_runs_whole(tail: list, inits: dict, culprit: str) -> None:
    model, x = _net(tail, inits)
    reason = batching.images_apart(_graph(model))
    assert reason is not None and culprit in reason
    with pytest.raises(ShapeError, match=f"mixes its images: .*{culprit}"):
        polydl.onnx.compile(model, images_per_pass=2)
    net = check(model, {"x": x})  # automatic: the whole batch in one pass
    assert "passes" not in net.explain()


def test_max_pool_indices_and_pads_of_the_batch_axis_mix_images() -> None:
    x = random((BATCH, 4, 6, 6))
    pool = make_model([helper.make_node("MaxPool", ["x"], ["y", "where"], name="/pool", kernel_shape=[2, 2])],
                      {"x": x}, ["y"])
    assert batching.images_apart(_graph(pool)) == "MaxPool '/pool' gives indices counted over the whole batch"
    pad = make_model([helper.make_node("Pad", ["x", "pads"], ["y"], name="/pad")], {"x": x}, ["y"],
                     {"pads": np.array([1, 0, 0, 0, 0, 0, 0, 0], np.int64)})
    assert batching.images_apart(_graph(pad)) == "Pad '/pad' pads the batch axis"


def test_a_value_without_a_static_shape_keeps_the_batch_whole() -> None:
    model, _ = _net()
    graph = _graph(model)
    del graph.shapes["y"]  # as an older ONNX infers no shape for an operator it does not know
    assert batching.images_apart(graph) == "Gemm '/fc' has a value without a static shape"


@pytest.mark.slow
def test_per_image_tails_keep_the_images_apart() -> None:
    tail = [helper.make_node("Softmax", ["logits"], ["sm"], name="/softmax", axis=1),
            helper.make_node("Unsqueeze", ["sm", "two"], ["u"], name="/unsqueeze"),
            helper.make_node("ReduceMean", ["u"], ["m"], name="/mean", axes=[1], keepdims=1),
            helper.make_node("Squeeze", ["m", "two"], ["y"], name="/squeeze")]
    model, x = _net(tail, {"two": np.array([2], np.int64)})
    assert batching.images_apart(_graph(model)) is None
    check(model, {"x": x}, images_per_pass=4)


def test_the_command_line_asks_for_passes(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    model, _ = _net()
    path = tmp_path / "net.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["compile", str(path), "--images-per-pass", "2"]) == 0
    assert "every step in 4 passes of 2 images" in capsys.readouterr().out


@pytest.mark.slow
def test_a_reshape_to_the_fixed_batch_keeps_the_batch_whole() -> None:
    # per image on the whole batch, but its shape constant names the batch: a pass of 2
    # images cannot take it
    tail = [helper.make_node("Reshape", ["logits", "shape"], ["y"], name="/same")]
    model, x = _net(tail, {"shape": np.array([BATCH, 10], np.int64)})
    assert batching.images_apart(_graph(model)) is None
    with pytest.raises(ShapeError, match="shapes do not follow its batch"):
        polydl.onnx.compile(model, images_per_pass=2)
    # where the rule would take passes of 2, the network is lowered whole instead
    small = _cpu(80000)
    assert batching.images_per_pass(_graph(model), small) == 2
    plan, _, inputs, outputs, _ = _lowered(model, None, None, small, 1)
    assert plan.passes == 1 and inputs == [("x", (BATCH, 8, 12, 12))] and outputs == [("y", (BATCH, 10))]
    check(model, {"x": x})


def test_images_per_pass_must_divide_the_batch() -> None:
    model, _ = _net()
    with pytest.raises(ShapeError, match="divide the batch of 8"):
        polydl.onnx.compile(model, images_per_pass=3)


def _cpu(l3_bytes: int, cores: int = 2) -> CpuTarget:
    return replace(host_target(), cores=cores, l3_bytes=l3_bytes)


def test_a_pass_takes_what_the_last_level_cache_holds_beside_the_weights() -> None:
    graph = _graph(_net()[0])
    per_image = batching._image_bytes(graph)  # the widest layer: the depthwise 16 -> 16
    assert per_image == 4 * (16 + 16) * 12 * 12 == 18432
    assert batching._weight_bytes(graph) == 4 * (16 * 8 * 9 + 16 + 16 * 9 + 10 * 16 + 10) == 5928
    # 80000 bytes: half holds 2 images' widest layer (36864), not 4 (73728); the other half the weights
    assert batching.images_per_pass(graph, _cpu(80000)) == 2
    # the whole batch fits: one pass; not even one image (nor the weights twice): one pass
    assert batching.images_per_pass(graph, _cpu(64 << 20)) == BATCH
    assert batching.images_per_pass(graph, _cpu(11000)) == BATCH
    # a pass of fewer images than cores: one pass
    assert batching.images_per_pass(graph, _cpu(80000, cores=16)) == BATCH
