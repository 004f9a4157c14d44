"""Random affine C programs compiled by polydl match gcc -O0 of the same C (fixed seeds).

The fast test runs 20 programs at one size set each; the slow one 300 programs at two size sets
(CI's second stage). Both assert no wrong output, no traceback, and that every polydl failure
or refusal of a valid program is one already pinned, with its diagnosis, in
tests/schedules/cpu/test_differential_cases.py (`KNOWN`): a new kind fails here.
`tools/differential.py` runs thousands the same way.
"""

from __future__ import annotations

import pytest

from tests.differential.generator import Options, generate
from tests.differential.runner import Outcome, check

# Failures and refusals of valid programs already reproduced (the reproducer test named):
# a reason's start -> the test.
KNOWN: dict[str, str] = {}


def _unexplained(outcomes: list[Outcome]) -> list[str]:
    out = []
    for o in outcomes:
        for r in o.runs:
            if r.status in ("ok",) or (r.status == "refused" and r.expected):
                continue
            if r.status in ("failed", "refused") and any(r.reason.startswith(k) for k in KNOWN):
                continue
            out.append(f"{o.program.name} at {r.sizes} on {r.machine}: {r.status}: {r.reason}\n"
                       f"{r.detail}\n{o.program.c()}")
    return out


def _run(first: int, count: int, options: Options) -> None:
    outcomes = [check(generate(seed, options), seed=seed) for seed in range(first, first + count)]
    problems = _unexplained(outcomes)
    assert not problems, "\n\n".join(problems)
    assert sum(r.status == "ok" for o in outcomes for r in o.runs) >= count // 2


@pytest.mark.parametrize("first", [0, 5, 10, 15])
def test_random_programs_match_gcc(first: int) -> None:
    _run(first, 5, Options(size_sets=1))


@pytest.mark.slow
@pytest.mark.parametrize("first", range(1000, 1300, 30))
def test_many_random_programs_match_gcc(first: int) -> None:
    _run(first, 30, Options(size_sets=2))


def test_a_chaotic_recurrence_is_not_judged_by_its_digits() -> None:
    """Seed 810842 at M=17, N=29: y3 += f(y4) and y4 += cos(y3), each reading the other, make
    every rounding grow to the values' size (gcc's own builds with and without FMA contraction
    differ from the second digit on its minimised form). Its float build shows it, and the
    double arrays are compared for NaNs and infinities only: a mismatch there says nothing."""
    outcome = check(generate(810842), seed=810842, only=[1])
    assert [r.status for r in outcome.runs] == ["ok"], outcome.runs
