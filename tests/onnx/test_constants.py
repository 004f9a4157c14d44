"""Nodes computed from constants alone (`polydl.onnx.constants`) against onnx's reference
evaluator: their values and their element types."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from polydl.onnx.constants import EVALUATORS  # noqa: E402
from polydl.onnx.graph import Node  # noqa: E402


@pytest.mark.parametrize("start, limit, delta", [
    (np.int64(0), np.int64(10), np.int64(3)),
    (np.int32(5), np.int32(-4), np.int32(-2)),
    (np.float32(0.5), np.float32(3.0), np.float32(0.75)),
])
def test_range_keeps_the_scalars_type(start: np.generic, limit: np.generic, delta: np.generic) -> None:
    element = helper.np_dtype_to_tensor_dtype(np.dtype(type(start)))
    names = ("start", "limit", "delta")
    graph = helper.make_graph(
        [helper.make_node("Range", list(names), ["y"])], "range",
        [helper.make_tensor_value_info(n, element, []) for n in names],
        [helper.make_tensor_value_info("y", element, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inputs = [np.asarray(v) for v in (start, limit, delta)]
    (expected,) = ReferenceEvaluator(model).run(None, dict(zip(names, inputs, strict=True)))
    (got,) = EVALUATORS["Range"](Node("r", "Range", names, ("y",)), list(inputs))
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
