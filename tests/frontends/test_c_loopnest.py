"""The C loop-nest frontend: accepted constructs -> IR, and every refusal at its file:line:col."""

from __future__ import annotations

import pytest

from polydl.errors import SourcePosition, SpecError
from polydl.frontends.c_loopnest import parse_c
from polydl.ir import (
    MATH_FUNCTIONS,
    Access,
    Array,
    Binary,
    Call,
    Condition,
    Const,
    Guard,
    IndexValue,
    IntBinary,
    IntConst,
    IntMinMax,
    IntNeg,
    IntOp,
    IntVar,
    Load,
    Loop,
    LoopNest,
    Select,
    Statement,
    ToFloat,
    Unary,
)
from polydl.poly.counting import count_points
from polydl.poly.model import build_model

HEADER = "void f(int N, int M, float A[N][M], const float B[N][M], float v[N]) {\n"


def spec(body: str) -> str:
    return HEADER + body + "\n}\n"


def body_of(body: str) -> tuple:
    return parse_c(spec(body), "t.c").body


def only_statement(body: str) -> Statement:
    (s,) = parse_c(spec(body), "t.c").statements()
    return s


def V(name: str) -> IntVar:
    return IntVar(name)


def C(value: int) -> IntConst:
    return IntConst(value)


def pos(line: int, column: int) -> SourcePosition:
    return SourcePosition("t.c", line, column)


# ----------------------------------------------------------------------------- accepted


MATMUL = """\
void mm(int M, int N, int K, float C[M][N], const float A[M][K], const double B[K][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
}
"""


def test_matmul_ir_and_positions() -> None:
    nest = parse_c(MATMUL, "t.c")
    s = Statement(
        "S0",
        target=_access("C", "i", "j"),
        op="+=",
        value=Binary("*", Load(_access("A", "i", "k")), Load(_access("B", "k", "j"))),
    )
    k = Loop("k", C(0), V("K"), 1, (s,))
    j = Loop("j", C(0), V("N"), 1, (k,))
    i = Loop("i", C(0), V("M"), 1, (j,))
    expected = LoopNest(
        name="mm",
        params=("M", "N", "K"),
        arrays=(
            Array("C", "float32", (V("M"), V("N")), is_input=False),
            Array("A", "float32", (V("M"), V("K")), is_input=True),
            Array("B", "float64", (V("K"), V("N")), is_input=True),
        ),
        body=(i,),
    )
    assert nest == expected
    assert nest.source == MATMUL and nest.filename == "t.c"
    assert [a.position for a in nest.arrays] == [pos(1, 36), pos(1, 57), pos(1, 79)]
    loops = [nest.body[0]]
    while isinstance(loops[-1].body[0], Loop):
        loops.append(loops[-1].body[0])
    assert [lp.position for lp in loops] == [pos(2, 3), pos(3, 5), pos(4, 7)]
    (stmt,) = nest.statements()
    assert stmt.position == pos(5, 9)
    assert stmt.target.position == pos(5, 9)
    assert [a.position for a in stmt.reads] == [pos(5, 9), pos(5, 20), pos(5, 30)]
    assert [a.name for a in nest.inputs] == ["A", "B"]
    assert [a.name for a in nest.outputs] == ["C"]


def _access(name: str, *indices: str) -> Access:
    return Access(name, tuple(V(i) for i in indices))


@pytest.mark.parametrize(
    "header, lower, upper, step",
    [
        ("for (int i = 0; i < N; i++)", C(0), V("N"), 1),
        ("for (int i = 1; i <= N - 1; ++i)", C(1), IntBinary("+", IntBinary("-", V("N"), C(1)), C(1)), 1),
        ("for (int i = 0; i <= 7; i += 2)", C(0), C(8), 2),
        ("for (int i = 2; i < N; i = i + 3)", C(2), V("N"), 3),
        ("for (int i = 2; i < N; i = 4 + i)", C(2), V("N"), 4),
        ("for (int i = 0; i < N; i += 2 * 3)", C(0), V("N"), 6),
        (
            "for (int i = max(0, M - 4); i <= min(N, M); i++)",
            IntMinMax("max", (C(0), IntBinary("-", V("M"), C(4)))),
            IntMinMax("min", (IntBinary("+", V("N"), C(1)), IntBinary("+", V("M"), C(1)))),
            1,
        ),
        ("for (int i = N / 2; i < N; i++)", IntBinary("/", V("N"), C(2)), V("N"), 1),
    ],
)
def test_loop_headers(header: str, lower, upper, step: int) -> None:  # type: ignore[no-untyped-def]
    (loop,) = body_of(f"  {header}\n    v[i] = 1.0f;")
    assert (loop.var, loop.lower, loop.upper, loop.step) == ("i", lower, upper, step)
    assert loop.position == pos(2, 3)


def test_non_rectangular_bounds_use_outer_loop_variables() -> None:
    text = spec(
        "  for (int i = 0; i < N; i++)\n"
        "    for (int j = max(0, i - 2); j < min(M, i + 3); j++)\n"
        "      A[i][j] = 0.0f;"
    )
    (outer,) = parse_c(text, "t.c").body
    (inner,) = outer.body
    assert inner.lower == IntMinMax("max", (C(0), IntBinary("-", V("i"), C(2))))
    assert inner.upper == IntMinMax("min", (V("M"), IntBinary("+", V("i"), C(3))))
    (s,) = build_model(parse_c(text, "t.c"), {"N": 4, "M": 5}).statements
    assert count_points(s.domain) == sum(
        len(range(max(0, i - 2), min(5, i + 3))) for i in range(4)
    )


def test_blocks_sequences_guards_and_statement_names() -> None:
    nest = parse_c(
        spec(
            "  for (int i = 0; i < N; i++) {\n"
            "    v[i] = 0.0f;\n"
            "    {\n"
            "      for (int j = 0; j < M; j++)\n"
            "        if (j >= i && 2 * j < N + 1 && i == j % 3)\n"
            "          v[i] += A[i][j];\n"
            "    }\n"
            "  }\n"
            "  ;\n"
            "  for (int i = 0; i < N; i++)\n"
            "    v[i] *= 2.0f;\n"
            "  v[0] -= 1.0f;"
        ),
        "t.c",
    )
    first, second, last = nest.body
    assert isinstance(first, Loop) and isinstance(second, Loop) and isinstance(last, Statement)
    init, inner = first.body  # the nested block is flattened into the loop body
    assert isinstance(init, Statement) and isinstance(inner, Loop)
    (guard,) = inner.body
    assert isinstance(guard, Guard)
    assert guard.position == pos(6, 9)
    assert guard.conditions == (
        Condition(">=", V("j"), V("i")),
        Condition("<", IntBinary("*", C(2), V("j")), IntBinary("+", V("N"), C(1))),
        Condition("==", V("i"), IntBinary("%", V("j"), C(3))),
    )
    names = [(s.name, s.op, s.position) for s in nest.statements()]
    assert names == [
        ("S0", "=", pos(3, 5)),
        ("S1", "+=", pos(7, 11)),
        ("S2", "*=", pos(12, 5)),
        ("S3", "-=", pos(13, 3)),
    ]


@pytest.mark.parametrize(
    "subscript, expected",
    [
        ("2 * i + 1", IntBinary("+", IntBinary("*", C(2), V("i")), C(1))),
        ("i * 3", IntBinary("*", V("i"), C(3))),
        ("(1 + 2) * i", IntBinary("*", C(3), V("i"))),
        ("i / 2", IntBinary("/", V("i"), C(2))),
        ("(i + N) % 4", IntBinary("%", IntBinary("+", V("i"), V("N")), C(4))),
        ("N - 1 - i", IntBinary("-", IntBinary("-", V("N"), C(1)), V("i"))),
        ("-i + N", IntBinary("+", IntNeg(V("i")), V("N"))),
        ("0x3", C(3)),
        ("-(-1)", C(1)),
        ("+i", V("i")),
    ],
)
def test_affine_subscripts(subscript: str, expected) -> None:  # type: ignore[no-untyped-def]
    s = only_statement(f"  for (int i = 0; i < N; i++)\n    A[i][{subscript}] = 0.0f;")
    assert s.target.indices == (V("i"), expected)


def _value(expr: str) -> object:
    return only_statement(f"  for (int i = 0; i < N; i++)\n    v[i] = {expr};").value


def _load(name: str, *indices) -> Load:  # type: ignore[no-untyped-def]
    return Load(Access(name, tuple(V(i) if isinstance(i, str) else i for i in indices)))


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("1.5f", Const(1.5)),
        ("2", Const(2.0)),
        ("1e-3", Const(0.001)),
        ("0x1p3f", Const(8.0)),
        ("-1.0f", Const(-1.0)),
        ("-B[i][0]", Unary("-", _load("B", "i", C(0)))),
        ("B[i][0] * 2 - 1.0f", Binary("-", Binary("*", _load("B", "i", C(0)), Const(2.0)), Const(1.0))),
        ("B[i][0] / (v[i] + 1)", Binary("/", _load("B", "i", C(0)), Binary("+", _load("v", "i"), Const(1.0)))),
        ("expf(B[i][0])", Call("expf", (_load("B", "i", C(0)),))),
        ("exp(B[i][0])", Call("expf", (_load("B", "i", C(0)),))),
        ("fmax(v[i], 0.0)", Call("fmaxf", (_load("v", "i"), Const(0.0)))),
        ("powf(v[i], 2.0f)", Call("powf", (_load("v", "i"), Const(2.0)))),
        (
            "v[i] < 0.0f ? -v[i] : v[i]",
            Select("<", _load("v", "i"), Const(0.0), Unary("-", _load("v", "i")), _load("v", "i")),
        ),
        ("(float)i", ToFloat(IndexValue(V("i")))),
        ("(double)(i + N)", ToFloat(IndexValue(IntBinary("+", V("i"), V("N"))))),
        ("i", IndexValue(V("i"))),
        ("N", IndexValue(V("N"))),
        # integer division is C's (toward zero), not the floor of index expressions
        ("i / 2", ToFloat(IntOp("/", IndexValue(V("i")), IndexValue(C(2))))),
        ("3 / 2", Const(1.0)),
        ("-7 / 2", Const(-3.0)),
        ("-7 % 2", Const(-1.0)),
        ("i * N", ToFloat(IntOp("*", IndexValue(V("i")), IndexValue(V("N"))))),
        ("i * 0.5f", Binary("*", IndexValue(V("i")), Const(0.5))),
        ("i < 2 ? 1 : 0", Select("<", IndexValue(V("i")), Const(2.0), Const(1.0), Const(0.0))),
    ],
)
def test_value_expressions(expr: str, expected: object) -> None:
    assert _value(expr) == expected


def test_comments_are_blanked_and_positions_stay_exact() -> None:
    text = (
        "/* a spec\n"
        "   over two lines */ void f(int N, // the size\n"
        "  float v[N]) { /* inline */ for (int i = 0; i < N; i++) v[i] = 1.0f; }\n"
    )
    nest = parse_c(text, "t.c")
    assert nest.array("v").position == pos(3, 9)
    (loop,) = nest.body
    assert loop.position == pos(3, 30)
    assert nest.statements()[0].position == pos(3, 58)


def test_const_int_sizes_void_params_and_empty_loops() -> None:
    nest = parse_c("void f(const int N, float v[N]) { for (int i = 0; i < N; i++) ; }", "t.c")
    assert nest.params == ("N",) and nest.body[0].body == ()


def test_products_with_constants_lower_to_isl() -> None:
    nest = parse_c(
        "void f(int N, float y[2 * N], const float x[N * 3]) {\n"
        "  for (int i = 0; i < N; i++)\n"
        "    y[i * 2] = x[3 * i + 2];\n}\n",
        "t.c",
    )
    (s,) = build_model(nest, {"N": 5}).statements
    assert count_points(s.domain) == 5


# ----------------------------------------------------------------------------- refused


def located(marked: str) -> tuple[str, int, int]:
    """Text with `$` removed, and the line and column where `$` stood."""
    offset = marked.index("$")
    line = marked.count("\n", 0, offset) + 1
    column = offset - (marked.rfind("\n", 0, offset) + 1) + 1
    return marked.replace("$", "", 1), line, column


def assert_refused(marked: str, keyword: str) -> SpecError:
    text, line, column = located(marked)
    with pytest.raises(SpecError) as info:
        parse_c(text, "t.c")
    err = info.value
    assert (err.file, err.line, err.column) == ("t.c", line, column), err.message
    assert keyword in err.message
    return err


LOOP = "  for (int i = 0; i < N; i++)\n"

BODY_ERRORS = [
    ("while", "  $while (N > 0) v[0] = 1;", "while"),
    ("do-while", "  $do v[0] = 1; while (N > 0);", "while"),
    ("goto", "  $goto end;\n  end: v[0] = 1;", "goto"),
    ("label", "  $end: v[0] = 1;", "labels"),
    ("return", "  $return;", "return"),
    ("break", LOOP + "    { $break; }", "break"),
    ("continue", LOOP + "    { $continue; }", "continue"),
    ("switch", "  $switch (N) { default: v[0] = 1; }", "switch"),
    ("call-statement", "  $foo(1);", "call"),
    ("unknown-function", LOOP + "    v[i] = $foo(B[i][0]);", "foo"),
    ("min-as-value", LOOP + "    v[i] = $min(B[i][0], 1.0f);", "loop bounds"),
    ("math-arity", "  v[0] = $expf(1.0f, 2.0f);", "argument"),
    ("product-of-variables", LOOP + "    for (int j = 0; j < M; j++)\n      v[$i * j] = 1;", "affine"),
    ("indirect-subscript", LOOP + "    v[$B[i][0]] = 1;", "indirect"),
    ("non-affine-bound", "  for (int i = 0; i < $N * M; i++) v[0] = 1;", "affine"),
    ("array-in-bound", "  for (int i = 0; i < $B[0][0]; i++) v[0] = 1;", "indirect"),
    ("call-in-bound", "  for (int i = 0; i < $foo(N); i++) v[0] = 1;", "call"),
    ("non-constant-step", "  for (int i = 0; i < N; i += $M) v[0] = 1;", "constant"),
    ("zero-step", "  for (int i = 0; i < N; i += $0) v[0] = 1;", "positive"),
    ("zero-step-assign", "  for (int i = 0; i < N; i = i + $0) v[0] = 1;", "positive"),
    ("decrement-with-upper-bound", "  for (int i = 0; $i < N; i--) v[0] = 1;", "counts down"),
    ("minus-assign-zero-step", "  for (int i = N; i >= 0; i -= $0) v[0] = 1;", "positive"),
    ("odd-increment", "  for (int i = 0; i < N; $i = 2 * i) v[0] = 1;", "increment"),
    ("assign-loop-variable", LOOP + "    { $i = 3; }", "loop variable"),
    ("increment-loop-variable", LOOP + "    { $i++; }", "loop variable"),
    ("add-to-loop-variable", LOOP + "    $i += 1;", "loop variable"),
    ("assign-size", "  $N = 3;", "size parameter"),
    ("assign-array", "  $v = 3;", "subscripts"),
    ("assign-undeclared", "  $x = 3;", "undeclared"),
    ("write-const", LOOP + "    $B[i][0] = 1;", "const"),
    ("undeclared-value", "  v[0] = $x;", "undeclared"),
    ("undeclared-subscript", "  v[$x] = 1;", "undeclared"),
    ("undeclared-bound", "  for (int i = 0; i < $X; i++) v[0] = 1;", "undeclared"),
    ("undeclared-array", "  $x[0] = 1;", "undeclared"),
    ("too-few-subscripts", LOOP + "    $A[i] = 1;", "dimension"),
    ("too-many-subscripts", "  $v[0][1] = 1;", "dimension"),
    ("bare-array-value", "  v[0] = $A;", "subscript"),
    ("size-as-array", "  v[0] = $N[0];", "not an array"),
    ("loop-variable-shadows-loop", LOOP + "    for (int $i = 0; i < N; i++) v[0] = 1;", "shadows"),
    ("loop-variable-shadows-size", "  for (int $N = 0; N < 3; N++) v[0] = 1;", "shadows"),
    ("loop-variable-shadows-array", "  for (int $v = 0; v < 3; v++) A[0][0] = 1;", "shadows"),
    ("loop-variable-shadows-function", "  for (int $f = 0; f < 3; f++) v[0] = 1;", "shadows"),
    ("reserved-loop-variable", "  for (int $free = 0; free < N; free++) v[0] = 1;", "reserved"),
    ("loop-without-declaration", LOOP + "    for ($i = 0; i < N; i++) v[0] = 1;", "loop variable"),
    ("loop-two-variables", "  for (int i = 0, $j = 0; i < N; i++) v[0] = 1;", "exactly one"),
    ("loop-long-variable", "  for (long $i = 0; i < N; i++) v[0] = 1;", "int"),
    ("loop-no-condition", "  $for (int i = 0; ; i++) v[0] = 1;", "condition"),
    ("loop-greater-condition", "  for (int i = N; $i > 0; i++) v[0] = 1;", "condition"),
    ("upper-depends-on-variable", "  for (int i = 0; i < $N - i; i++) v[0] = 1;", "depend"),
    ("increment-other-variable", LOOP + "    for (int j = 0; j < N; $i++) v[0] = 1;", "update"),
    ("float-bound", "  for (int i = 0; i < $2.5; i++) v[0] = 1;", "integer"),
    ("data-guard-loop", "  $if (B[0][0] > 1) for (int i = 0; i < N; i++) v[0] = 1;", "loop under"),
    ("non-comparison-guard", "  if ($N) v[0] = 1;", "affine comparisons"),
    ("min-in-guard", "  if (N < $min(M, 3)) v[0] = 1;", "loop bounds"),
    ("non-comparison-guard", "  if ($N) v[0] = 1;", "comparisons"),
    ("local-unsigned-declaration", "  unsigned $t = 0;", "declarations"),
    ("ternary-and", "  v[0] = $N > 1 && M > 1 ? 1.0f : 0.0f;", "?:"),
    ("comparison-value", "  v[0] = $v[1] < 2.0f;", "?:"),
    ("string", '  v[0] = $"a";', "string"),
    ("char", "  v[0] = $'a';", "char"),
    ("divide-by-variable", LOOP + "    v[i / $N] = 1;", "positive integer constant"),
    ("divide-by-zero", LOOP + "    v[i / $0] = 1;", "positive integer constant"),
    ("modulo-by-negative", LOOP + "    v[i % -$2] = 1;", "positive integer constant"),
    ("shift-in-subscript", LOOP + "    v[$i << 1] = 1;", "<<"),
    ("cast-in-subscript", LOOP + "    v[$(int)B[i][0]] = 1;", "cast"),
    ("ternary-in-subscript", LOOP + "    v[$i < 2 ? 0 : 1] = 1;", "not allowed"),
    ("infinite-literal", "  v[0] = $1e999f;", "finite"),
    ("float-literal-beyond-float", "  v[0] = $3.5e38f;", "range of float"),
    ("huge-integer", "  v[$99999999999999999999] = 1;", "range"),
    ("huge-product", "  v[$4000000000 * 4000000000 * 4] = 1;", "range"),
    ("modulo-assign", "  $v[0] %= 2;", "%="),
    ("float-modulo", "  v[0] = $B[0][0] % 2;", "integer"),
    ("long-double-cast", "  v[0] = $(long double)B[0][0];", "cast"),
    ("unsigned-int-cast", "  v[0] = $(unsigned)B[0][0];", "cast"),
    ("nested-assignment", "  v[0] = ($v[1] = 1.0f) * 2.0f;", "assignment"),
    ("comma", "  v[0] = ($1.0f, 2.0f);", "comma"),
    ("logical-not", "  v[0] = !$v[1];", "not allowed"),
    ("increment-statement", "  $v[0]++;", "increment"),
    ("error-directive", "  #$error stop here\n  v[0] = 1;", "#error stop here"),
    ("unterminated-comment", "  $/* never closed\n  v[0] = 1;", "comment"),
    ("syntax", "  v[0] = $;", "syntax error"),
]


@pytest.mark.parametrize("body, keyword", [c[1:] for c in BODY_ERRORS], ids=[c[0] for c in BODY_ERRORS])
def test_body_errors_are_positioned(body: str, keyword: str) -> None:
    assert_refused(HEADER + body + "\n}\n", keyword)


FUNCTION_ERRORS = [
    ("pointer-parameter", "void f(int N, float $*A) { A[0] = 1; }", "pointer"),
    ("array-of-pointers", "void f(int N, float *$A[N]) { }", "pointer"),
    ("redeclared-parameter", "void f(int N, int $N, float v[N]) { }", "already"),
    ("parameter-named-like-function", "void f(int $f, float v[1]) { }", "already"),
    ("underscore-function", "void $_f(float v[1]) { }", "_"),
    ("reserved-function-main", "void $main(float v[1]) { }", "reserved"),
    ("reserved-function-free", "void $free(float v[1]) { }", "reserved"),
    ("reserved-array-exp", "void f(float $exp[1]) { }", "reserved"),
    ("reserved-array-expf", "void f(float $expf[1]) { }", "reserved"),
    ("reserved-array-fmaxf", "void f(float $fmaxf[1]) { }", "reserved"),
    ("reserved-size-min", "void f(int $min, float v[1]) { }", "reserved"),
    ("reserved-size-calloc", "void f(int $calloc, float v[1]) { }", "reserved"),
    ("reserved-cxx-keyword", "void f(float $new[1]) { }", "reserved"),
    ("unsigned-int-array", "void f(int N, unsigned $A[N]) { }", "unsigned int and unsigned long"),
    ("long-double-array", "void f(int N, long double $A[N]) { }", "float, double, bfloat16"),
    ("char-scalar", "void f(int N, char $c, float v[N]) { }", "size parameter"),
    ("scalar-volatile", "void f(int N, volatile float $alpha, float v[N]) { }", "qualifier"),
    ("long-size", "void f(long $N, float v[1]) { }", "int"),
    ("variadic", "void f(int N, float v[N], $...) { }", "variadic"),
    ("size-after-use", "void f(float v[$N], int N) { }", "before"),
    ("zero-extent", "void f(float v[$0]) { }", ">= 1"),
    ("empty-extent", "void f(int N, float $v[]) { }", "extent"),
    ("loop-variable-in-extent", "void f(int N, float v[$i]) { }", "undeclared"),
    ("non-affine-extent", "void f(int N, int M, float v[$N * M]) { }", "affine"),
    ("volatile-array", "void f(int N, volatile float $v[N]) { }", "qualifier"),
    ("extern-function", "extern void $f(float v[1]) { }", "without extern"),
    ("non-void-function", "int $f(float v[1]) { }", "void"),
    ("no-output", "void $f(int N, const float A[N]) { }", "output"),
    ("second-function", "void f(float v[1]) { }\nvoid $g(float w[1]) { }", "choose one with --function"),
    ("global-declaration", "int $x;\nvoid f(float v[1]) { }", "file scope"),
    ("prototype", "void $g(int N);\nvoid f(float v[1]) { }", "file scope"),
    ("no-function", "$", "no function"),
    ("missing-header", '#include $"nothere.h"\nvoid f(float v[1]) { }', "No such file"),
    ("system-header", "#include $<stdio.h>\nvoid f(float v[1]) { }", "stdio.h"),
    ("unclosed-parenthesis", "void f$(int N, float v[N] { }", "never closed"),
    ("stray-brace", "void f(float v[1]) { v[0] = 1; } $}", "unmatched"),
    ("mismatched-bracket", "void f(float v[1]) { v[0] = (1$]; }", "unmatched"),
    ("unclosed-brace", "void f(float v[1]) ${ v[0] = 1;", "never closed"),
    ("hash-mid-line", 'void f(float v[1]) { v[0] = 1; $# line 7 "x.c"\n}', "preprocessor"),
    ("compound-literal", "void f(float v[1]) { v[0] = $(float){1}; }", "not allowed"),
    ("sizeof", "void f(float v[1]) { v[0] = $sizeof(int); }", "sizeof"),
    ("struct-member", "void f(float v[1]) { v[0] = $v->x; }", "not allowed"),
    ("keyword-as-name", "void f(int N, float $for[N]) { }", "syntax error"),
    ("illegal-character", "void f(float v[1]) { v[0] = $@; }", "syntax error"),
]


@pytest.mark.parametrize(
    "text, keyword", [c[1:] for c in FUNCTION_ERRORS], ids=[c[0] for c in FUNCTION_ERRORS]
)
def test_function_errors_are_positioned(text: str, keyword: str) -> None:
    assert_refused(text, keyword)


def test_error_message_shows_the_line_and_a_caret() -> None:
    err = assert_refused(HEADER + LOOP + "    v[$i * i] = 1;\n}\n", "affine")
    assert err.source_line == "    v[i * i] = 1;"
    assert str(err).startswith("t.c:3:7: error:")
    assert str(err).endswith("\n  " + " " * 6 + "^")


@pytest.mark.parametrize(
    "text",
    [
        HEADER + "  v[0] = " + "(" * 400 + "1" + ")" * 400 + ";\n}\n",
        HEADER + "".join(f"for (int i{k} = 0; i{k} < N; i{k}++) " for k in range(3000)) + "v[0] = 1;\n}\n",
        HEADER + "".join(f"for (int i{k} = 0; i{k} < N; i{k}++) " for k in range(150)) + "v[0] = 1;\n}\n",
        HEADER + "  v[0] = 1.0f" + " + 1.0f" * 5000 + ";\n}\n",
        HEADER + "  v[" + " + ".join(["1"] * 5000) + "] = 1;\n}\n",
        HEADER + "  v[0] = " + "- " * 3000 + "1.0f;\n}\n",
        HEADER + "{" * 2000 + "}" * 2000 + "\n}\n",
        HEADER + "  if (" + " && ".join(["N > 0"] * 3000) + ") v[0] = 1;\n}\n",
    ],
    ids=["parens", "loops", "loops-150", "sum-chain", "index-chain", "unary-chain", "blocks", "and-chain"],
)
def test_hostile_nesting_is_a_spec_error(text: str) -> None:
    try:
        parse_c(text, "t.c")
    except SpecError as err:
        assert err.file == "t.c"
        assert "deep" in err.message
    # a long && chain is flat for the frontend: accepting it is fine too


def test_error_position_after_a_multiline_comment() -> None:
    assert_refused(
        "/* header\n * comment */\nvoid f(int N, float v[N]) {\n  // note\n  v[$x] = 1;\n}\n",
        "undeclared",
    )


def test_every_node_carries_its_position() -> None:
    nest = parse_c(MATMUL.replace("}\n", "  for (int i = 0; i < M; i++)\n    C[i][0] *= 2.0f;\n}\n"))
    guard_spec = parse_c(spec(LOOP + "    if (i > 0) v[i] = B[i][0];"))
    for n in (nest, guard_spec):
        assert all(a.position is not None for a in n.arrays)
        pending = list(n.body)
        while pending:
            node = pending.pop()
            assert node.position is not None and node.position.line > 0
            if isinstance(node, Statement):
                assert all(a.position is not None for a in [node.target, *node.reads])
            else:
                pending.extend(node.body)
    assert guard_spec.filename == "<spec>"
    assert guard_spec.statements()[0].position.file == "<spec>"


@pytest.mark.parametrize("name", sorted({*MATH_FUNCTIONS} | {n[:-1] for n in MATH_FUNCTIONS}))
def test_math_function_names_are_reserved(name: str) -> None:
    assert_refused(f"void f(float ${name}[1]) {{ }}", "reserved")
