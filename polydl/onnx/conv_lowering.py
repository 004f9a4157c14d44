"""Conv and ConvTranspose lowered: a Conv absorbs the BatchNormalization after it (folded into
its weights and bias) and then, each only where the value has no other reader, a residual Add
and a Relu or Clip, as one kernel with fused epilogues. It runs blocked where the input has 16
channels or more (3 x 3 ones by Winograd where that pays), a stem of few channels from NCHW
into blocks, and strides or dilations that differ between the axes directly in NCHW."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polydl import layouts
from polydl.errors import UnsupportedOperator
from polydl.frontends import builders
from polydl.onnx import ctext, winograd
from polydl.onnx.graph import Node
from polydl.onnx.lowering_state import LoweringState
from polydl.onnx.values import (
    BLOCK,
    BLOCKED,
    PLAIN,
    Value,
    activation_text,
    bn_scale_shift,
    clip_bounds,
    ints,
    window_pads,
)


@dataclass(frozen=True)
class ConvGeometry:
    """Strides, dilations (each along H, W) and pads (top, left, bottom, right) of a Conv."""

    stride: tuple[int, int]
    dilation: tuple[int, int]
    pads: tuple[int, int, int, int]

    @classmethod
    def of(cls, node: Node, x_shape: Sequence[int], w_shape: Sequence[int]) -> ConvGeometry:
        if len(x_shape) != 4:
            raise UnsupportedOperator(node.name, node.op, "only 2-D convolutions are supported; "
                                      f"the input has rank {len(x_shape)}")
        stride = ints(node.attr("strides"), 2, 1)
        dilation = ints(node.attr("dilations"), 2, 1)
        pads = window_pads(node, x_shape[2:], w_shape[2:], stride, dilation)
        return cls(stride, dilation, pads)  # type: ignore[arg-type]

    def out(self, H: int, W: int, R: int, S: int) -> tuple[int, int]:
        """The output's extents (P, Q) for an H x W input and an R x S filter."""
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = self.stride, self.dilation, self.pads
        return ((H + pt + pb - dh * (R - 1) - 1) // sh + 1, (W + pl + pr - dw * (S - 1) - 1) // sw + 1)


def _conv_chain(low: LoweringState, node: Node) -> tuple[list[Node], list[str]]:
    """The nodes a Conv/Gemm absorbs after it, and the epilogue of each ("bn", "residual",
    an activation): a BatchNormalization first, then at most one residual Add and one
    activation, each only where the value before it has no other reader."""
    chain: list[Node] = []
    kinds: list[str] = []
    current = node.outputs[0]
    while True:
        reader = low.single_reader(current)
        if reader is None:
            break
        if (reader.op == "BatchNormalization" and not kinds and node.op == "Conv"
                and all(i in low.graph.constants for i in reader.inputs[1:5])):
            kind = "bn"
        elif reader.op == "Add" and "residual" not in kinds and "act" not in kinds and node.op == "Conv":
            other = reader.inputs[1] if reader.inputs[0] == current else reader.inputs[0]
            if other in low.graph.constants or low.graph.shapes.get(other) != low.graph.shapes.get(current):
                break
            kind = "residual"
        elif reader.op in ("Relu", "Clip") and "act" not in kinds:
            if reader.op == "Clip":
                try:
                    lo, hi = clip_bounds(reader, low.graph.constants)
                except UnsupportedOperator:
                    break
                if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
                    break
            kind = "act"
        else:
            break
        chain.append(reader)
        kinds.append(kind)
        current = reader.outputs[0]
    return chain, kinds


def lower_conv(low: LoweringState, node: Node) -> None:
    x = low.input(node, 0)
    weights = low.const_of(node.inputs[1])
    if weights is None:
        raise UnsupportedOperator(node.name, node.op, "the weights must be a constant (an "
                                  "initializer): polydl specialises the kernel to them")
    weights = weights.astype(np.float64)
    N, C, H, W = x.shape
    K, Cg, R, S = weights.shape
    groups = int(node.attr("group", 1))
    if Cg * groups != C or K % groups:
        raise UnsupportedOperator(node.name, node.op, f"weights {weights.shape} do not fit "
                                  f"{C} input channels in {groups} groups")
    geometry = ConvGeometry.of(node, x.shape, weights.shape)
    (sh, sw), (dh, dw) = geometry.stride, geometry.dilation
    given_bias = low.const_input(node, 2, "the bias")
    bias = given_bias.astype(np.float64) if given_bias is not None else np.zeros(K)
    chain, kinds = _conv_chain(low, node)
    label = [node.describe()]
    fuse: list[str] = []
    residual: Value | None = None
    residual_add: tuple[Node, str] | None = None  # the fused Add and the residual's name
    activation: Node | None = None  # the fused Relu/Clip
    current = node.outputs[0]
    for reader, kind in zip(chain, kinds, strict=True):
        if kind == "bn":
            scale, shift = bn_scale_shift(low.graph.constants, reader)
            weights = weights * scale[:, None, None, None]
            bias = bias * scale + shift
            label.append(f"{reader.describe()} folded")
        elif kind == "residual":
            other = reader.inputs[1] if reader.inputs[0] == current else reader.inputs[0]
            residual = low.values[other] if other in low.values else None
            if residual is None:
                break
            residual_add = (reader, other)
            fuse.append("residual")
            label.append(f"{reader.describe()} fused (residual)")
        else:
            activation = reader
            if reader.op == "Relu":
                fuse.append("relu")
            else:
                lo, hi = clip_bounds(reader, low.graph.constants)
                fuse.append(f"clip({lo},{hi})")
            label.append(f"{reader.describe()} fused")
        low.skip.add(reader.name)
        current = reader.outputs[0]
    act = (activation_text(activation, low.graph.constants) or "") if activation else ""
    if (sh, dh) != (sw, dw) and residual is None:
        _conv_direct(low, low.as_layout(x, PLAIN), weights, bias, geometry, groups, act, current,
                     ", ".join(label))
        return
    if (sh, dh) != (sw, dw):
        raise UnsupportedOperator(node.name, node.op, f"strides {(sh, sw)} and dilations "
                                  f"{(dh, dw)} that differ between the axes, with a fused residual")
    if groups == 1 and C < BLOCK and K >= BLOCK and residual is None and x.layout == PLAIN:
        _stem(low, x, weights, bias, geometry, fuse, current, ", ".join(label))
        return
    blocked = C >= BLOCK and _blockable(C, K, groups)
    layout = BLOCKED if blocked else PLAIN
    x = low.as_layout(x, layout)
    out = low.activation((N, K, *geometry.out(H, W, R, S)), layout)
    # A residual read by nothing after the Add is summed into in place: the kernel adds the
    # convolution to it (the write of a fresh output would first read its lines in: a third
    # stream of the output's size). see decisions: A residual summed into in place
    in_place = (residual_add is not None and residual is not None and residual.layout == layout
                and _dead_after(low, node, *residual_add, residual, x))
    if in_place:
        assert residual is not None
        fuse.remove("residual")
        out = Value(residual.buffer, out.shape, layout)
        # copies of the residual in other layouts no longer hold what the buffer will
        low.converted = {key: v for key, v in low.converted.items() if key[0] != residual.buffer}
        label[-1 if activation is None else -2] += " in place"
        residual = None
    if blocked and groups == 1 and (R, S, sh, sw, dh, dw) == (3, 3, 1, 1, 1, 1) \
            and low.winograd_target is not None:
        P, Q = out.shape[2:]
        shape = winograd.choose(N, C, K, H, W, P, Q, (geometry.pads[0], geometry.pads[1]),
                                low.winograd_target)
        if shape is not None:
            _conv_winograd(low, shape, x, out, weights, bias, residual, in_place, act, ", ".join(label))
            low.values[current] = out
            return
    has_bias = given_bias is not None or bool(np.any(bias != 0))
    fuse = (["bias"] if has_bias else []) + fuse
    built = builders.conv2d(N, C, K, H, W, R, S, stride=sh, padding=geometry.pads,
                            layout="nchw16c" if blocked else "nchw", fuse=tuple(fuse), groups=groups,
                            dilation=dh, accumulate=in_place,
                            **low.conv_options)
    w32 = weights.astype(np.float32)
    arguments = {"y": out.buffer, "x": x.buffer}
    if blocked:
        arguments["w"] = low.constant(layouts.to_conv_weights(w32, groups), "w")
        if has_bias:
            arguments["b"] = low.constant(layouts.to_blocked_channels(bias, np.float32), "b")
    else:
        arguments["w"] = low.constant(w32, "w")
        if has_bias:
            arguments["b"] = low.constant(bias.astype(np.float32), "b")
    if residual is not None:
        arguments["res"] = low.as_layout(residual, layout).buffer
    # the kernel sets y (`accumulate=False`; in place it adds to the residual there): its
    # microkernel calls overwrite it, so no pass clears it first
    low.kernel(", ".join(label) + f" [{layout}]", built, arguments)
    low.values[current] = out


def _dead_after(low: LoweringState, conv: Node, add: Node, name: str, value: Value, x: Value) -> bool:
    """Whether the memory of `value` (the residual `name` that `add` sums) may be overwritten
    by `conv`'s step, which reads `x`: an activation of the arena, not x's, no view aliases, no
    graph output, and every value held there read by nothing but `add` and nodes lowered before
    `conv`."""
    root = low.plan.root(value.buffer)
    if root.kind != "activation" or root == low.plan.root(x.buffer) \
            or any(b.alias == root.name for b in low.plan.buffers.values()):
        return False
    before = set(low.graph.nodes[:low.graph.nodes.index(conv)])
    sharing = [n for n, v in low.values.items() if low.plan.root(v.buffer).name == root.name]
    return name in sharing and all(
        n not in low.graph.outputs and all(r is add or r in before for r in low.graph.consumers(n))
        for n in sharing)


def _conv_winograd(low: LoweringState, shape: winograd.WinogradShape, x: Value, out: Value,
                   weights: np.ndarray, bias: np.ndarray, residual: Value | None, in_place: bool,
                   activation: str, label: str) -> None:
    """A blocked 3 x 3 convolution by Winograd's F(m x m, 3 x 3) (`winograd`), `shape.images`
    images per call; the bias, residual and `activation` applied in the output transform
    (`in_place`: the residual is what y holds)."""
    N, _, H, W = x.shape
    P, Q = out.shape[2:]
    text = winograd.conv_winograd_blocked(
        "conv_winograd", shape, "y" if in_place else "res" if residual is not None else None, activation)
    arguments = {"y": out.buffer, "x": x.buffer,
                 "u": low.constant(winograd.transform_weights(weights, shape.m).astype(np.float32), "u"),
                 "b": low.constant(layouts.to_blocked_channels(bias, np.float32), "b")}
    image = {x.buffer: shape.CB * H * W * BLOCK, out.buffer: shape.KB * P * Q * BLOCK}
    if residual is not None:
        arguments["res"] = low.as_layout(residual, BLOCKED).buffer
        image[arguments["res"]] = shape.KB * P * Q * BLOCK
    calls = N // shape.images
    how = f"winograd F({shape.m}x{shape.m},3x3), nchw16c"
    if calls > 1:
        how += f", {shape.images} image{'s' if shape.images > 1 else ''} per call"
    low.kernel(f"{label} [{how}]", text, arguments, repeat=calls,
               strides={buffer: size * shape.images for buffer, size in image.items()})


def _conv_direct(low: LoweringState, x: Value, weights: np.ndarray, bias: np.ndarray,
                 geometry: ConvGeometry, groups: int, activation: str, current: str,
                 label: str) -> None:
    """A convolution with a stride or dilation of its own per axis, in NCHW
    (`ctext.conv_direct`); `activation` is the fused Relu/Clip's expression, or empty."""
    N, C, H, W = x.shape
    K, Cg, R, S = weights.shape
    out = low.activation((N, K, *geometry.out(H, W, R, S)))
    text = ctext.conv_direct("conv_direct", x.shape, weights.shape, out.shape, geometry.stride,
                             geometry.dilation, geometry.pads, groups, activation)
    low.kernel(f"{label} [direct]", text, {"y": out.buffer, "x": x.buffer,
                                           "w": low.constant(weights, "w"),
                                           "b": low.constant(bias, "b")})
    low.values[current] = out


def _stem(low: LoweringState, x: Value, weights: np.ndarray, bias: np.ndarray,
          geometry: ConvGeometry, fuse: list[str], current: str, label: str) -> None:
    """A convolution of few input channels (a network's stem: 3 colours) from NCHW into the
    blocked layout (`builders.conv2d(out_layout="nchw16c")`: each tap of the padded input a
    broadcast against 16 output channels), all the images in one call, with the bias and the
    fused Relu/Clip (`fuse`).

    A GEMM over gathered windows (C*R*S values under each output position copied out first)
    was the other form; the padded input read in place runs as fast or faster.
    see decisions: The stem from its padded input in one call"""
    N, C, H, W = x.shape
    K, _, R, S = weights.shape
    out = low.activation((N, K, *geometry.out(H, W, R, S)), BLOCKED)
    built = builders.conv2d(N, C, K, H, W, R, S, stride=geometry.stride[0],
                            padding=geometry.pads, layout="nchw",
                            out_layout="nchw16c", fuse=("bias", *fuse), dilation=geometry.dilation[0],
                            accumulate=False, **low.conv_options)
    low.kernel(f"{label} [nchw -> nchw16c]", built,
               {"y": out.buffer, "x": x.buffer,
                "w": low.constant(layouts.to_kcrs16k(weights.astype(np.float32)), "w"),
                "b": low.constant(layouts.to_blocked_channels(bias, np.float32), "b")})
    low.values[current] = out


def _blockable(C: int, K: int, groups: int) -> bool:
    """Every grouping has a blocked form (`layouts.grouped_form`); depthwise with a channel
    multiplier reads its lanes by integer division, slower than NCHW's plain loops."""
    return layouts.grouped_form(C, K, groups) != "lanes"


def lower_conv_transpose(low: LoweringState, node: Node) -> None:
    x = low.plain(node, 0)
    weights = low.const_of(node.inputs[1])
    if weights is None:
        raise UnsupportedOperator(node.name, node.op, "the weights must be a constant")
    if len(x.shape) != 4:
        raise UnsupportedOperator(node.name, node.op, "only 2-D transposed convolutions are supported")
    groups = int(node.attr("group", 1))
    N, C, H, W = x.shape
    Cw, Kg, R, S = weights.shape
    K = Kg * groups
    stride = ints(node.attr("strides"), 2, 1)
    dilation = ints(node.attr("dilations"), 2, 1)
    out_pad = ints(node.attr("output_padding"), 2, 0)
    full = tuple((n - 1) * st + (k - 1) * d + 1 + op for n, st, k, d, op in
                 zip((H, W), stride, (R, S), dilation, out_pad, strict=True))
    auto_pad = node.attr("auto_pad", "NOTSET")
    target = node.attr("output_shape")
    if target is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # the full output cropped to the asked extents (SAME: input * stride), the odd cell
        # cropped at the end, or at the start for SAME_LOWER
        wanted = ([int(v) for v in target][-2:] if target is not None
                  else [n * st for n, st in zip((H, W), stride, strict=True)])
        totals = [f - t for f, t in zip(full, wanted, strict=True)]
        upper = auto_pad != "SAME_LOWER"
        pads = tuple((t // 2 if upper else t - t // 2) for t in totals) + \
            tuple((t - t // 2 if upper else t // 2) for t in totals)
    else:
        pads = ints(node.attr("pads"), 4, 0)
    P, Q = full[0] - pads[0] - pads[2], full[1] - pads[1] - pads[3]
    if min(pads) < 0 or P < 1 or Q < 1:
        raise UnsupportedOperator(node.name, node.op, f"pads {pads} do not fit the output {full}")
    out = low.activation((N, K, P, Q))
    has_bias = len(node.inputs) > 2 and bool(node.inputs[2])
    text = ctext.conv_transpose("conv_transpose", x.shape, weights.shape, out.shape, full,
                                stride, dilation, (pads[0], pads[1]), groups, has_bias)  # type: ignore[arg-type]
    arguments = {"y": out.buffer, "x": x.buffer, "wt": low.constant(weights, "w")}
    if has_bias:
        bias = low.const_of(node.inputs[2])
        if bias is None:
            raise UnsupportedOperator(node.name, node.op, "the bias must be a constant")
        arguments["b"] = low.constant(bias, "b")
    low.kernel(node.describe(), text, arguments)
    low.bind(node, out)


# ----------------------------------------------------------------------------- products
