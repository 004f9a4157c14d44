"""The C library's names in polydl's own stand-in headers: <math.h> and <float.h> define
INFINITY, NAN, FLT_MAX, M_PI, ... and declare the math functions polydl compiles; each value
reaches the kernel exactly, and a name they lack is an error saying the headers are polydl's own
and listing what they have."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl.cli import main
from polydl.errors import SpecError
from polydl.frontends.c_header_names import stand_ins
from polydl.frontends.c_preprocess import STAND_IN_HEADERS
from polydl.ir import MATH_FUNCTIONS
from tests.frontends.marked import refused_at_mark
from tests.kernels import run_and_check

CC = shutil.which("cc")

ROWMAX = """#include <math.h>
void rowmax(int N, int M, float m[N], float lowest[N], const float x[N][M]) {
  for (int i = 0; i < N; i++) {
    m[i] = -INFINITY;
    lowest[i] = -INFINITY;
    for (int j = 0; j < M; j++)
      m[i] = fmaxf(m[i], x[i][j]);
  }
}
"""


@pytest.mark.parametrize("n, m", [(1, 1), (7, 13), (64, 100)])
def test_a_max_reduction_from_minus_infinity(n: int, m: int) -> None:
    """Inputs far below any finite start the kernel could have used instead of -inf."""
    k = polydl.compile(ROWMAX, {"N": n, "M": m})
    x = np.random.default_rng(n).uniform(-3e38, -1e38, (n, m)).astype(np.float32)
    got, lowest = k(x)
    np.testing.assert_array_equal(got, x.max(axis=1))
    assert np.isneginf(lowest).all()


FLOAT_CONSTANTS = """#include <math.h>
#include <float.h>
void constants(int N, float y[N][14]) {
  for (int i = 0; i < N; i++) {
    y[i][0] = -INFINITY;
    y[i][1] = INFINITY;
    y[i][2] = NAN;
    y[i][3] = FLT_MAX;
    y[i][4] = -FLT_MAX;
    y[i][5] = FLT_MIN;
    y[i][6] = FLT_EPSILON;
    y[i][7] = FLT_TRUE_MIN;
    y[i][8] = HUGE_VALF;
    y[i][9] = M_PI;
    y[i][10] = M_E;
    y[i][11] = M_SQRT2;
    y[i][12] = M_LN2;
    y[i][13] = -M_PI / 2;
  }
}
"""


def test_float_constants_reach_the_kernel_exactly() -> None:
    f32 = np.finfo(np.float32)
    want = np.array([-np.inf, np.inf, np.nan, f32.max, -f32.max, f32.tiny, f32.eps,
                     f32.smallest_subnormal, np.inf, np.pi, np.e, np.sqrt(2), np.log(2),
                     -np.pi / 2], dtype=np.float32)
    k = polydl.compile(FLOAT_CONSTANTS, {"N": 3})
    got = k()
    for row in got:
        np.testing.assert_array_equal(row, want)
    np.testing.assert_array_equal(k.reference()[0], want)


DOUBLE_CONSTANTS = """#include <math.h>
#include <float.h>
void constants(int N, double y[N][10]) {
  for (int i = 0; i < N; i++) {
    y[i][0] = -INFINITY;
    y[i][1] = NAN;
    y[i][2] = DBL_MAX;
    y[i][3] = DBL_MIN;
    y[i][4] = DBL_EPSILON;
    y[i][5] = DBL_TRUE_MIN;
    y[i][6] = M_PI;
    y[i][7] = M_E;
    y[i][8] = M_SQRT2;
    y[i][9] = HUGE_VAL;
  }
}
"""


def test_double_constants_reach_the_kernel_exactly() -> None:
    f64 = np.finfo(np.float64)
    want = np.array([-np.inf, np.nan, f64.max, f64.tiny, f64.eps, f64.smallest_subnormal,
                     np.pi, np.e, np.sqrt(2.0), np.inf])
    k = polydl.compile(DOUBLE_CONSTANTS, {"N": 2})
    for row in k():
        np.testing.assert_array_equal(row, want)


def test_constants_in_arithmetic_match_numpy() -> None:
    spec = """#include <math.h>
#include <float.h>
void wrap(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++)
    y[i] = fminf(fmaxf(x[i] * M_PI, -FLT_MAX), INFINITY) + M_SQRT1_2;
}
"""
    run_and_check(polydl.compile(spec, {"N": 100}),
                  lambda x: x.astype(np.float64) * np.pi + np.sqrt(0.5))


def test_the_command_line_runs_a_reduction_from_minus_infinity(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "rowmax.c"
    spec.write_text(ROWMAX.replace("    lowest[i] = -INFINITY;\n", "").replace(
        " float lowest[N],", ""))
    assert main(["run", str(spec), "-p", "N=50", "-p", "M=70", "--repeat", "1"]) == 0
    assert "verify   ok" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the headers


def test_math_h_declares_the_functions_polydl_compiles() -> None:
    declared = set(stand_ins()["math.h"].functions)
    assert declared == set(MATH_FUNCTIONS) | {name[:-1] for name in MATH_FUNCTIONS}


def test_the_names_users_reach_for_are_defined() -> None:
    defined = {name for header in stand_ins().values() for name in header.macros}
    assert {"INFINITY", "NAN", "FLT_MAX", "FLT_MIN", "DBL_MAX", "M_PI", "M_E", "M_SQRT2"} <= defined
    assert {"FLT_MAX", "FLT_MIN", "DBL_MAX"} <= set(stand_ins()["float.h"].macros)


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
def test_the_stand_ins_agree_with_the_c_compiler(tmp_path: Path) -> None:
    """Compiled by the C compiler alone (its own float.h and math.h kept out), each value is
    the compiler's own (`__FLT_MAX__`, ...) or the mathematical constant to double precision."""
    program = tmp_path / "check.c"
    program.write_text("""#include <math.h>
#include <float.h>
int main(void) {
  int ok = FLT_MAX == __FLT_MAX__ && FLT_MIN == __FLT_MIN__ && FLT_EPSILON == __FLT_EPSILON__
      && FLT_TRUE_MIN == __FLT_DENORM_MIN__ && DBL_MAX == __DBL_MAX__ && DBL_MIN == __DBL_MIN__
      && DBL_EPSILON == __DBL_EPSILON__ && DBL_TRUE_MIN == __DBL_DENORM_MIN__
      && FLT_DIG == __FLT_DIG__ && DBL_MANT_DIG == __DBL_MANT_DIG__
      && INFINITY == __builtin_inff() && -INFINITY < -DBL_MAX && HUGE_VAL == __builtin_inf()
      && NAN != NAN && M_PI == 3.141592653589793 && M_SQRT2 * M_SQRT2 - 2.0 < 1e-15;
  volatile double one = 1.0;
  return ok && expf(0.0f) == 1.0f && exp(0.0) == one ? 0 : 1;
}
""")
    binary = tmp_path / "check"
    subprocess.run([CC, "-std=c11", "-nostdinc", "-isystem", str(STAND_IN_HEADERS), str(program),
                    "-o", str(binary), "-lm"], check=True, capture_output=True)
    assert subprocess.run([str(binary)]).returncode == 0


# ----------------------------------------------------------------------------- missing names


KERNEL = "void k(int N, float y[N], const float x[N]) {\n  for (int i = 0; i < N; i++)\n"


def _refused(marked: str, *words: str) -> SpecError:
    return refused_at_mark(marked, *words, filename="m.c")


def test_infinity_without_math_h_names_the_header() -> None:
    _refused(KERNEL + "    y[i] = -$INFINITY;\n}\n", "'INFINITY'", "<math.h>",
             "polydl's own", "#include <math.h>")


def test_flt_max_is_in_float_h() -> None:
    _refused("#include <math.h>\n" + KERNEL + "    y[i] = $FLT_MAX;\n}\n", "<float.h>",
             "#include <float.h>")


@pytest.mark.parametrize("name", ["M_LN3", "HUGE_VALL", "FLT_MAX_10_EXP", "MAXFLOAT"])
def test_a_library_name_polydl_lacks_lists_what_its_headers_define(name: str) -> None:
    _refused("#include <math.h>\n#include <float.h>\n" + KERNEL + f"    y[i] = ${name};\n}}\n",
             f"'{name}'", "polydl's headers are its own stand-ins", "INFINITY", "M_SQRT2",
             "<float.h> defines FLT_MAX")


def test_a_math_function_polydl_lacks_lists_what_math_h_declares() -> None:
    err = _refused("#include <math.h>\n" + KERNEL + "    y[i] = $erfcf(x[i]);\n}\n",
                   "'erfcf'", "polydl's own stand-in", "expf", "tanhf", "double form")
    assert "erfcf," not in err.message


def test_a_name_of_the_users_own_keeps_the_plain_message() -> None:
    err = _refused("#include <math.h>\n" + KERNEL + "    y[i] = $scale * x[i];\n}\n",
                   "undeclared identifier 'scale'")
    assert "stand-in" not in err.message
