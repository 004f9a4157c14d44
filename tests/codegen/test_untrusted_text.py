"""User text that reaches generated code only inside comments (the spec's path) cannot end the
comment; malformed schedules are `ScheduleError`s, not raw exceptions."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

import polydl
from polydl.errors import ScheduleError
from tests.kernels import run_and_check

SPEC = "void f(int N, float v[N]) {\n  for (int i = 0; i < N; i++)\n    v[i] = 2.0f;\n}\n"


def test_a_path_cannot_inject_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYDL_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "x*" / " int polydl_injected = 1; "
    folder.mkdir(parents=True)
    spec = folder / "*.c"  # the path reads `x*/ int polydl_injected = 1; /*.c`
    spec.write_text(SPEC)
    k = polydl.compile(spec, {"N": 5})
    assert "*/ int polydl_injected" not in k.source and "*/ int polydl_injected" not in k.header
    with pytest.raises(AttributeError):
        ctypes.CDLL(str(k.library_path)).polydl_injected  # noqa: B018
    run_and_check(k, lambda: 2.0 * __import__("numpy").ones(5))


@pytest.mark.parametrize(
    "schedule",
    [
        {"order": ["i"], "tiles": {"i": "4*/"}},
        {"order": ["i"], "microkernel": {"m": "i"}},
        {"order": 5},
        {"order": ["i */ int x; /*"]},
        {"order": ["i"], "tiles": {"i": -3}},
    ],
)
def test_malformed_schedules(schedule: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ScheduleError):
        polydl.compile(SPEC, {"N": 4}, schedule=schedule)
