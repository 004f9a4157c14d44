"""An ONNX graph lowered to a `NetworkPlan`: every node a polydl kernel or a copy.

The graph optimisation happens here, as the nodes are visited in order:
- a Conv absorbs the BatchNormalization after it (folded into its weights and bias) and then,
  each only where the value has no other reader, a residual Add, a Relu or a Clip: one kernel
  with fused epilogues (`conv_lowering`); a Gemm/MatMul absorbs its bias and activation likewise;
- convolutions run in the blocked layout (channel blocks of 16 innermost) where the input has
  16 channels or more, and element-wise operators, pooling and global pooling keep whatever
  layout their inputs have, so consecutive layers stay blocked and conversions happen at the
  edges only;
- reshapes of a plain tensor are aliases, not copies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from polydl import layouts
from polydl.errors import ShapeError, UnsupportedOperator
from polydl.network import CopyStep, NetworkPlan
from polydl.onnx import ctext
from polydl.onnx.conv_lowering import lower_conv, lower_conv_transpose
from polydl.onnx.graph import Node
from polydl.onnx.lowering_state import LoweringState
from polydl.onnx.values import (
    BLOCK,
    BLOCKED,
    PLAIN,
    Value,
    activation_text,
    bn_scale_shift,
    ints,
    window_pads,
)

BINARY = {"Add": "{0} + {1}", "Sub": "{0} - {1}", "Mul": "{0} * {1}", "Div": "{0} / {1}"}
UNARY = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish")


class Lowering(LoweringState):
    """A graph's lowering: its state and the walk over its nodes, each by its operator's
    handler (`HANDLERS`)."""

    def lower(self) -> NetworkPlan:
        for node in self.graph.nodes:
            if node.name in self.skip:
                continue
            handler = HANDLERS.get(node.op)
            if handler is None:
                raise UnsupportedOperator(node.name, node.op, supported=SUPPORTED)
            handler(self, node)
        for index, name in enumerate(self.graph.outputs):
            if name in self.graph.constants and name not in self.values:
                self.values[name] = Value(self.constant(self.graph.constants[name], "c"),
                                          tuple(self.graph.constants[name].shape))
            value = self.as_layout(self.values[name], PLAIN)
            out = self._buffer(f"out{index}", value.shape, "output", index=index)
            self.plan.outputs.append(out)
            self.plan.steps.append(CopyStep(f"output {name}", value.buffer, out))
        return self.plan


def _gemm(low: LoweringState, node: Node) -> None:
    a = low.plain(node, 0)
    b_const = low.const_of(node.inputs[1])
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    trans_a, trans_b = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
    M = a.shape[1] if trans_a else a.shape[0]
    if b_const is not None:  # weights: transposed and scaled once, here
        b_data = b_const.T if trans_b else b_const
        b_data = (b_data * alpha).astype(np.float32)
        b_buffer, b_shape, trans_b, alpha = low.constant(b_data, "w"), b_data.shape, False, 1.0
    else:
        b_value = low.plain(node, 1)
        b_buffer, b_shape = b_value.buffer, b_value.shape
    N = b_shape[0] if trans_b else b_shape[1]
    _product(low, node, a, b_buffer, tuple(b_shape), (M, N), trans_a, trans_b, alpha,
             bias_input=node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else "",
             beta=beta)


def _matmul(low: LoweringState, node: Node) -> None:
    a = low.plain(node, 0)
    b_const = low.const_of(node.inputs[1])
    if b_const is not None:
        b_buffer, b_shape = low.constant(b_const, "w"), tuple(b_const.shape)
    else:
        b_value = low.plain(node, 1)
        b_buffer, b_shape = b_value.buffer, b_value.shape
    a_shape = a.shape
    if len(a_shape) == 1 or len(b_shape) == 1:
        raise UnsupportedOperator(node.name, node.op, "MatMul of a vector: reshape it to a matrix")
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    out_shape = (*batch, a_shape[-2], b_shape[-1])
    _product(low, node, a, b_buffer, b_shape, out_shape, False, False, 1.0, bias_input="", beta=1.0)


def _product(low: LoweringState, node: Node, a: Value, b_buffer: str, b_shape: tuple[int, ...],
             out_shape: tuple[int, ...], trans_a: bool, trans_b: bool, alpha: float,
             bias_input: str, beta: float) -> None:
    rank = len(out_shape)
    a_shape = (1,) * (rank - len(a.shape)) + a.shape
    b_full = (1,) * (rank - len(b_shape)) + b_shape
    label = [node.describe()]
    bias_operand = None
    arguments = {"a": a.buffer, "b": b_buffer}
    current = node.outputs[0]
    if bias_input:
        data = low.const_of(bias_input)
        if data is not None:
            data = np.broadcast_to(data * beta, np.broadcast_shapes(data.shape, out_shape))
            reduced = _reduced(np.asarray(data, np.float32), out_shape)
            arguments["bias"] = low.constant(reduced, "b")
        else:
            value = low.plain(node, 2)
            reduced_shape = (1,) * (rank - len(value.shape)) + value.shape
            arguments["bias"] = value.buffer
            bias_operand = ctext.Operand("bias", reduced_shape)
        if bias_operand is None:
            bias_operand = ctext.Operand("bias", low.plan.buffers[arguments["bias"]].shape)
    elif node.op == "MatMul":  # MatMul + Add of a constant: the bias of a linear layer
        reader = low.single_reader(current)
        if reader is not None and reader.op == "Add":
            other = reader.inputs[1] if reader.inputs[0] == current else reader.inputs[0]
            data = low.const_of(other)
            if data is not None and np.broadcast_shapes(data.shape, out_shape) == out_shape:
                reduced = _reduced(np.broadcast_to(data, out_shape).astype(np.float32), out_shape)
                arguments["bias"] = low.constant(reduced, "b")
                bias_operand = ctext.Operand("bias", reduced.shape)
                label.append(f"{reader.describe()} fused (bias)")
                low.skip.add(reader.name)
                current = reader.outputs[0]
    epilogue = ""
    if alpha != 1.0:
        epilogue = f"{ctext.literal(alpha)} * {{0}}"
    reader = low.single_reader(current)
    if reader is not None and reader.op in UNARY:
        try:
            act = activation_text(reader, low.graph.constants)
        except UnsupportedOperator:
            act = None
        if act is not None and not epilogue:
            epilogue = act
            label.append(f"{reader.describe()} fused")
            low.skip.add(reader.name)
            current = reader.outputs[0]
    out = low.activation(out_shape)
    arguments["y"] = out.buffer
    if alpha != 1.0 and bias_operand is not None:  # alpha*A*B + C: alpha goes into A's copy
        a_scaled = low.activation(a.shape)
        low.kernel(f"{node.describe()} (alpha)", ctext.elementwise(
            "eltwise_scale", a.shape, [ctext.Operand("x0", a.shape)], f"{ctext.literal(alpha)} * {{0}}"),
            {"y": a_scaled.buffer, "x0": a.buffer})
        arguments["a"] = a_scaled.buffer
        epilogue = ""
    runtime_bias = bool(bias_input) and low.const_of(bias_input) is None
    text = ctext.matmul("matmul", a_shape, b_full, out_shape, trans_a, trans_b, bias_operand, epilogue,
                        bias_scale=beta if runtime_bias else 1.0)
    low.kernel(", ".join(label), text, arguments)
    low.values[current] = out


def _reduced(data: np.ndarray, out_shape: Sequence[int]) -> np.ndarray:
    """`data` (broadcast to `out_shape`) with every axis along which it is constant cut to 1."""
    data = np.asarray(data)
    for axis in range(data.ndim):
        first = np.take(data, [0], axis=axis)
        if np.array_equal(np.broadcast_to(first, data.shape), data):
            data = first
    return np.ascontiguousarray(data)


# ----------------------------------------------------------------------------- element-wise


def _elementwise(low: LoweringState, node: Node, expression: str, positions: Sequence[int],
                 divisor: int | None = None) -> None:
    """One element-wise kernel over the broadcast of the inputs at `positions`."""
    shapes = [low.graph.shapes.get(node.inputs[p]) or low.input(node, p).shape for p in positions]
    out_shape = tuple(np.broadcast_shapes(*shapes))
    runtime = [p for p in positions if node.inputs[p] not in low.graph.constants]
    values = {p: low.input(node, p) for p in runtime}
    blocked = (len(out_shape) == 4 and any(values[p].layout == BLOCKED for p in runtime)
               and all(values[p].shape == out_shape for p in runtime)
               and divisor not in runtime)
    operands, arguments, loads = [], {}, []
    for index, p in enumerate(positions):
        name = f"x{index}"
        constant = low.const_of(node.inputs[p])
        if constant is not None and constant.size == 1:
            loads.append(ctext.literal(float(np.asarray(constant).reshape(-1)[0])))
            continue
        if constant is not None:
            full = np.broadcast_to(constant, np.broadcast_shapes(constant.shape, out_shape))
            data = _reduced(full.reshape((1,) * (len(out_shape) - full.ndim) + full.shape), out_shape)
            if blocked:
                data = np.broadcast_to(data, (data.shape[0], out_shape[1], *data.shape[2:]))
                blocked_data = _block_broadcast(data, fill=1.0 if p == divisor else 0.0)
                arguments[name] = low.constant(blocked_data, "c")
                operands.append(ctext.Operand(name, blocked_data.shape))
            else:
                arguments[name] = low.constant(data, "c")
                operands.append(ctext.Operand(name, data.shape))
        else:
            value = low.as_layout(values[p], BLOCKED if blocked else PLAIN)
            shape = value.physical if blocked else (1,) * (len(out_shape) - len(value.shape)) + value.shape
            arguments[name] = value.buffer
            operands.append(ctext.Operand(name, shape))
        loads.append("{" + str(len(operands) - 1) + "}")
    out = low.activation(out_shape, BLOCKED if blocked else PLAIN)
    physical = out.physical
    arguments["y"] = out.buffer
    body = expression.format(*loads)
    text = ctext.elementwise(f"eltwise_{node.op.lower()}", physical, operands, body)
    low.kernel(f"{node.describe()} [{out.layout}]", text, arguments)
    low.bind(node, out)


def _block_broadcast(data: np.ndarray, fill: float) -> np.ndarray:
    """A [n][C][h][w] constant (n, h, w possibly 1) in the blocked layout, the padding
    channels `fill`."""
    n, c, h, w = data.shape
    out = np.full((n, layouts.blocks(c) * BLOCK, h, w), fill, dtype=np.float32)
    out[:, :c] = data
    return np.ascontiguousarray(out.reshape(n, -1, BLOCK, h, w).transpose(0, 1, 3, 4, 2))


def _binary(low: LoweringState, node: Node) -> None:
    _elementwise(low, node, BINARY[node.op].replace("{0}", "({0})").replace("{1}", "({1})"),
                 (0, 1), divisor=1 if node.op == "Div" else None)


def _unary(low: LoweringState, node: Node) -> None:
    text = activation_text(node, low.graph.constants)
    assert text is not None
    _elementwise(low, node, text, (0,))


def _sum(low: LoweringState, node: Node) -> None:
    if len(node.inputs) == 1:
        low.bind(node, low.input(node, 0))
        return
    expression = " + ".join("{" + str(i) + "}" for i in range(len(node.inputs)))
    _elementwise(low, node, expression, tuple(range(len(node.inputs))))


def _batchnorm(low: LoweringState, node: Node) -> None:
    if not all(i in low.graph.constants for i in node.inputs[1:5]):
        raise UnsupportedOperator(node.name, node.op, "the scale, bias, mean and variance must "
                                  "be constants (inference)")
    x = low.input(node, 0)
    scale, shift = bn_scale_shift(low.graph.constants, node)
    shape = (1, x.shape[1]) + (1,) * (len(x.shape) - 2)
    scale_name, shift_name = f"{node.name}#scale", f"{node.name}#shift"
    low.graph.constants[scale_name] = scale.reshape(shape).astype(np.float32)
    low.graph.constants[shift_name] = shift.reshape(shape).astype(np.float32)
    low.graph.shapes[scale_name] = low.graph.shapes[shift_name] = shape
    affine = Node(node.name, "BatchNormalization", (node.inputs[0], scale_name, shift_name), node.outputs)
    _elementwise(low, affine, "{0} * {1} + {2}", (0, 1, 2))


def _identity(low: LoweringState, node: Node) -> None:
    low.bind(node, low.input(node, 0))


# ----------------------------------------------------------------------------- pooling


def _pool_window(node: Node, shape: Sequence[int]) -> ctext.Window:
    if len(shape) != 4:
        raise UnsupportedOperator(node.name, node.op, "only 2-D pooling is supported")
    R, S = ints(node.attr("kernel_shape"), 2, 1)
    stride = ints(node.attr("strides"), 2, 1)
    if ints(node.attr("dilations"), 2, 1) != (1, 1):
        raise UnsupportedOperator(node.name, node.op, "dilated pooling is not supported")
    H, W = shape[2], shape[3]
    ceil = bool(node.attr("ceil_mode", 0))
    pads = window_pads(node, (H, W), (R, S), stride, (1, 1))
    out = []
    for size, window, st, lo, hi in zip((H, W), (R, S), stride, pads[:2], pads[2:], strict=True):
        span = size + lo + hi - window
        extent = (-(-span // st) if ceil else span // st) + 1
        if ceil and (extent - 1) * st >= size + lo:  # the last window must start inside
            extent -= 1
        out.append(extent)
    if min(out) < 1:
        raise UnsupportedOperator(node.name, node.op, f"the window {(R, S)} leaves an empty output")
    return ctext.Window((R, S), stride, pads, (out[0], out[1]))  # type: ignore[arg-type]


def _pool(low: LoweringState, node: Node) -> None:
    x = low.input(node, 0)
    if x.layout == PLAIN and len(x.shape) != 4:
        raise UnsupportedOperator(node.name, node.op, "only 2-D pooling is supported")
    window = _pool_window(node, x.shape)
    kind = "max" if node.op == "MaxPool" else "avg"
    if len(node.outputs) > 1 and node.outputs[1]:
        raise UnsupportedOperator(node.name, node.op, "the Indices output is not supported")
    N, C, H, W = x.shape
    out = low.activation((N, C, *window.out), x.layout)
    arguments = {"y": out.buffer, "x": x.buffer}
    divisors = ("", "")
    if kind == "avg":
        include_pad = bool(node.attr("count_include_pad", 0))
        counts = []
        for extent, size, window_size, st, lo, hi in zip(window.out, (H, W), window.size, window.stride,
                                                         window.pads[:2], window.pads[2:], strict=True):
            starts = np.arange(extent) * st - lo
            ends = starts + window_size
            if include_pad:
                starts_c, ends_c = np.maximum(starts, -lo), np.minimum(ends, size + hi)
            else:
                starts_c, ends_c = np.maximum(starts, 0), np.minimum(ends, size)
            counts.append(1.0 / (ends_c - starts_c))
        divisors = ("rd", "cd")
        arguments["rd"] = low.constant(counts[0], "c")
        arguments["cd"] = low.constant(counts[1], "c")
    text = ctext.pool(node.op.lower(), kind, x.physical, out.physical, window, x.layout == BLOCKED,
                      divisors)
    low.kernel(f"{node.describe()} [{x.layout}]", text, arguments)
    low.bind(node, out)


def _global_average(low: LoweringState, node: Node) -> None:
    x = low.input(node, 0)
    if len(x.shape) != 4:
        raise UnsupportedOperator(node.name, node.op, "only 2-D global pooling is supported")
    out = low.activation((x.shape[0], x.shape[1], 1, 1), x.layout)
    text = ctext.global_average("global_average_pool", x.physical, out.physical, x.layout == BLOCKED)
    low.kernel(f"{node.describe()} [{x.layout}]", text, {"y": out.buffer, "x": x.buffer})
    low.bind(node, out)


def _reduce_mean(low: LoweringState, node: Node) -> None:
    x = low.plain(node, 0)
    axes = low.ints_input(node, 1, "axes", "the axes")
    rank = len(x.shape)
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            low.bind(node, x)
            return
        axes = tuple(range(rank))
    axes = tuple(sorted({int(a) % rank for a in axes}))
    keep = bool(node.attr("keepdims", 1))
    out_shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape)) if keep else \
        tuple(s for d, s in enumerate(x.shape) if d not in axes)
    out = low.activation(out_shape or (1,))
    text = ctext.reduce_mean("reduce_mean", x.shape, axes, out_shape or (1,))
    low.kernel(node.describe(), text, {"y": out.buffer, "x": x.buffer})
    low.bind(node, Value(out.buffer, out_shape))


# ----------------------------------------------------------------------------- data movement


def _alias(low: LoweringState, node: Node, shape: Sequence[int]) -> None:
    x = low.plain(node, 0)
    if math.prod(shape) != math.prod(x.shape):
        raise ShapeError(node.outputs[0], f"{node.describe()} changes the element count",
                         expected=math.prod(x.shape), given=math.prod(shape))
    buffer = low._buffer("view", tuple(shape) or (1,), "activation", alias=x.buffer)
    low.bind(node, Value(buffer, tuple(shape)))


def _flatten(low: LoweringState, node: Node) -> None:
    shape = low.input(node, 0).shape
    axis = int(node.attr("axis", 1)) % (len(shape) + 1) if shape else 0
    _alias(low, node, (math.prod(shape[:axis]), math.prod(shape[axis:])))


def _reshape(low: LoweringState, node: Node) -> None:
    shape = low.graph.shapes.get(node.outputs[0])
    if shape is None:
        target = low.const_of(node.inputs[1])
        if target is None:
            raise UnsupportedOperator(node.name, node.op, "the target shape must be known when "
                                      "the network is compiled")
        x_shape = low.input(node, 0).shape
        dims_ = [x_shape[i] if int(s) == 0 and not node.attr("allowzero", 0) else int(s)
                 for i, s in enumerate(target.reshape(-1))]
        if -1 in dims_:
            known = math.prod(d for d in dims_ if d != -1)
            dims_[dims_.index(-1)] = math.prod(x_shape) // max(known, 1)
        shape = tuple(dims_)
    _alias(low, node, shape)


def _squeeze_like(low: LoweringState, node: Node) -> None:
    shape = low.graph.shapes.get(node.outputs[0])
    if shape is None:
        raise UnsupportedOperator(node.name, node.op, "the output shape must be known")
    _alias(low, node, shape)


def _transpose(low: LoweringState, node: Node) -> None:
    x = low.plain(node, 0)
    perm = node.attr("perm") or tuple(reversed(range(len(x.shape))))
    out_shape = tuple(x.shape[p] for p in perm)
    source = [""] * len(perm)
    for out_axis, in_axis in enumerate(perm):
        source[in_axis] = f"i{out_axis}"
    out = low.activation(out_shape)
    low.kernel(node.describe(), ctext.copy("transpose", out_shape, x.shape, source),
               {"y": out.buffer, "x": x.buffer})
    low.bind(node, out)


def _concat(low: LoweringState, node: Node) -> None:
    values = [low.plain(node, p) for p in range(len(node.inputs))]
    rank = len(values[0].shape)
    axis = int(node.attr("axis")) % rank
    out_shape = list(values[0].shape)
    out_shape[axis] = sum(v.shape[axis] for v in values)
    out = low.activation(out_shape)
    arguments = {"y": out.buffer} | {f"x{j}": v.buffer for j, v in enumerate(values)}
    low.kernel(node.describe(), ctext.concat("concat", [v.shape for v in values], out_shape, axis),
               arguments)
    low.bind(node, out)


def _split(low: LoweringState, node: Node) -> None:
    x = low.plain(node, 0)
    axis = int(node.attr("axis", 0)) % len(x.shape)
    sizes = low.ints_input(node, 1, "split", "the split sizes")
    count = len(node.outputs)
    if not sizes:
        each = -(-x.shape[axis] // count)
        sizes = tuple(min(each, x.shape[axis] - i * each) for i in range(count))
    shapes = []
    for size in sizes:
        shape = list(x.shape)
        shape[axis] = int(size)
        shapes.append(tuple(shape))
    outs = [low.activation(s) for s in shapes]
    arguments = {"x": x.buffer} | {f"y{j}": o.buffer for j, o in enumerate(outs)}
    low.kernel(node.describe(), ctext.split("split", x.shape, shapes, axis), arguments)
    for j, o in enumerate(outs):
        low.bind(node, o, j)


def _pad(low: LoweringState, node: Node) -> None:
    x = low.plain(node, 0)
    mode = node.attr("mode", "constant")
    if mode != "constant":
        raise UnsupportedOperator(node.name, node.op, f"mode '{mode}' is not supported; only 'constant'")
    pads = low.ints_input(node, 1, "pads", "the pads") or ()
    data = low.const_input(node, 2, "the pad value")
    value = float(data.reshape(-1)[0]) if data is not None and data.size else 0.0
    rank = len(x.shape)
    axes_data = low.const_input(node, 3, "the axes")
    if axes_data is not None:
        full = [0] * (2 * rank)
        axes = [int(a) % rank for a in axes_data.reshape(-1)]
        for j, a in enumerate(axes):
            full[a], full[rank + a] = pads[j], pads[len(axes) + j]
        pads = tuple(full)
    if min(pads) < 0:
        raise UnsupportedOperator(node.name, node.op, "negative pads (cropping) are not supported")
    out_shape = tuple(s + pads[d] + pads[rank + d] for d, s in enumerate(x.shape))
    out = low.activation(out_shape)
    low.kernel(node.describe(), ctext.pad("pad", x.shape, out_shape, pads[:rank], value),
               {"y": out.buffer, "x": x.buffer})
    low.bind(node, out)


def _softmax(low: LoweringState, node: Node) -> None:
    x = low.plain(node, 0)
    rank = len(x.shape)
    axis = int(node.attr("axis", -1 if low.graph.opset >= 13 else 1)) % rank
    if low.graph.opset >= 13:
        outer, extent, inner = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:])
    else:  # opset < 13: the input is flattened to 2-D at `axis`
        outer, extent, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis:]), 1
    out = low.activation(x.shape)
    low.kernel(node.describe(), ctext.softmax("softmax", outer, extent, inner),
               {"y": out.buffer, "x": x.buffer})
    low.bind(node, out)


def _constant(low: LoweringState, node: Node) -> None:  # folded already unless its form is unknown
    raise UnsupportedOperator(node.name, node.op, "a Constant without a tensor or float value")


HANDLERS: dict[str, Callable[[LoweringState, Node], None]] = {
    "Conv": lower_conv,
    "ConvTranspose": lower_conv_transpose,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "BatchNormalization": _batchnorm,
    **{op: _unary for op in UNARY},
    **{op: _binary for op in BINARY},
    "Sum": _sum,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "GlobalAveragePool": _global_average,
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Squeeze": _squeeze_like,
    "Unsqueeze": _squeeze_like,
    "Transpose": _transpose,
    "Concat": _concat,
    "Split": _split,
    "Softmax": _softmax,
    "Dropout": _identity,
    "Identity": _identity,
    "Constant": _constant,
    "Pad": _pad,
    "ReduceMean": _reduce_mean,
}
SUPPORTED = tuple(sorted(HANDLERS))
