"""What every backend's kernel shares: `CompiledKernel` and the checks of a call.

Takes a kernel's arguments (`KernelArgument`) and the values a call gives; returns each
argument as a numpy array checked before any native code runs (shape, dtype, C-contiguity,
writability, aliasing) and the outputs to return. Calling convention (docs/contract.md): `const`
arrays are inputs, passed positionally in declaration order or by name; outputs may be passed by
name and are then updated in place, otherwise they are allocated zero-filled. The call returns
the output, or a tuple of outputs. Each backend loads and launches its own kernel:
`runtime/c/kernel.py`, `runtime/gpu/kernel.py`.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from polydl.codegen.artifact import GeneratedCode, KernelArgument
from polydl.dtypes import DTYPES, f32_to_bf16
from polydl.errors import ShapeError
from polydl.ir import LoopNest
from polydl.names import respell, spelling

# polydl dtype -> the numpy dtype of a kernel's arrays (bfloat16: raw bits; ml_dtypes.bfloat16
# arrays are accepted and viewed as such)
NUMPY_DTYPES: dict[str, np.dtype] = {name: np.dtype(d.numpy) for name, d in DTYPES.items()}

ReferenceImpl = Callable[[dict[str, np.ndarray]], None]
# (the values a kernel's C function takes, in order; the arrays the call returns)
BoundCall = tuple[list[Any], list[np.ndarray]]


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether `dtype` is ml_dtypes' bfloat16 (numpy has none of its own)."""
    return dtype.name == "bfloat16"


class CompiledKernel:
    """What every compiled kernel is and how its calls are checked; the targets load and launch."""

    def __init__(
        self,
        code: GeneratedCode,
        nest: LoopNest,
        params: Mapping[str, int],
        schedule: Any,
        flops: int,
        reference_impl: ReferenceImpl,
        library_path: Path,
    ) -> None:
        self.code = code
        self.nest = nest
        self.params = dict(params)
        self.schedule = schedule
        self.flops = flops
        self.library_path = library_path
        self._reference_impl = reference_impl

    # ------------------------------------------------------------------ what the kernel is
    @property
    def name(self) -> str:
        return self.code.function

    @property
    def arguments(self) -> tuple[KernelArgument, ...]:
        return self.code.arguments

    @property
    def inputs(self) -> tuple[KernelArgument, ...]:
        return tuple(a for a in self.arguments if a.is_input)

    @property
    def outputs(self) -> tuple[KernelArgument, ...]:
        return tuple(a for a in self.arguments if not a.is_input)

    @property
    def source(self) -> str:
        return self.code.source

    @property
    def header(self) -> str:
        return self.code.header

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return respell(f"<polydl.{type(self).__name__} {self.name}({sizes}) "
                       f"{self.schedule.describe()}>")

    # ------------------------------------------------------------------ checking a call
    def reference(self, *args: Any, **named: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """The plain numpy evaluation of the same loop nest, for checking the kernel.

        Args:
            *args: the inputs in declaration order, as the kernel takes them.
            **named: inputs and outputs by name; outputs are copied, not modified.

        Returns:
            The output array, or a tuple of the outputs in declaration order, as the kernel's call.

        Raises:
            ShapeError: an argument the kernel's call would refuse.
        """
        arrays, outputs = bind_host(self.arguments, self._gather(args, named), copy_outputs=True)
        # the nest's own names (a spec's `_y` is `_pd___y` there)
        self._reference_impl({a.identifier: arrays[a.name] for a in self.arguments})
        return call_result(outputs)

    def __call__(self, *args: Any, **named: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run the kernel: each target's kernel class launches its code (see `polydl.Kernel`).

        Args:
            *args: the inputs in declaration order.
            **named: inputs and outputs by name.

        Returns:
            The output array, or a tuple of the outputs in declaration order.
        """
        raise NotImplementedError  # each target's kernel class launches its code

    def _gather(self, args: tuple[Any, ...], named: dict[str, Any]) -> dict[str, Any]:
        """The value of every argument given, by name: inputs by position, anything by name."""
        # by the spec's spelling of each name (`_y`, not the IR's name for it)
        inputs, by_name = self.inputs, {a.spelling: a for a in self.arguments}
        if len(args) > len(inputs):
            raise ShapeError(
                "<call>",
                f"too many positional arguments: {self.name} takes {len(inputs)} inputs "
                f"({', '.join(a.spelling for a in inputs)}); pass outputs by name",
                expected=len(inputs),
                given=len(args),
            )
        given: dict[str, Any] = {a.name: v for a, v in zip(inputs, args, strict=False)}
        for name, value in named.items():
            if name not in by_name:
                raise ShapeError(
                    name, f"{self.name} has no argument '{name}'",
                    expected=", ".join(by_name), given=name,
                )
            if by_name[name].name in given:
                raise ShapeError(
                    name, "given both by position and by name",
                    expected="one value", given="two values",
                )
            given[by_name[name].name] = value
        missing = [a.spelling for a in inputs if a.name not in given]
        if missing:
            raise ShapeError(
                missing[0],
                f"missing input{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
                expected=", ".join(a.spelling for a in inputs),
                given=", ".join(spelling(n) for n in given) or "none",
            )
        return given


def call_result(outputs: list[np.ndarray]) -> np.ndarray | tuple[np.ndarray, ...]:
    """What a call returns: its one output, or the tuple of its outputs."""
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


OUTPUT_ALIGNMENT = 64  # one cache line and one AVX-512 vector


def aligned_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero-filled C-order array whose data starts on a cache line. (A large numpy array
    starts 16 bytes past one, so every row of a tile straddles an extra line.)"""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.zeros(nbytes + OUTPUT_ALIGNMENT, dtype=np.uint8)
    skip = -_address(raw) % OUTPUT_ALIGNMENT
    return raw[skip : skip + nbytes].view(dtype).reshape(shape)


def aligned(array: Any) -> np.ndarray:
    """`array` as a C-contiguous numpy array whose data starts on a 64-byte cache line.

    Weights held this way spare a kernel its copy onto a line per call, or the split vector
    loads where the copy does not pay (`codegen/c/line_copies.py`): a large numpy array starts
    16 bytes past a line.

    Args:
        array: a numpy array or anything `np.asarray` takes.

    Returns:
        The array itself where it is C-contiguous and on a line, else a copy that is.
    """
    array = np.asarray(array)
    if array.flags.c_contiguous and array.ctypes.data % OUTPUT_ALIGNMENT == 0:
        return array
    out = aligned_zeros(array.shape, array.dtype)
    out[...] = array
    return out


def _address(array: np.ndarray) -> int:
    """Where a writeable array's data starts (what `array.ctypes.data` says, in a fraction of
    its time)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(array.data))


def bind_host(
    arguments: tuple[KernelArgument, ...], given: dict[str, Any], copy_outputs: bool = False
) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """(every argument's checked numpy array, the outputs to return): outputs not given are
    allocated zero-filled; `copy_outputs` leaves the given ones untouched."""
    arrays: dict[str, np.ndarray] = {}
    outputs: list[np.ndarray] = []
    for arg in arguments:
        if arg.name in given:
            array = _checked(arg, given[arg.name])
            if copy_outputs and not arg.is_input:
                array = array.copy()
        else:
            array = zero_output(arg)
        arrays[arg.name] = array
        if not arg.is_input:
            outputs.append(given[arg.name] if arg.name in given and not copy_outputs else array)
    _check_aliasing(arguments, arrays, given)
    return arrays, outputs


def zero_output(arg: KernelArgument) -> np.ndarray:
    """A new zero-filled array for an output not given, or ShapeError (naming the output and
    its bytes) where this machine cannot allocate it."""
    dtype = NUMPY_DTYPES[arg.dtype]
    try:
        return aligned_zeros(arg.shape, dtype)
    except (MemoryError, ValueError):
        nbytes = math.prod(arg.shape) * dtype.itemsize
        raise ShapeError(
            arg.spelling, f"cannot allocate the output: {arg.dtype}{list(arg.shape)} is {nbytes:,} bytes "
            f"({nbytes / 2**30:,.1f} GiB), more than this machine can allocate",
            expected=f"{arg.dtype}{list(arg.shape)}", given="not enough memory",
        ) from None


def _checked(arg: KernelArgument, value: Any) -> np.ndarray:
    """The array to hand to C for `arg` (a bfloat16 array viewed as its bits), or ShapeError."""
    role = "input" if arg.is_input else "output"
    if not arg.shape:
        return checked_scalar(arg, value)
    if not isinstance(value, np.ndarray):
        raise ShapeError(
            arg.spelling, f"{role} must be a numpy array",
            expected=f"ndarray {arg.dtype}{list(arg.shape)}", given=type(value).__name__,
        )
    want = np.dtype(NUMPY_DTYPES[arg.dtype])
    array = value
    if arg.dtype == "bfloat16" and is_bfloat16(value.dtype):
        array = value.view(np.uint16)
    if array.dtype != want:
        expected = "bfloat16 (ml_dtypes.bfloat16 or uint16 bits)" if arg.dtype == "bfloat16" else arg.dtype
        raise ShapeError(arg.spelling, f"{role} has the wrong dtype", expected=expected, given=str(value.dtype))
    if array.shape != arg.shape:
        raise ShapeError(
            arg.spelling, f"{role} has the wrong shape", expected=arg.shape, given=array.shape
        )
    if not array.flags.c_contiguous:
        raise ShapeError(
            arg.spelling, f"{role} must be C-contiguous (use np.ascontiguousarray)",
            expected="C-contiguous", given=f"strides {array.strides}",
        )
    if not arg.is_input and not array.flags.writeable:
        raise ShapeError(arg.spelling, "output is read-only", expected="writeable", given="read-only")
    return array


def checked_scalar(arg: KernelArgument, value: Any) -> np.ndarray:
    """A scalar parameter as a 0-d array of its dtype: a number (not a bool), a numpy scalar or
    a 0-d array."""
    if isinstance(value, bool | np.bool_) or not (
        isinstance(value, int | float | np.integer | np.floating)
        or (isinstance(value, np.ndarray) and value.shape == ()
            and (value.dtype.kind in "iuf" or is_bfloat16(value.dtype)))
    ):
        raise ShapeError(arg.spelling, "scalar input must be a number", expected=f"{arg.dtype} scalar",
                         given=type(value).__name__)
    number = float(value)
    if arg.dtype == "bfloat16":
        return f32_to_bf16(np.array(number, dtype=np.float32))
    return np.array(number, dtype=NUMPY_DTYPES[arg.dtype])


def _check_aliasing(
    arguments: tuple[KernelArgument, ...], arrays: dict[str, np.ndarray], given: dict[str, Any]
) -> None:
    """An output may share memory with no other argument: the C code declares them restrict."""
    names = [a.name for a in arguments if a.name in given and a.shape]  # scalars are copies
    for out in (a for a in arguments if not a.is_input and a.name in given):
        for other in names:
            if other != out.name and np.may_share_memory(arrays[out.name], arrays[other]):
                raise ShapeError(
                    out.spelling, f"output overlaps argument '{spelling(other)}'",
                    expected="separate memory", given=f"shares memory with '{spelling(other)}'",
                )
