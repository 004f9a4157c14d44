"""Settings: every POLYDL_* variable is read in polydl/settings.py, at call time, checked."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import polydl
from polydl import settings
from polydl.errors import PolyDLError

PACKAGE = Path(polydl.__file__).resolve().parent


def test_the_environment_is_read_when_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLYDL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("POLYDL_TUNING_DB", raising=False)
    assert settings.cache_dir() == tmp_path
    assert settings.tuning_db() == tmp_path / "tuning.sqlite"
    monkeypatch.setenv("POLYDL_CFLAGS", "-O2 -g")
    assert settings.cflags() == ("-O2", "-g")
    monkeypatch.delenv("POLYDL_CFLAGS")
    assert settings.cflags() is None


def test_an_override_wins_for_its_block_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYDL_CC", "gcc")
    with settings.override(cc="clang", isa="avx2"):
        assert settings.cc() == "clang" and settings.forced_isa() == "avx2"
        with settings.override(cc=None):
            assert settings.cc() == "cc"  # None: as if unset
    assert settings.cc() == "gcc" and settings.forced_isa() is None
    with pytest.raises(TypeError, match="unknown setting"):
        with settings.override(colour="red"):
            pass


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("isa", "neon", "POLYDL_ISA='neon'"),
        ("sanitize", "address,threads", "unknown sanitizer"),
        ("cflags", "-O2 '-g", "POLYDL_CFLAGS"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str, message: str) -> None:
    accessor = {"isa": settings.forced_isa, "sanitize": settings.sanitizers,
                "cflags": settings.cflags}[name]
    with settings.override(**{name: value}), pytest.raises(PolyDLError, match=message):
        accessor()


def _environment_reads(tree: ast.AST) -> list[int]:
    """Lines that read or write a POLYDL_* variable of the environment (os.environ[...],
    os.environ.get/pop/setdefault(...), os.getenv(...))."""
    lines = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Subscript):
            target = node.slice
        elif isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            if func.startswith("os.environ.") or func == "os.getenv":
                target = node.args[0]
        if isinstance(target, ast.Constant) and str(target.value).startswith("POLYDL_"):
            lines.append(node.lineno)
    return lines


def test_no_other_module_reads_polydl_variables() -> None:
    found = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "settings.py"
        and (lines := _environment_reads(ast.parse(path.read_text())))
    }
    assert not found


def test_the_check_sees_a_read() -> None:
    assert _environment_reads(ast.parse('import os\nos.environ.get("POLYDL_CC")')) == [2]
