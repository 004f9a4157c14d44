"""The tensors of an ONNX graph as lowered (`Value`: buffer, shape, layout) and the node
attributes every operator's lowering reads: integer lists, window pads, activations as C
expressions, batch-norm folded to a scale and a shift."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from polydl import layouts
from polydl.errors import UnsupportedOperator
from polydl.frontends.c_loopnest import read_c
from polydl.ir import LoopNest
from polydl.onnx import ctext
from polydl.onnx.graph import Node

BLOCK = layouts.BLOCK
PLAIN, BLOCKED = "plain", "nchw16c"


@dataclass(frozen=True)
class Value:
    """A tensor of the network as lowered: its ONNX shape, its layout, and its buffer."""

    buffer: str
    shape: tuple[int, ...]
    layout: str = PLAIN

    @property
    def physical(self) -> tuple[int, ...]:
        if self.layout == BLOCKED:
            n, c, h, w = self.shape
            return (n, layouts.blocks(c), h, w, BLOCK)
        return self.shape


def parse(text: ctext.Text) -> LoopNest:
    nest = read_c(text.source, f"<{text.name}>").nest
    arrays = tuple(replace(a, local=True, filled=a.name in text.filled) if a.name in text.local
                   else a for a in nest.arrays)
    return replace(nest, arrays=arrays)


def ints(value: Sequence[int] | None, count: int, default: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * count
    return tuple(int(v) for v in value)


def activation_text(node: Node, constants: dict[str, np.ndarray]) -> str | None:
    """The epilogue expression of a unary activation node ("{0}" is the value), or None."""
    op = node.op
    if op == "Relu":
        return "{0} > 0.0f ? {0} : 0.0f"
    if op == "Clip":
        lo, hi = clip_bounds(node, constants)
        text = "{0}"
        if lo is not None:
            text = f"({text} > {ctext.literal(lo)} ? {text} : {ctext.literal(lo)})"
        if hi is not None:
            text = f"({text} < {ctext.literal(hi)} ? {text} : {ctext.literal(hi)})"
        return text
    if op == "LeakyRelu":
        alpha = ctext.literal(float(node.attr("alpha", 0.01)))
        return f"{{0}} > 0.0f ? {{0}} : {alpha} * {{0}}"
    if op == "Sigmoid":
        return "1.0f / (1.0f + expf(-{0}))"
    if op == "HardSigmoid":
        alpha, beta = ctext.literal(float(node.attr("alpha", 0.2))), ctext.literal(float(node.attr("beta", 0.5)))
        inner = f"({alpha} * {{0}} + {beta})"
        return f"({inner} > 1.0f ? 1.0f : ({inner} < 0.0f ? 0.0f : {inner}))"
    if op == "HardSwish":
        inner = "({0} * 0.16666667f + 0.5f)"
        return f"{{0}} * ({inner} > 1.0f ? 1.0f : ({inner} < 0.0f ? 0.0f : {inner}))"
    if op in ("Identity", "Dropout"):
        return "{0}"
    return None


def clip_bounds(node: Node, constants: dict[str, np.ndarray]) -> tuple[float | None, float | None]:
    if len(node.inputs) > 1 or "min" not in node.attrs:
        bounds: list[float | None] = []
        for position in (1, 2):
            name = node.inputs[position] if len(node.inputs) > position else ""
            if not name:
                bounds.append(None)
            elif name in constants:
                bounds.append(float(np.asarray(constants[name]).reshape(-1)[0]))
            else:
                raise UnsupportedOperator(node.name, node.op, "Clip bounds must be constants")
        return bounds[0], bounds[1]
    return node.attr("min"), node.attr("max")


def window_pads(node: Node, sizes: Sequence[int], windows: Sequence[int], strides: Sequence[int],
          dilations: Sequence[int]) -> tuple[int, int, int, int]:
    """A Conv's or pool's pads (top, left, bottom, right), `auto_pad` resolved: SAME_* pads so
    the output has ceil(size / stride) cells, the odd cell at the end (UPPER) or start (LOWER)."""
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad == "VALID":
        return (0, 0, 0, 0)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return ints(node.attr("pads"), 4, 0)  # type: ignore[return-value]
    begins, ends = [], []
    for size, window, st, d in zip(sizes, windows, strides, dilations, strict=True):
        total = max(0, (-(-size // st) - 1) * st + (window - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return (begins[0], begins[1], ends[0], ends[1])


def bn_scale_shift(constants: dict[str, np.ndarray], bn: Node) -> tuple[np.ndarray, np.ndarray]:
    gamma, beta, mean, var = (constants[i].astype(np.float64) for i in bn.inputs[1:5])
    scale = gamma / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
    return scale, beta - mean * scale
