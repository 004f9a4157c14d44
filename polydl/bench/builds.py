"""polydl's side of a case: a built kernel as a `Runner`, checked against a float64 result,
and the `Pass` that says how a primitive's inputs, result, kernel and references are made."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from polydl.bench.cases import Case
from polydl.bench.timing import Runner, time_runners
from polydl.runtime.kernel import aligned_zeros
from polydl.runtime.verify import compare

Shape = tuple[int, ...]


@dataclass(frozen=True)
class PolydlBuild:
    runner: Runner
    compile_s: float
    schedule: str
    variant: str  # the conv layout, "" for GEMM
    kept: tuple[str, ...] = ()  # the inputs the kernel keeps between calls (`constant=`)


@dataclass(frozen=True)
class Pass:
    """How the cases of one primitive are measured, so one case runner serves every suite.
    `build` makes polydl's kernel for a layout (ignored when `layouts` is False: one kernel,
    nothing to compare), a schedule request ("auto" or "tuned") and the inputs it keeps
    between calls (`constant=`: `weights` or none); `expected` is the float64 result;
    `references` the other libraries."""

    input_shapes: Callable[[Case], list[Shape]]
    expected: Callable[[Case, list[np.ndarray], ModuleType | None], np.ndarray]
    build: Callable[[Case, list[np.ndarray], str, str, tuple[str, ...]], PolydlBuild]
    references: Callable[[Case, list[np.ndarray], ModuleType | None], list[Runner]]
    layouts: bool = True
    # the input an inference caller keeps between calls (a GEMM's B, a convolution's weights):
    # built with `constant=` where the bench times inference (`kept_weights`)
    weights: str | None = None
    # the layouts of `measure.CONV_LAYOUTS` a case is built in (the two plain ones by default)
    takes: Callable[[Case, str], bool] = lambda case, layout: layout in ("nchw16c", "nchw")

    def constant(self, kept_weights: bool) -> tuple[str, ...]:
        """What `build` keeps between calls: the weights where the bench times inference."""
        return (self.weights,) if kept_weights and self.weights else ()


def polydl_runner(
    kernel: Any, inputs: list[np.ndarray], plain: Callable[[np.ndarray], np.ndarray]
) -> Runner:
    """Timed through the in-place call `k(*inputs, C=out)`: the kernel, not an allocation.
    `out` starts on a cache line, as the output of `k(*inputs)` does and as PyTorch's tensors
    do (a large `np.zeros` starts 16 bytes past one, and every stored vector would straddle
    two lines); the inputs are numpy's as they come."""
    out_arg = next(a for a in kernel.arguments if not a.is_input)
    out = aligned_zeros(out_arg.shape, np.dtype(out_arg.dtype))
    named = {out_arg.name: out}
    return Runner("polydl", lambda: kernel(*inputs, **named), lambda: plain(kernel(*inputs)))


def verify(runner: Runner, expected: np.ndarray, dtype: str) -> tuple[bool, float]:
    """(whether `runner`'s fresh result matches `expected` at `dtype`'s tolerance, its error)."""
    got = runner.fresh()
    if got.shape != expected.shape:
        return False, float("inf")
    return compare(got, expected, dtype)


def variant_speeds(case: Case, builds: Sequence[PolydlBuild], repeat: int) -> dict[str, float]:
    """GFLOP/s of each built variant, timed interleaved (none when there is only one), by the
    median of its samples, the statistic the row then reports. By the fastest sample, a layout
    whose calls vary more could win the choice and lose the row (see decisions: Benchmark
    layouts chosen by the median)."""
    if len(builds) < 2:
        return {}
    runners = [Runner(b.variant, b.runner.run, b.runner.fresh) for b in builds]
    _, samples = time_runners(runners, min(repeat, 5), 3.0)
    return {n: case.flops / statistics.median(v) / 1e9 for n, v in samples.items()}
