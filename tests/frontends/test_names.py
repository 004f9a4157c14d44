"""Identifiers that C keywords, the generated code, or its headers own are refused at their
position; names that merely look alike (shadowing a header function) compile and run."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

import polydl
from polydl.errors import ShapeError, SpecError
from polydl.frontends.c_loopnest import parse_c
from polydl.frontends.c_names import refusal
from tests.kernels import run_and_check

HEADERS = ("math.h", "stddef.h", "stdint.h", "stdlib.h", "immintrin.h", "omp.h")
CC = shutil.which("cc")


def _preprocess(*flags: str) -> str:
    source = "".join(f"#include <{h}>\n" for h in HEADERS)
    return subprocess.run(
        ["cc", "-std=gnu11", "-fopenmp", "-march=native", *flags, "-x", "c", "-"],
        input=source, capture_output=True, text=True, check=True,
    ).stdout


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
def test_every_macro_of_the_generated_headers_is_refused() -> None:
    names = {line.split()[1].split("(")[0] for line in _preprocess("-dM", "-E").splitlines()}
    missed = sorted(n for n in names if not n.startswith("_") and refusal(n) is None)
    assert not missed


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
def test_every_function_of_the_generated_headers_is_refused_as_kernel_name() -> None:
    text = "\n".join(ln for ln in _preprocess("-E").splitlines() if not ln.startswith("#"))
    # a name followed by '(' after a type: declarations and prototypes of file-scope functions
    declared = set(re.findall(r"\b(?:extern\s+)?[A-Za-z_][\w\s\*]*?\b([a-z][A-Za-z0-9_]*)\s*\(", text))
    keywords = {"if", "while", "for", "return", "sizeof", "switch", "typeof", "int", "volatile"}
    missed = sorted(n for n in declared - keywords if refusal(n, is_function=True) is None)
    assert len(declared) > 300 and not missed, missed


def _refused(text: str, keyword: str) -> SpecError:
    marked = text.index("$")
    text = text.replace("$", "", 1)
    with pytest.raises(SpecError) as info:
        parse_c(text, "n.c")
    err = info.value
    assert (err.line, err.column) == (1, marked + 1), err.message
    assert keyword in err.message
    return err


@pytest.mark.parametrize(
    "name, keyword",
    [
        ("linux", "macro"), ("unix", "macro"), ("NULL", "reserved"), ("INFINITY", "reserved"),
        ("PRId64", "macro"), ("EXIT_SUCCESS", "macro"), ("RAND_MAX", "macro"),
        ("size_t", "reserved"), ("div_t", "type"), ("libxsmm_init", "libxsmm_"),
        ("LIBXSMM_VERSION", "LIBXSMM_"), ("polydl_gflops", "polydl_"), ("POLYDL_F_H", "POLYDL_"),
        ("omp_get_thread_num", "omp_"),
    ],
)
def test_names_the_generated_code_or_its_headers_own_are_refused(name: str, keyword: str) -> None:
    _refused(f"void f(int N, float ${name}[N]) {{ }}", keyword)


@pytest.mark.parametrize("name", ["y0", "j1", "rand", "gamma", "drem", "system"])
def test_header_functions_cannot_name_the_kernel(name: str) -> None:
    _refused(f"void ${name}(float v[1]) {{ v[0] = 1; }}", "already declared")


@pytest.mark.parametrize("keyword", ["restrict", "inline", "_Bool", "register", "int", "goto", "sizeof"])
def test_c_keywords_cannot_be_names(keyword: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_c(f"void f(int N, float {keyword}[N]) {{ }}", "n.c")
    assert info.value.line == 1 and info.value.column >= 1


def test_names_generated_code_uses_inside_microkernels_are_free_for_the_spec() -> None:
    """The microkernels' locals (a, b, c, ap, bk, kk, m0, ...) live in their own functions."""
    text = """void y0(int m0, int n0, int kk, float c[m0][n0], const float a[m0][kk], const float b[kk][n0]) {
  for (int ap = 0; ap < m0; ap++)
    for (int bk = 0; bk < n0; bk++)
      for (int cp = 0; cp < kk; cp++)
        c[ap][bk] += a[ap][cp] * b[cp][bk];
}
""".replace("void y0(", "void gemm(")
    k = polydl.compile(text, {"m0": 37, "n0": 20, "kk": 9})
    assert k.schedule.microkernel is not None
    run_and_check(k, lambda a, b: a.astype("float64") @ b)


def test_header_function_names_may_name_arrays_and_loops() -> None:
    text = """void shift(int N, float y0[N], const float j1[N]) {
  for (int y1 = 0; y1 < N; y1++)
    y0[y1] = j1[y1] + 1.0f;
}
"""
    run_and_check(polydl.compile(text, {"N": 13}), lambda j1: j1 + 1)


UNDERSCORED = """void f(int _N, float _y[_N][_N], const float _t0[_N][_N], const float __x[_N],
       float _pd_min) {
  for (int _i = 0; _i < _N; _i++)
    for (int _t1 = 0; _t1 < _N; _t1++) {
      float _s = _t0[_i][_t1] * __x[_t1];
      _y[_i][_t1] += _s + _pd_min + _i;
    }
}
"""


def test_names_beginning_with_underscore_are_renamed_not_refused() -> None:
    """Arrays, sizes, scalars, loop variables and locals named like generated code (`_t0`,
    `_pd_min`) compile; the kernel takes them by the spec's spelling."""
    k = polydl.compile(UNDERSCORED, {"_N": 6})
    assert [a.spelling for a in k.arguments] == ["_y", "_t0", "__x", "_pd_min"]
    rng = np.random.default_rng(0)
    t0, x = rng.random((6, 6), dtype=np.float32), rng.random(6, dtype=np.float32)
    want = t0 * x + 2.0 + np.arange(6)[:, None]
    np.testing.assert_allclose(k(t0, x, 2.0), want, rtol=1e-6)
    y = np.ones((6, 6), np.float32)
    k(_t0=t0, __x=x, _pd_min=2.0, _y=y)
    np.testing.assert_allclose(y, want + 1, rtol=1e-6)
    np.testing.assert_allclose(k.reference(t0, x, 2.0), want, rtol=1e-6)
    assert "_N=6" in repr(k)


def test_underscored_names_keep_their_spelling_in_errors() -> None:
    k = polydl.compile(UNDERSCORED, {"_N": 3})
    t0 = np.zeros((3, 3), np.float32)
    with pytest.raises(ShapeError) as info:
        k(t0, np.zeros(3, np.float64), 1.0)
    assert info.value.array == "__x" and "__x" in str(info.value)
    with pytest.raises(ShapeError, match="has no argument 'y' .*expected _y, _t0, __x, _pd_min"):
        k(t0, np.zeros(3, np.float32), 1.0, y=t0)
    with pytest.raises(SpecError, match=r"access _t0\[\(_i \+ 1\)\]\[_t1\] reads outside array "
                                        r"'_t0' \(extent _Nx_N\) at iteration _i=2"):
        polydl.compile(UNDERSCORED.replace("_t0[_i][_t1]", "_t0[_i + 1][_t1]"), {"_N": 3})
    with pytest.raises(SpecError, match="missing value for size parameter '_N'"):
        polydl.compile(UNDERSCORED, {})
    with pytest.raises(SpecError, match="undeclared identifier '_j'"):
        polydl.compile(UNDERSCORED.replace("+ _i;", "+ _j;"), {"_N": 3})


def test_underscored_names_meet_no_generated_name() -> None:
    """A spec's `_t0` and `_pd_min` are not the generated iterator and helper: the C text holds
    them renamed, and explain shows the spec's spelling."""
    from polydl.api import lower
    from polydl.driver.explain import explain
    from polydl.frontends import load_spec

    nest, params = load_spec(UNDERSCORED, {"_N": 4})
    compilation = lower(nest, params)
    assert "_pd___t0" in compilation.code.source and "_pd___pd_min" in compilation.code.source
    text = explain(compilation)
    assert "_t0 (input)" in text and "_pd___t0" not in text and "_pd___pd_min" not in text


def test_the_function_name_may_not_begin_with_underscore() -> None:
    _refused("void $_f(float v[1]) { v[0] = 1; }", "reserved for generated code")
