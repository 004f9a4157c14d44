"""The C preprocessor before parsing: `#define` (sizes too), function-like macros, `#include` of
local headers, `#if`/`#ifdef`, `-D`/`-I` (`defines=`, `include_dirs=`); each accepted spec runs
against numpy, and every error still points at the user's own file, line and column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl import settings
from polydl.cli import main
from polydl.errors import ArgumentError, SpecError
from polydl.frontends.c_loopnest import parse_c

RNG = np.random.default_rng(11)

SIZES = """#include <math.h>
#define N 37   /* a size the spec fixes: no parameter */
#define M (N + 3)
#define IDX(i, j) x[(i)][(j)]
#define SQ(v) ((v) * (v))
void sq(double y[N][M], const double x[N][M]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++)
      y[i][j] = SQ(IDX(i, j)) + sqrt(fabs(IDX(i, j)));
}
"""


def test_macro_sizes_become_constants_and_function_like_macros_expand() -> None:
    k = polydl.compile(SIZES)
    assert k.params == {} and [a.shape for a in k.arguments] == [(37, 40), (37, 40)]
    x = RNG.standard_normal((37, 40))
    np.testing.assert_allclose(k(x), x * x + np.sqrt(np.abs(x)), rtol=1e-12)


CONFIGURABLE = """#ifndef N
#define N 8
#endif
#pragma omp parallel for
void scale(float y[N], const float x[N]) {
  for (int i = 0; i < N; i++) {
#if defined(SHIFT) && N > 32
    y[i] = SCALE * x[i] + SHIFT;
#else
    y[i] = x[i];
#endif
  }
}
"""


@pytest.mark.parametrize("defines, n, want", [
    (None, 8, lambda x: x),
    ({"N": 64, "SCALE": "2.0f", "SHIFT": 1}, 64, lambda x: 2 * x + 1),
    ({"N": 16, "SCALE": 2, "SHIFT": 1}, 16, lambda x: x),  # N > 32 fails: the #else
    (["N=40", "SCALE=3", "SHIFT"], 40, lambda x: 3 * x + 1),  # a bare SHIFT is 1
])
def test_defines_choose_sizes_and_code(defines, n, want) -> None:  # type: ignore[no-untyped-def]
    k = polydl.compile(CONFIGURABLE, defines=defines)
    x = RNG.standard_normal(n).astype(np.float32)
    np.testing.assert_allclose(k(x), want(x), rtol=1e-6)


def _project(tmp_path: Path) -> Path:
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "shapes.h").write_text(
        "/* shared sizes */\n#define ROWS 12\n#define COLS 10\n")
    (tmp_path / "ops.h").write_text("#define AXPY(a, x, y) ((a) * (x) + (y))\n")
    spec = tmp_path / "axpy.c"
    spec.write_text(
        '#include "ops.h"\n#include <shapes.h>\n'
        "void axpy(int K, float z[ROWS][COLS], const float x[ROWS][COLS], const float w[K]) {\n"
        "  for (int i = 0; i < ROWS; i++)\n"
        "    for (int j = 0; j < COLS; j++)\n"
        "      z[i][j] = AXPY(w[0], x[i][j], w[K - 1]);\n"
        "}\n")
    return spec


def test_headers_from_the_spec_folder_and_include_dirs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = _project(tmp_path)
    k = polydl.compile(spec, {"K": 3}, include_dirs=[tmp_path / "include"])
    x = RNG.standard_normal((12, 10)).astype(np.float32)
    w = np.array([2.0, 0.0, -1.0], np.float32)
    np.testing.assert_allclose(k(x, w), 2 * x - 1, rtol=1e-6)
    with pytest.raises(SpecError, match="shapes.h: No such file") as info:
        polydl.compile(spec, {"K": 3})
    assert (info.value.file, info.value.line, info.value.column) == (str(spec), 2, 10)


def test_the_command_line_takes_defines_and_include_dirs(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    spec = _project(tmp_path)
    include = str(tmp_path / "include")
    assert main(["run", str(spec), "-p", "K=2", "-I", include, "--repeat", "1"]) == 0
    assert "verify   ok" in capsys.readouterr().out
    path = tmp_path / "scale.c"
    path.write_text(CONFIGURABLE)
    assert main(["compile", str(path), "-D", "N=48", "-DSCALE=2.0f", "-D", "SHIFT"]) == 0
    source = capsys.readouterr().out
    assert "2.0f" in source and "47" in source  # the constant size bounds the loop
    assert main(["explain", str(path), "--define", "N=5"]) == 0
    assert "y: float32[5]" in capsys.readouterr().out
    assert main(["compile", str(path), "-D", "1N=2"]) == 1
    assert "not a macro name" in capsys.readouterr().err


# ----------------------------------------------------------------------------- positions


def _error(text: str, **kw: object) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_c(text, "p.c", **kw)  # type: ignore[arg-type]
    return info.value


def test_errors_point_into_the_original_text_after_preprocessing() -> None:
    """Whitespace the preprocessor collapses and comments it drops do not move a caret."""
    err = _error(
        "#define N 8\n"
        "void f(float   y[N],   const float x[N]) {\n"
        "  for (int i = 0; i < N; i++)   /* note */   y[i] = x[i]  +    q;\n"
        "}\n")
    assert (err.file, err.line, err.column) == ("p.c", 3, 64)
    assert err.source_line == "  for (int i = 0; i < N; i++)   /* note */   y[i] = x[i]  +    q;"
    assert str(err).endswith("\n  " + " " * 63 + "^")


def test_an_error_inside_a_macro_points_into_its_use() -> None:
    """`BAD(x[0])` writes `(x[0] % 2)`: the error is at the `x[0]` the use passed."""
    err = _error(
        "#define BAD(v) (v % 2)\n"
        "void f(float y[1], const float x[1]) {\n"
        "  y[0] = 1.0f +   BAD(x[0]);\n"
        "}\n")
    assert (err.line, err.column) == (3, 23) and "'%' needs integer" in err.message


def test_a_define_that_breaks_the_syntax_says_which_macro() -> None:
    err = _error("void f(int N, float y[N]) { y[0] = 1; }\n",
                 preprocessing=_options({"N": 64}))
    assert (err.line, err.column) == (1, 12)
    assert "syntax error before '64' (in the expansion of macro 'N')" in err.message


def test_errors_in_a_header_point_into_the_header(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "kernel.h").write_text(
        "// the body\nvoid f(float y[4]) {\n  y[0] = undefined_value;\n}\n")
    spec = tmp_path / "main.c"
    spec.write_text('#include "kernel.h"\n')
    with pytest.raises(SpecError) as info:
        polydl.compile(spec)
    err = info.value
    assert (Path(err.file).name, err.line, err.column) == ("kernel.h", 3, 10)
    assert err.source_line == "  y[0] = undefined_value;"


def test_several_errors_keep_their_positions_through_the_preprocessor() -> None:
    err = _error(
        "#define ROWS 4\n"
        "void f(float y[ROWS], const float x[ROWS]) {\n"
        "#pragma unroll\n"
        "  for (int i = 0; i < ROWS; i++) {\n"
        "    y[i] = x[i] % 2;\n"
        "    y[i] =   zz;\n"
        "  }\n"
        "}\n")
    assert [(e.line, e.column) for e in err.errors] == [(5, 12), (6, 14)]


def test_directives_and_a_stray_hash() -> None:
    err = _error("void f(float v[1]) {\n#error stop here\n  v[0] = 1;\n}\n")
    assert (err.line, "stop here" in err.message) == (2, True)
    err = _error("#define X 1\nvoid f(float v[1]) { v[0] = X; # 3 \"x.c\"\n}\n")
    assert (err.line, err.column) == (2, 32) and "stray '#'" in err.message
    err = _error("#include <stdio.h>\nvoid f(float v[1]) { v[0] = 1; }\n")
    assert "system headers are not read" in err.message and "math.h" in err.message


def test_a_spec_without_directives_needs_no_preprocessor() -> None:
    with settings.override(cc="/nonexistent/cc"):
        parse_c("void f(float v[1]) { v[0] = 1; } /* # not a directive */", "p.c")
        err = _error("#define X 1\nvoid f(float v[1]) { v[0] = X; }\n")
    assert "POLYDL_CC" in err.message and "/nonexistent/cc" in err.message


def test_bad_defines_and_include_dirs_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ArgumentError, match="not a macro name"):
        polydl.compile(CONFIGURABLE, defines={"2N": 1})
    with pytest.raises(ArgumentError, match="one line"):
        polydl.compile(CONFIGURABLE, defines={"N": "1\n#define X"})
    with pytest.raises(ArgumentError, match="not a folder"):
        polydl.compile(CONFIGURABLE, include_dirs=[tmp_path / "missing"])
    with pytest.raises(SpecError, match="TOML spec"):
        polydl.compile('primitive = "matmul"\nM = 4\nN = 4\nK = 4\n', defines={"N": 1})


def _options(defines: dict[str, object]):  # type: ignore[no-untyped-def]
    from polydl.frontends.c_preprocess import preprocessing

    return preprocessing(defines)


@pytest.mark.parametrize("text, says", [
    ('#include "/dev/zero"\nvoid f(float y[1]) { y[0] = 1; }', "the C preprocessor (failed|took)"),
    ("#define A0 x x\n" + "".join(f"#define A{i + 1} A{i} A{i}\n" for i in range(40))
     + "void f(float y[1]) { y[0] = 1; A40 }", "after preprocessing"),
], ids=["endless-header", "macro-bomb"])
@pytest.mark.slow
def test_hostile_preprocessor_input_is_a_spec_error(text: str, says: str) -> None:
    """The preprocessor runs with bounded memory, output and time."""
    with pytest.raises(SpecError, match=says):
        parse_c(text, "p.c")
