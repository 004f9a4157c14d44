"""Division in subscripts, bounds and conditions means what C means: isl's floor division
agrees with C's toward-zero division where the value divided is >= 0, and a spec where it can
be negative on an iteration that runs is refused at the construct, naming that iteration."""

from __future__ import annotations

import numpy as np
import pytest

import polydl
from polydl.errors import SpecError

HEAD = "void f(int N, float y[N], const float x[N]) {\n  for (int i = 0; i < N; i++)\n"


@pytest.mark.parametrize(
    "body, what, at",
    [
        ("    y[i] = $x[(i - 1) / 2 + 1];", "a subscript of 'x'", "i=0"),
        ("    y[i] = $x[(i - 1) % 4 + 1];", "a subscript of 'x'", "i=0"),
        ("    $for (int j = (i - 3) / 2 + 2; j < N; j++) y[i] += x[j];", "a bound of loop 'j'", "i="),
        ("    if ((i - 3) / 2 < 0) $y[i] = x[i];", "the condition of an if", "i="),
    ],
)
def test_a_possibly_negative_dividend_is_refused(body: str, what: str, at: str) -> None:
    text = HEAD + body + "\n}\n"
    offset = text.index("$")
    column = offset - text.rfind("\n", 0, offset)
    with pytest.raises(SpecError) as info:
        polydl.compile(text.replace("$", ""), {"N": 8})
    err = info.value
    assert (err.line, err.column) == (3, column), str(err)
    assert what in err.message and f"negative at iteration {at}" in err.message


def test_non_negative_dividends_and_divisibility_tests_are_accepted() -> None:
    """(i + 1) / 2 never sees a negative value; `(i - 3) % 2 == 0` and `!= 0` hold at the same
    iterations whichever way the quotient rounds."""
    body = ("    if ((i - 3) % 2 == 0) y[i] = x[(i + 1) / 2];\n"
            "    else if ((i - 3) % 3 != 0) y[i] = -x[i];")
    k = polydl.compile(HEAD + body + "\n}\n", {"N": 9})
    x = np.arange(1, 10, dtype=np.float32)
    i = np.arange(9)
    want = np.where(np.fmod(i - 3, 2) == 0, x[(i + 1) // 2], np.where(np.fmod(i - 3, 3) != 0, -x, 0))
    np.testing.assert_allclose(k(x), want)
