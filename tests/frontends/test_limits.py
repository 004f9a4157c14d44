"""Specs too large to compile in bounded time are refused up front, at the place of excess."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from polydl.errors import SpecError
from polydl.frontends import load_spec
from polydl.frontends.c_loopnest import MAX_PARAMETERS, MAX_STATEMENTS, parse_c
from polydl.frontends.c_source import MAX_SPEC_BYTES

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_overlong_spec_is_refused_before_parsing() -> None:
    text = "void f(float v[1]) {\n" + "  v[0] = 1.0f;\n" * (MAX_SPEC_BYTES // 10) + "}\n"
    t0 = time.perf_counter()
    with pytest.raises(SpecError) as info:
        load_spec(text)
    assert "characters long" in info.value.message and info.value.line > 1
    assert time.perf_counter() - t0 < 5


def test_too_many_statements() -> None:
    body = "".join(f"  v[{i % 4}] += {i}.0f;\n" for i in range(MAX_STATEMENTS + 1))
    with pytest.raises(SpecError) as info:
        parse_c("void f(float v[4]) {\n" + body + "}\n", "s.c")
    assert info.value.line == MAX_STATEMENTS + 2 and "statements" in info.value.message
    parse_c("void f(float v[4]) {\n" + "".join(body.splitlines(True)[:MAX_STATEMENTS]) + "}\n")


def test_too_many_parameters() -> None:
    arrays = ", ".join(f"float a{i}[1]" for i in range(MAX_PARAMETERS + 1))
    with pytest.raises(SpecError) as info:
        parse_c(f"void f({arrays}) {{ }}", "p.c")
    assert "parameters" in info.value.message and info.value.column > 1


@pytest.mark.parametrize(
    "edit, line",
    [
        (("padding = 1", "padding = 199999999999999999999"), 14),  # beyond 2**62: the key
        (("H = 28", "H = 4611686018427387904"), 3),  # valid alone, too large with padding
    ],
)
def test_huge_toml_sizes_point_into_the_toml(edit: tuple[str, str], line: int) -> None:
    text = (EXAMPLES / "conv2d.toml").read_text().replace(*edit)
    text = text.replace("padding = 1", "padding = 4611686018427387904") if line == 3 else text
    with pytest.raises(SpecError) as info:
        load_spec(text)
    assert (info.value.file, info.value.line) == ("<spec>", line)
