"""The state of one ONNX graph's lowering: takes the graph and the target, holds the values met
so far and the `NetworkPlan` being built, and adds buffers, kernels and layout conversions to it.

The operator handlers (`lowering`, `conv_lowering`) take this state and add to it; it knows
none of them, so both import it and neither imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from polydl.errors import ShapeError, UnsupportedOperator
from polydl.frontends import builders
from polydl.ir import LoopNest
from polydl.network import Buffer, KernelStep, NetworkPlan
from polydl.onnx import ctext
from polydl.onnx.graph import Graph, Node
from polydl.onnx.values import BLOCKED, PLAIN, Value, parse
from polydl.target.cpu import CpuTarget


class LoweringState:
    """The state of one graph's lowering: the values met so far and the plan being built."""

    def __init__(self, graph: Graph, name: str, target: CpuTarget | None = None,
                 winograd: bool = True) -> None:
        self.graph = graph
        # 3 x 3 convolutions by Winograd's algorithm (`winograd.choose`), for this target
        self.winograd_target = target if winograd else None
        # the builders' forms for this target's vectors (`builders.target_options`)
        self.conv_options = builders.target_options(
            "conv2d", "c", target.vector_lanes("float32") if target is not None else None)
        self.plan = NetworkPlan(name=name, buffers={}, steps=[], inputs=[], outputs=[])
        self.values: dict[str, Value] = {}
        self.converted: dict[tuple[str, str], Value] = {}
        self.skip: set[str] = set()
        self.counter = 0
        for index, name_ in enumerate(graph.inputs):
            shape = graph.shapes[name_]
            buffer = self._buffer(f"in{index}", shape, "input", index=index)
            self.plan.inputs.append(buffer)
            self.values[name_] = Value(buffer, shape)

    # ------------------------------------------------------------------ buffers and steps
    def _buffer(self, hint: str, shape: Sequence[int], kind: str, index: int = 0, alias: str = "") -> str:
        self.counter += 1
        name = f"{hint}_{self.counter}" if kind in ("activation", "constant") else hint
        self.plan.buffers[name] = Buffer(name, tuple(int(s) for s in shape), kind, index, alias=alias)
        return name

    def constant(self, data: np.ndarray, hint: str = "w") -> str:
        data = np.ascontiguousarray(np.asarray(data, dtype=np.float32))
        name = self._buffer(hint, data.shape or (1,), "constant")
        self.plan.weights[name] = data.reshape(data.shape or (1,))
        return name

    def activation(self, shape: Sequence[int], layout: str = PLAIN) -> Value:
        value = Value("", tuple(shape), layout)
        return Value(self._buffer("t", value.physical, "activation"), value.shape, layout)

    def kernel(self, label: str, text: ctext.Text | tuple[LoopNest, dict[str, int]],
               arguments: dict[str, str], zero: Sequence[str] = (), repeat: int = 1,
               strides: dict[str, int] | None = None) -> None:
        nest, params = (parse(text), {}) if isinstance(text, ctext.Text) else text
        # the network's weights stay where they are for its life: a kernel that packs one
        # packs it at the first call only
        weights = [arg for arg, buffer in arguments.items()
                   if self.plan.root(buffer).kind == "constant"]
        nest = nest.keeping(a.name for a in nest.inputs if a.name in weights)
        self.plan.steps.append(KernelStep(label, nest, arguments, tuple(zero), dict(params),
                                          repeat, dict(strides or {})))

    def const_of(self, name: str) -> np.ndarray | None:
        return self.graph.constants.get(name)

    def const_input(self, node: Node, position: int, what: str) -> np.ndarray | None:
        """The constant at input `position` of `node`, None where that input is omitted;
        `UnsupportedOperator` where it is computed at run time (`what` names it)."""
        if len(node.inputs) <= position or not node.inputs[position]:
            return None
        data = self.const_of(node.inputs[position])
        if data is None:
            raise UnsupportedOperator(node.name, node.op, f"{what} must be a constant")
        return data

    def ints_input(self, node: Node, position: int, attribute: str, what: str) -> tuple[int, ...] | None:
        """Integers a node takes as a constant input (newer opsets) or as an attribute (older
        ones): the input where given, else the attribute, else None."""
        data = self.const_input(node, position, what)
        if data is not None:
            return tuple(int(v) for v in data.reshape(-1))
        value = node.attr(attribute)
        return None if value is None else tuple(int(v) for v in value)

    # ------------------------------------------------------------------ layouts
    def as_layout(self, value: Value, layout: str) -> Value:
        if value.layout == layout:
            return value
        key = (value.buffer, layout)
        if key not in self.converted:
            out = self.activation(value.shape, layout)
            if layout == BLOCKED:
                text = ctext.to_blocked("to_blocked", value.shape)
            else:
                text = ctext.from_blocked("from_blocked", value.shape)
            self.kernel(f"layout {value.layout} -> {layout}", text,
                        {"y": out.buffer, "x": value.buffer})
            self.converted[key] = out
        return self.converted[key]

    def input(self, node: Node, position: int) -> Value:
        name = node.inputs[position]
        if name in self.values:
            return self.values[name]
        if name in self.graph.constants:  # a constant used as a runtime operand
            data = self.graph.constants[name].astype(np.float32)
            value = Value(self.constant(data, "c"), tuple(data.shape))
            self.values[name] = value
            return value
        raise ShapeError(name, f"{node.describe()} reads '{name}', which no node computes",
                         expected="a value of the graph", given=name)

    def plain(self, node: Node, position: int) -> Value:
        return self.as_layout(self.input(node, position), PLAIN)

    def single_reader(self, value: str) -> Node | None:
        """The only node that reads `value`, if it has exactly one and is not a graph output."""
        if value in self.graph.outputs:
            return None
        readers = self.graph.consumers(value)
        return readers[0] if len(readers) == 1 else None

    def bind(self, node: Node, value: Value, position: int = 0) -> None:
        self.values[node.outputs[position]] = value
