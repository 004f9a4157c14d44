"""The GPU compiler drivers: generated CUDA/HIP in, a host-launcher shared library out.

CUDA compiles with `POLYDL_NVCC` (default `nvcc`), HIP with `POLYDL_HIPCC` (default `hipcc`,
`HIP_PLATFORM=amd`), for the architectures the generated code names (its target's). Libraries
are cached by content key like the C target's; the entry keeps the sources and the command.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from polydl import settings
from polydl.codegen.artifact import GeneratedCode
from polydl.codegen.gpu.generate import SOURCE_SUFFIX, architecture_flags
from polydl.errors import CompileError
from polydl.runtime.cache import content_key, entry_dir, write_atomic
from polydl.runtime.sanitize import compiler_environment
from polydl.version import __version__

COMPILERS = {"cuda": settings.VARIABLES["nvcc"], "hip": settings.VARIABLES["hipcc"]}


def gpu_compiler(kind: str) -> str:
    return settings.gpu_compiler(kind)


def gpu_command(
    kind: str, launcher: Path, output: Path, architectures: tuple[str, ...] | None = None,
    code_flags: tuple[str, ...] = (),
) -> list[str]:
    """The build command: for `architectures` where given, else the generated code's flags."""
    compiler = gpu_compiler(kind)
    arch = list(architecture_flags(kind, architectures) if architectures else code_flags)
    if kind == "cuda":
        return [compiler, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", *arch,
                str(launcher), "-o", str(output)]
    return [compiler, "-O3", "-std=c++17", "-shared", "-fPIC", *arch, str(launcher),
            "-o", str(output)]


def write_sources(code: GeneratedCode, directory: Path) -> dict[str, Path]:
    """The kernel source, the launcher (which includes it) and the header, in `directory`."""
    suffix = SOURCE_SUFFIX[code.kind]
    paths = {
        "source": directory / f"{code.function}{suffix}",
        "launcher": directory / f"{code.function}_launch{suffix}",
        "header": directory / f"{code.function}.h",
    }
    write_atomic(paths["source"], code.source.encode())
    write_atomic(paths["launcher"], code.launcher.encode())
    write_atomic(paths["header"], code.header.encode())
    return paths


def run_compiler(command: list[str], kind: str) -> None:
    env = compiler_environment()
    if kind == "hip":
        env.setdefault("HIP_PLATFORM", "amd")
    if shutil.which(command[0]) is None:
        raise CompileError(command[0], command, f"{kind} compiler '{command[0]}' not found on PATH "
                           f"(set {COMPILERS[kind]})")
    # clang's HIP driver leaves two empty folders in TMPDIR per compile (its offload bundles'):
    # a folder of its own, removed after, keeps them out of the user's /tmp
    with tempfile.TemporaryDirectory(prefix="polydl-gpucc-") as scratch:
        env["TMPDIR"] = scratch
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
        except subprocess.TimeoutExpired:
            raise CompileError(command[0], command, "compiler timed out after 900 s") from None
    if result.returncode != 0:
        raise CompileError(command[0], command, result.stderr or result.stdout)


def compile_gpu_library(
    code: GeneratedCode, directory: Path, architectures: tuple[str, ...] | None = None
) -> Path:
    """Write the sources into `directory` and compile the launcher into a shared library."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = write_sources(code, directory)
    library = directory / f"lib{code.function}.so"
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{library.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    command = gpu_command(code.kind, paths["launcher"], tmp, architectures, code.compile_flags)
    write_atomic(directory / "command.txt", (shlex.join(command) + "\n").encode())
    try:
        run_compiler(command, code.kind)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, library)
    return library


def build_gpu_library(code: GeneratedCode) -> Path:
    """The cached launcher library for `code`, compiling it if the cache has none."""
    compiler = gpu_compiler(code.kind)
    key = content_key(
        [__version__, code.kind, shutil.which(compiler) or compiler, code.source, code.launcher,
         " ".join(code.compile_flags)]
    )
    entry = entry_dir(key)
    library = entry / f"lib{code.function}.so"
    if library.is_file():
        return library
    return compile_gpu_library(code, entry)
