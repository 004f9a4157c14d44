"""A network as an ahead-of-time library: written by `polydl.onnx.write_library` (and `polydl
compile MODEL.onnx -o DIR`), linked into a plain C program with no Python, and checked against
onnxruntime; and the network cache: a second compile of the same model lowers nothing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

pytest.importorskip("onnxruntime")

import polydl.onnx  # noqa: E402
from polydl.cli import main  # noqa: E402
from polydl.onnx import zoo  # noqa: E402
from tests.onnx.reference import make_model, random, run_onnxruntime  # noqa: E402

MAIN_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include "NAME.h"

/* reads IN floats from argv[1], runs the network, writes OUT floats to argv[2] */
int main(int argc, char **argv) {
  float *x = malloc(sizeof(float) * IN), *y = malloc(sizeof(float) * OUT);
  FILE *f = fopen(argv[1], "rb");
  if (!f || fread(x, sizeof(float), IN, f) != IN) return 10;
  fclose(f);
  int status = NAME(x, y);
  if (status != 0) { printf("status %d\n", status); return 20; }
  f = fopen(argv[2], "wb");
  fwrite(y, sizeof(float), OUT, f);
  fclose(f);
  return 0;
}
"""


def _program(folder: Path, name: str, x: np.ndarray, outputs: int) -> Path:
    source = folder / "main.c"
    source.write_text(MAIN_C.replace("NAME", name).replace("IN", str(x.size))
                      .replace("OUT", str(outputs)))
    program = folder / "main"
    subprocess.run([shutil.which("cc") or "cc", str(source), f"-I{folder}", f"-L{folder}",
                    f"-l{name}", f"-Wl,-rpath,{folder}", "-o", str(program)], check=True)
    return program


def _run(program: Path, x: np.ndarray, folder: Path, count: int) -> tuple[int, np.ndarray]:
    (folder / "x.bin").write_bytes(x.tobytes())
    done = subprocess.run([str(program), str(folder / "x.bin"), str(folder / "y.bin")],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return done.returncode, np.zeros(0, np.float32)
    return 0, np.frombuffer((folder / "y.bin").read_bytes(), dtype=np.float32)[:count]


@pytest.mark.slow
def test_resnet18_library_called_from_c(tmp_path: Path) -> None:
    model = zoo.resnet18(batch=1)
    paths = polydl.onnx.write_library(model, tmp_path, name="resnet18")
    assert set(paths) == {"source", "header", "library", "weights"}
    assert "int resnet18(const float *in0, float *out0);" in paths["header"].read_text()
    x = random((1, 3, 224, 224), seed=3)
    program = _program(tmp_path, "resnet18", x, 1000)
    status, y = _run(program, x, tmp_path, 1000)
    assert status == 0
    expected = run_onnxruntime(model, {"input": x})[0].reshape(-1)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))

    paths["weights"].unlink()  # the library says it cannot read its weights, it does not crash
    status, _ = _run(program, x, tmp_path, 1000)
    assert status == 20


def _small_model() -> onnx.ModelProto:
    from onnx import helper

    from tests.onnx.reference import make_model

    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2,
               "b": rng.standard_normal(16).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return make_model(nodes, {"x": random((1, 8, 6, 6))}, ["y"], weights)


def test_embedded_weights_and_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "small.onnx"
    onnx.save(_small_model(), path)
    folder = tmp_path / "lib"
    assert main(["compile", str(path), "-o", str(folder), "--name", "small", "--embed-weights"]) == 0
    printed = capsys.readouterr().out
    assert "libsmall.so" in printed and "\nweights " not in printed
    assert not (folder / "small.weights").exists()
    x = random((1, 8, 6, 6), seed=1)
    status, y = _run(_program(folder, "small", x, 16 * 36), x, folder, 16 * 36)
    assert status == 0
    expected = run_onnxruntime(_small_model(), {"x": x})[0].reshape(-1)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_run_command_compares_with_onnxruntime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "small.onnx"
    onnx.save(_small_model(), path)
    assert main(["run", str(path), "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "verify   ok" in out and "time" in out


def test_command_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "small.onnx"
    onnx.save(_small_model(), path)
    assert main(["compile", str(path), "-p", "N=2"]) == 1
    assert "apply to loop-nest specs" in capsys.readouterr().err
    assert main(["compile", str(path), "--name", "not a name"]) == 1
    assert "C identifier" in capsys.readouterr().err
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    assert main(["run", str(tmp_path / "broken.onnx")]) == 1
    assert "not a readable ONNX model" in capsys.readouterr().err


def test_second_compile_comes_from_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _small_model()
    first = polydl.onnx.compile(model)
    import polydl.onnx as package

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("lowered again")

    monkeypatch.setattr(package, "_lowered", refuse)
    second = polydl.onnx.compile(model)
    x = random((1, 8, 6, 6), seed=2)
    np.testing.assert_array_equal(first(x), second(x))


def test_networks_of_one_library_keep_packed_copies_of_their_own_weights() -> None:
    """A classifier's weights are packed at the first call and the copy kept (the network's
    weights never change); two networks of one structure share the library, and handing it
    the other network's weights makes the kernel pack again."""
    x = random((1, 2048), seed=1)
    nets, weights = [], []
    for seed in (2, 3):
        w = random((2048, 1000), seed=seed)
        model = make_model([helper.make_node("Gemm", ["x", "w"], ["y"])], {"x": x}, ["y"], {"w": w})
        nets.append(polydl.onnx.compile(model, machine="x86-64-v3"))
        weights.append(w)
    assert nets[0].library_path == nets[1].library_path
    assert "B packed" in nets[0].explain()  # the weights, packed once and kept
    for _ in range(2):
        for net, w in zip(nets, weights, strict=True):
            np.testing.assert_allclose(net(x), x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    # a caller of the library that changes the weights in place hands them over again
    # (`NAME_set_weights`): the kept copy is packed anew, though at the same address
    net = nets[0]
    net(x)
    net._weights.view(np.float32)[:] *= 2.0
    net._set_weights(net._ffi.cast("void *", net._weights.ctypes.data))
    np.testing.assert_allclose(net(x), 2.0 * (x.astype(np.float64) @ weights[0]), rtol=1e-4,
                               atol=1e-4)
