"""Whole image classifiers through polydl.onnx against onnxruntime: the zoo's torchvision-shaped
models (reduced ones always, full size under `slow`) and, where torchvision is installed,
torchvision's own export. Outputs agree within 1e-4 of the largest logit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

import polydl.onnx  # noqa: E402
from polydl.onnx import zoo  # noqa: E402
from tests.onnx.reference import random, run_onnxruntime  # noqa: E402

# Every layer of the full model, at a quarter of the channels and 64x64 pixels.
REDUCED: dict[str, Any] = dict(width=0.25, image_size=64)


def check_classifier(model: onnx.ModelProto | str, x: np.ndarray, **options: Any) -> None:
    """Compile once, run `x`, compare the logits with onnxruntime's within 1e-4 relative to
    their largest magnitude."""
    compiled = polydl.onnx.compile(model, **options)
    reference = onnx.load(model) if isinstance(model, str) else model
    (want,) = run_onnxruntime(reference, {"input": x})
    got = compiled(x)
    assert isinstance(got, np.ndarray) and got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_model_is_valid_and_folding_keeps_its_function(name: str) -> None:
    """The zoo alone (onnxruntime only): a checked model with the declared input and output,
    the same logits with BatchNormalization nodes kept or folded into the Convs."""
    folded = zoo.MODELS[name](batch=None, **REDUCED)
    kept = zoo.MODELS[name](batch=None, fold_batchnorm=False, **REDUCED)
    onnx.checker.check_model(folded, full_check=True)
    assert [i.name for i in folded.graph.input] == ["input"]
    assert [o.name for o in folded.graph.output] == ["output"]
    assert folded.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    assert "BatchNormalization" not in {n.op_type for n in folded.graph.node}
    assert "BatchNormalization" in {n.op_type for n in kept.graph.node}
    x = random((2, 3, 64, 64))
    (a,) = run_onnxruntime(folded, {"input": x})
    (b,) = run_onnxruntime(kept, {"input": x})
    assert a.shape == (2, 1000) and np.isfinite(a).all() and np.abs(a).max() > 0.1
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(a).max()))


@pytest.mark.slow
def test_zoo_resnet18_reduced_symbolic_batch_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "resnet18.onnx"
    onnx.save(zoo.resnet18(batch=None, **REDUCED), path)
    check_classifier(str(path), random((2, 3, 64, 64)), batch=2)


@pytest.mark.slow
def test_zoo_mobilenet_v2_reduced_with_batchnorm_nodes() -> None:
    model = zoo.mobilenet_v2(batch=2, fold_batchnorm=False, **REDUCED)
    check_classifier(model, random((2, 3, 64, 64)))


@pytest.mark.slow
def test_zoo_resnext50_reduced_grouped_convolutions() -> None:
    check_classifier(zoo.resnext50_32x4d(batch=1, **REDUCED), random((1, 3, 64, 64)))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_zoo_model_full_size(name: str) -> None:
    check_classifier(zoo.MODELS[name](batch=1), random((1, 3, 224, 224)))


def structure(model: onnx.ModelProto) -> list[tuple[Any, ...]]:
    """A graph as a list of (op type, name, attributes, inputs) with every input told by what
    it is (an initializer's shape, which node's output, a graph input), not by its name."""
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    producers = {out: (k, j) for k, n in enumerate(model.graph.node) for j, out in enumerate(n.output)}

    def attribute(a: onnx.AttributeProto) -> Any:
        value = helper.get_attribute_value(a)
        if isinstance(value, onnx.TensorProto):
            array = numpy_helper.to_array(value)
            return array.dtype.str, array.shape, array.tolist()
        return value

    return [(n.op_type, n.name, {a.name: attribute(a) for a in n.attribute},
             [("weight", weights[i]) if i in weights else
              ("node", producers[i]) if i in producers else ("input", i) for i in n.input])
            for n in model.graph.node]


@pytest.mark.parametrize("name, fold", [(n, True) for n in sorted(zoo.MODELS)]
                         + [("resnet18", False), ("mobilenet_v2", False)])
def test_zoo_matches_torchvision_export_node_for_node(name: str, fold: bool,
                                                      tmp_path: Path) -> None:
    """The zoo's graph is the legacy exporter's, node for node: op types, names, attributes
    and what feeds each input (BatchNorm nodes kept: exported with TrainingMode.PRESERVE)."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    module = getattr(torchvision.models, name)(weights=None).eval()
    path = tmp_path / f"{name}.onnx"
    mode = torch.onnx.TrainingMode.EVAL if fold else torch.onnx.TrainingMode.PRESERVE
    with torch.no_grad():  # no two equal tensors, which the exporter would merge
        for bn in (m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            for tensor in (bn.weight, bn.bias, bn.running_mean, bn.running_var):
                tensor.uniform_(0.5, 1.5)
    torch.onnx.export(module, (torch.zeros(1, 3, 64, 64),), str(path), dynamo=False,
                      opset_version=17, input_names=["input"], output_names=["output"],
                      training=mode, dynamic_axes={"input": {0: "N"}, "output": {0: "N"}})
    exported = onnx.load(str(path))
    ours = zoo.MODELS[name](batch=None, fold_batchnorm=fold, image_size=64)
    assert structure(ours) == structure(exported)
    assert ours.graph.input == exported.graph.input
    assert ours.graph.output == exported.graph.output
    assert [(o.domain, o.version) for o in ours.opset_import] == \
        [(o.domain, o.version) for o in exported.opset_import]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "resnet50"])
def test_torchvision_export(name: str, tmp_path: Path) -> None:
    """torchvision's model (random weights) as torch.onnx.export's legacy exporter writes it:
    BatchNorm folded, dynamic batch axis, read from the file."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(model, (torch.zeros(1, 3, 224, 224),), str(path), dynamo=False,
                      opset_version=17, input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    check_classifier(str(path), random((2, 3, 224, 224)), batch=2)
