"""Identifiers that C keywords, the generated code, or its headers own are refused at their
position; names that merely look alike (shadowing a header function) compile and run."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import polydl
from polydl.errors import SpecError
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
        ("omp_get_thread_num", "omp_"), ("_t0", "_"), ("_pd_min", "_"),
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
