"""The general-loop-nest suite: plain C kernels timed as polydl builds them and as the same C
built by gcc -O3 and by clang with LLVM Polly, plus PyTorch eager for the DL operators.

Each kernel is a C file in `benchmarks/general/` whose function takes its int sizes first, then
its scalars and arrays. The reference builds get the sizes as compile-time constants (`-D`,
the int parameters removed from the signature), as polydl gets them. Every side starts each
call from the same inputs (copied in before the call, outside the timing), one call per side
per round, sides interleaved; the medians are compared. Every result is checked against the
gcc build's (the C semantics), and polydl's also against its numpy reference at small sizes
(the test suite).
"""

from __future__ import annotations

import ctypes
import hashlib
import math
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
from polydl.errors import PolyDLError
from polydl.frontends import load_spec
from polydl.ir import LoopNest

ROOT = Path(__file__).resolve().parents[2]
KERNEL_DIR = ROOT / "benchmarks" / "general"
# kernels the examples already hold, run from there
FROM_EXAMPLES = {"layernorm": "layernorm.c", "softmax": "softmax.c",
                 "linear_bias_relu": "linear_bias_relu.c", "jacobi_2d": "jacobi2d.c"}

# name -> (bench sizes, small sizes). The bench sizes take gcc -O3 roughly 10-500 ms.
SIZES: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    "gemm": ({"NI": 800, "NJ": 900, "NK": 1000}, {"NI": 30, "NJ": 34, "NK": 38}),
    "2mm": ({"NI": 600, "NJ": 700, "NK": 800, "NL": 900}, {"NI": 20, "NJ": 24, "NK": 28, "NL": 32}),
    "3mm": ({"NI": 500, "NJ": 600, "NK": 700, "NL": 800, "NM": 900},
            {"NI": 20, "NJ": 22, "NK": 24, "NL": 26, "NM": 28}),
    "gemver": ({"N": 2000}, {"N": 40}),
    "gesummv": ({"N": 2500}, {"N": 40}),
    "symm": ({"M": 800, "N": 1000}, {"M": 30, "N": 34}),
    "syr2k": ({"N": 800, "M": 1000}, {"N": 30, "M": 34}),
    "syrk": ({"N": 800, "M": 1000}, {"N": 30, "M": 34}),
    "trmm": ({"M": 800, "N": 1000}, {"M": 30, "N": 34}),
    "atax": ({"M": 1900, "N": 2100}, {"M": 38, "N": 42}),
    "bicg": ({"M": 1900, "N": 2100}, {"M": 38, "N": 42}),
    "doitgen": ({"NR": 100, "NQ": 120, "NP": 140}, {"NR": 6, "NQ": 7, "NP": 8}),
    "mvt": ({"N": 2000}, {"N": 40}),
    "cholesky": ({"N": 1000}, {"N": 30}),
    "durbin": ({"N": 2000}, {"N": 40}),
    "gramschmidt": ({"M": 1000, "N": 800}, {"M": 30, "N": 24}),  # N <= M: full rank
    "lu": ({"N": 1000}, {"N": 30}),
    "ludcmp": ({"N": 1000}, {"N": 30}),
    "trisolv": ({"N": 2000}, {"N": 40}),
    "correlation": ({"M": 1000, "N": 1200}, {"M": 30, "N": 34}),
    "covariance": ({"M": 1000, "N": 1200}, {"M": 30, "N": 34}),
    "nussinov": ({"N": 1000}, {"N": 30}),
    "floyd_warshall": ({"N": 700}, {"N": 30}),
    "adi": ({"TSTEPS": 50, "N": 800}, {"TSTEPS": 3, "N": 20}),
    "fdtd_2d": ({"TMAX": 100, "NX": 1000, "NY": 1200}, {"TMAX": 3, "NX": 20, "NY": 24}),
    "heat_3d": ({"T": 50, "N": 120}, {"T": 3, "N": 12}),
    "jacobi_1d": ({"T": 1000, "N": 20000}, {"T": 3, "N": 50}),
    "jacobi_2d": ({"T": 50, "N": 1000}, {"T": 3, "N": 30}),
    "seidel_2d": ({"T": 20, "N": 1000}, {"T": 3, "N": 30}),
    "deriche": ({"W": 2048, "H": 1536}, {"W": 30, "H": 24}),
    # DL operators (float32)
    "layernorm": ({"N": 4096, "D": 768}, {"N": 6, "D": 40}),
    "rmsnorm": ({"N": 4096, "D": 768}, {"N": 6, "D": 40}),
    "softmax": ({"N": 4096, "D": 1024}, {"N": 6, "D": 40}),
    "leaky_relu": ({"N": 4096, "D": 1024}, {"N": 6, "D": 40}),
    "attention": ({"S": 512, "D": 64}, {"S": 16, "D": 8}),
    "linear_bias_relu": ({"N": 256, "C": 1024, "K": 1024}, {"N": 6, "C": 20, "K": 12}),
}

DL_OPERATORS = ("layernorm", "rmsnorm", "softmax", "leaky_relu", "attention", "linear_bias_relu")
CLASSIC = tuple(name for name in SIZES if name not in DL_OPERATORS)

# Inputs that keep a factorisation or recurrence finite: random data makes LU and Cholesky
# divide by tiny pivots and the recurrences diverge, and then every side times NaNs.
SCALARS = {"alpha": 1.5, "beta": 1.2, "eps": 1e-5, "scale": 0.125, "slope": 0.01}


def kernel_path(name: str) -> Path:
    if name in FROM_EXAMPLES:
        return ROOT / "examples" / FROM_EXAMPLES[name]
    return KERNEL_DIR / f"{name}.c"


def _conditioned(name: str, arg: str, value: np.ndarray, rng: np.random.Generator,
                 sizes: Mapping[str, int]) -> np.ndarray:
    n = value.shape[0] if value.ndim else 0
    if name in ("cholesky", "lu", "ludcmp") and arg == "A":
        b = rng.random(value.shape)
        return (b @ b.T / n + np.eye(n)).astype(value.dtype)
    if name == "trisolv" and arg == "L":
        return (np.tril(rng.random(value.shape)) / n + np.eye(n)).astype(value.dtype)
    if name == "durbin" and arg == "r":
        return (rng.random(value.shape) / (4 * n)).astype(value.dtype)
    if name == "gramschmidt" and arg == "A":
        return (rng.random(value.shape) + np.eye(*value.shape)).astype(value.dtype)
    if name == "nussinov" and arg == "seq":
        return rng.integers(0, 4, value.shape).astype(value.dtype)
    if name in ("nussinov",) and arg == "table":
        return np.zeros_like(value)
    if name == "deriche" and arg == "alpha":
        return np.asarray(0.25, value.dtype)
    if name in ("correlation", "covariance") and arg == "float_n":
        return np.asarray(float(sizes["N"]), value.dtype)
    return value


@dataclass(frozen=True)
class Argument:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]  # () for a scalar
    is_input: bool


@dataclass
class Result:
    kernel: str
    sizes: dict[str, int]
    status: str = "ok"  # "ok", "refused: ...", "wrong: ...", "error: ..."
    ms: dict[str, float] = field(default_factory=dict)  # side -> median milliseconds
    errors: dict[str, float] = field(default_factory=dict)  # side -> relative error vs gcc
    notes: list[str] = field(default_factory=list)
    schedule: str = ""

    def speedup(self, side: str, over: str = "gcc") -> float | None:
        if side in self.ms and over in self.ms and self.ms[side] > 0:
            return self.ms[over] / self.ms[side]
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel, "sizes": self.sizes, "status": self.status, "ms": self.ms,
            "errors": self.errors, "notes": self.notes, "schedule": self.schedule,
            "speedup_over_gcc": {s: self.speedup(s) for s in self.ms if s != "gcc"},
        }


def arguments(nest: LoopNest, sizes: Mapping[str, int]) -> list[Argument]:
    return [
        Argument(a.name, np.dtype(a.dtype), a.concrete_shape(dict(sizes)), a.is_input)
        for a in nest.parameters
    ]


def make_inputs(name: str, args: list[Argument], sizes: Mapping[str, int],
                seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for a in args:
        if not a.shape:
            value = np.asarray(SCALARS.get(a.name, 0.5), a.dtype)
        else:
            value = rng.random(a.shape).astype(a.dtype)
        value = _conditioned(name, a.name, value, rng, sizes)
        out[a.name] = np.ascontiguousarray(value) if a.shape else value
    return out


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


COMPILERS = {
    "gcc": ["gcc", "-O3"],
    "polly": ["clang-19", "-O3", "-march=native", "-mllvm", "-polly", "-mllvm", "-polly-parallel",
              "-lgomp"],
}


def build_reference(side: str, path: Path, function: str, sizes: Mapping[str, int],
                    workdir: Path) -> Path:
    command = COMPILERS[side]
    if shutil.which(command[0]) is None:
        raise FileNotFoundError(f"{command[0]} is not installed")
    source = constant_size_source(path.read_text(), function, sizes)
    digest = hashlib.sha256((source + side + repr(sorted(sizes.items()))).encode()).hexdigest()[:12]
    src = workdir / f"{path.stem}-{side}-{digest}.c"
    lib = src.with_suffix(".so")
    if not lib.exists():
        src.write_text("#include <math.h>\n" + source)
        defines = [f"-D{k}={v}" for k, v in sizes.items()]
        subprocess.run([*command, "-fPIC", "-shared", *defines, str(src), "-o", str(lib), "-lm"],
                       check=True, capture_output=True, text=True)
    return lib


def reference_caller(lib: Path, function: str, args: list[Argument]) -> Callable[[dict[str, np.ndarray]], None]:
    fn = getattr(ctypes.CDLL(str(lib)), function)
    fn.restype = None

    def call(values: dict[str, np.ndarray]) -> None:
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


def polydl_caller(kernel: Any, args: list[Argument]) -> Callable[[dict[str, np.ndarray]], None]:
    def call(values: dict[str, np.ndarray]) -> None:
        inputs = [values[a.name] if a.shape else float(values[a.name]) for a in args if a.is_input]
        kernel(*inputs, **{a.name: values[a.name] for a in args if not a.is_input})

    return call


# ------------------------------------------------------------------ PyTorch eager


def torch_operator(name: str, torch: Any) -> Callable[[dict[str, np.ndarray]], None] | None:
    F = torch.nn.functional
    t = torch.from_numpy

    def layernorm(v: dict[str, np.ndarray]) -> None:
        y = F.layer_norm(t(v["x"]), (v["x"].shape[1],), t(v["gamma"]), t(v["beta"]), float(v["eps"]))
        t(v["y"]).copy_(y)

    def rmsnorm(v: dict[str, np.ndarray]) -> None:
        x = t(v["x"])
        y = x * torch.rsqrt((x * x).mean(dim=1, keepdim=True) + float(v["eps"])) * t(v["gamma"])
        t(v["y"]).copy_(y)

    def softmax(v: dict[str, np.ndarray]) -> None:
        t(v["y"]).copy_(torch.softmax(t(v["x"]), dim=1))

    def leaky_relu(v: dict[str, np.ndarray]) -> None:
        t(v["y"]).copy_(F.leaky_relu(t(v["x"]), float(v["slope"])))

    def attention(v: dict[str, np.ndarray]) -> None:
        p = torch.softmax(t(v["Q"]) @ t(v["K"]).T * float(v["scale"]), dim=1)
        t(v["P"]).copy_(p)
        t(v["out"]).copy_(p @ t(v["V"]))

    def linear_bias_relu(v: dict[str, np.ndarray]) -> None:
        t(v["y"]).copy_(torch.relu(F.linear(t(v["x"]), t(v["w"]), t(v["b"])) + t(v["y"])))

    return {"layernorm": layernorm, "rmsnorm": rmsnorm, "softmax": softmax,
            "leaky_relu": leaky_relu, "attention": attention,
            "linear_bias_relu": linear_bias_relu}.get(name)


# ------------------------------------------------------------------ one kernel


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    if not np.isfinite(got64).all() and np.isfinite(want64).all():
        return math.inf
    scale = max(float(np.nanmax(np.abs(want64))), 1e-30)
    return float(np.nanmax(np.abs(got64 - want64))) / scale


def tolerance(dtype: np.dtype) -> float:
    return 1e-3 if dtype == np.float32 else 1e-7


def run_kernel(name: str, sizes: Mapping[str, int], sides: tuple[str, ...], rounds: int,
               workdir: Path, torch: Any = None) -> Result:
    """Build `name` for every side, check each against gcc, time them interleaved."""
    path = kernel_path(name)
    result = Result(name, dict(sizes))
    try:
        nest, params = load_spec(path, dict(sizes), target_kind="c")
    except PolyDLError as exc:
        result.status = "refused: " + str(exc).splitlines()[0]
        return result
    args = arguments(nest, params)
    callers: dict[str, Callable[[dict[str, np.ndarray]], None]] = {}
    try:
        kernel = polydl.compile(path, params)
        callers["polydl"] = polydl_caller(kernel, args)
        result.schedule = kernel.schedule.describe()
    except PolyDLError as exc:
        result.status = "refused: " + str(exc).splitlines()[0]
    for side in sides:
        if side in ("gcc", "polly"):
            try:
                lib = build_reference(side, path, nest.name, params, workdir)
                callers[side] = reference_caller(lib, nest.name, args)
            except (subprocess.CalledProcessError, FileNotFoundError) as exc:
                detail = getattr(exc, "stderr", "") or str(exc)
                result.notes.append(f"{side} build failed: {detail.strip().splitlines()[-1]}")
        elif side == "torch" and torch is not None:
            op = torch_operator(name, torch)
            if op is not None:
                callers["torch"] = op
    pristine = make_inputs(name, args, sizes)
    outputs = [a for a in args if not a.is_input]
    buffers = {side: {k: v.copy() for k, v in pristine.items()} for side in callers}

    def fresh(side: str) -> dict[str, np.ndarray]:
        values = buffers[side]
        for a in outputs:
            np.copyto(values[a.name], pristine[a.name])
        return values

    for side, call in callers.items():  # one checked call each (and a warm-up)
        call(fresh(side))
    if "gcc" in callers:
        for side in callers:
            checked = [o for o in outputs if side != "torch" or _torch_checks(name, o.name)]
            errors = [relative_error(buffers[side][o.name], buffers["gcc"][o.name]) for o in checked]
            result.errors[side] = max(errors, default=0.0)
            if result.errors[side] > tolerance(outputs[0].dtype) and side != "gcc":
                if side == "polydl":
                    result.status = f"wrong: relative error {result.errors[side]:.1e} vs gcc"
                result.notes.append(f"{side} differs from gcc: {result.errors[side]:.1e}")
    samples: dict[str, list[float]] = {side: [] for side in callers}
    for _ in range(rounds):
        for side, call in callers.items():
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


def _torch_checks(name: str, output: str) -> bool:
    """PyTorch fills only the outputs an operator defines (not scratch such as P)."""
    return not (name == "attention" and output == "P")


def default_workdir() -> Path:
    return Path(tempfile.gettempdir()) / "polydl-general-bench"
