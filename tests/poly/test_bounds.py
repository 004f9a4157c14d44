"""Out-of-bounds accesses are refused at compile time (proven with isl, not sampled), at the
access, naming the iteration and the index; guarded or clamped accesses are accepted."""

from __future__ import annotations

import pytest

import polydl
from polydl.errors import SpecError
from tests.kernels import run_and_check

HEAD = "void f(int N, float y[N], const float x[N], const float w[N][N]) {\n"

REFUSED = [
    ("read-past-end", "  for (int i = 0; i < N; i++)\n    y[i] = $x[i + 1];", "reads", "x"),
    ("write-negative", "  for (int i = 0; i < N; i++)\n    $y[i - 1] = x[i];", "writes", "y"),
    ("inclusive-bound", "  for (int i = 0; i <= N; i++)\n    $y[i] = 1.0f;", "writes", "y"),
    ("stride-overshoot", "  for (int i = 0; i < N; i += 2)\n    y[i] = $x[i + 2];", "reads", "x"),
    ("triangular", "  for (int i = 0; i < N; i++)\n    for (int j = 0; j <= i + 1; j++)\n"
     "      y[i] += $w[i][j];", "reads", "w"),
    ("second-dimension", "  for (int i = 0; i < N; i++)\n    y[i] = $w[0][2 * i];", "reads", "w"),
    ("division", "  for (int i = 0; i < 2 * N; i++)\n    y[i / 2] += $x[(i + 2) / 2];", "reads", "x"),
    ("guard-too-weak", "  for (int i = 0; i < N; i++)\n    if (i >= 0)\n      y[i] = $x[i - 1];", "reads", "x"),
]


@pytest.mark.parametrize("body, verb, array", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_out_of_bounds_is_refused_at_the_access(body: str, verb: str, array: str) -> None:
    text = HEAD + body + "\n}\n"
    offset = text.index("$")
    line = text.count("\n", 0, offset) + 1
    column = offset - text.rfind("\n", 0, offset)
    with pytest.raises(SpecError) as info:
        polydl.compile(text.replace("$", ""), {"N": 6})
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert f"{verb} outside array '{array}'" in err.message and "iteration" in err.message


ACCEPTED = [
    ("guarded", "  for (int i = 0; i < N; i++)\n    if (i >= 1)\n      y[i] = x[i - 1];",
     lambda x, w: __import__("numpy").concatenate([[0], x[:-1]])),
    ("clamped-bounds", "  for (int i = 0; i < N; i++)\n    for (int j = max(0, i - 1); j < min(N, i + 2); j++)\n"
     "      y[i] += x[j];",
     None),
    ("modulo", "  for (int i = 0; i < N; i++)\n    y[i] = x[(i + 3) % 6];", None),
]


@pytest.mark.parametrize("body, expected", [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_accesses_proven_in_bounds_run(body: str, expected: object) -> None:
    k = polydl.compile(HEAD + body + "\n}\n", {"N": 6})
    run_and_check(k, expected)  # type: ignore[arg-type]
