"""Helper functions of a C spec: inlined into the kernel (static, inline or neither, several
levels deep, with locals and if/else), their types converting as C converts, the kernel chosen
among several functions, and every refusal (recursion, array writes, loops, pointers, names from
outside) at the helper's construct."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl.cli import main
from polydl.errors import SpecError
from polydl.frontends.c_inline import MAX_INLINED_NODES
from polydl.frontends.c_loopnest import parse_c
from polydl.ir import IntBinary, IntConst, IntVar
from tests.frontends.marked import refused_at_mark
from tests.kernels import run_and_check

SWISH = """static inline float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }
void swish(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++)
    y[i] = x[i] * sigmoid(x[i]);
}
"""


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


@pytest.mark.parametrize("n", [1, 7, 64, 1000])
def test_the_issue_swish_is_inlined_and_matches_numpy(n: int) -> None:
    k = polydl.compile(SWISH, {"N": n})
    assert k.name == "swish" and "sigmoid" not in k.source
    run_and_check(k, lambda x: x * _sigmoid(x))


@pytest.mark.parametrize("spelling", ["static inline", "static", "inline", ""])
def test_static_inline_both_or_neither(spelling: str) -> None:
    k = polydl.compile(SWISH.replace("static inline", spelling), {"N": 33})
    run_and_check(k, lambda x: x * _sigmoid(x))


LAYERS = """#include <math.h>
static inline float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }
static inline float silu(float v) { return v * sigmoid(v); }
float clampf(float v, float lo, float hi) {
  float r = v;
  if (r < lo)
    r = lo;
  else if (r > hi)
    r = hi;
  return r;
}
static float leaky(float v, float slope) {
  if (v > 0.0f && slope >= 0.0f)
    return v;
  float s = slope;
  s *= v;
  return s;
}
static float gate(float v) { return clampf(silu(v), -0.5f, 0.5f) + leaky(v, 0.1f); }
void act(int N, float y[N], float z[N], const float x[N]) {
  for (int i = 0; i < N; i++) {
    y[i] = gate(x[i]);
    z[i] = x[i] >= 0.0f ? silu(x[i]) : leaky(x[i], 0.25f);
  }
}
"""


def _layers(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = x.astype(np.float64)
    silu = v * _sigmoid(v)
    return (np.clip(silu, -0.5, 0.5) + np.where(v > 0, v, 0.1 * v),
            np.where(v >= 0, silu, 0.25 * v))


@pytest.mark.parametrize("n", [5, 128])
def test_helpers_call_helpers_with_locals_and_if_else(n: int) -> None:
    """Three levels (gate -> silu -> sigmoid), locals assigned under if/else, an early return
    under &&: the kernel computes what numpy computes."""
    run_and_check(polydl.compile(LAYERS, {"N": n}), _layers, seed=n)


def test_a_double_kernel_with_double_helpers() -> None:
    spec = """static double softplus(double v) {
  if (v > 20.0) return v;
  return log(1.0 + exp(v));
}
void sp(int N, double y[N], const double x[N]) {
  for (int i = 0; i < N; i++) y[i] = softplus(4.0 * x[i]);
}
"""
    run_and_check(polydl.compile(spec, {"N": 50}),
                  lambda x: np.where(4 * x > 20, 4 * x, np.log1p(np.exp(4 * x))))


CONVERSIONS = """static int trunc_half(int v) { return v / 2; }
static int twice(int i) { return 2 * i; }
static float widen(int v) { return v; }
static float shortened(short v) { return v; }
void conv(int N, float w[N], float u[N], float t[N], float s[N], const float x[2 * N]) {
  for (int i = 0; i < N; i++) {
    w[i] = trunc_half(x[i] * 10.0f);
    u[i] = trunc_half(i) + x[twice(i) + 1];
    t[i] = widen(x[i] * 3.0f) / 2;
    s[i] = shortened(x[i] * 20000.0f);
  }
}
"""


def test_parameter_and_result_types_convert_as_c_converts() -> None:
    """An int parameter given a float truncates toward zero, integer division stays integer,
    an int result used in a subscript is the index itself, a short parameter wraps."""
    n = 40

    def expected(x: np.ndarray) -> tuple[np.ndarray, ...]:
        tenfold = np.trunc(x[:n].astype(np.float64) * 10.0).astype(np.int64)
        w = np.trunc(tenfold / 2)
        u = np.arange(n) // 2 + x[1:2 * n:2]
        t = np.trunc(x[:n].astype(np.float64) * 3.0) / 2
        s = np.trunc(x[:n].astype(np.float64) * 20000.0).astype(np.int64).astype(np.int16)
        return w, u, t, s

    k = polydl.compile(CONVERSIONS, {"N": n})
    x = np.random.default_rng(3).uniform(-3, 3, 2 * n).astype(np.float32)
    for got, want in zip(k(x), expected(x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.any(np.abs(x[:n] * 20000) > 32767)  # some shorts wrapped


def test_helpers_in_extents_bounds_and_conditions() -> None:
    spec = """static int half(int n) { return n / 2; }
static float sq(float v) { return v * v; }
void f(int N, float y[N], float h[half(N)], const float x[N]) {
  for (int i = 0; i < half(N); i++)
    if (sq(x[i]) > 0.25f) h[i] = 1.0f; else h[i] = 2.0f;
  for (int i = half(N); i < N; i++)
    if (sq(i) > 100) y[i] = x[i];
}
"""
    nest = parse_c(spec, "h.c")
    assert nest.array("h").shape == (IntBinary("/", IntVar("N"), IntConst(2)),)
    k = polydl.compile(spec, {"N": 41})
    x = np.random.default_rng(5).standard_normal(41).astype(np.float32)
    y, h = k(x, y=np.zeros(41, np.float32))
    np.testing.assert_array_equal(h, np.where(x[:20] ** 2 > 0.25, 1, 2))
    idx = np.arange(20, 41)
    np.testing.assert_array_equal(y[20:], np.where(idx ** 2 > 100, x[20:], 0))


def test_a_prototype_lets_the_helper_follow_the_kernel() -> None:
    spec = """float sq(float v);
void f(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++) y[i] = sq(x[i]) + 1.0f;
}
float sq(float v) { return v * v; }
"""
    run_and_check(polydl.compile(spec, {"N": 9}), lambda x: x * x + 1)
    with pytest.raises(SpecError, match="does not match its definition") as info:
        parse_c(spec.replace("float sq(float v);", "float sq(double v);"), "p.c")
    assert (info.value.line, info.value.column) == (1, 7)


# ----------------------------------------------------------------------------- the kernel


TWO_KERNELS = """static float sq(float v) { return v * v; }
float unused(float v) { return v; }
void sumsq(int N, float s[1], const float x[N]) {
  for (int i = 0; i < N; i++) s[0] += sq(x[i]);
}
void squares(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++) y[i] = sq(x[i]);
}
"""


def test_the_kernel_is_the_function_no_other_calls() -> None:
    """A helper is never taken for the kernel, nor is an unused value-returning function."""
    spec = TWO_KERNELS[:TWO_KERNELS.index("void squares")]
    assert parse_c(spec, "k.c").name == "sumsq"


def test_function_chooses_where_several_could_be_the_kernel() -> None:
    with pytest.raises(SpecError) as info:
        parse_c(TWO_KERNELS, "k.c")
    err = info.value
    assert "choose one with --function NAME" in err.message
    assert "sumsq, squares could each be the kernel" in err.message
    assert (err.line, err.column) == (6, 6)
    x = np.linspace(-1, 1, 10, dtype=np.float32)
    k = polydl.compile(TWO_KERNELS, {"N": 10}, function="squares")
    np.testing.assert_allclose(k(x), x * x)
    k = polydl.compile(TWO_KERNELS, {"N": 10}, function="sumsq")
    np.testing.assert_allclose(k(x, s=np.zeros(1, np.float32)), [np.sum(x * x)], rtol=1e-6)


def test_the_command_line_runs_a_spec_with_helpers(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    swish = tmp_path / "swish.c"
    swish.write_text(SWISH)
    assert main(["run", str(swish), "-p", "N=1000", "--repeat", "1"]) == 0
    assert "verify   ok" in capsys.readouterr().out
    both = tmp_path / "both.c"
    both.write_text(TWO_KERNELS)
    assert main(["run", str(both), "-p", "N=100", "--repeat", "1", "--function", "squares"]) == 0
    out = capsys.readouterr().out
    assert "kernel   squares" in out and "verify   ok" in out
    assert main(["run", str(both), "-p", "N=100", "--repeat", "1"]) == 1
    assert "--function" in capsys.readouterr().err


# ----------------------------------------------------------------------------- refused


KERNEL = "void k(int N, float y[N], const float x[N]) {\n  for (int i = 0; i < N; i++)\n"


def _refused(marked: str, *words: str) -> SpecError:
    return refused_at_mark(marked, *words, filename="h.c")


@pytest.mark.parametrize(
    "helpers, call, words",
    [
        ("float f(float v) { return v > 0.0f ? $f(v - 1.0f) : v; }\n", "f(x[i])",
         ["helper 'f'", "recursive", "(f -> f)"]),
        ("float g(float v);\nfloat f(float v) { return g(v) + 1.0f; }\n"
         "float g(float v) { return $f(v) * 2.0f; }\n", "f(x[i])",
         ["recursive", "(f -> g -> f)"]),
        ("float f(float v) { return v; }\n", "$k(N, y, x)", ["kernel 'k'", "(k -> k)"]),
    ],
    ids=["direct", "mutual", "the-kernel"],
)
def test_recursion_is_refused_at_the_call_that_closes_the_cycle(helpers: str, call: str,
                                                                words: list[str]) -> None:
    body = f"    y[i] = {call};\n" if "k(" not in call else f"    {call};\n"
    _refused(helpers + KERNEL + body + "}\n", *words)


@pytest.mark.parametrize(
    "helper, call",
    [
        ("void set(float y[], int i) { $y[i] = 0.0f; }\n", "    set(y, i);\n"),
        ("float put(float y[], int i) { float r = 1.0f;\n  $y[i] += r; return r; }\n",
         "    y[i] = put(y, i);\n"),
        ("float put(float y[], int i) { for (int j = 0; j < 2; j++) $y[i]++; return 1.0f; }\n",
         "    y[i] = put(y, i);\n"),
    ],
    ids=["void-statement", "value", "inside-a-loop"],
)
def test_a_helper_that_writes_an_array_is_refused_at_the_write(helper: str, call: str) -> None:
    err = _refused(helper + KERNEL + call + "}\n", "writes the array 'y'", "in the kernel itself")
    assert err.message.startswith("helper '")


CONSTRUCTS = [
    ("loop", "float s(float v) { float t = 0.0f;\n  $for (int j = 0; j < 3; j++) t += v;\n"
     "  return t; }\n", ["helper 's'", "loop"]),
    ("while", "float s(float v) { $while (v > 1.0f) v = v / 2.0f; return v; }\n", ["loop"]),
    ("pointer-parameter", "float s(const float $*v) { return 1.0f; }\n", ["pointer"]),
    ("dereference", "float s(float v) { return $*v; }\n", ["helper 's'", "pointer"]),
    ("address", "float s(float v) { return v + ($&v)[0]; }\n", ["pointer"]),
    ("array-parameter", "float s(const float $v[4]) { return 1.0f; }\n",
     ["'v'", "an array", "s(x[i])"]),
    ("global", "float s(float v) { return v * $N; }\n", ["helper 's'", "uses 'N'", "argument"]),
    ("reads-an-array", "float s(float v) { return $x[0]; }\n", ["uses 'x'"]),
    ("local-array", "float s(float v) { float $t[2]; return v; }\n", ["array 't'"]),
    ("static-local", "float s(float v) { static float $c = 0.0f; return v + c; }\n",
     ["static"]),
    ("no-return-on-a-path", "float $s(float v) { if (v > 0.0f) return v; }\n",
     ["without returning"]),
    ("unassigned", "float s(float v) { float t; if (v > 0.0f) t = v; return $t; }\n",
     ["reads 't' before"]),
    ("void", "void $s(float v) { }\n", ["returns void"]),
    ("unsigned", "float s(unsigned $v) { return v; }\n", ["parameter 'v'", "float, double"]),
    ("bfloat16", "bfloat16 $s(float v) { return v; }\n", ["must return"]),
    ("extern", "extern float $s(float v) { return v; }\n", ["without extern"]),
    ("variadic", "float s(float v, $...) { return v; }\n", ["variadic"]),
    ("switch", "float s(float v) { $switch (1) { default: return v; } }\n", ["not allowed"]),
    ("increment-in-expression", "float s(float v) { return $v++; }\n", ["increments"]),
    ("dropped-call", "float s(float v) { $expf(v); return v; }\n", ["without using its value"]),
    ("reserved-name", "float $expf(float v) { return v; }\n", ["reserved"]),
]


@pytest.mark.parametrize("helper, words", [c[1:] for c in CONSTRUCTS], ids=[c[0] for c in CONSTRUCTS])
def test_what_a_helper_cannot_hold_is_refused_at_the_construct(helper: str,
                                                               words: list[str]) -> None:
    name = "expf" if "expf(float" in helper else "s"
    _refused(helper + KERNEL + f"    y[i] = {name}(x[i]);\n}}\n", *words)


def test_calling_a_helper_without_using_its_value_is_refused() -> None:
    _refused("float s(float v) { return v; }\n" + KERNEL + "    $s(x[i]);\n}\n",
             "value of helper 's' is not used")


def test_a_wrong_number_of_arguments() -> None:
    _refused("float s(float v) { return v; }\n" + KERNEL + "    y[i] = $s(x[i], 2.0f);\n}\n",
             "takes 1 argument(s), not 2")


def test_an_expression_that_grows_too_large_is_refused() -> None:
    """Each level uses its parameter twice: the inlined tree doubles per level and is refused
    at the first call past the limit, inside the helper that makes it."""
    lines = ["static float h0(float v) { return v + 1.0f; }"] + [
        f"static float h{k}(float v) {{ return h{k - 1}(v) * h{k - 1}(v); }}" for k in range(1, 14)]
    text = "\n".join(lines) + "\n" + KERNEL + "    y[i] = h13(x[i]);\n}\n"
    with pytest.raises(SpecError) as info:
        parse_c(text, "h.c")
    err = info.value
    assert f"more than {MAX_INLINED_NODES} operations" in err.message
    level = int(err.message.split("helper 'h")[1].split("'")[0])
    assert 1 <= level < 13
    assert (err.line, err.column) == (level + 2, lines[level + 1].index(f"h{level}(") + 1)


def test_errors_inside_inlined_code_point_at_the_users_text() -> None:
    """An argument's error at the call site, the helper's own at the helper's text."""
    helper = "float s(float v) { return v; }\n"
    _refused(helper + KERNEL + "    y[i] = s($q[i]);\n}\n", "undeclared identifier 'q'")
    _refused("float s(float v) { return $v % 2; }\n" + KERNEL + "    y[i] = s(x[i]);\n}\n",
             "'%' needs integer operands")
    _refused(helper + KERNEL + "    y[$s(i)] = 1.0f;\n}\n", "integer expression", "float")


@pytest.mark.parametrize("expr", ["x[i] +$* 2", "$*x"])
def test_unary_star_is_a_pointer_dereference(expr: str) -> None:
    err = _refused(KERNEL + f"    y[i] = {expr};\n}}\n", "unary '*' dereferences a pointer",
                   "pointers are not allowed")
    assert "use + - * /" not in err.message


def test_unary_star_in_a_subscript_is_a_pointer_dereference() -> None:
    _refused(KERNEL + "    y[$*x] = 1.0f;\n}\n", "dereferences a pointer")


def test_a_global_a_helper_would_read_is_refused_at_its_declaration() -> None:
    _refused("static const float $scale = 2.0f;\nfloat s(float v) { return v * scale; }\n"
             + KERNEL + "    y[i] = s(x[i]);\n}\n", "file scope", "functions only")


def test_helpers_in_a_header_of_the_users_own(tmp_path: Path) -> None:
    """Helpers kept in a local header: inlined, and their errors point into the header."""
    (tmp_path / "act.h").write_text(
        "static inline float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }\n"
        "static inline float hardtanh(float v) { return v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v; }\n"
        "static inline float bad(float v) { return v * N; }\n")
    spec = tmp_path / "swish.c"
    spec.write_text('#include "act.h"\n' + SWISH.split("\n", 1)[1].replace(
        "x[i] * sigmoid(x[i])", "hardtanh(x[i] * sigmoid(x[i]))"))
    run_and_check(polydl.compile(spec, {"N": 50}),
                  lambda x: np.clip(x * _sigmoid(x), -1.0, 1.0))
    spec.write_text(spec.read_text().replace("hardtanh(", "bad("))
    with pytest.raises(SpecError, match="helper 'bad' uses 'N'") as info:
        polydl.compile(spec, {"N": 50})
    err = info.value
    assert (Path(err.file).name, err.line, err.column) == ("act.h", 3, 47)
