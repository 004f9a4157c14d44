"""Folding what a network computes from constants alone, at compile time, with numpy.

Exporters compute shapes inside the graph (Shape -> Gather -> Unsqueeze -> Concat -> Reshape)
and store some weights as Constant nodes; none of that is work for the compiled network. A node
whose inputs are all constants (or a Shape of a value with a static shape) is evaluated here and
its outputs become constants. What is left are the nodes that compute on the network's inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from polydl.onnx.graph import Graph, Node

Evaluate = Callable[[Node, list[np.ndarray | None]], list[np.ndarray]]


def _axes(node: Node, inputs: list[np.ndarray | None], position: int = 1) -> tuple[int, ...] | None:
    if len(inputs) > position and inputs[position] is not None:
        return tuple(int(a) for a in np.asarray(inputs[position]).reshape(-1))
    axes = node.attr("axes")
    return None if axes is None else tuple(int(a) for a in axes)


def _unsqueeze(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    axes = _axes(node, inputs) or ()
    rank = x.ndim + len(axes)
    for axis in sorted(a % rank for a in axes):
        x = np.expand_dims(x, axis)
    return [x]


def _squeeze(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    axes = _axes(node, inputs)
    return [np.squeeze(x) if axes is None else np.squeeze(x, tuple(a % x.ndim for a in axes))]


def _reshape(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    shape = [int(s) for s in np.asarray(inputs[1]).reshape(-1)]
    if not node.attr("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]


def _slice(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    starts, ends = np.asarray(inputs[1]).reshape(-1), np.asarray(inputs[2]).reshape(-1)
    axes = _axes(node, inputs, 3) or tuple(range(len(starts)))
    steps = (np.asarray(inputs[4]).reshape(-1) if len(inputs) > 4 and inputs[4] is not None
             else np.ones(len(starts), dtype=np.int64))
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        index[a % x.ndim] = slice(int(s), int(e), int(st))
    return [x[tuple(index)]]


def _cast(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    import onnx

    return [np.asarray(inputs[0]).astype(onnx.helper.tensor_dtype_to_np_dtype(node.attr("to")))]


def _constant(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in node.attrs:
            value = node.attrs[key]
            dtype = np.float32 if "float" in key else np.int64 if "int" in key else None
            return [np.asarray(value, dtype=dtype)]
    raise KeyError("value")


def _constant_of_shape(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    value = node.attr("value")
    fill = np.asarray(value).reshape(-1)[0] if value is not None else np.float32(0)
    return [np.full(tuple(int(s) for s in np.asarray(inputs[0]).reshape(-1)), fill)]


def _binary(function: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Evaluate:
    return lambda node, inputs: [np.asarray(function(np.asarray(inputs[0]), np.asarray(inputs[1])))]


def _range(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """ONNX Range: the scalars' own type kept (int64 stays int64, float32 float32)."""
    start, limit, delta = (np.asarray(v) for v in inputs[:3])
    dtype = np.result_type(start, limit, delta)
    return [np.arange(start.item(), limit.item(), delta.item(), dtype=dtype)]


EVALUATORS: dict[str, Evaluate] = {
    "Constant": _constant,
    "Identity": lambda node, inputs: [np.asarray(inputs[0])],
    "Cast": _cast,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Reshape": _reshape,
    "Flatten": lambda node, inputs: [np.asarray(inputs[0]).reshape(
        int(np.prod(np.asarray(inputs[0]).shape[: node.attr("axis", 1) % max(np.asarray(inputs[0]).ndim, 1)])), -1)],
    "Gather": lambda node, inputs: [np.take(np.asarray(inputs[0]), np.asarray(inputs[1]),
                                            axis=node.attr("axis", 0))],
    "Concat": lambda node, inputs: [np.concatenate([np.asarray(i) for i in inputs],
                                                   axis=node.attr("axis"))],
    "Slice": _slice,
    "Transpose": lambda node, inputs: [np.transpose(np.asarray(inputs[0]), node.attr("perm"))],
    "ConstantOfShape": _constant_of_shape,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _binary(lambda a, b: a // b if a.dtype.kind in "iu" else a / b),
    "Sqrt": lambda node, inputs: [np.sqrt(np.asarray(inputs[0]))],
    "Range": _range,
}


def fold_constants(graph: Graph) -> Graph:
    """`graph` with every node computed from constants alone replaced by its outputs."""
    kept: list[Node] = []
    for node in graph.nodes:
        if node.op == "Shape" and node.inputs[0] in graph.shapes:
            shape = np.asarray(graph.shapes[node.inputs[0]], dtype=np.int64)
            start, end = node.attr("start", 0), node.attr("end", None)
            graph.constants[node.outputs[0]] = shape[start:end]
            graph.shapes[node.outputs[0]] = graph.constants[node.outputs[0]].shape
            continue
        evaluate = EVALUATORS.get(node.op)
        present = [i for i in node.inputs if i]
        if evaluate is not None and all(i in graph.constants for i in present):
            values = [graph.constants[i] if i else None for i in node.inputs]
            try:
                outputs = evaluate(node, values)
            except Exception:  # an attribute form the evaluator does not know: lower it instead
                kept.append(node)
                continue
            for name, value in zip(node.outputs, outputs, strict=False):
                graph.constants[name] = np.asarray(value)
                graph.shapes[name] = tuple(np.asarray(value).shape)
            continue
        kept.append(node)
    graph.nodes = kept
    return graph
