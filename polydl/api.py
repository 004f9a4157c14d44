"""The Python entry points: a spec or a builder call in, a callable kernel out.

The API boundary: it resolves what the caller names (`target=` a backend kind or a target
value, `machine=` "native", a preset, a `polydl machine --json` file or a target value) into
one target value, detecting this machine only for "native", and hands it to the driver.

One module of about 600 lines: every public builder's signature and documented arguments, side
by side, as `help(polydl)` shows them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from polydl.driver import pipeline
from polydl.driver.compilation import Compilation
from polydl.errors import TargetError
from polydl.frontends import builders, conv_backward, layers, load_spec
from polydl.ir import LoopNest
from polydl.runtime.c.kernel import Kernel
from polydl.schedules.schedule import Schedule
from polydl.target import CpuTarget, GpuTarget, MachineArg, Target, resolve_target

ScheduleArg = str | Schedule | Mapping[str, Any]
TargetArg = str | CpuTarget | GpuTarget

__all__ = ["Compilation", "build_kernel", "compile", "lower", "target_of"]


# Docstring lines every builder shares, written once: `_shared_docs` puts them where a
# docstring says `{where}` (the arguments that choose the target and schedule) and `{fails}`
# (the errors of building a kernel).
_SHARED_DOCS = {
    "{where}": (
        'target: the backend kind, "c" (default), "cuda" or "hip", or a target value.',
        'machine: "native" (None, this machine), a preset name, a `polydl machine --json` file or a '
        'target value.',
        'schedule: "auto" (the reuse model\'s pick), "tuned" (the performance database\'s) or a '
        '`Schedule`.',
    ),
    "{fails}": (
        "ArgumentError: a size or option of the wrong type or out of range (`polydl.errors`).",
        "TargetError: an unknown target kind or machine description.",
        "ScheduleError: a given schedule that is malformed or breaks a dependence.",
        "CompileError: the C compiler failed or could not be run.",
    ),
}
_F = TypeVar("_F", bound=Callable[..., Any])


def _shared_docs(function: _F) -> _F:
    """`function` with its docstring's shared lines filled in (help() shows them)."""
    doc = function.__doc__ or ""
    for marker, lines in _SHARED_DOCS.items():
        doc = doc.replace(marker, "\n        ".join(lines))
    function.__doc__ = doc
    return function


def target_of(target: TargetArg = "c", machine: MachineArg = None) -> Target:
    """The target value the pipeline is given for a `target=` and `machine=` pair.

    Args:
        target: the backend kind, "c", "cuda" or "hip", or a target value (then `machine` stays None).
        machine: "native" (None, this machine), a preset name, a `polydl machine --json` file or a target value.

    Returns:
        The `CpuTarget` or `GpuTarget` (see `polydl.target.resolve_target`).

    Raises:
        TargetError: an unknown kind, preset or description file, or both a target value and a machine.
    """
    if isinstance(target, CpuTarget | GpuTarget):
        if machine is not None:
            raise TargetError("give the target either as a value (target=) or by machine=, not both")
        return target
    return resolve_target(target, machine)


@_shared_docs
def lower(
    nest: LoopNest, params: Mapping[str, int], target: TargetArg = "c",
    schedule: ScheduleArg = "auto", *, machine: MachineArg = None,
    constant: Sequence[str] = (), exact_math: bool = False,
) -> Compilation:
    """Run the compiler up to generated source, without compiling it.

    Args:
        nest: the loop nest (`polydl.frontends.load_spec` or a builder of `polydl.frontends`).
        params: the size parameters' values, such as {"M": 512}.
        {where}
        constant: names of inputs kept unchanged between calls, such as weights (see `build_kernel`).
        exact_math: math functions as the C library's scalar calls (see `build_kernel`).

    Returns:
        The `Compilation`: the polyhedral model, the schedule, the generated code and the decisions.

    Raises:
        SpecError: an access outside its array, or sizes no statement runs at.
        ArgumentError: a `constant` name that is no input.
        TargetError: an unknown target kind or machine description.
        ScheduleError: a given schedule that is malformed or breaks a dependence.
    """
    return pipeline.lower(nest.keeping(constant).with_exact_math(exact_math), params,
                          target_of(target, machine), schedule)


@_shared_docs
def build_kernel(
    nest: LoopNest, params: Mapping[str, int], target: TargetArg = "c",
    schedule: ScheduleArg = "auto", *, machine: MachineArg = None,
    constant: Sequence[str] = (), exact_math: bool = False,
) -> Kernel:
    """Lower (or reuse the stored lowering of) a nest and return its compiled kernel.

    `constant` names inputs the caller keeps unchanged between calls (weights at inference):
    where the schedule packs one, the copy is made at the first call and kept for the next;
    after changing one in place, call `kernel.constants_changed()`.

    Math functions (`expf`, `tanhf`, ...) of a C kernel run in vector form, within the error
    bounds docs/contract.md states; `exact_math=True` calls the C library's scalar functions
    instead, each result exactly libm's.

    Args:
        nest: the loop nest (`polydl.frontends.load_spec` or a builder of `polydl.frontends`).
        params: the size parameters' values, such as {"M": 512}.
        {where}
        constant: names of inputs kept unchanged between calls, such as ("B",).
        exact_math: math functions as the C library's scalar calls, each result libm's.

    Returns:
        The compiled kernel: a `Kernel` for "c", a `GpuKernel` for "cuda" and "hip".

    Raises:
        SpecError: an access outside its array, or sizes no statement runs at.
        ArgumentError: a `constant` name that is no input.
        TargetError: an unknown target kind or machine description.
        ScheduleError: a given schedule that is malformed or breaks a dependence.
        CompileError: the C (or GPU) compiler failed, or the library cannot be loaded.
    """
    return pipeline.build_kernel(nest.keeping(constant).with_exact_math(exact_math), params,  # type: ignore[return-value]
                                 target_of(target, machine), schedule)


@_shared_docs
def compile(  # noqa: A001 - the public name docs/contract.md gives
    spec: str | os.PathLike[str],
    params: Mapping[str, int] | None = None,
    *,
    target: TargetArg = "c",
    machine: MachineArg = None,
    schedule: ScheduleArg = "auto",
    function: str | None = None,
    defines: Mapping[str, object] | None = None,
    include_dirs: Sequence[str | os.PathLike[str]] | None = None,
    constant: Sequence[str] = (),
    exact_math: bool = False,
) -> Kernel:
    """Compile a C loop-nest or TOML spec (a path or the text itself) into a callable kernel.

    The kernel is built for `target` as `machine` describes it (default: this machine). A C
    spec goes through the C preprocessor where it has directives or `defines` are given.

        k = polydl.compile("examples/matmul.c", params={"M": 512, "N": 512, "K": 512})
        c = k(a, b)                      # inputs (the const arrays) in declaration order

    Args:
        spec: a `.c` or `.toml` path, or the spec's text.
        params: the size parameters' values, such as {"M": 512} (`-p M=512`).
        {where}
        function: the function to compile, of a C file that defines several (`--function`).
        defines: C preprocessor macros: {"N": 64} is `-D N=64`, a None value `-D N`.
        include_dirs: folders searched for the spec's `#include "..."` headers (`-I DIR`).
        constant: names of inputs kept unchanged between calls, such as weights (see `build_kernel`).
        exact_math: math functions as the C library's scalar calls (`--exact-math`; see
            `build_kernel`).

    Returns:
        The compiled kernel: a `Kernel` for "c", a `GpuKernel` for "cuda" and "hip".

    Raises:
        SpecError: the spec breaks a rule (with file:line:col and a caret), a size is missing,
            or an access falls outside its array.
        ArgumentError: a `constant` name that is no input.
        TargetError: an unknown target kind or machine description.
        ScheduleError: a given schedule that is malformed or breaks a dependence.
        CompileError: the C (or GPU) compiler failed, or the library cannot be loaded.
    """
    resolved = target_of(target, machine)
    nest, bound = load_spec(spec, params, function, defines, include_dirs, target_kind=resolved.kind)
    return build_kernel(nest, bound, resolved, schedule, constant=constant, exact_math=exact_math)


def _build(
    builder: str, target: TargetArg, machine: MachineArg, schedule: ScheduleArg,
    constant: Sequence[str] = (), **sizes: Any
) -> Kernel:
    resolved = target_of(target, machine)
    # the builder's form for the target where the caller leaves it (as a TOML spec's loading)
    lanes = resolved.vector_lanes("float32") if isinstance(resolved, CpuTarget) else None
    options = builders.target_options(builder, resolved.kind, lanes)
    nest, params = builders.PRIMITIVES[builder](**{**options, **sizes})
    return build_kernel(nest, params, resolved, schedule, constant=constant)


@_shared_docs
def matmul(
    M: int,
    N: int,
    K: int,
    dtype: str = "float32",
    *,
    target: TargetArg = "c",
    machine: MachineArg = None,
    schedule: ScheduleArg = "auto",
    constant: Sequence[str] = (),
) -> Kernel:
    """A GEMM, `C[M][N] += A[M][K] * B[K][N]`; call it as `k(A, B) -> C`.

    Args:
        M: rows of A and C.
        N: columns of B and C.
        K: the reduction: columns of A, rows of B.
        dtype: "float32", "float64" or "bfloat16" (bf16 A and B, an fp32 C).
        {where}
        constant: names of inputs kept unchanged between calls: ("B",) (see `build_kernel`).

    Returns:
        The compiled `Kernel`.

    Raises:
        {fails}
    """
    return _build("matmul", target, machine, schedule, constant, M=M, N=N, K=K, dtype=dtype)


@_shared_docs
def conv2d(
    N: int,
    C: int,
    K: int,
    H: int,
    W: int,
    R: int,
    S: int,
    stride: int = 1,
    padding: int | Sequence[int] = 0,
    dtype: str = "float32",
    layout: str = "nchw",
    fuse: tuple[str, ...] | list[str] = (),
    groups: int = 1,
    dilation: int = 1,
    accumulate: bool = True,
    out_dtype: str | None = None,
    out_layout: str | None = None,
    *,
    target: TargetArg = "c",
    machine: MachineArg = None,
    schedule: ScheduleArg = "auto",
    constant: Sequence[str] = (),
) -> Kernel:
    """2-D convolution `y[N,K,P,Q] = sum x[N,C,H,W] * w[K,C/groups,R,S]`; call it as `k(x, w, *fused)`.

    Blocked weights as `polydl.layouts.to_conv_weights` gives them. `layout="nhwc"` (groups=1)
    takes x[N,H,W,C] and w[K,R,S,C] and gives y[N,P,Q,K]. `out_layout="nchw16c"` with layout
    "nchw" (groups=1) gives a blocked y from an NCHW x, weights as `polydl.layouts.to_kcrs16k`
    gives them (w[KB,C,R,S,16]): the fast form of a layer of few input channels (a stem).

    Args:
        N: images.
        C: input channels.
        K: output channels.
        H: input rows.
        W: input columns.
        R: filter rows.
        S: filter columns.
        stride: the step between windows, in both directions.
        padding: zeros around the input: an int, or (top, left, bottom, right) as ONNX's `pads`.
        dtype: "float32", "float64" or "bfloat16" (bf16 x and w, an fp32 y).
        layout: "nchw", "nchw16c" (channels blocked by 16) or "nhwc".
        fuse: epilogues in order, each adding its inputs after w: "bias", "scale_shift", "residual",
            "relu", "clip(LO,HI)".
        groups: PyTorch's groups, dividing C and K (depthwise: groups == C == K).
        dilation: the spacing of the filter's taps.
        accumulate: False sets a `y` passed in (`y = conv`) instead of adding to it.
        out_dtype: "bfloat16" gives a bf16 y from bf16 inputs; None: float32.
        out_layout: "nchw16c" with layout "nchw" (a blocked y); None: `layout`.
        {where}
        constant: names of inputs kept unchanged between calls: ("w",) (see `build_kernel`).

    Returns:
        The compiled `Kernel`.

    Raises:
        {fails}
    """
    return _build(
        "conv2d",
        target,
        machine,
        schedule,
        constant,
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
        groups=groups,
        dilation=dilation,
        accumulate=accumulate,
        out_dtype=out_dtype,
        out_layout=out_layout,
    )


# ----------------------------------------------------------------------------- more primitives
# Sizes and options as the builders in `frontends.conv_backward` and `frontends.layers` take
# them; each returns the compiled kernel.


def _layer(
    built: tuple[LoopNest, dict[str, int]], target: TargetArg, machine: MachineArg,
    schedule: ScheduleArg, constant: Sequence[str] = (),
) -> Kernel:
    return build_kernel(built[0], built[1], target, schedule, machine=machine, constant=constant)


@_shared_docs
def conv2d_backward_data(
    N: int, C: int, K: int, H: int, W: int, R: int, S: int, stride: int = 1,
    padding: int | Sequence[int] = 0, dtype: str = "float32", layout: str = "nchw",
    groups: int = 1, *, target: TargetArg = "c", machine: MachineArg = None,
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """The input gradient of `conv2d` with the same sizes; call it as `k(dy, w) -> dx`.

    Args:
        N: images.
        C: input channels.
        K: output channels.
        H: input rows.
        W: input columns.
        R: filter rows.
        S: filter columns.
        stride: the step between windows, in both directions.
        padding: zeros around the input: an int, or (top, left, bottom, right).
        dtype: "float32" or "float64".
        layout: "nchw" or "nchw16c" (channels blocked by 16).
        groups: PyTorch's groups, dividing C and K.
        {where}

    Returns:
        The compiled `Kernel`.

    Raises:
        {fails}
    """
    return _layer(conv_backward.conv2d_backward_data(
        N, C, K, H, W, R, S, stride, padding, dtype, layout, groups), target, machine, schedule)


@_shared_docs
def conv2d_backward_weights(
    N: int, C: int, K: int, H: int, W: int, R: int, S: int, stride: int = 1,
    padding: int | Sequence[int] = 0, dtype: str = "float32", layout: str = "nchw",
    groups: int = 1, *, target: TargetArg = "c", machine: MachineArg = None,
    schedule: ScheduleArg = "auto",
) -> Kernel:
    """The weight gradient of `conv2d` with the same sizes; call it as `k(x, dy) -> dw`.

    Args:
        N: images.
        C: input channels.
        K: output channels.
        H: input rows.
        W: input columns.
        R: filter rows.
        S: filter columns.
        stride: the step between windows, in both directions.
        padding: zeros around the input: an int, or (top, left, bottom, right).
        dtype: "float32" or "float64".
        layout: "nchw" or "nchw16c" (channels blocked by 16).
        groups: PyTorch's groups, dividing C and K.
        {where}

    Returns:
        The compiled `Kernel`.

    Raises:
        {fails}
    """
    return _layer(conv_backward.conv2d_backward_weights(
        N, C, K, H, W, R, S, stride, padding, dtype, layout, groups), target, machine, schedule)


@_shared_docs
def linear(
    N: int, C: int, K: int, dtype: str = "float32", fuse: tuple[str, ...] | list[str] = (), *,
    target: TargetArg = "c", machine: MachineArg = None, schedule: ScheduleArg = "auto",
    constant: Sequence[str] = (),
) -> Kernel:
    """Fully-connected `y[N,K] = x[N,C] w[K,C]^T`, then `fuse`; call it as `k(x, w, *fused) -> y`.

    Args:
        N: rows of x (the batch).
        C: input features.
        K: output features.
        dtype: "float32" or "float64".
        fuse: epilogues in order, each adding its inputs after w: "bias", "scale_shift", "residual",
            "relu", "clip(LO,HI)".
        {where}
        constant: names of inputs kept unchanged between calls: ("w",) (see `build_kernel`).

    Returns:
        The compiled `Kernel`.

    Raises:
        {fails}
    """
    return _layer(layers.linear(N, C, K, dtype, tuple(fuse)), target, machine, schedule,
                  constant)


@_shared_docs
def linear_backward_data(
    N: int, C: int, K: int, dtype: str = "float32", *, target: TargetArg = "c",
    machine: MachineArg = None, schedule: ScheduleArg = "auto",
) -> Kernel:
    """The input gradient of `linear`, `dx[N,C] = dy[N,K] w[K,C]`; call it as `k(dy, w) -> dx`.

    Args:
        N: rows of x (the batch).
        C: input features.
        K: output features.
        dtype: "float32" or "float64".
        {where}

    Returns:
        The compiled `Kernel`.

    Raises:
        {fails}
    """
    return _layer(layers.linear_backward_data(N, C, K, dtype), target, machine, schedule)


@_shared_docs
def linear_backward_weights(
    N: int, C: int, K: int, dtype: str = "float32", *, target: TargetArg = "c",
    machine: MachineArg = None, schedule: ScheduleArg = "auto",
) -> Kernel:
    """The weight gradient of `linear`, `dw[K,C] = dy[N,K]^T x[N,C]`; call it as `k(x, dy) -> dw`.

    Args:
        N: rows of x (the batch).
        C: input features.
        K: output features.
        dtype: "float32" or "float64".
        {where}

    Returns:
        The compiled `Kernel`.

    Raises:
        {fails}
    """
    return _layer(layers.linear_backward_weights(N, C, K, dtype), target, machine, schedule)


@_shared_docs
def pool2d(
    N: int, C: int, H: int, W: int, R: int, S: int, stride: int = 1, padding: int = 0,
    kind: str = "max", dtype: str = "float32", layout: str = "nchw", *, target: TargetArg = "c",
    machine: MachineArg = None, schedule: ScheduleArg = "auto",
) -> Kernel:
    """Max or average pooling of R x S windows; call it as `k(x) -> y`.

    Args:
        N: images.
        C: channels.
        H: input rows.
        W: input columns.
        R: window rows.
        S: window columns.
        stride: the step between windows, in both directions.
        padding: cells added on every side: skipped by "max", zeros for "avg".
        kind: "max" or "avg".
        dtype: "float32" or "float64".
        layout: "nchw" or "nchw16c" (channels blocked by 16).
        {where}

    Returns:
        The compiled `Kernel`.

    Raises:
        {fails}
    """
    return _layer(layers.pool2d(N, C, H, W, R, S, stride, padding, kind, dtype, layout),
                  target, machine, schedule)


@_shared_docs
def eltwise(
    N: int, C: int, H: int = 1, W: int = 1, kind: str = "relu", dtype: str = "float32", *,
    target: TargetArg = "c", machine: MachineArg = None, schedule: ScheduleArg = "auto",
) -> Kernel:
    """Element-wise "relu" `k(x)`, "add" `k(a, b)` or "scale_shift" `k(x, scale[C], shift[C])`.

    Args:
        N: images.
        C: channels.
        H: rows.
        W: columns.
        kind: "relu", "add" or "scale_shift".
        dtype: "float32" or "float64".
        {where}

    Returns:
        The compiled `Kernel`.

    Raises:
        {fails}
    """
    return _layer(layers.eltwise(N, C, H, W, kind, dtype), target, machine, schedule)


@_shared_docs
def batchnorm_inference(
    N: int, C: int, H: int, W: int, eps: float = 1e-5, dtype: str = "float32", *,
    target: TargetArg = "c", machine: MachineArg = None, schedule: ScheduleArg = "auto",
) -> Kernel:
    """Batch-norm with given statistics; call it as `k(x, gamma, beta, mean, var) -> y`.

    Args:
        N: images.
        C: channels.
        H: rows.
        W: columns.
        eps: added to the variance before its square root.
        dtype: "float32" or "float64".
        {where}

    Returns:
        The compiled `Kernel`.

    Raises:
        {fails}
    """
    return _layer(layers.batchnorm_inference(N, C, H, W, eps, dtype), target, machine, schedule)


@_shared_docs
def batchnorm_statistics(
    N: int, C: int, H: int, W: int, dtype: str = "float32", *, target: TargetArg = "c",
    machine: MachineArg = None, schedule: ScheduleArg = "auto",
) -> Kernel:
    """Per-channel batch mean and (biased) variance; call it as `k(x) -> (mean, var)`.

    Args:
        N: images.
        C: channels.
        H: rows.
        W: columns.
        dtype: "float32" or "float64".
        {where}

    Returns:
        The compiled `Kernel`.

    Raises:
        {fails}
    """
    return _layer(layers.batchnorm_statistics(N, C, H, W, dtype), target, machine, schedule)


@_shared_docs
def lstm_cell(
    N: int, C: int, K: int, dtype: str = "float32", *, target: TargetArg = "c",
    machine: MachineArg = None, schedule: ScheduleArg = "auto",
) -> Kernel:
    """One LSTM step; call it as `k(x, h_prev, c_prev, w[4][C+K][K], b[4][K]) -> (c, h)`.

    Args:
        N: rows of x (the batch).
        C: input features.
        K: hidden features.
        dtype: "float32" or "float64".
        {where}

    Returns:
        The compiled `Kernel`.

    Raises:
        {fails}
    """
    return _layer(layers.lstm_cell(N, C, K, dtype), target, machine, schedule)
