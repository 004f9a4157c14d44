"""ONNX models of torchvision's image classifiers, built with `onnx.helper` and random weights.

Each builder returns an `onnx.ModelProto` (opset 17, IR version 8) with one input "input"
`[batch, 3, image_size, image_size]` float32 and one output "output" `[batch, num_classes]`,
laid out as `torch.onnx.export(model.eval(), x, dynamo=False, opset_version=17)` lays out
torchvision's model: the same node sequence, op types, attributes and node names
(`/layer1/layer1.0/conv1/Conv`), and the same inputs feeding each node (checked against torch
2.14 / torchvision 0.29 by tests/onnx/test_models.py; only the initializers' names differ: the
exporter calls folded weights `onnx::Conv_123`). `batch=None` gives a symbolic batch "N".

The exporter in eval mode folds every BatchNormalization into the Conv before it (the Conv
gains a bias); `fold_batchnorm=False` keeps them as BatchNormalization nodes after bias-free
Convs, as the exporter writes with `training=TrainingMode.PRESERVE`. Both forms of one seed
compute the same function: the folded weights are made from the same random statistics.

Weights are random but keep activations in a sane range through the whole depth: He-normal
convolutions, BatchNorm statistics with variance in [0.5, 1.5], and a small scale on the last
BatchNorm of each residual branch. Only onnx, numpy and the standard library are imported, so
the zoo loads without the compiler.

    model = resnet18(batch=None)           # symbolic batch
    model = MODELS["mobilenet_v2"](batch=4, seed=1, fold_batchnorm=False)
    small = resnet18(width=0.25, image_size=64)   # a reduced variant for quick tests
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # what torch.onnx.export writes for opset 17
BATCHNORM_EPSILON = 1e-5
BATCHNORM_MOMENTUM = 0.9  # ONNX's momentum is 1 - PyTorch's (0.1)
SYMBOLIC_BATCH = "N"

__all__ = [
    "MODELS",
    "mobilenet_v2",
    "resnet18",
    "resnet50",
    "resnext50_32x4d",
]


@dataclass
class _GraphBuilder:
    """Collects nodes and initializers in the order the exporter writes them."""

    rng: np.random.Generator
    fold_batchnorm: bool
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    _used: dict[str, int] = field(default_factory=dict)

    def _node_name(self, scope: str, op_type: str) -> str:
        """`/scope/Op`, then `/scope/Op_1`, ... as the exporter numbers repeats in one scope."""
        base = f"{scope}/{op_type}"
        count = self._used.get(base, 0)
        self._used[base] = count + 1
        return base if count == 0 else f"{base}_{count}"

    def node(self, op_type: str, scope: str, inputs: list[str], output: str | None = None,
             **attributes: Any) -> str:
        name = self._node_name(scope, op_type)
        out = output or f"{name}_output_0"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attributes))
        return out

    def initializer(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def constant(self, scope: str, value: float) -> str:
        """A 0-d float Constant node, as the exporter writes Clip's bounds."""
        tensor = numpy_helper.from_array(np.array(value, dtype=np.float32), "")
        return self.node("Constant", scope, [], value=tensor)

    def conv_bn(self, x: str, scope: str, conv: str, bn: str, cin: int, cout: int, kernel: int,
                stride: int = 1, padding: int | None = None, groups: int = 1,
                branch_end: bool = False) -> str:
        """Conv2d(bias=False) then BatchNorm2d: one Conv with a bias when folded, else both.

        `conv` and `bn` are the modules' paths below `scope` ("conv1", "bn1"); `branch_end`
        marks the last BatchNorm of a residual branch, given a small scale."""
        padding = (kernel - 1) // 2 if padding is None else padding
        fan_in = cin // groups * kernel * kernel
        weight = self.rng.standard_normal((cout, cin // groups, kernel, kernel)) * np.sqrt(2.0 / fan_in)
        scale_range = (0.1, 0.3) if branch_end else (0.5, 1.5)
        gamma = self.rng.uniform(*scale_range, cout)
        beta = self.rng.uniform(-0.1, 0.1, cout)
        mean = self.rng.uniform(-0.1, 0.1, cout)
        var = self.rng.uniform(0.5, 1.5, cout)
        conv_path = _parameter_path(_scope(scope, conv))
        bn_path = _parameter_path(_scope(scope, bn))
        attributes: dict[str, Any] = dict(dilations=[1, 1], group=groups, kernel_shape=[kernel, kernel],
                          pads=[padding] * 4, strides=[stride, stride])
        if self.fold_batchnorm:
            factor = gamma / np.sqrt(var + BATCHNORM_EPSILON)
            w = self.initializer(f"{conv_path}.weight", weight * factor[:, None, None, None])
            b = self.initializer(f"{conv_path}.bias", beta - mean * factor)
            return self.node("Conv", _scope(scope, conv), [x, w, b], **attributes)
        w = self.initializer(f"{conv_path}.weight", weight)
        y = self.node("Conv", _scope(scope, conv), [x, w], **attributes)
        names = [self.initializer(f"{bn_path}.{what}", value) for what, value in
                 (("weight", gamma), ("bias", beta), ("running_mean", mean), ("running_var", var))]
        return self.node("BatchNormalization", _scope(scope, bn), [y, *names],
                         epsilon=BATCHNORM_EPSILON, momentum=BATCHNORM_MOMENTUM, training_mode=0)

    def linear(self, x: str, scope: str, path: str, cin: int, cout: int, output: str) -> str:
        """nn.Linear as the exporter writes it: Gemm(x, W[cout, cin], b) with transB=1."""
        bound = 1.0 / np.sqrt(cin)
        w = self.initializer(f"{path}.weight", self.rng.uniform(-bound, bound, (cout, cin)))
        b = self.initializer(f"{path}.bias", self.rng.uniform(-bound, bound, cout))
        return self.node("Gemm", scope, [x, w, b], output=output, alpha=1.0, beta=1.0, transB=1)

    def model(self, name: str, batch: int | None, image_size: int, num_classes: int) -> onnx.ModelProto:
        n: int | str = SYMBOLIC_BATCH if batch is None else batch
        graph = helper.make_graph(
            self.nodes, "main_graph",
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [n, 3, image_size, image_size])],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, [n, num_classes])],
            initializer=self.initializers,
        )
        model = helper.make_model(graph, producer_name="polydl.onnx.zoo", producer_version=name,
                                  opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model


def _scope(scope: str, module: str) -> str:
    """The exporter's scope of a submodule: `/layer1/layer1.0` + `conv1` ->
    `/layer1/layer1.0/conv1`; a numbered child repeats its parent's name:
    `/features/features.0` + `0` -> `/features/features.0/features.0.0`."""
    if module[0].isalpha():
        return f"{scope}/{module}"
    return f"{scope}/{scope.rpartition('/')[2]}.{module}"


def _parameter_path(scope: str) -> str:
    """A scope's module path, the prefix of its parameters' names:
    `/features/features.1/conv/conv.0/conv.0.0` -> `features.1.conv.0.0`."""
    path, last = "", ""
    for part in scope.strip("/").split("/"):
        if last and part.startswith(last + "."):
            path += part[len(last):]
        else:
            path = f"{path}.{part}" if path else part
        last = part
    return path


def _check_arguments(batch: int | None, image_size: int, width: float) -> None:
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch must be a positive int or None, not {batch!r}")
    if image_size < 32:
        raise ValueError(f"image_size must be at least 32, not {image_size}")
    if width <= 0:
        raise ValueError(f"width must be positive, not {width}")


# --- ResNet / ResNeXt (torchvision.models.resnet) -------------------------------------------

def _resnet(name: str, block: str, layers: tuple[int, int, int, int], *, batch: int | None,
            seed: int, fold_batchnorm: bool, groups: int = 1, width_per_group: int = 64,
            width: float = 1.0, image_size: int = 224, num_classes: int = 1000) -> onnx.ModelProto:
    _check_arguments(batch, image_size, width)
    g = _GraphBuilder(np.random.default_rng(seed), fold_batchnorm)
    expansion = 4 if block == "bottleneck" else 1
    inplanes = max(1, int(64 * width))
    x = g.conv_bn("input", "", "conv1", "bn1", 3, inplanes, 7, stride=2, padding=3)
    x = g.node("Relu", "/relu", [x])
    x = g.node("MaxPool", "/maxpool", [x], ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3],
               pads=[1, 1, 1, 1], strides=[2, 2])
    for stage, blocks in enumerate(layers, start=1):
        planes = max(1, int(64 * width)) * 2 ** (stage - 1)
        for index in range(blocks):
            stride = 2 if stage > 1 and index == 0 else 1
            scope = f"/layer{stage}/layer{stage}.{index}"
            identity = x
            if block == "basic":
                out = g.conv_bn(x, scope, "conv1", "bn1", inplanes, planes, 3, stride)
                out = g.node("Relu", f"{scope}/relu", [out])
                out = g.conv_bn(out, scope, "conv2", "bn2", planes, planes, 3, branch_end=True)
                last_relu = "relu_1"
            else:
                mid = int(planes * (width_per_group / 64.0)) * groups
                out = g.conv_bn(x, scope, "conv1", "bn1", inplanes, mid, 1)
                out = g.node("Relu", f"{scope}/relu", [out])
                out = g.conv_bn(out, scope, "conv2", "bn2", mid, mid, 3, stride, groups=groups)
                out = g.node("Relu", f"{scope}/relu_1", [out])
                out = g.conv_bn(out, scope, "conv3", "bn3", mid, planes * expansion, 1,
                                branch_end=True)
                last_relu = "relu_2"
            if stride != 1 or inplanes != planes * expansion:
                identity = g.conv_bn(x, f"{scope}/downsample", "0", "1", inplanes,
                                     planes * expansion, 1, stride, padding=0)
            out = g.node("Add", scope, [out, identity])
            x = g.node("Relu", f"{scope}/{last_relu}", [out])
            inplanes = planes * expansion
    x = g.node("GlobalAveragePool", "/avgpool", [x])
    x = g.node("Flatten", "", [x], axis=1)
    g.linear(x, "/fc", "fc", inplanes, num_classes, output="output")
    return g.model(name, batch, image_size, num_classes)


def resnet18(batch: int | None = 1, seed: int = 0, *, fold_batchnorm: bool = True,
             width: float = 1.0, image_size: int = 224, num_classes: int = 1000) -> onnx.ModelProto:
    """torchvision.models.resnet18: BasicBlocks [2, 2, 2, 2]; `width` scales every channel
    count (0.25 gives 16-32-64-128)."""
    return _resnet("resnet18", "basic", (2, 2, 2, 2), batch=batch, seed=seed,
                   fold_batchnorm=fold_batchnorm, width=width, image_size=image_size,
                   num_classes=num_classes)


def resnet50(batch: int | None = 1, seed: int = 0, *, fold_batchnorm: bool = True,
             width: float = 1.0, image_size: int = 224, num_classes: int = 1000) -> onnx.ModelProto:
    """torchvision.models.resnet50 (v1.5: the stride on the 3x3): Bottlenecks [3, 4, 6, 3]."""
    return _resnet("resnet50", "bottleneck", (3, 4, 6, 3), batch=batch, seed=seed,
                   fold_batchnorm=fold_batchnorm, width=width, image_size=image_size,
                   num_classes=num_classes)


def resnext50_32x4d(batch: int | None = 1, seed: int = 0, *, fold_batchnorm: bool = True,
                    width: float = 1.0, image_size: int = 224,
                    num_classes: int = 1000) -> onnx.ModelProto:
    """torchvision.models.resnext50_32x4d: ResNet-50's Bottlenecks with a grouped 3x3
    (32 groups of 4 channels per 64 planes: group=32 on 128 to 1024 channels)."""
    return _resnet("resnext50_32x4d", "bottleneck", (3, 4, 6, 3), batch=batch, seed=seed,
                   fold_batchnorm=fold_batchnorm, groups=32, width_per_group=4, width=width,
                   image_size=image_size, num_classes=num_classes)


# --- MobileNetV2 (torchvision.models.mobilenetv2) -------------------------------------------

# (expand ratio t, output channels c, repeats n, first stride s), as in the paper's Table 2
_MOBILENET_V2_SETTING = (
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
)


def _make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: to a multiple of `divisor`, never down by more than 10%."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def mobilenet_v2(batch: int | None = 1, seed: int = 0, *, fold_batchnorm: bool = True,
                 width: float = 1.0, image_size: int = 224,
                 num_classes: int = 1000) -> onnx.ModelProto:
    """torchvision.models.mobilenet_v2: inverted residuals with depthwise 3x3 convolutions
    (group = channels) and ReLU6 as Clip(x, 0, 6) with Constant bounds; `width` is
    torchvision's `width_mult`. The classifier's Dropout vanishes in eval mode."""
    _check_arguments(batch, image_size, width)
    g = _GraphBuilder(np.random.default_rng(seed), fold_batchnorm)

    def relu6(x: str, scope: str) -> str:
        low = g.constant(scope, 0.0)
        high = g.constant(scope, 6.0)
        return g.node("Clip", scope, [x, low, high])

    def conv_bn_relu6(x: str, scope: str, cin: int, cout: int, kernel: int, stride: int = 1,
                      groups: int = 1) -> str:
        """Conv2dNormActivation: children 0 (Conv), 1 (BatchNorm), 2 (ReLU6)."""
        y = g.conv_bn(x, scope, "0", "1", cin, cout, kernel, stride, groups=groups)
        return relu6(y, _scope(scope, "2"))

    channels = _make_divisible(32 * width)
    last_channels = _make_divisible(1280 * max(1.0, width))
    x = conv_bn_relu6("input", "/features/features.0", 3, channels, 3, stride=2)
    index = 1
    for expand, c, repeats, first_stride in _MOBILENET_V2_SETTING:
        out_channels = _make_divisible(c * width)
        for i in range(repeats):
            stride = first_stride if i == 0 else 1
            scope = f"/features/features.{index}/conv"
            hidden = int(round(channels * expand))
            y, layer = x, 0
            if expand != 1:
                y = conv_bn_relu6(y, f"{scope}/conv.{layer}", channels, hidden, 1)
                layer += 1
            y = conv_bn_relu6(y, f"{scope}/conv.{layer}", hidden, hidden, 3, stride, groups=hidden)
            y = g.conv_bn(y, scope, str(layer + 1), str(layer + 2), hidden, out_channels, 1,
                          branch_end=stride == 1 and channels == out_channels)
            if stride == 1 and channels == out_channels:
                y = g.node("Add", f"/features/features.{index}", [x, y])
            x, channels, index = y, out_channels, index + 1
    x = conv_bn_relu6(x, f"/features/features.{index}", channels, last_channels, 1)
    x = g.node("GlobalAveragePool", "", [x])
    x = g.node("Flatten", "", [x], axis=1)
    g.linear(x, "/classifier/classifier.1", "classifier.1", last_channels, num_classes,
             output="output")
    return g.model("mobilenet_v2", batch, image_size, num_classes)


MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "resnext50_32x4d": resnext50_32x4d,
}
