"""A compiled network: its shared library built from the layers' kernels, and the Python
callable over numpy arrays that runs it.

The library is the network's translation unit (`codegen.c.network`) linked with one object per
distinct layer kernel; objects are compiled in parallel. Libraries are cached by content (every
source, the flags, the compiler); the weights blob travels beside the library or inside it.
"""

from __future__ import annotations

import os
import shlex
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cffi
import numpy as np

from polydl.codegen.artifact import GeneratedCode
from polydl.codegen.c.network import NetworkSource
from polydl.errors import CompileError, PolyDLError, ShapeError
from polydl.runtime.c.toolchain import Toolchain, current_toolchain, run_compiler
from polydl.runtime.cache import (
    content_key,
    entry_dir,
    entry_is_complete,
    entry_lock,
    write_atomic,
    write_manifest,
)
from polydl.runtime.kernel import aligned_zeros
from polydl.runtime.loading import load_for_life
from polydl.runtime.sanitize import require_runtime
from polydl.version import __version__

SHARED = ("-fPIC", "-std=gnu11")


def link_network(network: NetworkSource, kernels: Sequence[GeneratedCode], directory: Path,
                 toolchain: Toolchain | None = None) -> Path:
    """Write the sources into `directory` and build `lib<name>.so` there."""
    toolchain = toolchain or current_toolchain()
    target_flags = kernels[0].target_flags if kernels else ()
    extra = tuple(dict.fromkeys(f for code in kernels for f in code.compile_flags))
    directory.mkdir(parents=True, exist_ok=True)
    sources = [(directory / f"{network.function}.c", network.source)]
    sources += [(directory / f"{code.function}.c", code.source) for code in kernels]
    for path, text in sources:
        write_atomic(path, text.encode())
    write_atomic(directory / f"{network.function}.h", network.header.encode())
    build = Path(tempfile.mkdtemp(dir=directory, prefix=".build."))
    objects = [build / f"{path.stem}.o" for path, _ in sources]
    # each kernel's code-generation flags (-f..., such as its math's -fno-math-errno) compile its
    # own object; the libraries it names are linked below
    own = [(), *(tuple(f for f in code.compile_flags if f.startswith("-f")) for code in kernels)]
    commands = [[toolchain.compiler, "-c", *SHARED, *toolchain.flags, *target_flags, *flags,
                 str(path), "-o", str(obj)]
                for (path, _), obj, flags in zip(sources, objects, own, strict=True)]
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda c: run_compiler(toolchain, c, directory), commands))
    library = directory / f"lib{network.function}.so"
    link = [toolchain.compiler, "-shared", *SHARED, *toolchain.flags, *target_flags,
            *map(str, objects), "-o", str(build / library.name), *extra, "-lm", "-lpthread", "-ldl"]
    run_compiler(toolchain, link, directory)
    write_atomic(directory / "command.txt",
                 ("\n".join(shlex.join(c) for c in [*commands, link]) + "\n").encode())
    os.replace(build / library.name, library)
    for obj in objects:
        obj.unlink(missing_ok=True)
    build.rmdir()
    return library


def cached_network_library(network: NetworkSource, kernels: Sequence[GeneratedCode]) -> Path:
    """The cached library of `network`, built if the cache has no complete entry."""
    toolchain = current_toolchain()
    key = content_key([__version__, toolchain.identity, " ".join(toolchain.flags), network.source,
                       *(code.source + " ".join(code.target_flags) for code in kernels)])
    entry = entry_dir(key)
    library = entry / f"lib{network.function}.so"
    files = [library, entry / f"{network.function}.c"]
    if entry_is_complete(entry, files):
        return library
    with entry_lock(entry):
        if not entry_is_complete(entry, files):
            link_network(network, kernels, entry, toolchain)
            write_manifest(entry, files)
    return library


# Loaded libraries stay loaded for the life of the process (as kernels do, runtime/c/kernel.py):
# unloading one would unmap the OpenMP runtime its idle worker threads still run. Networks of
# the same structure share one library (its cache key is the code, not the weights), so each
# call sets its own weights under the library's lock.
_LOADED: dict[Path, tuple[cffi.FFI, Any, threading.Lock]] = {}
_LOAD_LOCK = threading.Lock()
# per library: the weights (a network's array) it was handed last
_CURRENT_WEIGHTS: dict[Path, weakref.ref[np.ndarray]] = {}


def _load(library: Path, function: str, inputs: int, outputs: int) -> tuple[cffi.FFI, Any, threading.Lock]:
    with _LOAD_LOCK:
        if library not in _LOADED:
            ffi = cffi.FFI()
            parameters = [f"const float *in{i}" for i in range(inputs)]
            parameters += [f"float *out{i}" for i in range(outputs)]
            ffi.cdef(f"int {function}({', '.join(parameters)});\n"
                     f"int {function}_set_weights(const void *blob);\n"
                     f"int {function}_set_profile(double *times);")
            require_runtime()
            try:
                lib = load_for_life(ffi, library)
            except OSError as exc:
                raise CompileError("dlopen", [str(library)], f"cannot load the network: {exc}") from None
            _LOADED[library] = (ffi, lib, threading.Lock())
        return _LOADED[library]


class Network:
    """A compiled network: `net(x, ...)` runs it on numpy float32 inputs in the graph's input
    order and returns the output (a tuple for several); `net.run({name: x})` returns a dict
    by output name; `net.explain()` tells what each step is."""

    def __init__(self, library: Path, function: str, inputs: Sequence[tuple[str, tuple[int, ...]]],
                 outputs: Sequence[tuple[str, tuple[int, ...]]], weights: bytes,
                 explanation: str, source: str = "") -> None:
        self.library_path = library
        self.function = function
        self.inputs = [(name, tuple(shape)) for name, shape in inputs]
        self.outputs = [(name, tuple(shape)) for name, shape in outputs]
        self.explanation = explanation
        self.source = source
        self._ffi, self._lib, self._lock = _load(library, function, len(self.inputs),
                                                 len(self.outputs))
        self._entry = getattr(self._lib, function)
        self._set_weights = getattr(self._lib, f"{function}_set_weights")
        # kept alive, on a cache line as the kernels' arrays are: the library reads it every call
        self._weights = aligned_zeros((len(weights),), np.dtype(np.uint8))
        self._weights[:] = np.frombuffer(weights, dtype=np.uint8)

    def _use_weights(self) -> None:
        """Hand the library this network's weights, unless they are the ones it holds (under
        the library's lock). Setting them tells the kernels that keep packed copies of weights
        to pack again, so it is done only when another network of the library ran since."""
        current = _CURRENT_WEIGHTS.get(self.library_path)
        if current is None or current() is not self._weights:
            self._set_weights(self._ffi.cast("void *", self._weights.ctypes.data))
            _CURRENT_WEIGHTS[self.library_path] = weakref.ref(self._weights)

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}{list(s)}" for n, s in self.inputs)
        outs = ", ".join(f"{n}{list(s)}" for n, s in self.outputs)
        return f"<polydl.Network {self.function}({ins}) -> {outs}>"

    def explain(self) -> str:
        return self.explanation

    def _checked(self, name: str, shape: tuple[int, ...], value: Any) -> np.ndarray:
        if not isinstance(value, np.ndarray):
            raise ShapeError(name, "must be a numpy array", expected=f"float32{list(shape)}",
                             given=type(value).__name__)
        if value.dtype != np.float32:
            raise ShapeError(name, "has the wrong dtype", expected="float32", given=str(value.dtype))
        if value.shape != shape:
            raise ShapeError(name, "has the wrong shape", expected=list(shape), given=list(value.shape))
        return np.ascontiguousarray(value)

    def __call__(self, *args: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        if len(args) != len(self.inputs):
            raise ShapeError("<call>", f"the network takes {len(self.inputs)} input(s) "
                             f"({', '.join(n for n, _ in self.inputs)})",
                             expected=len(self.inputs), given=len(args))
        arrays = [self._checked(n, s, v) for (n, s), v in zip(self.inputs, args, strict=True)]
        results = [aligned_zeros(shape, np.dtype(np.float32)) for _, shape in self.outputs]
        pointers = [self._ffi.cast("float *", a.ctypes.data) for a in [*arrays, *results]]
        with self._lock:  # one library serves every network of the same structure
            self._use_weights()
            status = self._entry(*pointers)
        if status != 0:
            raise PolyDLError(f"network {self.function} failed with status {status} "
                              "(-1: out of memory, -2: weights unreadable)")
        return results[0] if len(results) == 1 else tuple(results)

    def profile(self, *args: Any, repeat: int = 1) -> list[float]:
        """Seconds each step took, the median over `repeat` calls on these inputs (the
        steps as `explain` numbers them)."""
        set_profile = getattr(self._lib, f"{self.function}_set_profile")
        count = set_profile(self._ffi.NULL)
        samples = []
        for _ in range(max(1, repeat)):
            times = np.zeros(count, dtype=np.float64)
            with self._lock:
                set_profile(self._ffi.cast("double *", times.ctypes.data))
            try:
                self(*args)
            finally:
                with self._lock:
                    set_profile(self._ffi.NULL)
            samples.append(times)
        return [float(v) for v in np.median(np.stack(samples), axis=0)]

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        names = [n for n, _ in self.inputs]
        unknown = [k for k in feeds if k not in names]
        if unknown:
            raise ShapeError(unknown[0], "is not an input of the network", expected=", ".join(names),
                             given=unknown[0])
        missing = [n for n in names if n not in feeds]
        if missing:
            raise ShapeError(missing[0], "is missing", expected=", ".join(names),
                             given=", ".join(feeds) or "none")
        result = self(*(feeds[n] for n in names))
        values = result if isinstance(result, tuple) else (result,)
        return {name: v for (name, _), v in zip(self.outputs, values, strict=True)}
