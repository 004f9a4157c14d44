"""Every ONNX operator polydl.onnx imports, one small model each, against onnxruntime; and the
importer's errors and calling convention (symbolic batch, several outputs, `run`, `explain`).

Each test compiles its model once; shapes are small ([2, 8, 10, 10]) so the file stays quick."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
from onnx import helper  # noqa: E402

import polydl  # noqa: E402
import polydl.onnx  # noqa: E402
from tests.onnx.reference import (  # noqa: E402
    check,
    make_model,
    random,
    run_onnxruntime,
)

X = (2, 8, 10, 10)


def node(op_type: str, inputs: list[str], outputs: list[str] | None = None, **attributes: Any
         ) -> onnx.NodeProto:
    """A node named as the exporter names them (`/Conv`), output `y` unless given."""
    return helper.make_node(op_type, inputs, outputs or ["y"], name=f"/{op_type}", **attributes)


def single(op_type: str, x: np.ndarray, initializers: dict[str, np.ndarray] | None = None,
           extra_inputs: tuple[str, ...] = (), *, opset: int = 17, **attributes: Any
           ) -> onnx.ModelProto:
    """One node on graph input "x" (then `extra_inputs`, usually initializers)."""
    return make_model([node(op_type, ["x", *extra_inputs], **attributes)], {"x": x}, ["y"],
                      initializers, opset=opset)


# ----------------------------------------------------------------------------- Conv
# id, input shape, weight shape, attributes, bias
CONV_CASES = [
    ("stride2_pads1_bias", X, (16, 8, 3, 3),
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), True),
    ("same_upper_stride2", X, (8, 8, 3, 3),
     dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"), True),
    ("same_lower_stride2", X, (8, 8, 3, 3),
     dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER"), False),
    ("same_upper_even_kernel", X, (8, 8, 2, 2), dict(kernel_shape=[2, 2], auto_pad="SAME_UPPER"), True),
    ("valid_no_kernel_shape", X, (12, 8, 3, 3), dict(auto_pad="VALID"), False),
    ("asymmetric_pads", X, (8, 8, 3, 3), dict(kernel_shape=[3, 3], pads=[0, 1, 2, 1]), True),
    ("dilation2", X, (8, 8, 3, 3),
     dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]), False),
    ("group2", X, (16, 4, 3, 3), dict(kernel_shape=[3, 3], group=2, pads=[1, 1, 1, 1]), True),
    ("depthwise_stride2", X, (8, 1, 3, 3),
     dict(kernel_shape=[3, 3], group=8, strides=[2, 2], pads=[1, 1, 1, 1]), True),
    ("depthwise_multiplier2", X, (16, 1, 3, 3),
     dict(kernel_shape=[3, 3], group=8, pads=[1, 1, 1, 1]), False),
    ("pointwise_no_bias", X, (24, 8, 1, 1), dict(kernel_shape=[1, 1]), False),
    ("rectangular_kernel_stride", (1, 3, 11, 9), (8, 3, 3, 5),
     dict(kernel_shape=[3, 5], strides=[2, 1], pads=[1, 2, 1, 2]), True),
]


@pytest.mark.parametrize("x_shape, w_shape, attributes, bias",
                         [c[1:] for c in CONV_CASES], ids=[c[0] for c in CONV_CASES])
@pytest.mark.slow
def test_conv(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attributes: dict,
              bias: bool) -> None:
    weights = {"w": random(w_shape, 1)}
    if bias:
        weights["b"] = random(w_shape[:1], 2)
    x = random(x_shape)
    check(single("Conv", x, weights, tuple(weights), **attributes), {"x": x})


# id, input shape, weight shape [C, K / group, R, S], attributes, bias
CONV_TRANSPOSE_CASES = [
    ("stride2_pads1_output_padding1", (2, 8, 5, 5), (8, 4, 3, 3),
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]), True),
    ("stride2_kernel2", (2, 8, 5, 5), (8, 6, 2, 2), dict(kernel_shape=[2, 2], strides=[2, 2]),
     False),
    ("stride1_pads1", (2, 8, 6, 6), (8, 4, 3, 3),
     dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), True),
]


@pytest.mark.parametrize("x_shape, w_shape, attributes, bias",
                         [c[1:] for c in CONV_TRANSPOSE_CASES],
                         ids=[c[0] for c in CONV_TRANSPOSE_CASES])
def test_conv_transpose(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attributes: dict,
                        bias: bool) -> None:
    weights = {"w": random(w_shape, 1)}
    if bias:
        weights["b"] = random(w_shape[1:2], 2)
    x = random(x_shape)
    check(single("ConvTranspose", x, weights, tuple(weights), **attributes), {"x": x})


# ----------------------------------------------------------------------------- Gemm, MatMul
# id, A shape, B shape, C shape (None: no C), B and C as initializers, attributes
GEMM_CASES = [
    ("transB_bias_vector", (6, 8), (5, 8), (5,), True, dict(transB=1)),
    ("transA_column_C", (8, 6), (8, 5), (6, 1), True, dict(transA=1)),
    ("alpha_beta_full_C_inputs", (6, 8), (8, 5), (6, 5), False, dict(alpha=0.5, beta=2.0)),
    ("both_transposed_scalar_C", (8, 6), (5, 8), (), True,
     dict(transA=1, transB=1, alpha=1.5, beta=-1.0)),
    ("row_C", (6, 8), (8, 5), (1, 5), False, {}),
    ("no_C", (6, 8), (8, 5), None, False, {}),
]


@pytest.mark.parametrize("a_shape, b_shape, c_shape, constant, attributes",
                         [c[1:] for c in GEMM_CASES], ids=[c[0] for c in GEMM_CASES])
def test_gemm(a_shape: tuple[int, ...], b_shape: tuple[int, ...], c_shape: tuple[int, ...] | None,
              constant: bool, attributes: dict) -> None:
    values = {"a": random(a_shape), "b": random(b_shape, 1)}
    names = ["a", "b"]
    if c_shape is not None:
        values["c"] = random(c_shape, 2)
        names.append("c")
    inputs = {"a": values.pop("a")}
    if not constant:
        inputs.update(values)
        values = {}
    model = make_model([node("Gemm", names, **attributes)], inputs, ["y"], values)
    check(model, inputs)


# id, A shape, B shape, B an initializer
MATMUL_CASES = [
    ("2d", (6, 8), (8, 5), False),
    ("batched_3d", (3, 6, 8), (3, 8, 5), False),
    ("3d_times_2d_weight", (3, 6, 8), (8, 5), True),
    ("broadcast_batch_dims", (2, 1, 6, 8), (3, 8, 5), False),
]


@pytest.mark.parametrize("a_shape, b_shape, constant", [c[1:] for c in MATMUL_CASES],
                         ids=[c[0] for c in MATMUL_CASES])
def test_matmul(a_shape: tuple[int, ...], b_shape: tuple[int, ...], constant: bool) -> None:
    a, b = random(a_shape), random(b_shape, 1)
    inputs = {"a": a} if constant else {"a": a, "b": b}
    model = make_model([node("MatMul", ["a", "b"])], inputs, ["y"], {"b": b} if constant else {})
    check(model, inputs)


# ----------------------------------------------------------------------------- BatchNormalization
def batchnorm_weights(channels: int, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "scale": rng.uniform(0.5, 1.5, channels).astype(np.float32),
        "shift": rng.uniform(-0.5, 0.5, channels).astype(np.float32),
        "mean": rng.uniform(-0.5, 0.5, channels).astype(np.float32),
        "var": rng.uniform(0.5, 1.5, channels).astype(np.float32),  # > 0
    }


def test_batchnormalization_alone() -> None:
    x = random(X)
    model = single("BatchNormalization", x, batchnorm_weights(8), ("scale", "shift", "mean", "var"),
                   epsilon=1e-3)
    check(model, {"x": x})


def test_batchnormalization_after_conv_is_folded_and_explained() -> None:
    x = random(X)
    weights = {"w": random((16, 8, 3, 3), 1), **batchnorm_weights(16)}
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["t"], name="/conv1/Conv", kernel_shape=[3, 3],
                          pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["t", "scale", "shift", "mean", "var"], ["y"],
                          name="/bn1/BatchNormalization", epsilon=1e-5, momentum=0.9)],
        {"x": x}, ["y"], weights)
    compiled = check(model, {"x": x})
    plan = compiled.explain()
    assert isinstance(plan, str)
    assert "/bn1/BatchNormalization" in plan and "/conv1/Conv" in plan, plan


@pytest.mark.parametrize("kernel", [3, 7])
@pytest.mark.slow
def test_a_stem_of_few_channels_into_the_blocked_layout(kernel: int) -> None:
    """Three colours into 16+ blocked channels: the stem reads its padded input under each
    window, both images in one call, with the bias and Relu fused."""
    x = random((2, 3, 19, 17))
    weights = {"w": random((24, 3, kernel, kernel), 1), "b": random((24,), 2)}
    model = make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["t"], name="/conv1/Conv",
                          kernel_shape=[kernel, kernel], strides=[2, 2], pads=[kernel // 2] * 4),
         helper.make_node("Relu", ["t"], ["y"], name="/relu/Relu")],
        {"x": x}, ["y"], weights)
    plan = check(model, {"x": x}).explain()
    assert "Relu '/relu/Relu' fused [nchw -> nchw16c]" in plan, plan


# ----------------------------------------------------------------------------- activations
# id, op, extra inputs (initializers or Constant nodes' outputs), attributes, input scale
ACTIVATION_CASES = [
    ("relu", "Relu", {}, {}),
    ("clip_min_max", "Clip", {"lo": np.float32(-0.5), "hi": np.float32(0.5)}, {}),
    ("clip_max_only", "Clip", {"": None, "hi": np.float32(0.5)}, {}),
    ("leaky_relu", "LeakyRelu", {}, dict(alpha=0.1)),
    ("sigmoid", "Sigmoid", {}, {}),
    ("hard_sigmoid", "HardSigmoid", {}, dict(alpha=0.25, beta=0.4)),
    ("hard_sigmoid_defaults", "HardSigmoid", {}, {}),
    ("hard_swish", "HardSwish", {}, {}),
]


@pytest.mark.parametrize("op_type, operands, attributes", [c[1:] for c in ACTIVATION_CASES],
                         ids=[c[0] for c in ACTIVATION_CASES])
def test_activation(op_type: str, operands: dict[str, np.float32 | None], attributes: dict) -> None:
    x = random(X, low=-4.0, high=4.0)  # wide enough to reach every piece of the clipping ones
    weights = {name: np.array(value) for name, value in operands.items() if name}
    check(single(op_type, x, weights, tuple(operands), **attributes), {"x": x})


def test_clip_with_constant_nodes_as_relu6() -> None:
    """ReLU6 as torch.onnx.export writes it: Clip whose bounds are 0-d Constant nodes."""
    x = random(X, low=-8.0, high=8.0)
    zero = helper.make_tensor("", onnx.TensorProto.FLOAT, [], [0.0])
    six = helper.make_tensor("", onnx.TensorProto.FLOAT, [], [6.0])
    model = make_model(
        [helper.make_node("Constant", [], ["lo"], name="/relu6/Constant", value=zero),
         helper.make_node("Constant", [], ["hi"], name="/relu6/Constant_1", value=six),
         helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="/relu6/Clip")],
        {"x": x}, ["y"])
    check(model, {"x": x})


# ----------------------------------------------------------------------------- element-wise binary
@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
def test_binary_broadcasting(op_type: str) -> None:
    """One op applied across every broadcast the exporters write, operands on either side:
    [N,C,H,W] with [C,1,1] (a graph input), [1] (an initializer), [N,C,1,1], a scalar, and
    the same shape. Operands are positive, so Div never meets a small divisor."""
    x = random(X, low=0.5, high=2.0)
    c = random((8, 1, 1), 1, 0.5, 2.0)
    nc = random((2, 8, 1, 1), 2, 0.5, 2.0)
    weights = {"one": np.array([1.5], np.float32), "scalar": np.array(0.75, np.float32)}
    chain = [("x", "c"), ("one", "t0"), ("t1", "nc"), ("c", "t2"), ("t3", "scalar"),
             ("scalar", "t4"), ("t5", "x")]
    nodes = [helper.make_node(op_type, list(pair), [f"t{i}" if i < len(chain) - 1 else "y"],
                              name=f"/{op_type}_{i}") for i, pair in enumerate(chain)]
    inputs = {"x": x, "c": c, "nc": nc}
    check(make_model(nodes, inputs, ["y"], weights), inputs)


@pytest.mark.parametrize("shapes", [[X, X, X], [X, X, (8, 1, 1)]], ids=["same_shapes", "broadcast"])
def test_sum_of_three(shapes: list[tuple[int, ...]]) -> None:
    inputs = {name: random(shape, seed) for seed, (name, shape) in enumerate(zip("abc", shapes, strict=True))}
    check(make_model([node("Sum", ["a", "b", "c"])], inputs, ["y"]), inputs)


# ----------------------------------------------------------------------------- pooling
# id, op, attributes
POOL_CASES = [
    ("max_k3_s2_pads1", "MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("max_k3_s2_ceil", "MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("max_k2_s2", "MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),
    ("max_k3_strides_2_1_asymmetric_pads", "MaxPool",
     dict(kernel_shape=[3, 3], strides=[2, 1], pads=[1, 0, 0, 1])),
    ("avg_k3_s2_pads1_exclude_pad", "AveragePool",
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0)),
    ("avg_k3_s2_pads1_include_pad", "AveragePool",
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("avg_k3_s2_ceil", "AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("avg_k3_s2_pads1_ceil_include_pad", "AveragePool",
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
          count_include_pad=1)),
    ("avg_k2_default_strides", "AveragePool", dict(kernel_shape=[2, 2])),
]


@pytest.mark.parametrize("op_type, attributes", [c[1:] for c in POOL_CASES],
                         ids=[c[0] for c in POOL_CASES])
def test_pool(op_type: str, attributes: dict) -> None:
    x = random(X)
    model = single(op_type, x, **attributes)
    if attributes.get("ceil_mode") and attributes.get("count_include_pad"):
        # onnxruntime before 1.24 (and onnx's reference before 1.17) also count the cells past
        # the padding that ceil_mode adds; today's onnxruntime, onnx and PyTorch do not.
        want = _average_pool_counting_pads(x, 3, 2, 1)
        np.testing.assert_allclose(polydl.onnx.compile(model)(x), want, rtol=1e-4, atol=1e-5)
        return
    check(model, {"x": x})


def _average_pool_counting_pads(x: np.ndarray, window: int, stride: int, pad: int) -> np.ndarray:
    """Average pooling, ceil_mode, count_include_pad: each window divided by its cells inside
    the padded input (not those past it), as PyTorch's avg_pool2d does."""
    n, c, h, w = x.shape
    padded = np.zeros((n, c, h + 2 * pad, w + 2 * pad), np.float64)
    padded[:, :, pad:pad + h, pad:pad + w] = x

    def extent(size: int) -> int:
        out = -(-(size + 2 * pad - window) // stride) + 1
        return out - 1 if (out - 1) * stride >= size + pad else out

    rows, cols = extent(h), extent(w)
    y = np.zeros((n, c, rows, cols), np.float64)
    for p in range(rows):
        for q in range(cols):
            block = padded[:, :, p * stride:p * stride + window, q * stride:q * stride + window]
            y[:, :, p, q] = block.sum(axis=(2, 3)) / (block.shape[2] * block.shape[3])
    return y.astype(np.float32)


def test_global_average_pool() -> None:
    x = random(X)
    check(single("GlobalAveragePool", x), {"x": x})


# ----------------------------------------------------------------------------- shapes and layout
@pytest.mark.parametrize("axis", [1, 2])
def test_flatten(axis: int) -> None:
    x = random(X)
    check(single("Flatten", x, axis=axis), {"x": x})


@pytest.mark.parametrize("shape", [[0, -1], [-1, 10, 0]], ids=["zero_and_minus_one", "minus_one"])
def test_reshape(shape: list[int]) -> None:
    x = random((2, 8, 10, 5))
    check(single("Reshape", x, {"shape": np.array(shape, np.int64)}, ("shape",)), {"x": x})


@pytest.mark.parametrize("perm", [[0, 2, 3, 1], None], ids=["nhwc", "default_reverse"])
def test_transpose(perm: list[int] | None) -> None:
    x = random((2, 3, 4, 5))
    attributes: dict[str, Any] = {} if perm is None else {"perm": perm}
    check(single("Transpose", x, **attributes), {"x": x})


def test_concat_channels() -> None:
    inputs = {"a": random(X), "b": random((2, 4, 10, 10), 1)}
    model = make_model([node("Concat", ["a", "b", "w"], axis=1)], inputs, ["y"],
                       {"w": random((2, 3, 10, 10), 2)})
    check(model, inputs)


@pytest.mark.parametrize("sizes", [None, [2, 6]], ids=["equal", "given_sizes"])
def test_split(sizes: list[int] | None) -> None:
    """opset 13+: the sizes are an optional second input; two outputs come back as a tuple."""
    x = random(X)
    weights = {} if sizes is None else {"split": np.array(sizes, np.int64)}
    model = make_model([node("Split", ["x", *weights], ["y0", "y1"], axis=1)], {"x": x},
                       ["y0", "y1"], weights)
    compiled = check(model, {"x": x})
    assert isinstance(compiled(x), tuple)


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax(axis: int) -> None:
    x = random(X, low=-4.0, high=4.0)
    check(single("Softmax", x, axis=axis), {"x": x})


def test_dropout_is_identity_at_inference() -> None:
    x = random(X)
    model = single("Dropout", x, {"ratio": np.array(0.3, np.float32)}, ("ratio",))
    check(model, {"x": x})


def test_identity() -> None:
    x = random(X)
    check(single("Identity", x), {"x": x})


def test_constant_node_operand() -> None:
    x = random(X)
    value = helper.make_tensor("", onnx.TensorProto.FLOAT, [8, 1, 1], random((8, 1, 1), 1).ravel())
    model = make_model(
        [helper.make_node("Constant", [], ["k"], name="/Constant", value=value),
         helper.make_node("Add", ["x", "k"], ["y"], name="/Add")],
        {"x": x}, ["y"])
    check(model, {"x": x})


@pytest.mark.parametrize("value", [None, 0.5], ids=["zero", "constant_value"])
def test_pad_constant(value: float | None) -> None:
    """opset 11+: pads (begins then ends) and the value are inputs."""
    x = random(X)
    weights: dict[str, np.ndarray] = {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)}
    if value is not None:
        weights["value"] = np.array(value, np.float32)
    check(single("Pad", x, weights, tuple(weights), mode="constant"), {"x": x})


# id, opset, axes, keepdims
REDUCE_MEAN_CASES = [
    ("axes_attribute_keepdims", 17, [2, 3], 1),
    ("axes_attribute_no_keepdims", 17, [1], 0),
    ("opset18_axes_input_keepdims", 18, [2, 3], 1),
    ("opset18_axes_input_negative_no_keepdims", 18, [-1], 0),
]


@pytest.mark.parametrize("opset, axes, keepdims", [c[1:] for c in REDUCE_MEAN_CASES],
                         ids=[c[0] for c in REDUCE_MEAN_CASES])
def test_reduce_mean(opset: int, axes: list[int], keepdims: int) -> None:
    x = random(X)
    if opset >= 18:
        model = single("ReduceMean", x, {"axes": np.array(axes, np.int64)}, ("axes",),
                       opset=opset, keepdims=keepdims)
    else:
        model = single("ReduceMean", x, opset=opset, axes=axes, keepdims=keepdims)
    check(model, {"x": x})


# ----------------------------------------------------------------------------- the importer's API
@pytest.mark.parametrize("op_type", ["LSTM", "Einsum"])
def test_unsupported_operator_names_the_node(op_type: str) -> None:
    if op_type == "LSTM":  # sequence [3, 2, 8], hidden size 4
        x = random((3, 2, 8))
        weights = {"W": random((1, 16, 8), 1), "R": random((1, 16, 4), 2)}
        bad = helper.make_node("LSTM", ["t", "W", "R"], ["y"], name="/rnn/LSTM", hidden_size=4)
    else:
        x = random((2, 8))
        weights = {"W": random((8, 5), 1)}
        bad = helper.make_node("Einsum", ["t", "W"], ["y"], name="/head/Einsum",
                               equation="ij,jk->ik")
    model = make_model([helper.make_node("Relu", ["x"], ["t"], name="/relu/Relu"), bad],
                       {"x": x}, ["y"], weights)
    with pytest.raises(polydl.UnsupportedOperator) as caught:
        polydl.onnx.compile(model)
    error = caught.value
    assert isinstance(error, polydl.PolyDLError)
    assert (error.node, error.op) == (bad.name, op_type)
    assert "Conv" in error.supported and op_type not in error.supported
    assert bad.name in str(error) and op_type in str(error) and "Conv" in str(error), str(error)


@pytest.mark.parametrize("runtime", ["weights", "bias"])
def test_conv_weights_and_bias_must_be_constants(runtime: str) -> None:
    """A Conv whose weights or bias are computed at run time (here a graph input) is refused
    with the node named, not a crash."""
    x = random(X)
    w, b = random((4, 8, 3, 3), 1), random((4,), 2)
    inputs = {"x": x, "w": w} if runtime == "weights" else {"x": x, "b": b}
    constants = {"b": b} if runtime == "weights" else {"w": w}
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="/conv/Conv")],
                       inputs, ["y"], constants)
    with pytest.raises(polydl.UnsupportedOperator, match=f"the {runtime} must be a constant") as caught:
        polydl.onnx.compile(model)
    assert caught.value.node == "/conv/Conv"


def conv_relu_model(batch: int | str = 2) -> onnx.ModelProto:
    """Conv + bias + Relu, then global pooling and a Gemm: an exporter's classifier in small."""
    return make_model(
        [helper.make_node("Conv", ["input", "w", "b"], ["c"], name="/conv/Conv",
                          kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"], name="/relu/Relu"),
         helper.make_node("GlobalAveragePool", ["r"], ["p"], name="/pool/GlobalAveragePool"),
         helper.make_node("Flatten", ["p"], ["f"], name="/Flatten", axis=1),
         helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["output"], name="/fc/Gemm", transB=1)],
        {"input": random(X)}, ["output"],
        {"w": random((16, 8, 3, 3), 1), "b": random((16,), 2), "fc_w": random((10, 16), 3),
         "fc_b": random((10,), 4)},
        input_shapes={"input": [batch, 8, 10, 10]},
    )


@pytest.fixture(scope="module")
def conv_relu() -> Any:
    return polydl.onnx.compile(conv_relu_model())


def test_single_output_is_an_array_and_run_gives_a_dict(conv_relu: Any) -> None:
    x = random(X, 5)
    (want,) = run_onnxruntime(conv_relu_model(), {"input": x})
    got = conv_relu(x)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    by_name = conv_relu.run({"input": x})
    assert isinstance(by_name, dict) and list(by_name) == ["output"]
    np.testing.assert_allclose(by_name["output"], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bad", [
    np.zeros((2, 8, 10, 11), np.float32),   # a wrong extent
    np.zeros((3, 8, 10, 10), np.float32),   # a wrong batch for a fixed-batch model
    np.zeros((8, 10, 10), np.float32),      # a wrong rank
    np.zeros(X, np.float64),                # a wrong dtype
], ids=["extent", "batch", "rank", "dtype"])
def test_bad_input_raises_shape_error(conv_relu: Any, bad: np.ndarray) -> None:
    with pytest.raises(polydl.ShapeError):
        conv_relu(bad)
    with pytest.raises(polydl.ShapeError):
        conv_relu.run({"input": bad})


def test_batch_fixes_a_symbolic_batch_dimension() -> None:
    model = conv_relu_model(batch="N")
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    x = random((3, 8, 10, 10), 6)
    compiled = check(model, {"input": x}, batch=3)
    with pytest.raises(polydl.ShapeError):
        compiled(random(X))


def test_several_outputs_come_back_as_a_tuple_and_run_as_a_dict() -> None:
    """An intermediate value that is also an output (the Conv's, before the fused Relu) must
    survive fusion; outputs come back in the graph's order."""
    x = random(X)
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["conv"], name="/conv/Conv", kernel_shape=[3, 3],
                          pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["conv"], ["relu"], name="/relu/Relu"),
         helper.make_node("Sigmoid", ["x"], ["gate"], name="/gate/Sigmoid")],
        {"x": x}, ["relu", "conv", "gate"], {"w": random((8, 8, 3, 3), 1)})
    compiled = check(model, {"x": x})
    want = run_onnxruntime(model, {"x": x})
    got = compiled.run({"x": x})
    assert isinstance(got, dict) and list(got) == ["relu", "conv", "gate"]
    for name, w in zip(got, want, strict=True):
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("options, message", [
    ({}, "pass batch= to fix the batch dimension"),          # symbolic batch, none given
    ({"batch": 0}, "must be a positive integer"),
    ({"batch": True}, "must be a positive integer"),
])
def test_compile_options_are_checked(options: dict, message: str) -> None:
    with pytest.raises(polydl.ShapeError, match=message):
        polydl.onnx.compile(conv_relu_model(batch="N"), **options)


def test_compile_refuses_what_it_cannot_build(tmp_path: Any) -> None:
    with pytest.raises(polydl.ShapeError, match="the model fixes the batch dimension"):
        polydl.onnx.compile(conv_relu_model(batch=2), batch=3)
    with pytest.raises(polydl.ShapeError, match="no ONNX file"):
        polydl.onnx.compile(str(tmp_path / "missing.onnx"))
    with pytest.raises(polydl.ShapeError, match="must be a path, bytes or an onnx.ModelProto"):
        polydl.onnx.compile(42)
    with pytest.raises(polydl.TargetError, match="CPU target 'c', not 'cuda'"):
        polydl.onnx.compile(conv_relu_model(), target="cuda")
    ints = make_model([helper.make_node("Identity", ["x"], ["y"], name="/id")],
                      {"x": np.zeros((2, 3), np.int64)}, ["y"])
    with pytest.raises(polydl.ShapeError, match="polydl runs float32 networks"):
        polydl.onnx.compile(ints)


def test_call_arguments_are_checked(conv_relu: Any) -> None:
    x = random(X)
    with pytest.raises(polydl.ShapeError, match="takes 1 input"):
        conv_relu()
    with pytest.raises(polydl.ShapeError, match="must be a numpy array"):
        conv_relu(x.tolist())
    with pytest.raises(polydl.ShapeError, match="is not an input of the network"):
        conv_relu.run({"input": x, "other": x})
    with pytest.raises(polydl.ShapeError, match="is missing"):
        conv_relu.run({})


def test_a_networks_kernels_are_built_with_their_math_flags() -> None:
    """Each kernel's object is compiled with its own flags: Sigmoid's expf runs in vector form."""
    x = random(X, low=-4.0, high=4.0)
    compiled = check(single("Sigmoid", x), {"x": x})
    commands = (compiled.library_path.parent / "command.txt").read_text().splitlines()
    assert any("-fno-math-errno" in c and " -c " in c for c in commands)
