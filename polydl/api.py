"""The Python entry points: a spec or a builder call in, a callable `Kernel` out.

Runs the pipeline once: frontend -> polyhedral model -> schedule -> codegen -> runtime.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from polydl.codegen.artifact import GeneratedCode, code_from_dict, code_to_dict
from polydl.codegen.targets import generate
from polydl.errors import PolyDLError, ScheduleError
from polydl.frontends import builders, conv_backward, layers, load_spec
from polydl.gpu import GPU_TARGETS
from polydl.gpu_lowering import build_gpu_kernel, lower_gpu
from polydl.ir import LoopNest, fingerprint
from polydl.machine import current_machine
from polydl.poly.model import PolyModel, build_model
from polydl.reference import make_reference
from polydl.runtime.cache import compiler_revision, content_key, read_lowering, write_lowering
from polydl.runtime.kernel import Kernel
from polydl.runtime.toolchain import build_shared_library
from polydl.schedules.apply import ScheduledNest, apply_schedule
from polydl.schedules.auto import auto_schedule, resolve
from polydl.schedules.schedule import Schedule
from polydl.version import __version__

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
        return self.model.flops


def _schedule_from(data: Mapping[str, Any]) -> Schedule:
    """A schedule given as a mapping (e.g. read from JSON), or ScheduleError if malformed."""
    try:
        return Schedule.from_dict(dict(data))
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ScheduleError(f"malformed schedule {dict(data)!r}: {type(exc).__name__}: {exc}") from None


def choose_schedule(model: PolyModel, schedule: ScheduleArg) -> Schedule:
    if isinstance(schedule, Schedule):
        return resolve(model, schedule)
    if isinstance(schedule, Mapping):
        return resolve(model, _schedule_from(schedule))
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
    if target in GPU_TARGETS:
        return lower_gpu(nest, params, target, schedule)  # type: ignore[return-value]
    model = build_model(nest, dict(params))
    chosen = choose_schedule(model, schedule)
    scheduled = apply_schedule(model, chosen)
    return Compilation(model, scheduled, generate(scheduled, target))


class LazyReference:
    """The numpy reference of a nest, built on first use: a cached kernel never needs isl."""

    def __init__(self, nest: LoopNest, params: Mapping[str, int], model: PolyModel | None = None) -> None:
        self.nest, self.params, self.model = nest, dict(params), model
        self._run: Callable[[dict[str, np.ndarray]], None] | None = None

    def __call__(self, arrays: dict[str, np.ndarray]) -> None:
        if self._run is None:
            model = self.model or build_model(self.nest, self.params)
            self._run = make_reference(model)
        self._run(arrays)


def kernel_from(compilation: Compilation) -> Kernel:
    model = compilation.model
    return _kernel(
        compilation.code, model.nest, model.params, compilation.schedule, compilation.flops, model
    )


def _kernel(
    code: GeneratedCode,
    nest: LoopNest,
    params: Mapping[str, int],
    schedule: Schedule,
    flops: int,
    model: PolyModel | None = None,
) -> Kernel:
    return Kernel(
        code=code,
        nest=nest,
        params=params,
        schedule=schedule,
        flops=flops,
        reference_impl=LazyReference(nest, params, model),
        library_path=build_shared_library(code),
    )


def _lowering_key(
    nest: LoopNest, params: Mapping[str, int], target: str, schedule: ScheduleArg
) -> str | None:
    """Everything the generated code depends on; None where it depends on mutable state."""
    if isinstance(schedule, Schedule):
        chosen = schedule.to_json()
    elif isinstance(schedule, Mapping):
        chosen = _schedule_from(schedule).to_json()
    elif schedule == "auto":
        chosen = "auto"
    else:  # "tuned" reads the tuning database, which changes under us
        return None
    return content_key(
        [__version__, compiler_revision(), fingerprint(nest), json.dumps(dict(params), sort_keys=True),
         target, chosen, current_machine().key()]
    )


def build_kernel(
    nest: LoopNest, params: Mapping[str, int], target: str = "c", schedule: ScheduleArg = "auto"
) -> Kernel:
    """Lower (or reuse the stored lowering of) a nest and return its compiled kernel."""
    if target in GPU_TARGETS:
        return build_gpu_kernel(nest, params, target, schedule)  # type: ignore[no-any-return]
    key = _lowering_key(nest, params, target, schedule)
    record = read_lowering(key) if key else None
    if record is not None:
        try:
            return _kernel(
                code_from_dict(record["code"]), nest, params,
                Schedule.from_dict(record["schedule"]), int(record["flops"]),
            )
        except (KeyError, TypeError, ValueError):
            pass  # an entry from an older layout: lower again and overwrite it
    compilation = lower(nest, params, target, schedule)
    if key:
        write_lowering(key, {
            "code": code_to_dict(compilation.code),
            "schedule": compilation.schedule.to_dict(),
            "flops": compilation.flops,
        })
    return kernel_from(compilation)


def compile(  # noqa: A001 - the public name DESIGN.md gives
    spec: str | os.PathLike[str],
    params: Mapping[str, int] | None = None,
    *,
    target: str = "c",
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """Compile a C loop-nest or TOML spec (a path or the text itself) into a callable kernel."""
    nest, bound = load_spec(spec, params)
    return build_kernel(nest, bound, target, schedule)


def _build(
    builder: str, target: str, schedule: ScheduleArg, **sizes: Any
) -> Kernel:
    nest, params = builders.PRIMITIVES[builder](**sizes)
    return build_kernel(nest, params, target, schedule)


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


# ----------------------------------------------------------------------------- more primitives
# Sizes and options as the builders in `frontends.conv_backward` and `frontends.layers` take
# them; each returns the compiled kernel.


def _layer(built: tuple[LoopNest, dict[str, int]], target: str, schedule: ScheduleArg) -> Kernel:
    return build_kernel(built[0], built[1], target, schedule)


def conv2d_backward_data(
    N: int, C: int, K: int, H: int, W: int, R: int, S: int, stride: int = 1, padding: int = 0,
    dtype: str = "float32", layout: str = "nchw", *, target: str = "c",
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """The input gradient of `conv2d` with the same sizes: `k(dy, w) -> dx`."""
    return _layer(conv_backward.conv2d_backward_data(
        N, C, K, H, W, R, S, stride, padding, dtype, layout), target, schedule)


def conv2d_backward_weights(
    N: int, C: int, K: int, H: int, W: int, R: int, S: int, stride: int = 1, padding: int = 0,
    dtype: str = "float32", layout: str = "nchw", *, target: str = "c",
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """The weight gradient of `conv2d` with the same sizes: `k(x, dy) -> dw`."""
    return _layer(conv_backward.conv2d_backward_weights(
        N, C, K, H, W, R, S, stride, padding, dtype, layout), target, schedule)


def linear(
    N: int, C: int, K: int, dtype: str = "float32", fuse: tuple[str, ...] | list[str] = (), *,
    target: str = "c", schedule: ScheduleArg = "auto",
) -> Kernel:
    """Fully-connected `y[N,K] = x[N,C] w[K,C]^T`, then `fuse`; call as `k(x, w, *fused)`."""
    return _layer(layers.linear(N, C, K, dtype, tuple(fuse)), target, schedule)


def linear_backward_data(
    N: int, C: int, K: int, dtype: str = "float32", *, target: str = "c",
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """`dx[N,C] = dy[N,K] w[K,C]`; call as `k(dy, w)`."""
    return _layer(layers.linear_backward_data(N, C, K, dtype), target, schedule)


def linear_backward_weights(
    N: int, C: int, K: int, dtype: str = "float32", *, target: str = "c",
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """`dw[K,C] = dy[N,K]^T x[N,C]`; call as `k(x, dy)`."""
    return _layer(layers.linear_backward_weights(N, C, K, dtype), target, schedule)


def pool2d(
    N: int, C: int, H: int, W: int, R: int, S: int, stride: int = 1, padding: int = 0,
    kind: str = "max", dtype: str = "float32", layout: str = "nchw", *, target: str = "c",
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """Max or average pooling of R x S windows; call as `k(x) -> y`."""
    return _layer(layers.pool2d(N, C, H, W, R, S, stride, padding, kind, dtype, layout),
                  target, schedule)


def eltwise(
    N: int, C: int, H: int = 1, W: int = 1, kind: str = "relu", dtype: str = "float32", *,
    target: str = "c", schedule: ScheduleArg = "auto",
) -> Kernel:
    """Element-wise "relu" `k(x)`, "add" `k(a, b)` or "scale_shift" `k(x, scale, shift)`."""
    return _layer(layers.eltwise(N, C, H, W, kind, dtype), target, schedule)


def batchnorm_inference(
    N: int, C: int, H: int, W: int, eps: float = 1e-5, dtype: str = "float32", *,
    target: str = "c", schedule: ScheduleArg = "auto",
) -> Kernel:
    """Batch-norm with given statistics; call as `k(x, gamma, beta, mean, var) -> y`."""
    return _layer(layers.batchnorm_inference(N, C, H, W, eps, dtype), target, schedule)


def batchnorm_statistics(
    N: int, C: int, H: int, W: int, dtype: str = "float32", *, target: str = "c",
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """Per-channel batch mean and (biased) variance; call as `k(x) -> (mean, var)`."""
    return _layer(layers.batchnorm_statistics(N, C, H, W, dtype), target, schedule)


def lstm_cell(
    N: int, C: int, K: int, dtype: str = "float32", *, target: str = "c",
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """One LSTM step; call as `k(x, h_prev, c_prev, w[4][C+K][K], b[4][K]) -> (c, h)`."""
    return _layer(layers.lstm_cell(N, C, K, dtype), target, schedule)
