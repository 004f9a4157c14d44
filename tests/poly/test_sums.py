"""Which statements sum or take an extremum into their cell (`poly.sums`)."""

from __future__ import annotations

import pytest

from polydl.ir import Access, Call, IntVar, Load, Select, Statement
from polydl.poly.sums import addend_of, extremum_of

C = Access("y", (IntVar("i"),))
E = Load(Access("x", (IntVar("i"),)))
CELL = Load(C)


def _set(value: object) -> Statement:
    return Statement("S0", C, "=", value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "kind"), [
    (Call("fmaxf", (CELL, E)), "max"),
    (Call("fmaxf", (E, CELL)), "max"),
    (Call("fminf", (CELL, E)), "min"),
    (Select(">", E, CELL, E, CELL), "max"),   # e > c ? e : c
    (Select("<", CELL, E, E, CELL), "max"),   # c < e ? e : c
    (Select(">=", E, CELL, E, CELL), "max"),
    (Select("<", E, CELL, E, CELL), "min"),   # e < c ? e : c
    (Select(">", CELL, E, E, CELL), "min"),   # c > e ? e : c
])
def test_extrema_that_keep_the_cell_over_a_nan(value: object, kind: str) -> None:
    assert extremum_of(_set(value)) == (E, kind)
    assert addend_of(_set(value)) is None


@pytest.mark.parametrize("value", [
    Select(">", CELL, E, CELL, E),    # c > e ? c : e takes a NaN e: not fmaxf's
    Select("==", E, CELL, E, CELL),
    Select(">", E, Load(Access("z", (IntVar("i"),))), E, CELL),  # compares another value
    Call("fmaxf", (E, E)),
    Call("expf", (CELL,)),
])
def test_other_selects_and_calls_are_no_extremum(value: object) -> None:
    assert extremum_of(_set(value)) is None


def test_an_update_is_no_extremum() -> None:
    assert extremum_of(Statement("S0", C, "+=", E)) is None
