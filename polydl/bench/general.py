"""The general-loop-nest suite: plain C kernels timed as polydl builds them, as gcc and clang
with LLVM Polly build the same C, and as PyTorch eager computes the DL operators.

Each kernel is a C file (`general_corpus`) whose function takes its int sizes first, then its
arrays and scalars. The reference builds get the sizes as compile-time constants (`-D`, the int
parameters removed from the signature), as polydl gets them: `gcc -O3 -march=native -fopenmp`
(the C's own `#pragma omp` lines run in parallel there; polydl ignores them), the same with
`-ffast-math`, and Polly. Every side starts each call from the same inputs (copied in before
the call, outside the timing), one call per side per round, sides interleaved; the medians are
compared. Every result is checked against the gcc build's (the C semantics); polydl's is also
checked against its numpy reference and gcc -O0 at the test sizes (the test suite). A kernel
polydl refuses is a row with the refusal as its status, the other sides still timed.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import polydl
from polydl.bench import torch_ops
from polydl.bench.general_corpus import CORPUS, ROOT, kernels_of
from polydl.bench.general_inputs import make_inputs
from polydl.bench.general_signature import Argument, read_signature
from polydl.errors import PolyDLError

Values = dict[str, np.ndarray]
Caller = Callable[[Values], None]

# name -> (bench sizes, test sizes)
SIZES: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    name: (dict(k.bench), dict(k.test)) for name, k in CORPUS.items()}
DL_OPERATORS = tuple(kernels_of("dl"))
CLASSIC = tuple(kernels_of("polybench"))

# each reference build's command (the sizes come as -D constants)
COMPILERS = {
    "gcc": ["gcc", "-O3", "-march=native", "-fopenmp"],
    "gcc_fastmath": ["gcc", "-O3", "-march=native", "-fopenmp", "-ffast-math"],
    "polly": ["clang-19", "-O3", "-march=native", "-mllvm", "-polly", "-mllvm", "-polly-parallel",
              "-lgomp"],
    "gcc_O0": ["gcc", "-O0"],  # the C semantics, for the correctness tests
}
SIDES = ("polydl", "gcc", "gcc_fastmath", "polly", "torch")


def kernel_path(name: str) -> Path:
    """The C file of corpus kernel `name`."""
    return CORPUS[name].path


@dataclass
class Result:
    kernel: str
    sizes: dict[str, int]
    threads: int = 1
    status: str = "ok"  # "ok", "refused: ...", "wrong: ...", "error: ..."
    ms: dict[str, float] = field(default_factory=dict)  # side -> median milliseconds
    errors: dict[str, float] = field(default_factory=dict)  # side -> relative error vs gcc
    notes: list[str] = field(default_factory=list)
    schedule: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "suite": CORPUS[self.kernel].suite, "sizes": self.sizes,
                "threads": self.threads, "status": self.status, "ms": self.ms,
                "errors": self.errors, "notes": self.notes, "schedule": self.schedule}


# ------------------------------------------------------------------ reference builds


def constant_size_source(source: str, function: str, sizes: Mapping[str, int]) -> str:
    """The source with the int size parameters removed from `function`'s signature (the
    compiler then gets them as `-D` constants)."""
    head = re.search(rf"\b{re.escape(function)}\s*\(", source)
    if head is None:
        raise PolyDLError(f"function {function} not found")
    start = head.end()
    for name in sizes:
        pattern = re.compile(rf"\bint\s+{re.escape(name)}\s*,\s*")
        match = pattern.search(source, start)
        if match is None:
            raise PolyDLError(f"size parameter 'int {name},' not found in {function}'s signature")
        source = source[: match.start()] + source[match.end():]
    return source


def build_reference(side: str, path: Path, function: str, sizes: Mapping[str, int],
                    workdir: Path) -> Path:
    """The shared library of `path` built by `side`'s compiler (`COMPILERS`), sizes as `-D`
    constants; kept in `workdir` under a key of everything that changes it."""
    command = COMPILERS[side]
    if shutil.which(command[0]) is None:
        raise FileNotFoundError(f"{command[0]} is not installed")
    source = "#include <math.h>\n" + constant_size_source(path.read_text(), function, sizes)
    defines = [f"-D{k}={v}" for k, v in sizes.items()]
    key = hashlib.sha256(repr((source, command, defines)).encode()).hexdigest()[:16]
    lib = workdir / f"{path.stem}-{side}-{key}.so"
    if not lib.exists():
        scratch = Path(tempfile.mkdtemp(dir=workdir))
        src = scratch / f"{path.stem}.c"
        src.write_text(source)
        # compiled and linked apart: gcc before 13 links a shared library built with
        # -ffast-math with crtfastmath.o, whose constructor flushes subnormals to zero in
        # the whole process that loads it (the tests, polydl's own kernels beside it)
        obj = scratch / f"{path.stem}.o"
        subprocess.run([*command, "-fPIC", "-c", *defines, str(src), "-o", str(obj)],
                       check=True, capture_output=True, text=True)
        link = [f for f in command[1:] if f == "-fopenmp" or f.startswith("-l")]
        subprocess.run([command[0], "-shared", str(obj), "-o", str(scratch / lib.name), *link, "-lm"],
                       check=True, capture_output=True, text=True)
        os.replace(scratch / lib.name, lib)  # whole or absent, for concurrent builders
        shutil.rmtree(scratch, ignore_errors=True)
    return lib


def reference_caller(lib: Path, function: str, args: list[Argument]) -> Caller:
    fn = getattr(ctypes.CDLL(str(lib)), function)
    fn.restype = None

    def call(values: Values) -> None:
        cargs: list[Any] = []
        for a in args:
            v = values[a.name]
            if not a.shape:
                cargs.append(ctypes.c_float(float(v)) if a.dtype == np.float32
                             else ctypes.c_double(float(v)))
            else:
                cargs.append(ctypes.c_void_p(v.ctypes.data))
        fn(*cargs)

    return call


def polydl_caller(kernel: Any, args: list[Argument]) -> Caller:
    def call(values: Values) -> None:
        inputs = [values[a.name] if a.shape else float(values[a.name]) for a in args if a.is_input]
        kernel(*inputs, **{a.name: values[a.name] for a in args if not a.is_input})

    return call


def torch_caller(name: str, sizes: Mapping[str, int]) -> Caller:
    def call(values: Values) -> None:
        torch_ops.call(name, values, sizes, values)

    return call


def refusal(exc: PolyDLError) -> str:
    """A refusal's first line, paths relative to the checkout."""
    return str(exc).splitlines()[0].replace(f"{ROOT}/", "")


# ------------------------------------------------------------------ comparing


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest difference relative to the reference's largest magnitude (inf where only one
    side is not finite)."""
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    if not np.array_equal(np.isfinite(got64), np.isfinite(want64)):
        return math.inf
    finite = np.isfinite(want64)
    if not np.array_equal(got64[~finite], want64[~finite], equal_nan=True):
        return math.inf
    scale = max(float(np.max(np.abs(want64[finite]), initial=0.0)), 1e-30)
    return float(np.max(np.abs(got64[finite] - want64[finite]), initial=0.0)) / scale


def tolerance(dtype: np.dtype) -> float:
    """What the benchmark accepts between two builds of a kernel (rounding and reassociation)."""
    return 1e-3 if dtype == np.float32 else 1e-7


# ------------------------------------------------------------------ one kernel


def run_kernel(name: str, sizes: Mapping[str, int], sides: tuple[str, ...], rounds: int,
               workdir: Path, torch_available: bool = False, threads: int = 1) -> Result:
    """Build `name` for every side, check each against gcc, time them interleaved."""
    path = kernel_path(name)
    result = Result(name, dict(sizes), threads)
    signature = read_signature(path)
    args = signature.arguments(sizes)
    callers: dict[str, Caller] = {}
    if "polydl" in sides:
        try:
            kernel = polydl.compile(path, dict(sizes))
            callers["polydl"] = polydl_caller(kernel, args)
            result.schedule = kernel.schedule.describe()
        except PolyDLError as exc:
            result.status = "refused: " + refusal(exc)
    for side in sides:
        if side in COMPILERS:
            try:
                lib = build_reference(side, path, signature.function, sizes, workdir)
                callers[side] = reference_caller(lib, signature.function, args)
            except (subprocess.CalledProcessError, FileNotFoundError) as exc:
                detail = getattr(exc, "stderr", "") or str(exc)
                result.notes.append(f"{side} build failed: {detail.strip().splitlines()[-1]}")
        elif side == "torch" and torch_available and name in torch_ops.operator_names():
            callers["torch"] = torch_caller(name, sizes)
    pristine = make_inputs(name, args, sizes)
    outputs = [a for a in args if not a.is_input]
    buffers = {side: {k: v.copy() for k, v in pristine.items()} for side in callers}

    def fresh(side: str) -> Values:
        values = buffers[side]
        for a in outputs:
            np.copyto(values[a.name], pristine[a.name])
        return values

    checked = {side: [a.name for a in outputs] for side in callers}
    for side, call in callers.items():  # one checked call each (and a warm-up)
        if side == "torch":
            checked[side] = list(torch_ops.call(name, fresh(side), sizes, buffers[side]))
        else:
            call(fresh(side))
    if "gcc" in callers:
        for side in callers:
            errors = [relative_error(buffers[side][o], buffers["gcc"][o]) for o in checked[side]]
            result.errors[side] = max(errors, default=0.0)
            if result.errors[side] > tolerance(outputs[0].dtype) and side != "gcc":
                if side == "polydl":
                    result.status = f"wrong: relative error {result.errors[side]:.1e} vs gcc"
                result.notes.append(f"{side} differs from gcc: {result.errors[side]:.1e}")
    samples: dict[str, list[float]] = {side: [] for side in callers}
    sides_in_order = list(callers)
    for r in range(rounds):
        # each round starts one side later: every side follows every other one as often (the
        # side before leaves its caches and its threads behind)
        for side in sides_in_order[r % len(sides_in_order):] + sides_in_order[:r % len(sides_in_order)]:
            call = callers[side]
            # an untimed call first: the OpenMP threads of the side before spin for a while
            # after its call (PyTorch's runtime and libgomp are separate pools on the same
            # cores), and this side's own threads are then awake
            call(fresh(side))
            values = fresh(side)
            t0 = time.perf_counter()
            call(values)
            samples[side].append(time.perf_counter() - t0)
    result.ms = {side: statistics.median(s) * 1e3 for side, s in samples.items() if s}
    return result


def default_workdir() -> Path:
    return Path(tempfile.gettempdir()) / "polydl-general-bench"
