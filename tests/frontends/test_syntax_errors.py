"""Syntax errors at the mistake: a bracket never closed at that bracket (saying where the parser
needed the closing one), a missing `;` at the end of its statement, anything else at the token
where the C parser stopped; through the preprocessor, in the user's own columns."""

from __future__ import annotations

import pytest

from polydl.errors import SpecError
from polydl.frontends.c_source import parse_translation_unit
from tests.frontends.marked import located

HEADER = "void f(int N, float y[N], const float x[N]) {\n"


def refused(marked: str) -> SpecError:
    """The error of a spec, checked to stand where `$` is marked."""
    text, line, column = located(marked)
    with pytest.raises(SpecError) as info:
        parse_translation_unit(text, "t.c")
    err = info.value
    assert (err.file, err.line, err.column) == ("t.c", line, column), str(err)
    return err


def test_a_missing_parenthesis_in_a_for_header_is_at_its_line() -> None:
    err = refused(HEADER + "  for $(int i = 0; i < N; i++ {\n    y[i] = x[i];\n  }\n}\n")
    assert err.message == "syntax error: '(' is never closed (expected ')' before '{' at 2:30)"
    assert err.source_line == "  for (int i = 0; i < N; i++ {"


def test_a_missing_semicolon_is_at_the_end_of_its_statement() -> None:
    err = refused(HEADER + "  for (int i = 0; i < N; i++) {\n    y[i] = x[i]$\n  }\n}\n")
    assert err.message == "syntax error: expected ';' before '}'"


def test_a_missing_semicolon_between_statements_on_one_line() -> None:
    err = refused(HEADER + "  for (int i = 0; i < N; i++) { y[i] = x[i] $y[i] = 1.0f; }\n}\n")
    assert err.message == "syntax error: expected ';' before 'y'"


def test_a_missing_semicolon_after_a_declaration() -> None:
    err = refused(HEADER + "  float s = 0.0f$\n  y[0] = s;\n}\n")
    assert err.message == "syntax error: expected ';' before 'y'"


def test_a_missing_bracket_is_at_the_bracket_left_open() -> None:
    err = refused(HEADER + "  for (int i = 0; i < N; i++) {\n    y$[i = x[i];\n  }\n}\n")
    assert err.message == "syntax error: '[' is never closed (expected ']' before ';' at 3:15)"


def test_a_brace_left_open_at_the_end_of_the_file() -> None:
    err = refused("void f(int N, float y[N], const float x[N]) ${\n"
                  "  for (int i = 0; i < N; i++) {\n    y[i] = x[i];\n  }\n")
    assert err.message == "syntax error: '{' is never closed (expected '}' at the end of the input)"


def test_a_stray_closing_brace_is_at_itself() -> None:
    err = refused(HEADER + "  y[0] = 1.0f;\n}\n$}\n")
    assert err.message == "syntax error: unmatched '}'"


def test_an_earlier_mistake_comes_before_a_later_bracket_left_open() -> None:
    err = refused(HEADER + "  y[0] = $= 1.0f;\n  y[1] = (x[0];\n}\n")
    assert "never closed" not in err.message


def test_a_token_the_parser_cannot_take_is_where_it_stopped() -> None:
    err = refused(HEADER + "  y[0] = $;\n}\n")
    assert err.message.startswith("syntax error") and "expected ';'" not in err.message


def test_positions_through_the_preprocessor_are_the_users_columns() -> None:
    text = ("#define N 8\nvoid f(float y[N], const float x[N]) {\n"
            "  for (int i = 0;   i < N; i++) {\n    y[i] =    x[i]$\n  }\n}\n")
    err = refused(text)
    assert err.message == "syntax error: expected ';' before '}'"
    assert err.source_line == "    y[i] =    x[i]"
    err = refused("#define N 8\nvoid f(float y[N], const float x[N]) {\n"
                  "  for   $(int i = 0; i < N; i++ {\n    y[i] = x[i];\n  }\n}\n")
    assert err.message == "syntax error: '(' is never closed (expected ')' before '{' at 3:32)"
