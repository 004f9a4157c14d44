"""C as PolyBench writes it: chained assignments, declarations without a value at function scope,
local arrays sized by parameters, and a parameter named `_fict_`. Each kernel is compared with
its numpy reference and with gcc -O0 of the same C; a read before any assignment is refused
where it stands; `_fict_` keeps its name wherever a caller sees it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl.bench import general
from polydl.cli import main
from polydl.errors import ShapeError
from polydl.frontends.c_loopnest import parse_c
from tests.frontends.marked import refused_at_mark

# PolyBench 4.2's deriche, with DATA_TYPE double and the _PB_ sizes as parameters
DERICHE = """\
void kernel_deriche(int w, int h, double alpha, const double imgIn[w][h], double imgOut[w][h],
                    double y1[w][h], double y2[w][h]) {
  int i, j;
  double xm1, tm1, ym1, ym2;
  double xp1, xp2;
  double tp1, tp2;
  double yp1, yp2;
  double k;
  double a1, a2, a3, a4, a5, a6, a7, a8;
  double b1, b2, c1, c2;
  k = (1.0 - exp(-alpha)) * (1.0 - exp(-alpha)) / (1.0 + 2.0 * alpha * exp(-alpha) - exp(2.0 * alpha));
  a1 = a5 = k;
  a2 = a6 = k * exp(-alpha) * (alpha - 1.0);
  a3 = a7 = k * exp(-alpha) * (alpha + 1.0);
  a4 = a8 = -k * exp(-2.0 * alpha);
  b1 = pow(2.0, -alpha);
  b2 = -exp(-2.0 * alpha);
  c1 = c2 = 1;
  for (i = 0; i < w; i++) {
    ym1 = 0.0;
    ym2 = 0.0;
    xm1 = 0.0;
    for (j = 0; j < h; j++) {
      y1[i][j] = a1 * imgIn[i][j] + a2 * xm1 + b1 * ym1 + b2 * ym2;
      xm1 = imgIn[i][j];
      ym2 = ym1;
      ym1 = y1[i][j];
    }
  }
  for (i = 0; i < w; i++) {
    yp1 = 0.0;
    yp2 = 0.0;
    xp1 = 0.0;
    xp2 = 0.0;
    for (j = h - 1; j >= 0; j--) {
      y2[i][j] = a3 * xp1 + a4 * xp2 + b1 * yp1 + b2 * yp2;
      xp2 = xp1;
      xp1 = imgIn[i][j];
      yp2 = yp1;
      yp1 = y2[i][j];
    }
  }
  for (i = 0; i < w; i++)
    for (j = 0; j < h; j++)
      imgOut[i][j] = c1 * (y1[i][j] + y2[i][j]);
  for (j = 0; j < h; j++) {
    tm1 = 0.0;
    ym1 = 0.0;
    ym2 = 0.0;
    for (i = 0; i < w; i++) {
      y1[i][j] = a5 * imgOut[i][j] + a6 * tm1 + b1 * ym1 + b2 * ym2;
      tm1 = imgOut[i][j];
      ym2 = ym1;
      ym1 = y1[i][j];
    }
  }
  for (j = 0; j < h; j++) {
    tp1 = 0.0;
    tp2 = 0.0;
    yp1 = 0.0;
    yp2 = 0.0;
    for (i = w - 1; i >= 0; i--) {
      y2[i][j] = a7 * tp1 + a8 * tp2 + b1 * yp1 + b2 * yp2;
      tp2 = tp1;
      tp1 = imgOut[i][j];
      yp2 = yp1;
      yp1 = y2[i][j];
    }
  }
  for (i = 0; i < w; i++)
    for (j = 0; j < h; j++)
      imgOut[i][j] = c2 * (y1[i][j] + y2[i][j]);
}
"""

# PolyBench 4.2's durbin: a local array sized by the parameter, scalars assigned later
DURBIN = """\
void kernel_durbin(int n, const double r[n], double y[n]) {
  double z[n];
  double alpha;
  double beta;
  double sum;
  int i, k;
  y[0] = -r[0];
  beta = 1.0;
  alpha = -r[0];
  for (k = 1; k < n; k++) {
    beta = (1 - alpha * alpha) * beta;
    sum = 0.0;
    for (i = 0; i < k; i++) {
      sum += r[k - i - 1] * y[i];
    }
    alpha = -(r[k] + sum) / beta;
    for (i = 0; i < k; i++) {
      z[i] = y[i] + alpha * y[k - i - 1];
    }
    for (i = 0; i < k; i++) {
      y[i] = z[i];
    }
    y[k] = alpha;
  }
}
"""

# PolyBench 4.2's fdtd-2d: the input named _fict_
FDTD_2D = """\
void kernel_fdtd_2d(int tmax, int nx, int ny, double ex[nx][ny], double ey[nx][ny],
                    double hz[nx][ny], const double _fict_[tmax]) {
  int t, i, j;
  for (t = 0; t < tmax; t++) {
    for (j = 0; j < ny; j++)
      ey[0][j] = _fict_[t];
    for (i = 1; i < nx; i++)
      for (j = 0; j < ny; j++)
        ey[i][j] = ey[i][j] - 0.5 * (hz[i][j] - hz[i - 1][j]);
    for (i = 0; i < nx; i++)
      for (j = 1; j < ny; j++)
        ex[i][j] = ex[i][j] - 0.5 * (hz[i][j] - hz[i][j - 1]);
    for (i = 0; i < nx - 1; i++)
      for (j = 0; j < ny - 1; j++)
        hz[i][j] = hz[i][j] - 0.7 * (ex[i][j + 1] - ex[i][j] + ey[i + 1][j] - ey[i][j]);
  }
}
"""

# float scalars declared, then assigned; a local array with a constant extent; a chain of
# assignments to array cells and a local, each converted to its target's type
LOCALS = """\
#define ROWS 3
void scaled(int n, const float x[ROWS][n], float y[ROWS][n], int q[n]) {
  float alpha;
  float tmp[ROWS][n];
  int i, j;
  alpha = 1.5f;
  for (i = 0; i < ROWS; i++)
    for (j = 0; j < n; j++)
      tmp[i][j] = alpha * x[i][j];
  for (j = 0; j < n; j++) {
    float s;
    if (j > 0)
      s = tmp[0][j - 1];
    else
      s = 0.25f;
    y[0][j] = q[j] = s * 10.0f;
  }
  for (i = 1; i < ROWS; i++)
    for (j = 0; j < n; j++)
      y[i][j] = tmp[i][j] + tmp[i - 1][j];
}
"""

KERNELS = {
    "deriche": (DERICHE, {"w": 5, "h": 7}),
    "durbin": (DURBIN, {"n": 9}),
    "fdtd_2d": (FDTD_2D, {"tmax": 3, "nx": 5, "ny": 6}),
    "locals": (LOCALS, {"n": 7}),
}


def _inputs(kernel: polydl.Kernel, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values: dict[str, np.ndarray] = {}
    for a in kernel.arguments:
        dtype = np.dtype(a.dtype)
        if not a.shape:
            values[a.name] = np.asarray(0.25, dtype)
        elif dtype.kind == "i":
            values[a.name] = rng.integers(-5, 5, a.shape).astype(dtype)
        else:
            values[a.name] = (rng.random(a.shape) * 0.5 + 0.25).astype(dtype)
    return values


def _gcc_O0(spec: Path, function: str, sizes: dict[str, int], arguments: list[general.Argument],
            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, np.ndarray]], None]:
    """The same C built by gcc -O0 (the benchmark's reference build, at -O0)."""
    monkeypatch.setitem(general.COMPILERS, "gcc", ["gcc", "-O0"])
    return general.reference_caller(general.build_reference("gcc", spec, function, sizes, tmp_path),
                                    function, arguments)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_polybench_form_equals_numpy_and_gcc(name: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    source, sizes = KERNELS[name]
    spec = tmp_path / f"{name}.c"
    spec.write_text(source)
    kernel = polydl.compile(spec, sizes)
    arguments = [general.Argument(a.name, np.dtype(a.dtype), a.shape, a.is_input)
                 for a in kernel.arguments]
    pristine = _inputs(kernel)
    outputs = [a.name for a in kernel.outputs]

    def fresh() -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in pristine.items()}

    got = fresh()
    kernel(*[got[a.name] for a in kernel.inputs], **{o: got[o] for o in outputs})
    want = fresh()
    reference = kernel.reference(*[want[a.name] for a in kernel.inputs],
                                 **{o: want[o] for o in outputs})
    reference = reference if isinstance(reference, tuple) else (reference,)
    built = fresh()
    _gcc_O0(spec, kernel.name, sizes, arguments, tmp_path, monkeypatch)(built)
    for output, ref in zip(outputs, reference, strict=True):
        assert np.abs(built[output]).max() > 0  # the reference build computed something
        np.testing.assert_allclose(got[output], ref, rtol=1e-5, atol=1e-6, err_msg=output)
        np.testing.assert_allclose(got[output], built[output], rtol=1e-5, atol=1e-6, err_msg=output)


def test_durbin_solves_its_toeplitz_system(tmp_path: Path) -> None:
    """An independent check of the local array: y solves T y = -r, T Toeplitz of (1, r...)."""
    n = 8
    kernel = polydl.compile(_spec_text(DURBIN, tmp_path), {"n": n})
    r = np.random.default_rng(1).random(n) * 0.2
    y = kernel(r)
    t = np.array([[1.0 if i == j else r[abs(i - j) - 1] for j in range(n)] for i in range(n)])
    np.testing.assert_allclose(t @ y, -r, rtol=1e-9, atol=1e-12)
    assert [a.name for a in kernel.arguments] == ["r", "y"]  # z is neither input nor output


def _spec_text(text: str, folder: Path) -> Path:
    path = folder / "spec.c"
    path.write_text(text)
    return path


def test_chained_assignment_reads_right_to_left() -> None:
    nest = parse_c("void f(int N, const float x[N], float y[N], double z[N]) {\n"
                   "  for (int i = 0; i < N; i++) y[i] = z[i] = x[i] / 3.0;\n}\n")
    first, second = nest.statements()
    assert (first.target.array, second.target.array) == ("z", "y")
    assert second.value.access.array == "z"  # y takes z's value after z's assignment


READ_BEFORE_ASSIGNMENT = {
    "never": "  float alpha;\n  y[0] = $alpha * x[0];\n",
    "compound": "  float s;\n  $s += x[0];\n  y[0] = s;\n",
    "later-in-loop": "  float s;\n  for (int i = 0; i < N; i++) {\n    y[i] = $s;\n    s = x[i];\n  }\n",
    "after-loop": "  float s;\n  for (int i = 0; i < N; i++)\n    s = x[i];\n  y[0] = $s;\n",
    "one-branch": "  float s;\n  if (N > 2)\n    s = x[0];\n  y[0] = $s;\n",
    "data-branch": "  float s;\n  if (x[0] > 0.0f)\n    s = x[0];\n  y[0] = $s;\n",
    "own-value": "  float s = $s + 1.0f;\n  y[0] = s;\n",
}


@pytest.mark.parametrize("body", READ_BEFORE_ASSIGNMENT.values(), ids=READ_BEFORE_ASSIGNMENT)
def test_read_before_assignment_is_refused_at_the_read(body: str) -> None:
    err = refused_at_mark("void f(int N, const float x[N], float y[N]) {\n" + body + "}\n",
                          "is read before it is assigned")
    assert err.message.startswith("'s'") or err.message.startswith("'alpha'")


def test_assigned_on_every_path_is_accepted() -> None:
    parse_c("void f(int N, const float x[N], float y[N]) {\n  float s, t;\n"
            "  if (N > 2) s = x[0]; else s = x[1];\n"
            "  if (x[0] > 0.0f) t = x[0]; else t = -x[0];\n"
            "  y[0] = s + t;\n}\n")


def test_local_array_in_a_loop_is_refused() -> None:
    refused_at_mark("void f(int N, const float x[N], float y[N]) {\n"
                    "  for (int i = 0; i < N; i++) {\n    float $z[N];\n    y[i] = x[i];\n  }\n}\n",
                    "outside the loops")


# ------------------------------------------------------------------ _fict_ keeps its name


@pytest.fixture(scope="module")
def fdtd(tmp_path_factory: pytest.TempPathFactory) -> polydl.Kernel:
    return polydl.compile(_spec_text(FDTD_2D, tmp_path_factory.mktemp("fdtd")), KERNELS["fdtd_2d"][1])


def test_fict_keeps_its_name_in_arguments_and_inputs(fdtd: polydl.Kernel) -> None:
    assert [a.name for a in fdtd.arguments] == ["ex", "ey", "hz", "_fict_"]
    assert [a.name for a in fdtd.inputs] == ["_fict_"]
    assert "_pd_" not in fdtd.header


def test_fict_passes_by_keyword_and_by_the_arguments_list(fdtd: polydl.Kernel) -> None:
    values = _inputs(fdtd)
    by_keyword = {k: v.copy() for k, v in values.items()}
    fdtd(**by_keyword)
    by_list = {k: v.copy() for k, v in values.items()}
    fdtd(by_list["_fict_"], **{a.name: by_list[a.name] for a in fdtd.outputs})
    want = fdtd.reference(**values)
    for a, ref in zip(fdtd.outputs, want, strict=True):
        np.testing.assert_array_equal(by_keyword[a.name], by_list[a.name])
        np.testing.assert_allclose(by_keyword[a.name], ref, rtol=1e-12)


def test_fict_is_named_in_a_shape_error(fdtd: polydl.Kernel) -> None:
    with pytest.raises(ShapeError) as info:
        fdtd(np.zeros(2))
    assert info.value.array == "_fict_"
    assert "_fict_" in str(info.value) and "_pd_" not in str(info.value)


def test_fict_keeps_its_name_in_the_aot_header(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sizes = KERNELS["fdtd_2d"][1]
    assert main(["compile", str(_spec_text(FDTD_2D, tmp_path)),
                 *[x for k, v in sizes.items() for x in ("-p", f"{k}={v}")], "-o", str(out)]) == 0
    header = (out / "kernel_fdtd_2d.h").read_text()
    assert "*POLYDL_RESTRICT _fict_)" in header or "_fict_)" in header
    assert "_pd_" not in header
