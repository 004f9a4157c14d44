"""Running a network a few images at a time: whether a graph keeps its images apart, and how
many images a pass takes.

A network whose every node maps image i of its inputs to image i of its outputs can run its
whole step list on a slice of the batch, then on the next: the batch loop moves outside the
layers (the layers fused along the images). Each pass's activations are a few images' and stay
in the last-level cache between layers, where a whole batch's go through memory; the price is
reading the weights once per pass, so it pays where the weights fit the cache beside them
(`images_per_pass`; see decisions: Passes of a few images).
"""

from __future__ import annotations

import math

from polydl.onnx.graph import Graph, Node
from polydl.target.cpu import CpuTarget

# Operators that treat each image of their first input on its own, given that their other
# inputs (weights, biases, bounds) are not batched.
_PER_IMAGE = frozenset({
    "Conv", "ConvTranspose", "BatchNormalization", "Relu", "Clip", "LeakyRelu", "Sigmoid",
    "HardSigmoid", "HardSwish", "MaxPool", "AveragePool", "GlobalAveragePool", "Dropout",
    "Identity",
})
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Sum"})
_LAYERS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "Gemm", "MatMul", "Concat"})


def batch_of(graph: Graph) -> int:
    """The batch: axis 0 of the graph's first input (1 for a graph without one)."""
    shape = graph.shapes.get(graph.inputs[0], ()) if graph.inputs else ()
    return shape[0] if shape else 1


def _axis(value: int, rank: int) -> int:
    return value + rank if value < 0 else value


def _mixing(node: Node, graph: Graph, batched: set[str]) -> str | None:
    """Why `node` mixes images (a sentence), or None where image i of its outputs depends on
    image i of its batched inputs only."""
    shapes = graph.shapes
    ins = [i for i in node.inputs if i]
    if any(v not in shapes for v in (*ins, *node.outputs) if v):
        return "has a value without a static shape"  # (the lowering names what it cannot do)
    rank = len(shapes[node.outputs[0]])
    if node.op in _PER_IMAGE:
        if any(i in batched for i in ins[1:]):
            return "takes a batched tensor as weights"
        if node.op == "MaxPool" and len([o for o in node.outputs if o]) > 1:
            return "gives indices counted over the whole batch"
        return None
    if node.op in _ELEMENTWISE:
        for i in ins:
            shape = shapes[i]
            if i in batched and len(shape) != rank:
                return "broadcasts a batched operand"
            if i not in batched and len(shape) == rank and shape[0] != 1:
                return "combines the images with a tensor of the batch's size"
        return None
    if node.op == "Pad":
        if len(ins) > 3:
            return "pads the axes an input names"
        pads = node.attr("pads")
        if pads is None and len(ins) > 1:
            pads = graph.constants.get(ins[1])
        if pads is None:
            return "pads by a computed amount"
        pads = [int(p) for p in pads]
        return None if pads[0] == 0 and pads[len(pads) // 2] == 0 else "pads the batch axis"
    if node.op == "Softmax":
        default = 1 if graph.opset < 13 else -1
        return None if _axis(node.attr("axis", default), rank) != 0 else "normalises over the images"
    if node.op == "ReduceMean":
        axes = node.attr("axes")
        if axes is None and len(ins) > 1:
            axes = graph.constants.get(ins[1])
        source = len(shapes[ins[0]])
        if axes is None or any(_axis(int(a), source) == 0 for a in axes):
            return "averages over the images"
        return None
    if node.op == "Flatten":
        return None if _axis(node.attr("axis", 1), len(shapes[ins[0]])) >= 1 else "flattens the images together"
    if node.op == "Reshape":
        before, after = shapes[ins[0]], shapes[node.outputs[0]]
        if before[:1] == after[:1] and math.prod(before[1:]) == math.prod(after[1:]):
            return None
        return "reshapes across images"
    if node.op in ("Squeeze", "Unsqueeze"):  # axis 0 kept: the output check below sees to it
        return None
    if node.op == "Transpose":
        perm = node.attr("perm")
        return None if perm is not None and int(perm[0]) == 0 else "moves the batch axis"
    if node.op in ("Concat", "Split"):
        if node.op == "Concat" and any(i not in batched for i in ins):
            return "joins images with a constant"
        axis = _axis(node.attr("axis", 0), len(shapes[ins[0]]))
        return None if axis != 0 else "joins or splits along the images"
    if node.op in ("Gemm", "MatMul"):
        if ins[0] not in batched or any(i in batched for i in ins[1:]):
            return "multiplies by a batched matrix"
        if node.op == "Gemm" and node.attr("transA", 0):
            return "transposes the batch into the reduction"
        if len(ins) > 2 and len(shapes[ins[2]]) == 2 and shapes[ins[2]][0] != 1:
            return "adds a bias with a row per image"
        if node.op == "MatMul" and len(shapes[ins[1]]) != 2:
            return "broadcasts a batched product"
        return None
    return f"{node.op} is not known to keep the images apart"


def images_apart(graph: Graph) -> str | None:
    """None where every node of `graph` maps image i (axis 0 of the graph's inputs) to image i
    of its outputs and every output holds all the images; else the first node that does not,
    and why."""
    batch = batch_of(graph)
    if not graph.inputs or any(graph.shapes.get(i, ())[:1] != (batch,) for i in graph.inputs):
        return "the inputs do not share a batch axis"
    batched = set(graph.inputs)
    for node in graph.nodes:
        if not any(i in batched for i in node.inputs if i):
            continue
        reason = _mixing(node, graph, batched)
        if reason is not None:
            return f"{node.describe()} {reason}"
        for out in node.outputs:
            if out and graph.shapes.get(out, ())[:1] != (batch,):
                return f"{node.describe()} gives '{out}' without the batch axis"
            batched.add(out)
    missing = [o for o in graph.outputs if o not in batched]
    return f"output '{missing[0]}' does not hold the images" if missing else None


def _weight_bytes(graph: Graph) -> int:
    return sum(a.nbytes for a in graph.constants.values())


def _image_bytes(graph: Graph) -> int:
    """The most bytes of activations one layer (a convolution, pooling, product or join: the
    activations and elementwise nodes after it run in place, fused) reads and writes, per image."""
    batch = batch_of(graph)
    layers = [n for n in graph.nodes if n.op in _LAYERS] or graph.nodes
    most = 0
    for node in layers:
        values = [v for v in (*node.inputs, *node.outputs) if v and v not in graph.constants
                  and v in graph.shapes]
        most = max(most, sum(4 * math.prod(graph.shapes[v]) for v in values))
    return most // batch


def images_per_pass(graph: Graph, target: CpuTarget) -> int:
    """How many images one pass of the network takes: the whole batch, or (where the graph
    keeps its images apart, its weights fit half the last-level cache, to be read again each
    pass from there, and a pass's images still give every core one) the largest power of two
    dividing the batch whose activations at the widest layer fit the other half (see
    decisions: Passes of a few images)."""
    batch = batch_of(graph)
    half = target.l3_bytes // 2
    if batch < 2 or _weight_bytes(graph) > half or images_apart(graph) is not None:
        return batch
    per_image = max(1, _image_bytes(graph))
    images = batch
    while images % 2 == 0 and images * per_image > half:
        images //= 2
    if images == batch or images < target.cores or images * per_image > half:
        return batch
    return images
