"""Toolchain faults end in a `CompileError` naming the command and the compiler's message, or
in the documented fallback (no OpenMP: serial kernels with a `ToolchainWarning`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl.errors import CompileError, ScheduleError, ToolchainWarning
from polydl.runtime.c import toolchain
from tests.kernels import run_and_check
from tests.runtime.faults import fake_compiler

SPEC = """
void scale(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++)
    y[i] = 3.0f * x[i];
}
"""


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("POLYDL_CACHE_DIR", str(root))
    return root


def _use(monkeypatch: pytest.MonkeyPatch, script: Path) -> None:
    monkeypatch.setenv("POLYDL_CC", str(script))


def test_missing_compiler(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYDL_CC", "/nonexistent/bin/cc")
    with pytest.raises(CompileError) as info:
        polydl.compile(SPEC, {"N": 3})
    assert "/nonexistent/bin/cc" in str(info.value) and "POLYDL_CC" in info.value.output


def test_failing_compiler_message_and_command(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, fake_compiler(tmp_path, "failcc", 'echo "failcc: internal error: broken" >&2; exit 4'))
    with pytest.raises(CompileError) as info:
        polydl.compile(SPEC, {"N": 5})
    err = info.value
    assert "failcc" in err.command and "scale.c" in err.command
    assert "internal error: broken" in err.output
    assert not list(cache.rglob("*.so")) and not list(cache.rglob("manifest.json"))


def test_compiler_without_openmp_falls_back_to_serial_kernels(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, fake_compiler(tmp_path, "noompcc", (
        'for a in "$@"; do [ "$a" = "-fopenmp" ] && '
        '{ echo "noompcc: error: unsupported option \'-fopenmp\'" >&2; exit 1; }; done\n'
        'exec "$REAL_CC" "$@"'
    )))
    with pytest.warns(ToolchainWarning, match="OpenMP"):
        k = polydl.compile(SPEC, {"N": 300})
    assert "-fopenmp" not in (k.library_path.parent / "command.txt").read_text()
    run_and_check(k, lambda x: 3 * x)


def test_an_error_about_an_openmp_construct_is_no_missing_openmp(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gcc refusing a construct in the code is a fault of the code, reported: a serial rebuild
    would hide it behind a warning that the compiler lacks OpenMP."""
    _use(monkeypatch, fake_compiler(tmp_path, "strictcc", (
        'for a in "$@"; do [ "$a" = "-fopenmp" ] && { echo "k.c:9:5: error: OpenMP constructs '
        'other than \'simd\' may not be nested inside \'simd\' region" >&2; exit 1; }; done\n'
        'exec "$REAL_CC" "$@"'
    )))
    with pytest.raises(CompileError, match="OpenMP constructs"):
        polydl.compile(SPEC, {"N": 7})


def test_compiler_that_writes_nothing(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, fake_compiler(tmp_path, "lazycc", "exit 0"))
    with pytest.raises(CompileError, match="wrote no library"):
        polydl.compile(SPEC, {"N": 6})


def test_compiler_that_writes_garbage(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = 'while [ "$1" != "-o" ]; do shift; done; echo "not an ELF file" > "$2"; exit 0'
    _use(monkeypatch, fake_compiler(tmp_path, "junkcc", body))
    with pytest.raises(CompileError) as info:
        polydl.compile(SPEC, {"N": 7})
    assert "cannot load" in info.value.output


@pytest.mark.slow
def test_hanging_compiler_times_out(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, fake_compiler(tmp_path, "slowcc", "exec sleep 30"))
    monkeypatch.setattr(toolchain, "COMPILE_TIMEOUT_S", 1)
    with pytest.raises(CompileError, match="timed out"):
        polydl.compile(SPEC, {"N": 8})


def test_unknown_sanitizer_is_a_clear_error(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYDL_SANITIZE", "address,threads")
    with pytest.raises(polydl.PolyDLError, match="threads"):
        polydl.compile(SPEC, {"N": 9})


def test_missing_libxsmm(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without LIBXSMM the default backend is polydl's own; asking for LIBXSMM is a clear error."""
    import polydl.codegen.c.microkernels as microkernels

    monkeypatch.setattr(microkernels, "libxsmm_available", lambda: False)
    k = polydl.compile(MATMUL, {"M": 16, "N": 16, "K": 16})
    assert k.schedule.microkernel is not None and "-lxsmm" not in k.source
    run_and_check(k, lambda a, b: a.astype(np.float64) @ b)
    wanted = k.schedule.to_dict()
    wanted["microkernel"] = {**wanted["microkernel"], "backend": "libxsmm"}
    with pytest.raises(ScheduleError, match="libxsmm-dev"):
        polydl.compile(MATMUL, {"M": 16, "N": 16, "K": 16}, schedule=wanted)


MATMUL = """void mm(int M, int N, int K, float C[M][N], const float A[M][K], const float B[K][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
}
"""
