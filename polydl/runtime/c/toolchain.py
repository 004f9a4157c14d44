"""The compiler driver: generated C in, a shared library in the compile cache out.

The C compiler is `POLYDL_CC` (default `cc`) with `POLYDL_CFLAGS` (default `-O3 -fopenmp`),
then the flags of the code's target (`-march=` of the target and its ISA's `-m` options, never
`-march=native`: the library is for the target, not for the machine that builds it), plus the
sanitizer flags of `POLYDL_SANITIZE` (see `sanitize.py`). A compiler that does not know the
target's -march (an older gcc and `znver4`) builds for the same ISA by its x86-64 level, with a
`ToolchainWarning`. A library is built once per content key (see `cache.py`), under a lock so that
concurrent processes share one build; the entry keeps the source and the exact command, so
every generated file can be inspected. A compiler that rejects `-fopenmp` (or cannot link
OpenMP) gets the same command without it, with a `ToolchainWarning`: kernels then run on one
thread.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from polydl import settings
from polydl.codegen.artifact import GeneratedCode
from polydl.errors import CacheWarning, CompileError, ToolchainWarning
from polydl.runtime.cache import (
    MANIFEST,
    content_key,
    entry_dir,
    entry_is_complete,
    entry_lock,
    fall_back,
    is_unwritable,
    write_atomic,
    write_manifest,
)
from polydl.runtime.sanitize import compiler_environment, sanitizer_flags
from polydl.settings import cache_dir as cache_root
from polydl.version import __version__

DEFAULT_CFLAGS = ("-O3", "-fopenmp")
# gcc's loop splitting (on at -O3) turns a sum along an innermost loop, an `omp simd reduction`,
# back into scalar code where it sits in a triangular loop (`j <= i`) of a parallel region
# (gcc 12: syrk's dot products); isl has already split the loops where conditions change.
GCC_CFLAGS = ("-fno-split-loops",)
# Flags every shared library needs, whatever the user configures.
SHARED_FLAGS = ("-shared", "-fPIC", "-std=gnu11")
COMPILE_TIMEOUT_S = 600
OPENMP_FLAG = "-fopenmp"
# What compilers say when they lack OpenMP: gcc/clang option errors, a missing libgomp/libomp
# or omp.h; never an error about an OpenMP construct in the code (generated code that OpenMP
# refuses is a bug to report, not a compiler to build serially with).
_NO_OPENMP = re.compile(r"-fopenmp|-lgomp|-lomp|omp\.h|libgomp|libomp", re.IGNORECASE)
_DISK_FULL = "No space left on device"
# What compilers say of a -march or -mtune they do not know (gcc: "bad value", clang: "unknown
# target CPU").
_UNKNOWN_MARCH = re.compile(
    r"bad value .*-m(arch|tune)|unknown target CPU|-m(arch|tune)=.*(unknown|invalid)", re.IGNORECASE)


@dataclass(frozen=True)
class Toolchain:
    compiler: str
    flags: tuple[str, ...]

    @property
    def identity(self) -> str:
        return compiler_identity(self.compiler)

    def command(
        self, source: Path, output: Path, target_flags: tuple[str, ...] = (),
        extra: tuple[str, ...] = (),
    ) -> list[str]:
        return [self.compiler, *SHARED_FLAGS, *self.flags, *target_flags, str(source), "-o",
                str(output), *extra, "-lm"]


def current_toolchain() -> Toolchain:
    compiler = settings.cc()
    flags = settings.cflags()
    chosen = flags if flags is not None else DEFAULT_CFLAGS + (GCC_CFLAGS if is_gcc(compiler) else ())
    return Toolchain(compiler, chosen + sanitizer_flags())


def is_gcc(compiler: str) -> bool:
    """Whether `compiler` is GCC (its `--version` names the FSF; clang's and others' do not)."""
    try:
        version = _version(compiler)[1]
    except CompileError:  # no compiler: the build says so
        return False
    return "Free Software Foundation" in version and "clang" not in version.lower()


def compiler_identity(compiler: str) -> str:
    """The compiler's path and first `--version` line: part of every cache key."""
    path, version = _version(compiler)
    first = version.strip().splitlines()
    return f"{os.path.realpath(path)} {first[0] if first else ''}"


@cache
def _version(compiler: str) -> tuple[str, str]:
    """The compiler's path and what its `--version` prints."""
    path = shutil.which(compiler)
    if path is None:
        raise CompileError(compiler, [compiler], f"C compiler '{compiler}' not found on PATH (set POLYDL_CC)")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CompileError(compiler, [path, "--version"], str(exc)) from None
    return path, out.stdout or out.stderr


def build_shared_library(code: GeneratedCode, toolchain: Toolchain | None = None) -> Path:
    """The cached shared library for `code`, compiling it if the cache has no complete entry."""
    if code.kind != "c":
        raise CompileError("polydl", [], f"target '{code.kind}' has no host shared library")
    toolchain = toolchain or current_toolchain()
    key = content_key(
        [__version__, toolchain.identity, " ".join(toolchain.flags), " ".join(code.compile_flags),
         " ".join(code.target_flags), code.source]
    )
    # the configured root first: it may be read-only and still hold a complete entry
    library = _complete_library(entry_dir(key, cache_root()), code)
    if library is not None:
        return library
    try:
        return _cached_build(entry_dir(key), code, toolchain)
    except OSError as exc:
        if not is_unwritable(exc):
            raise
        fall_back(exc)  # read-only or full: build in this process's temporary cache
        return _cached_build(entry_dir(key), code, toolchain)


def _entry_files(entry: Path, code: GeneratedCode) -> list[Path]:
    return [entry / f"lib{code.function}.so", entry / f"{code.function}.c", entry / f"{code.function}.h"]


def _complete_library(entry: Path, code: GeneratedCode) -> Path | None:
    files = _entry_files(entry, code)
    return files[0] if entry_is_complete(entry, files) else None


def _cached_build(entry: Path, code: GeneratedCode, toolchain: Toolchain) -> Path:
    files = _entry_files(entry, code)
    library = files[0]
    with entry_lock(entry):
        if entry_is_complete(entry, files):  # another process built it while we waited
            return library
        if (entry / MANIFEST).exists():  # no manifest: an older layout, rebuilt quietly
            warnings.warn(
                CacheWarning(f"cache entry {entry} is incomplete or corrupted; rebuilding it"),
                stacklevel=3,
            )
        write_atomic(files[1], code.source.encode())
        write_atomic(files[2], code.header.encode())
        compile_for_target(toolchain, files[1], library, code)
        write_manifest(entry, files)
    return library


def compile_for_target(toolchain: Toolchain, source: Path, library: Path, code: GeneratedCode) -> None:
    """Compile `code` (written at `source`) for its target; by the ISA's x86-64 level where the
    compiler does not know the target's -march or -mtune."""
    try:
        compile_library(toolchain, source, library, code.compile_flags, code.target_flags)
    except CompileError as exc:
        if code.fallback_flags == code.target_flags or not _UNKNOWN_MARCH.search(exc.output):
            raise
        compile_library(toolchain, source, library, code.compile_flags, code.fallback_flags)
        warnings.warn(
            ToolchainWarning(
                f"C compiler '{toolchain.compiler}' does not know "
                f"{' '.join(f for f in code.target_flags if f not in code.fallback_flags)}; "
                f"built with {' '.join(code.fallback_flags)} (the same ISA)"
            ),
            stacklevel=4,
        )


def compile_library(
    toolchain: Toolchain, source: Path, library: Path, extra: tuple[str, ...] = (),
    target_flags: tuple[str, ...] = (),
) -> None:
    """Compile `source` into `library` through a temporary file renamed into place; without
    OpenMP if the compiler has none."""
    try:
        _compile(toolchain, source, library, extra, target_flags)
    except CompileError as exc:
        if OPENMP_FLAG not in toolchain.flags or not _NO_OPENMP.search(exc.output):
            raise
        serial = Toolchain(toolchain.compiler, tuple(f for f in toolchain.flags if f != OPENMP_FLAG))
        try:
            _compile(serial, source, library, extra, target_flags)
        except CompileError:
            raise exc from None
        warnings.warn(
            ToolchainWarning(
                f"C compiler '{toolchain.compiler}' cannot build with OpenMP "
                f"({exc.output.strip().splitlines()[0] if exc.output.strip() else 'no message'}); "
                "kernels run on one thread"
            ),
            stacklevel=4,
        )


def run_compiler(toolchain: Toolchain, command: list[str], folder: Path) -> None:
    """Run one compiler command: a `CompileError` when the compiler is missing, times out or
    fails; an `OSError` (ENOSPC) when `folder`'s disk is full."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S,
                                env=compiler_environment())
    except (FileNotFoundError, PermissionError):
        raise CompileError(
            toolchain.compiler, command, f"C compiler '{toolchain.compiler}' not found or not executable"
        ) from None
    except subprocess.TimeoutExpired:
        raise CompileError(
            toolchain.compiler, command, f"compiler timed out after {COMPILE_TIMEOUT_S} s"
        ) from None
    if result.returncode != 0:
        message = result.stderr or result.stdout or f"exit status {result.returncode}, no message"
        if _DISK_FULL in message:
            raise OSError(errno.ENOSPC, _DISK_FULL, str(folder))
        raise CompileError(toolchain.compiler, command, message)


def _compile(
    toolchain: Toolchain, source: Path, library: Path, extra: tuple[str, ...],
    target_flags: tuple[str, ...] = (),
) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=library.parent, prefix=f".{library.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    command = toolchain.command(source, tmp, target_flags, extra)
    write_atomic(library.parent / "command.txt", (shlex.join(command) + "\n").encode())
    try:
        run_compiler(toolchain, command, library.parent)
    except (CompileError, OSError):
        tmp.unlink(missing_ok=True)
        raise
    if os.path.getsize(tmp) == 0:
        tmp.unlink(missing_ok=True)
        raise CompileError(toolchain.compiler, command, "the compiler reported success but wrote no library")
    os.replace(tmp, library)
