"""The Python entry points: a spec or a builder call in, a callable `Kernel` out.

Runs the pipeline once: frontend -> polyhedral model -> schedule -> codegen -> runtime.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polydl.codegen.artifact import GeneratedCode
from polydl.codegen.targets import generate
from polydl.errors import PolyDLError
from polydl.frontends import builders, load_spec
from polydl.ir import LoopNest
from polydl.poly.counting import count_points
from polydl.poly.model import PolyModel, build_model
from polydl.reference import make_reference
from polydl.runtime.kernel import Kernel
from polydl.runtime.toolchain import build_shared_library
from polydl.schedules.apply import ScheduledNest, apply_schedule
from polydl.machine import current_machine
from polydl.schedules.auto import auto_schedule, resolve
from polydl.schedules.schedule import Schedule

ScheduleArg = str | Schedule | Mapping[str, Any]


@dataclass(frozen=True, eq=False)
class Compilation:
    """Every stage's output for one spec: what `explain` prints and `Kernel` wraps."""

    model: PolyModel
    scheduled: ScheduledNest
    code: GeneratedCode

    @property
    def schedule(self) -> Schedule:
        return self.scheduled.schedule

    @property
    def flops(self) -> int:
        return sum(
            count_points(s.domain) * s.statement.flops for s in self.model.statements
        )


def choose_schedule(model: PolyModel, schedule: ScheduleArg) -> Schedule:
    if isinstance(schedule, Schedule):
        return resolve(model, schedule)
    if isinstance(schedule, Mapping):
        return resolve(model, Schedule.from_dict(dict(schedule)))
    if schedule == "auto":
        return auto_schedule(model, current_machine())
    if schedule == "tuned":
        from polydl.tuning import tuned_schedule  # the tuner compiles, so it sits above the API

        return tuned_schedule(model)
    raise PolyDLError(f"schedule must be 'auto', 'tuned' or a Schedule, not {schedule!r}")


def lower(
    nest: LoopNest, params: Mapping[str, int], target: str = "c", schedule: ScheduleArg = "auto"
) -> Compilation:
    """Run the compiler up to generated source (no native compile)."""
    model = build_model(nest, dict(params))
    chosen = choose_schedule(model, schedule)
    scheduled = apply_schedule(model, chosen)
    return Compilation(model, scheduled, generate(scheduled, target))


def kernel_from(compilation: Compilation) -> Kernel:
    library = build_shared_library(compilation.code)
    return Kernel(
        code=compilation.code,
        nest=compilation.model.nest,
        params=compilation.model.params,
        schedule=compilation.schedule,
        flops=compilation.flops,
        reference_impl=make_reference(compilation.model),
        library_path=library,
    )


def compile(  # noqa: A001 - the public name DESIGN.md gives
    spec: str | os.PathLike[str],
    params: Mapping[str, int] | None = None,
    *,
    target: str = "c",
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """Compile a C loop-nest or TOML spec (a path or the text itself) into a callable kernel."""
    nest, bound = load_spec(spec, params)
    return kernel_from(lower(nest, bound, target, schedule))


def _build(
    builder: str, target: str, schedule: ScheduleArg, **sizes: Any
) -> Kernel:
    nest, params = builders.PRIMITIVES[builder](**sizes)
    return kernel_from(lower(nest, params, target, schedule))


def matmul(
    M: int,
    N: int,
    K: int,
    dtype: str = "float32",
    *,
    target: str = "c",
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """`C[M][N] += A[M][K] * B[K][N]`; call as `k(A, B)`."""
    return _build("matmul", target, schedule, M=M, N=N, K=K, dtype=dtype)


def conv2d(
    N: int,
    C: int,
    K: int,
    H: int,
    W: int,
    R: int,
    S: int,
    stride: int = 1,
    padding: int = 0,
    dtype: str = "float32",
    layout: str = "nchw",
    fuse: tuple[str, ...] | list[str] = (),
    *,
    target: str = "c",
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """2-D convolution `y[N,K,P,Q] = sum x[N,C,H,W] * w[K,C,R,S]`; call as `k(x, w, *fused)`."""
    return _build(
        "conv2d",
        target,
        schedule,
        N=N,
        C=C,
        K=K,
        H=H,
        W=W,
        R=R,
        S=S,
        stride=stride,
        padding=padding,
        dtype=dtype,
        layout=layout,
        fuse=tuple(fuse),
    )
