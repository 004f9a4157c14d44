"""Ahead-of-time output: the files `polydl compile -o DIR` writes for use without Python.

Takes `GeneratedCode`; writes the source and the header and, for the C target, a shared library
whose exported function has the spec's name and can be linked from plain C or C++. Files get
the mode open() gives (0644 under the usual umask).

It sits in the driver, above the runtime, because it picks the runtime backend by the code's kind
(`runtime.c.toolchain`, `runtime.gpu.toolchain`); a stage's shared modules never reach into its
backend folders.
"""

from __future__ import annotations

from pathlib import Path

from polydl.codegen.artifact import GeneratedCode
from polydl.runtime.c.toolchain import build_shared_library
from polydl.runtime.cache import write_atomic

SOURCE_SUFFIX = {"c": ".c", "cuda": ".cu", "hip": ".hip.cpp"}


def write_artifacts(code: GeneratedCode, directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    if code.launcher:  # GPU targets: kernels, host launcher, header
        from polydl.runtime.gpu.toolchain import write_sources

        return write_sources(code, directory)
    paths = {
        "source": directory / f"{code.function}{SOURCE_SUFFIX.get(code.kind, '.txt')}",
        "header": directory / f"{code.function}.h",
    }
    write_atomic(paths["source"], code.source.encode())
    write_atomic(paths["header"], code.header.encode())
    if code.kind == "c":
        library = directory / f"lib{code.function}.so"
        # a copy of the cached library, written as the sources are (atomically, mode 0644)
        write_atomic(library, build_shared_library(code).read_bytes())
        paths["library"] = library
    return paths
