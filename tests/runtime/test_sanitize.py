"""The sanitizer mode: kernels built with ASan+UBSan, in a Python started with ASan's runtime;
a memory error or undefined behaviour aborts the process (no recovery), so a test fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from polydl.errors import CompileError
from polydl.runtime.sanitize import runtime_library, sanitized_environment, sanitizer_flags

ROOT = Path(__file__).resolve().parents[2]


def _has_asan() -> bool:
    if shutil.which("cc") is None:
        return False
    try:
        runtime_library("cc")
    except CompileError:
        return False
    return True


needs_asan = pytest.mark.skipif(not _has_asan(), reason="needs a compiler with libasan")

# Builds a hand-written library with the sanitized toolchain and calls it: `BUG` selects a
# heap overflow, a signed overflow, or nothing; then a polydl kernel runs under the same runtime.
SCRIPT = textwrap.dedent(
    """
    import sys, cffi, numpy as np
    from pathlib import Path
    import polydl
    from polydl.runtime.c.toolchain import compile_library, current_toolchain
    bug, out = sys.argv[1], Path(sys.argv[2])
    source = out / "bug.c"
    source.write_text('''
    #include <stdlib.h>
    int overflow(int size, int n) { int *a = malloc(size * sizeof(int)); a[n] = 1; int v = a[0]; free(a); return v; }
    int add(int a, int b) { return a + b; }
    ''')
    library = out / "libbug.so"
    compile_library(current_toolchain(), source, library)
    ffi = cffi.FFI()
    ffi.cdef("int overflow(int size, int n); int add(int a, int b);")
    lib = ffi.dlopen(str(library))
    if bug == "heap":
        lib.overflow(4, 4)
    elif bug == "signed":
        lib.add(2147483647, 1)
    else:
        lib.overflow(4, 3)
        lib.add(1, 2)
    import islpy as isl
    try:  # islpy raises through a C++ exception, which ASan intercepts
        isl.Set("{ [i] : ")
    except isl.Error:
        pass
    k = polydl.matmul(M=19, N=23, K=7)
    a, b = np.ones((19, 7), np.float32), np.ones((7, 23), np.float32)
    assert np.allclose(k(a, b), 7.0)
    print("clean run")
    """
)


def _run(bug: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = sanitized_environment()
    env["PYTHONPATH"] = str(ROOT)
    env["POLYDL_CACHE_DIR"] = str(tmp_path / "cache")
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, bug, str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600,
    )


def test_flags_abort_on_the_first_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYDL_SANITIZE", "address,undefined")
    flags = sanitizer_flags()
    assert "-fsanitize=address,undefined" in flags and "-fno-sanitize-recover=all" in flags
    monkeypatch.setenv("POLYDL_SANITIZE", "")
    assert sanitizer_flags() == ()


@needs_asan
def test_clean_code_runs_clean(tmp_path: Path) -> None:
    result = _run("none", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "clean run" in result.stdout


@needs_asan
@pytest.mark.parametrize("bug, reports", [
    # ASan's report, or (gcc 13) UBSan's object-size check, which sees the same store first
    ("heap", ("heap-buffer-overflow", "insufficient space for an object")),
    ("signed", ("signed integer overflow",)),
])
def test_a_report_fails_the_process(bug: str, reports: tuple[str, ...], tmp_path: Path) -> None:
    result = _run(bug, tmp_path)
    assert result.returncode != 0
    assert any(report in result.stderr for report in reports), result.stderr[-3000:]
    assert "clean run" not in result.stdout


def test_asan_build_refused_without_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    import polydl
    from polydl.runtime import sanitize

    monkeypatch.setenv("POLYDL_SANITIZE", "address")
    monkeypatch.setattr(sanitize, "asan_runtime_loaded", lambda: False)
    with pytest.raises(polydl.PolyDLError, match="LD_PRELOAD"):
        polydl.matmul(M=3, N=5, K=2)


def test_compilers_run_without_the_preloaded_sanitizer_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    from polydl.runtime.sanitize import compiler_environment

    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/gcc/x86_64-linux-gnu/12/libasan.so /opt/other.so")
    assert compiler_environment()["LD_PRELOAD"] == "/opt/other.so"
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libasan.so.8")
    assert "LD_PRELOAD" not in compiler_environment()
