"""The on-disk compile cache and the compiler driver."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import polydl
from polydl.api import lower
from polydl.errors import CompileError
from polydl.frontends import load_spec
from polydl.runtime.c.toolchain import (
    Toolchain,
    build_shared_library,
    compiler_identity,
    current_toolchain,
)
from polydl.runtime.cache import content_key, write_atomic

SPEC = """
void scale(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++)
    y[i] = 3.0f * x[i];
}
"""


def _code(n: int = 8):  # type: ignore[no-untyped-def]
    nest, params = load_spec(SPEC, {"N": n})
    return lower(nest, params).code


def test_same_code_hits_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYDL_CACHE_DIR", str(tmp_path))
    first = build_shared_library(_code())
    stamp = first.stat().st_mtime_ns
    t0 = time.perf_counter()
    again = build_shared_library(_code())
    assert again == first and again.stat().st_mtime_ns == stamp
    assert time.perf_counter() - t0 < 5  # no recompilation (a generous bound, not a benchmark)
    entry = first.parent
    assert (entry / "scale.c").read_text() == _code().source
    assert " ".join(current_toolchain().flags) in (entry / "command.txt").read_text()
    assert not list(entry.glob(".*tmp"))


def test_different_code_or_flags_get_different_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYDL_CACHE_DIR", str(tmp_path))
    a = build_shared_library(_code(8))
    b = build_shared_library(_code(9))
    c = build_shared_library(_code(8), Toolchain("cc", ("-O1",)))
    assert len({a.parent, b.parent, c.parent}) == 3


def test_content_key_separates_parts() -> None:
    assert content_key(["ab", "c"]) != content_key(["a", "bc"])


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "f.bin"
    write_atomic(target, b"one")
    write_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_missing_compiler_is_a_compile_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYDL_CC", "no-such-cc-polydl")
    with pytest.raises(CompileError) as info:
        polydl.compile(SPEC, {"N": 3})
    assert "no-such-cc-polydl" in str(info.value)


def test_failing_compile_reports_command_and_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYDL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("POLYDL_CFLAGS", "-O2 -fno-such-flag-polydl")
    with pytest.raises(CompileError) as info:
        polydl.compile(SPEC, {"N": 4})
    err = info.value
    assert "-fno-such-flag-polydl" in err.command
    assert "fno-such-flag-polydl" in err.output
    assert not list(tmp_path.rglob("*.so"))


def test_compiler_identity_names_the_compiler() -> None:
    assert "cc" in compiler_identity("cc") or "gcc" in compiler_identity("cc")


def test_stored_lowerings_are_keyed_by_the_compilers_code(monkeypatch: pytest.MonkeyPatch) -> None:
    from polydl.driver import pipeline
    from polydl.runtime import cache
    from polydl.target import CPU_PRESETS, host_target

    nest, params = load_spec("void f(int N, float y[N]) { for (int i = 0; i < N; i++) y[i] += 1.0f; }",
                             {"N": 8})
    native = host_target()
    before = pipeline.lowering_key(nest, params, native, "auto")
    assert before == pipeline.lowering_key(nest, params, native, "auto")
    assert pipeline.lowering_key(nest, params, CPU_PRESETS["generic"], "auto") != before
    monkeypatch.setattr(pipeline, "compiler_revision", lambda: "other code")
    assert pipeline.lowering_key(nest, params, native, "auto") != before
    assert len(cache.compiler_revision()) == 16


def test_compiler_revision_hashes_only_the_code_that_generates_kernels() -> None:
    from polydl.runtime import cache

    package = Path(cache.__file__).resolve().parents[1]
    hashed = [p.relative_to(package).as_posix() for p in cache.revision_files()]
    assert len(set(hashed)) == len(hashed)
    for excluded in ("bench/", "runtime/"):
        assert not [p for p in hashed if p.startswith(excluded)], excluded
    assert "cli.py" not in hashed and "driver/explain.py" not in hashed
    assert "driver/pipeline.py" in hashed and "target/cpu.py" in hashed
    for folder in ("frontends/", "poly/", "schedules/", "codegen/"):
        assert any(p.startswith(folder) and p.endswith(".py") for p in hashed), folder
    assert any(p.startswith("codegen/templates/") and p.endswith(".j2") for p in hashed)
    assert "api.py" in hashed and "frontends/__init__.py" in hashed
