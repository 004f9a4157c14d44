"""An ONNX model as polydl reads it: nodes, constant tensors and static shapes.

Takes a path or an `onnx.ModelProto`; returns a `Graph` whose every value has a static shape:
a symbolic batch dimension is fixed by `batch=`, shapes come from `onnx.shape_inference` (with
data propagation, so computed Reshape shapes resolve), and subgraphs that only compute
constants (Shape -> Gather -> Concat feeding a Reshape, as exporters write them) are folded
here with numpy, so that what reaches the lowering is the network itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polydl.errors import ShapeError, UnsupportedOperator


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:  # an optional extra
        raise UnsupportedOperator(
            "<model>", "<import>", "reading ONNX models needs the onnx package: "
            "pip install 'polydl[onnx]'"
        ) from None
    return onnx


@dataclass(frozen=True)
class Node:
    """One operator application: `outputs = op(inputs)`; an empty input name is an omitted
    optional input."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def describe(self) -> str:
        return f"{self.op} '{self.name}'"


@dataclass
class Graph:
    """The network: nodes in a topological order, constants by name, static shapes of every
    value, the graph's inputs (not constants) and outputs in declaration order."""

    name: str
    inputs: list[str]
    outputs: list[str]
    nodes: list[Node]
    constants: dict[str, np.ndarray]
    shapes: dict[str, tuple[int, ...]]
    opset: int

    def consumers(self, value: str) -> list[Node]:
        return [n for n in self.nodes if value in n.inputs]

    def producer(self, value: str) -> Node | None:
        return next((n for n in self.nodes if value in n.outputs), None)


def load_model(model: Any) -> Any:
    """The ModelProto for a path, bytes or a ModelProto."""
    onnx = _onnx()
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        return onnx.load_from_string(model)
    if isinstance(model, str | os.PathLike):
        try:
            return onnx.load(os.fspath(model))
        except FileNotFoundError:
            raise ShapeError("model", f"no ONNX file {os.fspath(model)!r}",
                             expected="an .onnx file", given=os.fspath(model)) from None
        except Exception as exc:  # onnx raises DecodeError and others for a damaged file
            raise ShapeError("model", f"{os.fspath(model)!r} is not a readable ONNX model: {exc}",
                             expected="an ONNX ModelProto", given=os.fspath(model)) from None
    raise ShapeError("model", "must be a path, bytes or an onnx.ModelProto",
                     expected="str | PathLike | bytes | onnx.ModelProto",
                     given=type(model).__name__)


def _attribute(onnx: Any, attribute: Any) -> Any:
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode()
    if attribute.type == onnx.AttributeProto.TENSOR:
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list):
        return tuple(v.decode() if isinstance(v, bytes) else v for v in value)
    return value


def _fix_batch(onnx: Any, model: Any, batch: int | None, constants: set[str]) -> Any:
    """A copy of `model` whose graph inputs have static shapes (batch= fixes dimension 0)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in model.graph.input:
        if value.name in constants:
            continue
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            raise UnsupportedOperator(value.name, "<input>", f"graph input '{value.name}' is a "
                                      f"{kind}, not a tensor")
        dims = value.type.tensor_type.shape.dim
        for axis, dim in enumerate(dims):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                if axis == 0 and batch is not None and dim.dim_value != batch:
                    raise ShapeError(value.name, f"batch={batch} given, but the model fixes the "
                                     f"batch dimension of '{value.name}' at {dim.dim_value}",
                                     expected=dim.dim_value, given=batch)
                continue
            if axis == 0 and batch is not None:
                dim.Clear()
                dim.dim_value = batch
                continue
            symbol = dim.dim_param or "?"
            raise ShapeError(
                value.name,
                f"graph input '{value.name}' has the symbolic dimension '{symbol}' at axis "
                f"{axis}" + ("; pass batch= to fix the batch dimension" if axis == 0 else
                             "; only the batch dimension (axis 0) can be fixed, by batch="),
                expected="a static shape", given=symbol,
            )
    return model


def _images(model: Any, images: int, constants: set[str]) -> Any:
    """`model` (its inputs static) with `images` at axis 0 of every input: one pass over part
    of the batch, for a graph that keeps its images apart (`batching.images_apart`)."""
    for value in model.graph.input:
        if value.name not in constants:
            value.type.tensor_type.shape.dim[0].dim_value = images
    for value in model.graph.output:  # every output holds the images: inferred anew
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
    del model.graph.value_info[:]  # the exporter's shapes are the whole batch's
    return model


def read_graph(model: Any, batch: int | None = None, images: int | None = None) -> Graph:
    """The static-shaped graph of `model` (path, bytes or ModelProto); `images` (a divisor
    of the batch) gives the graph of one pass over that many images."""
    onnx = _onnx()
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ShapeError("batch", "must be a positive integer", expected="int >= 1", given=batch)
    proto = load_model(model)
    graph = proto.graph
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    proto = _fix_batch(onnx, proto, batch, set(constants))
    if images is not None:
        proto = _images(proto, images, set(constants))
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception as exc:  # onnx's InferenceError and checker errors
        raise ShapeError("model", f"ONNX shape inference failed: {exc}",
                         expected="a consistent model", given=proto.graph.name) from None
    graph = inferred.graph
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=13)
    shapes: dict[str, tuple[int, ...]] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(
            d.HasField("dim_value") for d in dims
        ):
            shapes[value.name] = tuple(int(d.dim_value) for d in dims)
    for name, array in constants.items():
        shapes[name] = tuple(array.shape)
    nodes = []
    for index, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx"):
            raise UnsupportedOperator(node.name or f"node{index}", f"{node.domain}.{node.op_type}")
        nodes.append(Node(
            name=node.name or f"{node.op_type}_{index}",
            op=node.op_type,
            inputs=tuple(node.input),
            outputs=tuple(node.output),
            attrs={a.name: _attribute(onnx, a) for a in node.attribute},
        ))
    inputs = [v.name for v in graph.input if v.name not in constants]
    for name in inputs:
        elem = next(v for v in graph.input if v.name == name).type.tensor_type.elem_type
        if elem != onnx.TensorProto.FLOAT:
            raise ShapeError(name, f"graph input '{name}' has element type "
                             f"{onnx.TensorProto.DataType.Name(elem)}; polydl runs float32 networks",
                             expected="float32", given=onnx.TensorProto.DataType.Name(elem))
    return Graph(
        name=proto.graph.name or "network",
        inputs=inputs,
        outputs=[v.name for v in graph.output],
        nodes=nodes,
        constants=constants,
        shapes=shapes,
        opset=opset,
    )
