"""A spec with several errors reports each (up to `MAX_SPEC_ERRORS`), every one with its
position and caret, as a C compiler does; reading stops where going on is not safe."""

from __future__ import annotations

import pytest

import polydl
from polydl.cli import main
from polydl.errors import MAX_SPEC_ERRORS, SpecError
from polydl.frontends.c_loopnest import MAX_STATEMENTS, parse_c

SEVERAL = """void f(int N, float y[N], const float x[N], float *p) {
  for (int i = 0; i < N; i++) {
    y[i] = x[i] % 2;
    y[i] = p[i] + 1.0f;
    y[i] = foo(x[i]);
    while (1) {}
  }
  y[0] = x[0] + q;
}
"""


def _errors(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_c(text, "e.c")
    return info.value


def test_every_independent_error_is_reported_in_order() -> None:
    err = _errors(SEVERAL)
    where = [(e.line, e.column) for e in err.errors]
    # p's declaration is refused; its use on line 4 is not reported again
    assert where == [(1, 51), (3, 12), (5, 12), (6, 5), (8, 17)]
    assert (err.line, err.column) == (1, 51) and "pointer" in err.message
    assert "undeclared identifier 'q'" in err.errors[-1].message
    text = str(err)
    assert text.count("e.c:") == 5 and text.count("^") == 5
    assert "\n      while (1) {}\n      ^\n" in text
    assert not err.left_out


def test_a_single_error_is_its_own_only_entry() -> None:
    err = _errors("void f(int N, float y[N]) { y[0] = $; }".replace("$", "q"))
    assert err.errors == (err,)
    assert str(err).count("error:") == 1


def test_reading_stops_after_the_limit_with_a_note() -> None:
    body = "".join(f"  y[0] = x[0] % {k};\n" for k in range(MAX_SPEC_ERRORS + 5))
    err = _errors("void f(int N, float y[N], const float x[N]) {\n" + body + "}\n")
    assert len(err.errors) == MAX_SPEC_ERRORS and err.left_out
    assert [e.line for e in err.errors] == list(range(2, MAX_SPEC_ERRORS + 2))
    assert str(err).endswith(f"stopped after {MAX_SPEC_ERRORS} errors; the rest were left out")


def test_exactly_the_limit_is_not_cut() -> None:
    body = "".join(f"  y[0] = x[0] % {k};\n" for k in range(MAX_SPEC_ERRORS))
    err = _errors("void f(int N, float y[N], const float x[N]) {\n" + body + "}\n")
    assert len(err.errors) == MAX_SPEC_ERRORS and not err.left_out


def test_errors_inside_loops_and_branches_are_all_found() -> None:
    text = """void f(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++) {
    if (i > 0) {
      y[i] = x[i] % 2;
      y[i] = x[i * i];
    } else
      y[i] = bar;
  }
}
"""
    err = _errors(text)
    assert [(e.line, e.column) for e in err.errors] == [(4, 14), (5, 16), (7, 14)]


def test_a_failed_local_is_not_reported_again_where_used() -> None:
    text = """void f(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++) {
    unsigned c = 1;
    y[i] = c + x[i];
    y[i] = x[i] % 2;
  }
}
"""
    err = _errors(text)
    assert [e.line for e in err.errors] == [3, 5]


def test_passing_a_limit_stops_reading() -> None:
    """More statements than allowed: one error for that, nothing reported after it."""
    body = "".join(f"  v[0] += {k}.0f;\n" for k in range(MAX_STATEMENTS + 3))
    err = _errors("void f(int N, float v[4], const float x[N]) {\n  v[0] = x[0] % 2;\n" + body
                  + "  v[0] = q;\n}\n")
    assert len(err.errors) == 2 and "statements" in err.errors[1].message


def test_missing_sizes_are_reported_together() -> None:
    with pytest.raises(SpecError) as info:
        polydl.compile("void f(int N, int M, int K, float y[N][M][K]) { y[0][0][0] = 1; }",
                       {"M": 0})
    assert [e.message.split(" (")[0] for e in info.value.errors] == [
        "missing value for size parameter 'N'",
        "size parameter 'M' must be >= 1, not 0",
        "missing value for size parameter 'K'",
    ]


def test_the_command_line_prints_each_error_with_its_line_and_caret(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.c"
    path.write_text(SEVERAL)
    assert main(["compile", str(path), "-p", "N=4"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 15 and all(ln.startswith(f"polydl: {path}:") for ln in lines[::3])
    assert lines[0].endswith("e.g. float p[N][M]")
    assert lines[1:3] == ["  " + SEVERAL.splitlines()[0], "  " + " " * 50 + "^"]


def test_a_refused_parameter_silences_the_extents_and_uses_that_name_it() -> None:
    err = _errors("void f(int N, float *p, float A[p], float B[A]) { A[0] = p[0]; B[0] = q; }")
    assert [(e.line, e.column) for e in err.errors] == [(1, 21)] and "pointer" in err.message
