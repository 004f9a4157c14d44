"""The compiler driver: generated C in, a shared library in the compile cache out.

The C compiler is `POLYDL_CC` (default `cc`) with `POLYDL_CFLAGS` (default
`-O3 -march=native -fopenmp`). A library is built once per content key (see `cache.py`); the
entry keeps the source and the exact command, so every generated file can be inspected.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from polydl.codegen.artifact import GeneratedCode
from polydl.errors import CompileError
from polydl.runtime.cache import content_key, entry_dir, write_atomic
from polydl.version import __version__

DEFAULT_CFLAGS = ("-O3", "-march=native", "-fopenmp")
# Flags every shared library needs, whatever the user configures.
SHARED_FLAGS = ("-shared", "-fPIC", "-std=gnu11")


@dataclass(frozen=True)
class Toolchain:
    compiler: str
    flags: tuple[str, ...]

    @property
    def identity(self) -> str:
        return compiler_identity(self.compiler)

    def command(self, source: Path, output: Path, extra: tuple[str, ...] = ()) -> list[str]:
        return [self.compiler, *SHARED_FLAGS, *self.flags, str(source), "-o", str(output), *extra, "-lm"]


def current_toolchain() -> Toolchain:
    compiler = os.environ.get("POLYDL_CC", "cc")
    flags = os.environ.get("POLYDL_CFLAGS")
    return Toolchain(compiler, tuple(shlex.split(flags)) if flags is not None else DEFAULT_CFLAGS)


@cache
def compiler_identity(compiler: str) -> str:
    """The compiler's path and first `--version` line: part of every cache key."""
    path = shutil.which(compiler)
    if path is None:
        raise CompileError(compiler, [compiler], f"C compiler '{compiler}' not found on PATH (set POLYDL_CC)")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CompileError(compiler, [path, "--version"], str(exc)) from None
    first = (out.stdout or out.stderr).strip().splitlines()
    return f"{os.path.realpath(path)} {first[0] if first else ''}"


def build_shared_library(code: GeneratedCode, toolchain: Toolchain | None = None) -> Path:
    """The cached shared library for `code`, compiling it if the cache has none."""
    if code.target != "c":
        raise CompileError("polydl", [], f"target '{code.target}' has no host shared library")
    toolchain = toolchain or current_toolchain()
    key = content_key(
        [__version__, toolchain.identity, " ".join(toolchain.flags), " ".join(code.compile_flags),
         code.source]
    )
    entry = entry_dir(key)
    library = entry / f"lib{code.function}.so"
    if library.is_file():
        return library
    entry.mkdir(parents=True, exist_ok=True)
    source = entry / f"{code.function}.c"
    write_atomic(source, code.source.encode())
    write_atomic(entry / f"{code.function}.h", code.header.encode())
    compile_library(toolchain, source, library, code.compile_flags)
    return library


def compile_library(
    toolchain: Toolchain, source: Path, library: Path, extra: tuple[str, ...] = ()
) -> None:
    """Compile `source` into `library` through a temporary file renamed into place."""
    fd, tmp_name = tempfile.mkstemp(dir=library.parent, prefix=f".{library.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    command = toolchain.command(source, tmp, extra)
    write_atomic(library.parent / "command.txt", (shlex.join(command) + "\n").encode())
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        tmp.unlink(missing_ok=True)
        raise CompileError(toolchain.compiler, command, f"C compiler '{toolchain.compiler}' not found") from None
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise CompileError(toolchain.compiler, command, "compiler timed out after 600 s") from None
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise CompileError(toolchain.compiler, command, result.stderr or result.stdout)
    os.replace(tmp, library)
