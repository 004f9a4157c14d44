"""Subscripts read from integer arrays: `emb[tok[i]][j]`, `x[idx[k] + 1]`, `dx[tok[i]][j] += ...`
read as `Indirect` subscripts (the index array's access, a constant); everything else about
subscripts is refused where it stands, saying what is allowed."""

from __future__ import annotations

import pytest

from polydl.frontends.c_loopnest import parse_c
from polydl.ir import Access, Indirect, IntVar, Load, Statement, int_vars
from tests.frontends.marked import refused_at_mark

HEAD = "void f(int N, int V, const int idx[N], const long tok[N][2], const float x[V], float y[N]) {\n"


def _statement(body: str) -> Statement:
    return parse_c(HEAD + body + "}\n", "g.c").statements()[0]


@pytest.mark.parametrize("subscript, offset", [
    ("idx[i]", 0), ("idx[i] + 1", 1), ("2 + idx[i]", 2), ("idx[i] - 3", -3), ("idx[i] + (4 - 1)", 3),
])
def test_gather_reads_as_indirect(subscript: str, offset: int) -> None:
    s = _statement(f"  for (int i = 0; i < N; i++)\n    y[i] = x[{subscript}];\n")
    assert isinstance(s.value, Load)
    (index,) = s.value.access.indices
    assert index == Indirect(Access("idx", (IntVar("i"),)), offset)
    assert s.is_indirect and not s.target.is_indirect
    # the index array's read is a read of the statement, before the gather
    assert [a.array for a in s.reads] == ["idx", "x"]
    assert int_vars(index) == {"i"}


def test_scatter_target_and_two_dimensional_index_array() -> None:
    s = _statement("  for (int i = 0; i < N; i++)\n    y[tok[i][1]] += x[i % 3];\n")
    assert s.target.is_indirect
    (index,) = s.target.indices
    assert isinstance(index, Indirect) and index.access.array == "tok"
    # += reads its target cell; the index array is read by the write too
    assert [a.array for a in s.reads] == ["y", "tok", "x"]


@pytest.mark.parametrize("marked, words", [
    ("    y[i] = x[$idx[idx[i]]];\n", ("nested",)),
    ("    y[i] = x[$idx[i] * 2];\n", ("whole subscript", "plus or minus a constant")),
    ("    y[i] = x[idx[i] + $i];\n", ("offset by a constant",)),
    ("    y[i] = x[3 - $idx[i]];\n", ("whole subscript",)),
    ("    y[i] = x[$x[i]];\n", ("'x' holds float32", "int or long")),
    ("    y[i] = x[$idx[i] + idx[i]];\n", ("whole subscript",)),
])
def test_refusals(marked: str, words: tuple[str, ...]) -> None:
    refused_at_mark(HEAD + "  for (int i = 0; i < N; i++)\n" + marked + "}\n", *words,
                    filename="spec.c")


def test_index_array_in_loop_bound_stays_refused() -> None:
    refused_at_mark(HEAD + "  for (int i = 0; i < $idx[0]; i++) y[i] = 1;\n}\n", "indirect",
                    filename="spec.c")


def test_char_index_array_refused() -> None:
    refused_at_mark("void f(int N, const char c[N], const float x[N], float y[N]) {\n"
                    "  for (int i = 0; i < N; i++) y[i] = x[$c[i]];\n}\n", "int8", "int or long",
                    filename="spec.c")
