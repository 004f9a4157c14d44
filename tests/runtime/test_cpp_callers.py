"""Callers of the ahead-of-time output: the headers `polydl compile -o DIR` and
`polydl.onnx.write_library` write compile as C and as C++ (`POLYDL_RESTRICT` is `__restrict` in
C++), a C++ program links the libraries and computes what numpy computes, and every file written
gets the mode open() gives (0666 less the umask), not mkstemp's 0600."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import polydl.onnx
from polydl.cli import main
from polydl.runtime.cache import write_atomic

ROOT = Path(__file__).resolve().parents[2]
CXX = shutil.which("g++")
CC = shutil.which("cc") or shutil.which("gcc")
needs_cxx = pytest.mark.skipif(CXX is None or CC is None, reason="needs g++ and a C compiler")

SOFTMAX = """void softmax(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++) {
    float top = x[i][0];
    for (int j = 1; j < D; j++)
      if (x[i][j] > top) top = x[i][j];
    float sum = 0.0f;
    for (int j = 0; j < D; j++) {
      y[i][j] = expf(x[i][j] - top);
      sum += y[i][j];
    }
    for (int j = 0; j < D; j++)
      y[i][j] /= sum;
  }
}
"""

# two kernel headers in one C++ file (each defines POLYDL_RESTRICT); writes C then Y, raw floats
KERNELS_CPP = r"""
#include <cstdio>
#include <vector>

#include "matmul.h"
#include "softmax.h"
#include "matmul.h"

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  std::vector<float> a(5 * 7), b(7 * 3), c(5 * 3, 0.0f), x(3 * 6), y(3 * 6);
  for (int i = 0; i < 5; i++)
    for (int k = 0; k < 7; k++) a[i * 7 + k] = static_cast<float>(i + k) / 8.0f;
  for (int k = 0; k < 7; k++)
    for (int j = 0; j < 3; j++) b[k * 3 + j] = static_cast<float>(k - 2 * j) / 4.0f;
  for (int i = 0; i < 3 * 6; i++) x[i] = static_cast<float>(i % 7) - 3.0f;
  if (matmul(c.data(), a.data(), b.data()) != 0) return 3;
  if (softmax(y.data(), x.data()) != 0) return 4;
  std::FILE *f = std::fopen(argv[1], "wb");
  if (!f) return 5;
  std::fwrite(c.data(), sizeof(float), c.size(), f);
  std::fwrite(y.data(), sizeof(float), y.size(), f);
  return std::fclose(f) == 0 ? 0 : 6;
}
"""

# the same headers from C, strictly
KERNELS_C = """#include "matmul.h"
#include "softmax.h"
int use(float *c, const float *a, const float *b, float *y, const float *x) {
  return matmul(c, a, b) | softmax(y, x);
}
"""

NETWORK_CPP = r"""
#include <cstdio>
#include <vector>

#include "tiny.h"

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  std::vector<float> x(2 * 8), y(2 * 5);
  std::FILE *f = std::fopen(argv[1], "rb");
  if (!f || std::fread(x.data(), sizeof(float), x.size(), f) != x.size()) return 3;
  std::fclose(f);
  int status = tiny(x.data(), y.data());
  if (status != 0) return 10 - status;
  f = std::fopen(argv[2], "wb");
  if (!f) return 4;
  std::fwrite(y.data(), sizeof(float), y.size(), f);
  return std::fclose(f) == 0 ? 0 : 5;
}
"""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _build(source: Path, folder: Path, libraries: list[str]) -> Path:
    program = source.with_suffix("")
    done = subprocess.run([str(CXX), "-std=c++17", "-Wall", "-Werror", str(source), f"-I{folder}",
                           f"-L{folder}", *(f"-l{name}" for name in libraries),
                           f"-Wl,-rpath,{folder}", "-o", str(program)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return program


@needs_cxx
def test_kernels_are_called_from_cpp_and_their_headers_compile_as_c(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (tmp_path / "softmax.c").write_text(SOFTMAX)
    for spec, sizes in ((ROOT / "examples" / "matmul.c", ["M=5", "N=3", "K=7"]),
                        (tmp_path / "softmax.c", ["N=3", "D=6"])):
        assert main(["compile", str(spec), *(a for s in sizes for a in ("-p", s)),
                     "--machine", "generic", "-o", str(out)]) == 0
    header = (out / "matmul.h").read_text()
    assert "int matmul(float *POLYDL_RESTRICT C, const float *POLYDL_RESTRICT A, " \
           "const float *POLYDL_RESTRICT B);" in header
    assert "#define POLYDL_RESTRICT __restrict" in header

    source = tmp_path / "caller.cpp"
    source.write_text(KERNELS_CPP)
    program = _build(source, out, ["matmul", "softmax"])
    done = subprocess.run([str(program), str(tmp_path / "result.bin")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = np.frombuffer((tmp_path / "result.bin").read_bytes(), dtype=np.float32)
    i, k, j = np.arange(5)[:, None], np.arange(7), np.arange(3)
    a = (i + k) / 8.0
    b = (np.arange(7)[:, None] - 2 * j) / 4.0
    np.testing.assert_allclose(result[:15].reshape(5, 3), a @ b, rtol=1e-5, atol=1e-6)
    x = (np.arange(18) % 7 - 3.0).reshape(3, 6)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(result[15:].reshape(3, 6), e / e.sum(axis=1, keepdims=True),
                               rtol=1e-5, atol=1e-7)

    # as C: a strict C99 caller, and each definition after its own prototype (they agree)
    (tmp_path / "caller.c").write_text(KERNELS_C)
    checks = [[str(CC), "-std=c99", "-Wall", "-Werror", "-pedantic", "-fsyntax-only", f"-I{out}",
               str(tmp_path / "caller.c")]]
    checks += [[str(CC), "-std=c11", "-fsyntax-only", "-include", str(out / f"{name}.h"),
                str(out / f"{name}.c")] for name in ("matmul", "softmax")]
    for command in checks:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr

    expected = 0o666 & ~_umask()
    for name in ("matmul.c", "matmul.h", "libmatmul.so", "softmax.c", "softmax.h", "libsoftmax.so"):
        assert _mode(out / name) == expected, name
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left


def _tiny_model() -> tuple[Any, np.ndarray, np.ndarray]:
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(7)
    w = (rng.standard_normal((5, 8)) * 0.5).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1, name="gemm"),
         helper.make_node("Relu", ["g"], ["y"], name="relu")],
        "tiny",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 5])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model, w, b


@needs_cxx
def test_a_network_library_is_called_from_cpp(tmp_path: Path) -> None:
    model, w, b = _tiny_model()
    folder = tmp_path / "lib"
    paths = polydl.onnx.write_library(model, folder, name="tiny", machine="generic")
    assert set(paths) == {"source", "header", "library", "weights"}

    source = tmp_path / "caller.cpp"
    source.write_text(NETWORK_CPP)
    program = _build(source, folder, ["tiny"])
    x = np.random.default_rng(8).uniform(-1, 1, (2, 8)).astype(np.float32)
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    done = subprocess.run([str(program), str(tmp_path / "x.bin"), str(tmp_path / "y.bin")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    y = np.frombuffer((tmp_path / "y.bin").read_bytes(), dtype=np.float32).reshape(2, 5)
    want = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + b, 0.0)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)

    expected = 0o666 & ~_umask()
    for key in ("source", "header", "weights"):
        assert _mode(paths[key]) == expected, key
    # the library is the linker's output (executable bits too): no bit the umask takes away
    library = _mode(paths["library"])
    assert library & 0o644 == expected & 0o644 and library & _umask() == 0


def test_write_atomic_gives_the_mode_open_gives(tmp_path: Path) -> None:
    """Under a stricter umask too, and over a file that had mkstemp's 0600; nothing is left."""
    target = tmp_path / "out" / "k.h"
    target.parent.mkdir()
    target.write_bytes(b"old")
    target.chmod(0o600)
    previous = os.umask(0o027)
    try:
        write_atomic(target, b"new")
    finally:
        os.umask(previous)
    assert target.read_bytes() == b"new" and _mode(target) == 0o640
    write_atomic(target, b"again")
    assert _mode(target) == 0o666 & ~_umask()
    assert [p.name for p in target.parent.iterdir()] == ["k.h"]
