"""Small ONNX graphs for tests, and the one helper that compiles a model with polydl.onnx, runs
it and compares every output with onnxruntime's (the independent reference)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime
from onnx import helper, numpy_helper

import polydl.onnx

OPSET = 17
RTOL = 1e-4
ATOL = 1e-5


def random(shape: Sequence[int], seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    initializers: Mapping[str, np.ndarray] | None = None,
    *,
    opset: int = OPSET,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
) -> onnx.ModelProto:
    """A checked model of `nodes`: graph inputs declared from the example arrays `inputs` (in
    that order; `input_shapes` overrides a declared shape, e.g. with a symbolic batch), weights
    from `initializers`, and the outputs' types and shapes filled in by ONNX's inference (as an
    exporter writes them: no value_info for intermediate values)."""
    shapes = dict(input_shapes or {})
    graph = helper.make_graph(
        list(nodes), "test_graph",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                       list(shapes.get(name, value.shape)))
         for name, value in inputs.items()],
        [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None) for name in outputs],
        initializer=[numpy_helper.from_array(np.asarray(value), name)
                     for name, value in (initializers or {}).items()],
    )
    model = helper.make_model(graph, producer_name="polydl-tests",
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.value_info[:]
    onnx.checker.check_model(model, full_check=True)
    return model


def input_names(model: onnx.ModelProto) -> list[str]:
    weights = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in weights]


def output_names(model: onnx.ModelProto) -> list[str]:
    return [o.name for o in model.graph.output]


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def as_tuple(result: Any) -> tuple[np.ndarray, ...]:
    return result if isinstance(result, tuple) else (result,)


def assert_matches(got: Sequence[np.ndarray], want: Sequence[np.ndarray], names: Sequence[str],
                   rtol: float = RTOL, atol: float = ATOL) -> None:
    assert len(got) == len(want), f"{len(got)} outputs, onnxruntime gives {len(want)}"
    for name, g, w in zip(names, got, want, strict=True):
        assert isinstance(g, np.ndarray), f"{name}: {type(g).__name__}, not an ndarray"
        assert g.shape == w.shape, f"{name}: shape {g.shape}, onnxruntime {w.shape}"
        assert g.dtype == w.dtype, f"{name}: dtype {g.dtype}, onnxruntime {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)


def check(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, rtol: float = RTOL,
          atol: float = ATOL, **compile_options: Any) -> Any:
    """Compile `model` once, call it with `feeds` in the graph's input order and compare each
    output with onnxruntime's; returns the compiled model."""
    compiled = polydl.onnx.compile(model, **compile_options)
    got = as_tuple(compiled(*(feeds[name] for name in input_names(model))))
    assert_matches(got, run_onnxruntime(model, feeds), output_names(model), rtol, atol)
    return compiled
