"""Code generators by target name: adding a target adds an entry here and its templates."""

from __future__ import annotations

from collections.abc import Callable

from polydl.codegen.artifact import GeneratedCode
from polydl.codegen.c_target import generate_c
from polydl.errors import PolyDLError
from polydl.schedules.apply import ScheduledNest

GENERATORS: dict[str, Callable[[ScheduledNest], GeneratedCode]] = {"c": generate_c}


def generate(scheduled: ScheduledNest, target: str) -> GeneratedCode:
    try:
        generator = GENERATORS[target]
    except KeyError:
        raise PolyDLError(
            f"unknown target '{target}'; available: {', '.join(sorted(GENERATORS))}"
        ) from None
    return generator(scheduled)
