"""Benchmark suites: polydl against reference libraries, timed interleaved in one run.

Takes a suite name (`gemm`, `resnet50` or its backward passes `resnet50_bwd_data` and
`resnet50_bwd_weights`; shapes shipped as package data in `polydl/data/`)
and returns a table on stdout plus, optionally, a JSON report. Every case is run by polydl and
by each reference available here (numpy; PyTorch's oneDNN paths when torch is importable), all
in the same process, with the same threads, in alternating rounds, so machine noise hits every
side alike; speeds are medians and are compared as ratios. The machine's peak is measured in the
same run by an FMA-throughput loop. Speed is reported here, never asserted in tests.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from polydl.errors import PolyDLError
from polydl.target.cpu import CpuTarget as Machine
from polydl.target.host import host_target as current_machine
from polydl.version import __version__

SUITE_FILES = {
    "gemm": "gemm.json",
    "resnet50": "resnet50_conv.json",
    "resnet50_bwd_data": "resnet50_conv.json",
    "resnet50_bwd_weights": "resnet50_conv.json",
    # A/B suites on the same layers (polydl.bench_variants)
    "resnet50_fused": "resnet50_conv.json",
    "resnet50_bf16": "resnet50_conv.json",
}
# The primitive each convolution suite runs on the layers of its file.
CONV_PRIMITIVES = {
    "resnet50": "conv2d",
    "resnet50_bwd_data": "conv2d_backward_data",
    "resnet50_bwd_weights": "conv2d_backward_weights",
    "resnet50_fused": "conv2d",
    "resnet50_bf16": "conv2d",
}
# Seconds of timing per case (references and polydl together), not counting compilation.
DEFAULT_BUDGET_S = {"gemm": 10.0, "resnet50": 12.0, "resnet50_bwd_data": 8.0,
                    "resnet50_bwd_weights": 8.0, "resnet50_fused": 12.0, "resnet50_bf16": 12.0}
SAMPLES_PER_ROUND = 3  # timed samples of each runner per round, after one untimed call
MIN_SAMPLE_S = 1e-3  # a sample of a fast call times this long a batch of calls
NOISY_SHARE = 0.10  # other processes' share of the CPU time above which the report warns
# Conv layouts polydl may use. By default each is built and the fastest that verifies is kept
# (the blocked one loses where C is not a multiple of 16, e.g. conv1's C=3); without the
# comparison, the first that builds and verifies is used.
CONV_LAYOUTS = ("nchw16c", "nchw")


class BenchError(PolyDLError):
    """A benchmark that cannot start: unknown suite or case."""


# ---------------------------------------------------------------------------------- suites
@dataclass(frozen=True)
class Case:
    """One shape of a suite: `primitive` is `matmul` or `conv2d`; `sizes` its builder's sizes."""

    name: str
    primitive: str
    sizes: tuple[tuple[str, int], ...]
    dtype: str = "float32"

    @property
    def size(self) -> dict[str, int]:
        return dict(self.sizes)

    @property
    def output_hw(self) -> tuple[int, int]:
        s = self.size
        p = (s["H"] + 2 * s["padding"] - s["R"]) // s["stride"] + 1
        q = (s["W"] + 2 * s["padding"] - s["S"]) // s["stride"] + 1
        return p, q

    @property
    def flops(self) -> int:
        """Useful floating-point operations (a multiply-add is two), the same for every side."""
        s = self.size
        if self.primitive == "matmul":
            return 2 * s["M"] * s["N"] * s["K"]
        p, q = self.output_hw
        return 2 * s["N"] * s["K"] * s["C"] * s["R"] * s["S"] * p * q

    @property
    def shape(self) -> str:
        s = self.size
        if self.primitive == "matmul":
            return f"{s['M']}x{s['N']}x{s['K']}"
        return f"C{s['C']} K{s['K']} {s['H']}x{s['W']} {s['R']}x{s['S']}/{s['stride']}"


def load_suite(name: str) -> list[Case]:
    """The cases of suite `name`, read from the package data."""
    if name not in SUITE_FILES:
        raise BenchError(f"unknown suite '{name}'; known: {', '.join(SUITE_FILES)}")
    data_dir = importlib.resources.files("polydl").joinpath("data")
    data = json.loads(data_dir.joinpath(SUITE_FILES[name]).read_text())
    if name == "gemm":
        return [
            Case(s["name"], "matmul", (("M", s["M"]), ("N", s["N"]), ("K", s["K"])),
                 s.get("dtype", "float32"))
            for s in data["shapes"]
        ]
    keys = ("C", "K", "H", "W", "R", "S", "stride", "padding")
    return [
        Case(layer["name"], CONV_PRIMITIVES[name], (("N", data["N"]), *((k, layer[k]) for k in keys)),
             data.get("dtype", "float32"))
        for layer in data["layers"]
    ]


def select_cases(cases: Sequence[Case], names: Sequence[str] | None) -> list[Case]:
    if not names:
        return list(cases)
    known = {c.name: c for c in cases}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BenchError(f"unknown case '{unknown[0]}'; this suite has: {', '.join(known)}")
    return [known[n] for n in names]


# ---------------------------------------------------------------------------------- threads
# Fixed before any runtime loads, so every side gets the same threads and none keeps spinning
# on the cores after its call: OpenBLAS's idle workers otherwise busy-wait about 2^28 cycles
# (~0.1 s), halving the speed of whatever runs next; 2^4 cycles makes them sleep at once.
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT")


def thread_environment(machine: Machine) -> dict[str, str]:
    """The thread settings for a run: one thread per core unless `OMP_NUM_THREADS` says so."""
    threads = os.environ.get("OMP_NUM_THREADS") or str(machine.cores)
    return {
        "OMP_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS") or threads,
        "OPENBLAS_THREAD_TIMEOUT": os.environ.get("OPENBLAS_THREAD_TIMEOUT") or "4",
    }


def threads_prepared() -> bool:
    """Whether this process started with the thread settings (numpy's BLAS reads them at load)."""
    return all(name in os.environ for name in THREAD_ENV)


def import_torch(threads: int) -> ModuleType | None:
    """PyTorch if importable (it is optional), with its thread pool sized to `threads`."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return torch


# ---------------------------------------------------------------------------------- peak
# Independent accumulators per thread: enough to cover FMA latency x FMA pipes (4 x 2 on current
# x86 cores) with room to spare, and few enough to stay in registers (16 ymm, 32 zmm).
_PEAK_ISA = {
    "avx512": ("__m512", "_mm512_set1_ps", "_mm512_fmadd_ps", 16, 24, ("-mavx512f",)),
    "avx2": ("__m256", "_mm256_set1_ps", "_mm256_fmadd_ps", 8, 12, ("-mavx2", "-mfma")),
}


def peak_source(isa: str) -> tuple[str, int, int, tuple[str, ...]]:
    """C source of an FMA-throughput loop for `isa`: (source, lanes, accumulators, flags)."""
    key = "avx512" if isa.startswith("avx512") else isa
    if key in _PEAK_ISA:
        vec, set1, fma, lanes, accs, flags = _PEAK_ISA[key]
        step = "\n".join(f"      acc{i} = {fma}(acc{i}, a, b);" for i in range(accs))
        add = "_mm256_add_ps" if key == "avx2" else "_mm512_add_ps"
        store = "_mm256_storeu_ps" if key == "avx2" else "_mm512_storeu_ps"
        header = "#include <immintrin.h>"
        reduce = (
            f"{vec} total = acc0;\n"
            + "".join(f"    total = {add}(total, acc{i});\n" for i in range(1, accs))
            + f"    float lanes_out[{lanes}];\n    {store}(lanes_out, total);\n"
            + f"    float s = 0.f;\n    for (int l = 0; l < {lanes}; l++) s += lanes_out[l];"
        )
    else:  # scalar: plain floats, contracted to FMA where the ISA has it
        vec, set1, lanes, accs, flags = "float", "", 1, 12, ()
        step = "\n".join(f"      acc{i} = acc{i} * a + b;" for i in range(accs))
        header = ""
        reduce = "float s = " + " + ".join(f"acc{i}" for i in range(accs)) + ";"
    init = "\n".join(f"    {vec} acc{i} = {set1}({1.0 + i / 64:.6f}f);" for i in range(accs))
    source = f"""{header}
#include <omp.h>

int fma_threads(void) {{
  int threads = 1;
  #pragma omp parallel
  {{
    #pragma omp single
    threads = omp_get_num_threads();
  }}
  return threads;
}}

/* acc = acc * a + b with a < 1 converges: no overflow, no denormals. */
void fma_loop(long iterations, float *sink) {{
  #pragma omp parallel
  {{
    const {vec} a = {set1}(0.999999f), b = {set1}(1e-6f);
{init}
    for (long i = 0; i < iterations; i++) {{
{step}
    }}
    {reduce}
    sink[omp_get_thread_num() * 16] = s;
  }}
}}
"""
    return source, lanes, accs, flags


class FmaPeak:
    """The machine's peak fp32 GFLOP/s, measured by an FMA loop on every OpenMP thread."""

    def __init__(self, machine: Machine) -> None:
        import cffi

        from polydl.runtime.toolchain import compile_library, current_toolchain

        source, self.lanes, self.accumulators, flags = peak_source(machine.isa)
        self.isa = machine.isa
        self._dir = tempfile.TemporaryDirectory(prefix="polydl-peak-")
        path = Path(self._dir.name)
        (path / "fma_peak.c").write_text(source)
        compile_library(current_toolchain(), path / "fma_peak.c", path / "libfma_peak.so", flags)
        self._ffi = cffi.FFI()
        self._ffi.cdef("int fma_threads(void); void fma_loop(long iterations, float *sink);")
        self._lib = self._ffi.dlopen(str(path / "libfma_peak.so"))
        self.threads = int(self._lib.fma_threads())
        self._sink = np.zeros(self.threads * 16 + 16, dtype=np.float32)
        self._iterations = self._calibrate()

    def _run(self, iterations: int) -> float:
        pointer = self._ffi.cast("float *", self._sink.ctypes.data)
        t0 = time.perf_counter()
        self._lib.fma_loop(iterations, pointer)
        return time.perf_counter() - t0

    def _calibrate(self, target_s: float = 0.1) -> int:
        iterations = 1 << 16
        while True:
            seconds = self._run(iterations)
            if seconds > target_s / 4 or iterations > 1 << 34:
                return max(int(iterations * target_s / max(seconds, 1e-9)), 1)
            iterations *= 4

    def measure(self, samples: int = 5) -> list[float]:
        """`samples` GFLOP/s readings of about 0.1 s each."""
        flops = 2.0 * self.threads * self._iterations * self.accumulators * self.lanes
        return [flops / self._run(self._iterations) / 1e9 for _ in range(samples)]

    def close(self) -> None:
        self._dir.cleanup()


# ---------------------------------------------------------------------------------- runners
@dataclass
class Runner:
    """One way to compute a case. `run` is what is timed (after inputs are prepared);
    `fresh` computes the result from scratch and returns it as a plain-layout numpy array."""

    name: str
    run: Callable[[], object]
    fresh: Callable[[], np.ndarray]


def numpy_conv2d(x: np.ndarray, w: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """Convolution as im2col + one BLAS GEMM; returns an NCHW view of an NHWC result."""
    n, c = x.shape[:2]
    k, _, r, s = w.shape
    if padding:
        x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    windows = np.lib.stride_tricks.sliding_window_view(x, (r, s), axis=(2, 3))
    windows = windows[:, :, ::stride, ::stride]  # [n][c][p][q][r][s]
    p, q = windows.shape[2:4]
    columns = windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * p * q, c * r * s)
    y = columns @ w.reshape(k, c * r * s).T
    return y.reshape(n, p, q, k).transpose(0, 3, 1, 2)


def gemm_references(a: np.ndarray, b: np.ndarray, torch: ModuleType | None) -> list[Runner]:
    c = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    runners = [
        Runner("numpy", lambda: np.matmul(a, b, out=c), lambda: np.asarray(a @ b)),
    ]
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        tc = torch.empty(c.shape, dtype=ta.dtype)
        runners.append(Runner(
            "torch.matmul",
            lambda: torch.matmul(ta, tb, out=tc),
            lambda: torch.matmul(ta, tb).numpy().copy(),
        ))
    return runners


def conv_references(
    x: np.ndarray, w: np.ndarray, case: Case, torch: ModuleType | None
) -> list[Runner]:
    s = case.size
    stride, padding = s["stride"], s["padding"]
    runners = [
        Runner(
            "numpy",
            lambda: numpy_conv2d(x, w, stride, padding),
            lambda: np.ascontiguousarray(numpy_conv2d(x, w, stride, padding)),
        )
    ]
    if torch is None:
        return runners
    conv2d = torch.nn.functional.conv2d
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    runners.append(Runner(
        "torch.nchw",
        lambda: conv2d(tx, tw, None, stride, padding),
        lambda: conv2d(tx, tw, None, stride, padding).numpy().copy(),
    ))
    last = torch.channels_last
    cx, cw = tx.contiguous(memory_format=last), tw.contiguous(memory_format=last)
    runners.append(Runner(
        "torch.channels_last",
        lambda: conv2d(cx, cw, None, stride, padding),
        lambda: conv2d(cx, cw, None, stride, padding).contiguous().numpy().copy(),
    ))
    if torch.backends.mkldnn.is_available():
        # oneDNN's own blocked tensors: activations and the reordered weight stay blocked.
        mx = tx.to_mkldnn()
        pad, step, dilation = [padding] * 2, [stride] * 2, [1, 1]
        mw = torch._C._nn.mkldnn_reorder_conv2d_weight(tw.to_mkldnn(), pad, step, dilation, 1)

        def mkldnn() -> Any:
            return torch.mkldnn_convolution(mx, mw, None, pad, step, dilation, 1)

        runners.append(Runner("torch.mkldnn", mkldnn, lambda: mkldnn().to_dense().numpy().copy()))
    return runners


@dataclass
class PolydlBuild:
    runner: Runner
    compile_s: float
    schedule: str
    variant: str  # the conv layout, "" for GEMM


def _polydl_runner(
    kernel: Any, inputs: list[np.ndarray], plain: Callable[[np.ndarray], np.ndarray]
) -> Runner:
    """Timed through the in-place call `k(*inputs, C=out)`: the kernel, not an allocation."""
    out_arg = next(a for a in kernel.arguments if not a.is_input)
    out = np.zeros(out_arg.shape, dtype=np.dtype(out_arg.dtype))
    named = {out_arg.name: out}
    return Runner("polydl", lambda: kernel(*inputs, **named), lambda: plain(kernel(*inputs)))


def build_polydl_gemm(case: Case, a: np.ndarray, b: np.ndarray) -> PolydlBuild:
    import polydl

    s = case.size
    t0 = time.perf_counter()
    kernel = polydl.matmul(M=s["M"], N=s["N"], K=s["K"], dtype=case.dtype)
    compile_s = time.perf_counter() - t0
    return PolydlBuild(_polydl_runner(kernel, [a, b], np.asarray), compile_s,
                       kernel.schedule.describe(), "")


def build_polydl_conv(case: Case, x: np.ndarray, w: np.ndarray, layout: str) -> PolydlBuild:
    import polydl
    from polydl import layouts

    s = case.size
    t0 = time.perf_counter()
    kernel = polydl.conv2d(
        N=s["N"], C=s["C"], K=s["K"], H=s["H"], W=s["W"], R=s["R"], S=s["S"],
        stride=s["stride"], padding=s["padding"], dtype=case.dtype, layout=layout,
    )
    compile_s = time.perf_counter() - t0
    blocked = layout == "nchw16c"
    inputs = [layouts.to_nchw16c(x), layouts.to_kcrs16c16k(w)] if blocked else [x, w]

    def plain(y: np.ndarray) -> np.ndarray:
        return layouts.from_nchw16c(y, s["K"]) if blocked else np.asarray(y)

    expected = [a.shape for a in kernel.arguments if a.is_input]
    if [i.shape for i in inputs] != expected:
        made = [i.shape for i in inputs]
        raise BenchError(f"layout {layout}: the kernel takes inputs {expected}, not {made}")
    return PolydlBuild(_polydl_runner(kernel, inputs, plain), compile_s,
                       kernel.schedule.describe(), layout)


# ---------------------------------------------------------------------------------- timing
def time_call(run: Callable[[], object], inner: int) -> float:
    t0 = time.perf_counter()
    for _ in range(inner):
        run()
    return (time.perf_counter() - t0) / inner


def plan(
    single_s: dict[str, float], repeat: int, budget_s: float
) -> tuple[int, dict[str, int]]:
    """Rounds (at most `repeat`, within `budget_s`) and calls per sample for each runner."""
    inner = {n: max(1, math.ceil(MIN_SAMPLE_S / max(t, 1e-9))) for n, t in single_s.items()}
    per_round = sum(t * (1 + SAMPLES_PER_ROUND * inner[n]) for n, t in single_s.items())
    rounds = int(budget_s / per_round) if per_round > 0 else repeat
    return max(1, min(repeat, rounds)), inner


def time_interleaved(
    runners: Sequence[Runner], rounds: int, inner: dict[str, int]
) -> dict[str, list[float]]:
    """Seconds per call: every round runs each runner in turn (order rotated per round), one
    untimed call first so a runner never pays for the previous one's threads or caches."""
    samples: dict[str, list[float]] = {r.name: [] for r in runners}
    for i in range(rounds):
        turn = i % len(runners)
        for runner in [*runners[turn:], *runners[:turn]]:
            runner.run()
            for _ in range(SAMPLES_PER_ROUND):
                samples[runner.name].append(time_call(runner.run, inner[runner.name]))
    return samples


def time_runners(
    runners: Sequence[Runner], repeat: int, budget_s: float
) -> tuple[int, dict[str, list[float]]]:
    """(rounds, seconds per call of each runner): one call each to plan, then interleaved rounds."""
    single = {r.name: time_call(r.run, 1) for r in runners}
    rounds, inner = plan(single, repeat, budget_s)
    return rounds, time_interleaved(runners, rounds, inner)


# ---------------------------------------------------------------------------------- rows
@dataclass
class Row:
    """One case's result. Speeds are median GFLOP/s; `references` maps each reference that
    verified to its speed."""

    case: str
    shape: str
    flops: int
    polydl_gflops: float | None
    references: dict[str, float]
    status: str  # "ok", "FAILED" (wrong result) or "ERROR" (polydl could not build or run)
    relative_error: float | None = None
    compile_s: float | None = None
    variant: str = ""
    schedule: str = ""
    message: str = ""
    peak_gflops: float | None = None
    rounds: int = 0
    samples: dict[str, int] = field(default_factory=dict)
    variants: dict[str, float] = field(default_factory=dict)
    # the fastest sample of each side (polydl under "polydl"): less sensitive to a busy machine
    fastest: dict[str, float] = field(default_factory=dict)
    reference_errors: dict[str, float] = field(default_factory=dict)

    @property
    def best_reference(self) -> tuple[str, float] | None:
        if not self.references:
            return None
        name = max(self.references, key=lambda n: self.references[n])
        return name, self.references[name]

    def ratio_vs(self, prefixes: Sequence[str] = ("",)) -> float | None:
        """polydl's speed over the best reference whose name starts with one of `prefixes`."""
        speeds = [g for n, g in self.references.items() if n.startswith(tuple(prefixes))]
        if self.polydl_gflops is None or not speeds or self.status != "ok":
            return None
        return self.polydl_gflops / max(speeds)

    @property
    def ratio(self) -> float | None:
        return self.ratio_vs()

    @property
    def peak_percent(self) -> float | None:
        if self.polydl_gflops is None or not self.peak_gflops:
            return None
        return 100.0 * self.polydl_gflops / self.peak_gflops

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        best = self.best_reference
        data.update(
            best_reference=best[0] if best else None,
            best_reference_gflops=best[1] if best else None,
            ratio=self.ratio,
            peak_percent=self.peak_percent,
        )
        return data


# ---------------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Target:
    """An issue target: ratios against the references named by `prefixes`."""

    description: str
    prefixes: tuple[str, ...]
    geomean_min: float | None
    each_min: float | None


TARGETS = {
    "resnet50": Target("geomean >= 1.0 vs best oneDNN path, no layer < 0.8", ("torch.",), 1.0, 0.8),
    "gemm": Target(">= numpy on every shape", ("numpy",), None, 1.0),
    "resnet50_fused": Target("fused faster than unfused polydl on every layer",
                             ("polydl.unfused",), None, 1.0),
    "resnet50_bf16": Target("bf16 geomean >= 1.6x fp32 polydl", ("polydl.fp32",), 1.6, None),
    "resnet50_bwd_data": Target("geomean >= 0.9 vs best oneDNN path", ("torch.",), 0.9, None),
    "resnet50_bwd_weights": Target("geomean >= 0.9 vs best oneDNN path", ("torch.",), 0.9, None),
}


def geometric_mean(values: Sequence[float]) -> float | None:
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


@dataclass(frozen=True)
class TargetResult:
    description: str
    geomean: float | None
    minimum: float | None
    minimum_case: str | None
    met: bool | None  # None: not evaluated (its reference did not run)
    note: str = ""


def evaluate_target(target: Target, rows: Sequence[Row]) -> TargetResult:
    failed = [r.case for r in rows if r.status != "ok"]
    ratios = {r.case: r.ratio_vs(target.prefixes) for r in rows if r.status == "ok"}
    measured = {c: v for c, v in ratios.items() if v is not None}
    if not rows or (not measured and not failed):
        return TargetResult(target.description, None, None, None, None,
                            "not evaluated: its reference did not run")
    geomean = geometric_mean(list(measured.values()))
    worst = min(measured, key=lambda c: measured[c]) if measured else None
    minimum = measured[worst] if worst else None
    if len(measured) < len(ratios):
        return TargetResult(target.description, geomean, minimum, worst, None,
                            "not evaluated: its reference did not run on every case")
    met = not failed
    if target.geomean_min is not None:
        met = met and geomean is not None and geomean >= target.geomean_min
    if target.each_min is not None:
        met = met and minimum is not None and minimum >= target.each_min
    note = f"{len(failed)} case(s) failed or did not build" if failed else ""
    return TargetResult(target.description, geomean, minimum, worst, met, note)


@dataclass(frozen=True)
class Summary:
    geomean_ratio: float | None
    min_ratio: float | None
    min_case: str | None
    failed: tuple[str, ...]
    target: TargetResult


def summarize(suite: str, rows: Sequence[Row]) -> Summary:
    ratios = {r.case: r.ratio for r in rows if r.ratio is not None}
    worst = min(ratios, key=lambda c: ratios[c]) if ratios else None
    return Summary(
        geomean_ratio=geometric_mean([v for v in ratios.values() if v is not None]),
        min_ratio=ratios[worst] if worst else None,
        min_case=worst,
        failed=tuple(r.case for r in rows if r.status != "ok"),
        target=evaluate_target(TARGETS[suite], rows),
    )


# ---------------------------------------------------------------------------------- report
@dataclass
class Environment:
    machine: Machine
    threads: int
    peak_gflops: float
    peak_samples: list[float]
    torch_version: str | None
    # share of the machine's CPU time that other processes used during the run (None: unknown)
    other_cpu_share: float | None = None
    numpy_version: str = np.__version__
    polydl_version: str = __version__
    python: str = platform.python_version()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["machine"] = asdict(self.machine)
        return data


def report_json(
    suite: str, env: Environment, rows: Sequence[Row], settings: dict[str, Any]
) -> dict[str, Any]:
    summary = summarize(suite, rows)
    return {
        "suite": suite,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": env.to_json(),
        "settings": settings,
        "rows": [r.to_json() for r in rows],
        "summary": {
            "geomean_ratio": summary.geomean_ratio,
            "min_ratio": summary.min_ratio,
            "min_case": summary.min_case,
            "failed": list(summary.failed),
            "target": asdict(summary.target),
        },
    }


def write_json(path: str | os.PathLike[str], report: dict[str, Any]) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=1) + "\n")


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _check(row: Row) -> str:
    if row.status == "ERROR":
        return "ERROR"
    return f"{row.status} {_num(row.relative_error, '.0e')}"


def _table(header: Sequence[str], lines: Sequence[Sequence[str]], left: int) -> list[str]:
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [fmt(header), fmt(["-" * w for w in widths]), *(fmt(line) for line in lines)]


def format_report(suite: str, env: Environment, rows: Sequence[Row]) -> str:
    m = env.machine
    out = [
        f"polydl {env.polydl_version} bench --suite {suite}",
        f"machine  {m.model}, {m.isa}, {m.cores} cores; {env.threads} threads for every side",
        f"peak     {env.peak_gflops:.1f} GFLOP/s fp32 (FMA loop, best of "
        f"{len(env.peak_samples)} samples; median {statistics.median(env.peak_samples):.0f})",
        "others   " + ("unknown" if env.other_cpu_share is None else
                         f"{100 * env.other_cpu_share:.0f}% of the CPU time went to other work "
                         "during the run")
        + ("" if (env.other_cpu_share or 0.0) < NOISY_SHARE else
           ": the cores were shared, expect noise"),
        "refs     numpy " + env.numpy_version + (
            f", PyTorch {env.torch_version} (oneDNN: NCHW, channels_last, mkldnn blocked)"
            if env.torch_version else "; PyTorch not installed: numpy only"),
        "",
    ]
    header = ["case", "shape", "layout", "polydl", "best ref", "ref", "ratio", "%peak",
              "compile s", "check"]
    lines = []
    for r in rows:
        best = r.best_reference
        lines.append([
            r.case, r.shape, r.variant or "-", _num(r.polydl_gflops, ".1f"),
            _num(best[1] if best else None, ".1f"), best[0] if best else "-",
            _num(r.ratio, ".2f"), _num(r.peak_percent, ".0f"), _num(r.compile_s, ".1f"), _check(r),
        ])
    out += _table(header, lines, left=3)
    out.append("(speeds in GFLOP/s, medians; ratio = polydl / best reference)")

    names = sorted({n for r in rows for n in r.references})
    if names:
        out += ["", "every reference (GFLOP/s):"]
        lines = [[r.case, *(_num(r.references.get(n), ".1f") for n in names),
                  str(r.rounds)] for r in rows]
        out += _table(["case", *names, "rounds"], lines, left=1)

    out += ["", "polydl schedules:"]
    for r in rows:
        detail = r.schedule if r.status != "ERROR" else r.message
        variants = ", ".join(f"{k} {v:.1f}" for k, v in r.variants.items())
        out.append(f"  {r.case}: {detail}" + (f"  [layouts: {variants}]" if variants else ""))

    s = summarize(suite, rows)
    t = s.target
    verdict = {True: "MET", False: "MISSED", None: "NOT EVALUATED"}[t.met]
    out += [
        "",
        f"geomean ratio {_num(s.geomean_ratio, '.2f')}, min ratio {_num(s.min_ratio, '.2f')}"
        + (f" ({s.min_case})" if s.min_case else "")
        + (f"; failed: {', '.join(s.failed)}" if s.failed else ""),
        f"target   {t.description}: {verdict} (geomean {_num(t.geomean, '.2f')}, "
        f"min {_num(t.minimum, '.2f')}{' ' + t.minimum_case if t.minimum_case else ''})"
        + (f"; {t.note}" if t.note else ""),
    ]
    return "\n".join(out)


# ---------------------------------------------------------------------------------- one case
def _float64_result(
    case: Case, inputs: Sequence[np.ndarray], torch: ModuleType | None
) -> np.ndarray:
    if case.primitive == "matmul":
        a, b = inputs
        return a.astype(np.float64) @ b.astype(np.float64)
    if case.primitive != "conv2d":
        from polydl import bench_backward

        return bench_backward.expected(case, list(inputs), torch)
    x, w = inputs
    s = case.size
    if torch is not None:
        y = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                       None, s["stride"], s["padding"])
        return y.numpy()
    return numpy_conv2d(x.astype(np.float64), w.astype(np.float64), s["stride"], s["padding"])


def _verify(runner: Runner, expected: np.ndarray, dtype: str) -> tuple[bool, float]:
    from polydl.verify import compare

    got = runner.fresh()
    if got.shape != expected.shape:
        return False, float("inf")
    return compare(got, expected, dtype)


def _build_polydl(
    case: Case, inputs: Sequence[np.ndarray], expected: np.ndarray, layouts: Sequence[str],
    compare_layouts: bool, repeat: int,
) -> tuple[PolydlBuild, bool, float, dict[str, float], list[str]]:
    """polydl's kernel for `case`. A conv uses the first of `layouts` that builds and verifies,
    or with `compare_layouts` the fastest of them. Returns (build, verified, relative error,
    speeds of the layouts compared, problems met)."""
    if case.primitive == "matmul":
        build = build_polydl_gemm(case, inputs[0], inputs[1])
        ok, err = _verify(build.runner, expected, case.dtype)
        return build, ok, err, {}, [] if ok else [f"result differs (relative error {err:.1e})"]
    built: list[tuple[PolydlBuild, bool, float]] = []
    problems = []
    for layout in layouts:
        try:
            if case.primitive == "conv2d":
                build = build_polydl_conv(case, inputs[0], inputs[1], layout)
            else:
                from polydl import bench_backward

                build = bench_backward.build_polydl(case, list(inputs), layout)
        except Exception as exc:  # noqa: BLE001 - a layout that does not build is reported
            problems.append(f"{layout}: {_one_line(exc)}")
            continue
        ok, err = _verify(build.runner, expected, case.dtype)
        if not ok:
            problems.append(f"{layout}: result differs (relative error {err:.1e})")
        built.append((build, ok, err))
        if ok and not compare_layouts:
            break
    if not built:
        raise BenchError("; ".join(problems))
    good = [b for b in built if b[1]] or built
    speeds = variant_speeds(case, [b for b, _, _ in good], repeat)
    if speeds:
        good.sort(key=lambda b: -speeds[b[0].variant])
    build, ok, err = good[0]
    return build, ok, err, speeds, problems


def variant_speeds(case: Case, builds: Sequence[PolydlBuild], repeat: int) -> dict[str, float]:
    """GFLOP/s of each built variant, timed interleaved (none when there is only one), by the
    fastest sample: one burst of other work cannot flip the choice."""
    if len(builds) < 2:
        return {}
    runners = [Runner(b.variant, b.runner.run, b.runner.fresh) for b in builds]
    _, samples = time_runners(runners, min(repeat, 5), 3.0)
    return {n: case.flops / min(v) / 1e9 for n, v in samples.items()}


def bench_case(
    case: Case, torch: ModuleType | None, repeat: int, budget_s: float, peak_gflops: float,
    layouts: Sequence[str] = CONV_LAYOUTS, compare_layouts: bool = True, seed: int = 0,
) -> Row:
    rng = np.random.default_rng(seed)
    s = case.size
    shapes: list[tuple[int, ...]]
    if case.primitive == "matmul":
        shapes = [(s["M"], s["K"]), (s["K"], s["N"])]
    elif case.primitive != "conv2d":
        from polydl import bench_backward

        shapes = bench_backward.input_shapes(case)
    else:
        shapes = [(s["N"], s["C"], s["H"], s["W"]), (s["K"], s["C"], s["R"], s["S"])]
    inputs = [rng.uniform(-1.0, 1.0, size=shape).astype(np.float32) for shape in shapes]
    expected = _float64_result(case, inputs, torch)

    t0 = time.perf_counter()
    try:
        build, ok, err, variants, problems = _build_polydl(
            case, inputs, expected, layouts, compare_layouts, repeat
        )
    except Exception as exc:  # noqa: BLE001 - one case's failure is a row, not the end of the run
        return Row(case.name, case.shape, case.flops, None, {}, "ERROR", peak_gflops=peak_gflops,
                   compile_s=time.perf_counter() - t0, message=_one_line(exc))
    status = "ok" if ok else "FAILED"
    if case.primitive == "matmul":
        references = gemm_references(inputs[0], inputs[1], torch)
    elif case.primitive != "conv2d":
        from polydl import bench_backward

        references = bench_backward.references(case, inputs, torch)
    else:
        references = conv_references(inputs[0], inputs[1], case, torch)
    reference_errors = {}
    verified = []
    for ref in references:
        ok, ref_err = _verify(ref, expected, case.dtype)
        reference_errors[ref.name] = ref_err
        if ok:
            verified.append(ref)
    runners = [build.runner, *verified]
    rounds, samples = time_runners(runners, repeat, budget_s)
    speeds = {n: case.flops / statistics.median(v) / 1e9 for n, v in samples.items()}
    fastest = {n: case.flops / min(v) / 1e9 for n, v in samples.items()}
    return Row(
        case.name,
        case.shape,
        case.flops,
        polydl_gflops=speeds.pop("polydl"),
        references=speeds,
        status=status,
        peak_gflops=peak_gflops,
        relative_error=err,
        compile_s=build.compile_s,
        variant=build.variant,
        schedule=build.schedule,
        message="; ".join(problems),
        rounds=rounds,
        samples={n: len(v) for n, v in samples.items()},
        variants=variants,
        fastest=fastest,
        reference_errors=reference_errors,
    )


# ---------------------------------------------------------------------------------- main
@contextlib.contextmanager
def private_compile_cache(enabled: bool) -> Iterator[None]:
    """A fresh, temporary compile cache, so the compile column shows cold compilation."""
    if not enabled:
        yield
        return
    saved = os.environ.get("POLYDL_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="polydl-bench-cache-") as root:
        os.environ["POLYDL_CACHE_DIR"] = root
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop("POLYDL_CACHE_DIR", None)
            else:
                os.environ["POLYDL_CACHE_DIR"] = saved


class CpuMeter:
    """The share of the machine's CPU time that other processes take while this one runs:
    busy time from /proc/stat less this process's and its children's (the C compiler)."""

    def __init__(self) -> None:
        self._start = self._read(), time.perf_counter()

    @staticmethod
    def _read() -> tuple[float, float] | None:
        import resource

        try:
            ticks = [int(f) for f in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
        except (OSError, ValueError):
            return None
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait
        own = sum(
            r.ru_utime + r.ru_stime
            for r in (resource.getrusage(resource.RUSAGE_SELF),
                      resource.getrusage(resource.RUSAGE_CHILDREN))
        )
        return busy, own

    def other_share(self) -> float | None:
        (start, t0), end = self._start, self._read()
        wall = (time.perf_counter() - t0) * (os.cpu_count() or 1)
        if start is None or end is None or wall <= 0:
            return None
        return max(0.0, (end[0] - start[0]) - (end[1] - start[1])) / wall


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(
    suite: str,
    json_path: str | None,
    cases: list[str] | None,
    repeat: int,
    *,
    budget_s: float | None = None,
    cold_cache: bool = True,
    layouts: Sequence[str] = CONV_LAYOUTS,
    compare_layouts: bool = True,
) -> int:
    """Run `suite` (or only `cases` of it): print the table, write `json_path` if given.

    `repeat` bounds the rounds per case and `budget_s` the timing seconds per case. Returns 0
    when every case built and verified, 1 otherwise (missed speed targets are reported, not
    failures). A process started without the thread settings (`THREAD_ENV`) runs the
    benchmark in a child process that has them."""
    selected = select_cases(load_suite(suite), cases)
    arguments: dict[str, Any] = dict(
        suite=suite, json_path=json_path, cases=[c.name for c in selected], repeat=max(1, repeat),
        budget_s=budget_s, cold_cache=cold_cache, layouts=list(layouts),
        compare_layouts=compare_layouts,
    )
    if not threads_prepared():
        return _run_in_child(arguments)
    return _run(**arguments)


def _run_in_child(arguments: dict[str, Any]) -> int:
    import subprocess

    env = {**os.environ, **thread_environment(current_machine())}
    code = (
        "import json, sys; from polydl.bench import main; "
        "sys.exit(main(**json.loads(sys.argv[1])))"
    )
    sys.stdout.flush()
    return subprocess.run([sys.executable, "-c", code, json.dumps(arguments)], env=env).returncode


def _run(
    suite: str, json_path: str | None, cases: list[str], repeat: int, budget_s: float | None,
    cold_cache: bool, layouts: Sequence[str], compare_layouts: bool,
) -> int:
    selected = select_cases(load_suite(suite), cases)
    budget = DEFAULT_BUDGET_S[suite] if budget_s is None else budget_s
    machine = current_machine()
    threads = int(os.environ["OMP_NUM_THREADS"])
    torch = import_torch(threads)
    _progress(f"bench {suite}: {len(selected)} case(s), {threads} threads, "
              f"{'PyTorch ' + torch.__version__ if torch else 'no PyTorch (numpy only)'}")
    from polydl.bench_variants import CASE_RUNNERS

    run_case = CASE_RUNNERS.get(suite, bench_case)
    meter = CpuMeter()
    peak = FmaPeak(machine)
    try:
        peak_samples = peak.measure()
        rows = []
        grad = torch.inference_mode() if torch is not None else contextlib.nullcontext()
        with private_compile_cache(cold_cache), grad:
            for i, case in enumerate(selected, 1):
                t0 = time.perf_counter()
                peak_now = max(peak_samples)
                row = run_case(case, torch, repeat, budget, peak_now, layouts, compare_layouts)
                rows.append(row)
                best = row.best_reference
                _progress(
                    f"[{i}/{len(selected)}] {case.name}: polydl {_num(row.polydl_gflops, '.1f')} "
                    f"vs {best[0] + ' ' + format(best[1], '.1f') if best else '-'} GFLOP/s, "
                    f"{row.status}, {time.perf_counter() - t0:.1f} s"
                )
        peak_samples += peak.measure()
    finally:
        peak.close()
    # The peak is what the machine can do: the best sample, not the typical one.
    peak_gflops = max(peak_samples)
    for row in rows:
        row.peak_gflops = peak_gflops
    env = Environment(machine, threads, peak_gflops, peak_samples,
                      torch.__version__ if torch is not None else None,
                      meter.other_share())
    print(format_report(suite, env, rows), flush=True)
    if json_path:
        settings = {"repeat": repeat, "budget_s": budget, "cold_cache": cold_cache,
                    "layouts": list(layouts),
                    "compare_layouts": compare_layouts, "samples_per_round": SAMPLES_PER_ROUND,
                    "min_sample_s": MIN_SAMPLE_S, "cases": [c.name for c in selected],
                    "thread_env": {n: os.environ.get(n) for n in THREAD_ENV}}
        write_json(json_path, report_json(suite, env, rows, settings))
        print(f"wrote {json_path}", flush=True)
    return 0 if all(r.status == "ok" for r in rows) else 1
