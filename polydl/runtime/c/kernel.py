"""`Kernel`: a compiled C loop nest as a Python callable over numpy arrays.

Takes the generated code, the loop nest and its compiled library, loaded with cffi for the life
of the process; returns a callable with the calling convention and the checks every kernel
shares (`runtime/kernel.py`). The common call is checked by comparisons planned once per kernel
(`CallPlan`), anything else by the full checks; inputs whose packed copies the library keeps
between calls are followed by address (`KeptInputs`).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cffi
import numpy as np

from polydl.codegen.artifact import GeneratedCode, KernelArgument
from polydl.codegen.c.generate import c_parameters
from polydl.errors import CompileError, PolyDLError, ShapeError, TargetError
from polydl.ir import LoopNest
from polydl.runtime.kernel import (
    NUMPY_DTYPES,
    BoundCall,
    CompiledKernel,
    ReferenceImpl,
    bind_host,
    call_result,
    checked_scalar,
    is_bfloat16,
    zero_output,
)
from polydl.runtime.loading import load_for_life
from polydl.runtime.sanitize import require_runtime
from polydl.schedules.schedule import Schedule


class Kernel(CompiledKernel):
    """A compiled CPU kernel. `k(*inputs, **named)` runs it; `k.reference(...)` runs numpy.

    What it is: `k.source` (the generated C), `k.header`, `k.schedule` (`describe()` says the
    loop order, tiles, parallel loops and microkernel), `k.flops` (of one call), `k.inputs` and
    `k.outputs` (the arguments, in declaration order), `k.params` (the sizes it was built for).

    `cannot_run` says why this CPU cannot execute the library (built for another target): the
    library is then never loaded, and a call is a `TargetError` instead of an illegal
    instruction."""

    def __init__(
        self,
        code: GeneratedCode,
        nest: LoopNest,
        params: Mapping[str, int],
        schedule: Schedule,
        flops: int,
        reference_impl: ReferenceImpl,
        library_path: Path,
        cannot_run: str = "",
    ) -> None:
        super().__init__(code, nest, params, schedule, flops, reference_impl, library_path)
        self.cannot_run = cannot_run
        self._kept = KeptInputs(code, self.arguments, library_path)
        if not cannot_run:
            self._ffi, self._function, changed, self._index_fault = _load(library_path, code)
            self._call_plan = CallPlan(self._ffi, code.arguments)
            self._kept.changed = changed

    def constants_changed(self) -> None:
        """Say that an input kept between calls (`constant=` when built) was changed in place.

        Its packed copy is made again at the next call, in every kernel of this library. Another
        array, or one at another address, is noticed without this. C callers have
        `void NAME_constants_changed(void)` in the header.
        """
        self._kept.bump()

    def __call__(self, *args: Any, **named: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run the kernel on numpy arrays; every argument is checked before native code runs.

            c = k(a, b)                  # outputs not given are allocated zero-filled
            k(a, b, C=c)                 # an output given by name is updated in place (+= adds)

        Args:
            *args: the inputs (the spec's `const` arrays and its scalar parameters), in
                declaration order: C-contiguous arrays of the kernel's shape and dtype
                (bfloat16: `ml_dtypes.bfloat16` arrays or their `uint16` bits).
            **named: any input by name, and outputs by name (used and modified as they are).

        Returns:
            The output array, or a tuple of the outputs in declaration order.

        Raises:
            ShapeError: a missing, unknown or repeated argument, a wrong shape or dtype, an array
                that is not C-contiguous, a read-only output, or an output sharing memory with
                another argument (`array`, `expected` and `given` say which and what).
            TargetError: the kernel was built for a CPU this one cannot run.
            IndexRangeError: a subscript read from an index array selects no cell of the
                array it indexes (`index_array`, `position` and `value` say which); nothing
                outside an array was touched, though where the index array is one the nest
                writes, or reads in part, outputs may be part-updated.
            PolyDLError: the kernel could not allocate its scratch memory.
        """
        if self.cannot_run:
            raise TargetError(self.cannot_run)
        bound = self._call_plan.bind(args, named)
        if bound is None:  # something is off or unusual: the full checks raise or accept it
            bound = self._bind_checked(args, named)
        if self._kept.names:
            self._kept.note(args, named)
        # the arrays stay alive through the call: held by `args`, `named` and `outputs`, and by
        # the from_buffer cdata in c_values
        c_values, outputs = bound
        status = self._function(*c_values)
        if status != 0:
            raise self._failure(status)
        return call_result(outputs)

    def _failure(self, status: int) -> PolyDLError:
        """The error a nonzero status stands for (the header documents each)."""
        if 0 < status <= len(self.code.index_checks):
            position, value = self._ffi.new("long *"), self._ffi.new("long *")
            self._index_fault(position, value)
            return self.code.index_checks[status - 1].error(position[0], value[0])
        return PolyDLError(f"kernel {self.name} could not allocate its scratch memory")

    def _bind_checked(self, args: tuple[Any, ...], named: dict[str, Any]) -> BoundCall:
        """The C arguments and the outputs of a call that passes every check, or the
        ShapeError of the first check it fails."""
        arrays, outputs = bind_host(self.arguments, self._gather(args, named))
        c_values = [
            self._ffi.cast(f"{a.c_type} *", arrays[a.name].ctypes.data) if a.shape
            else arrays[a.name].item()  # a scalar parameter, by value
            for a in self.arguments
        ]
        return c_values, outputs


_MISSING = object()  # an argument the call did not give


class KeptInputs:
    """The inputs whose packed copies the library keeps between calls (`GeneratedCode.kept`),
    and the arrays last passed for them. The library finds a copy by the input's address;
    a different array at an address seen before (the first one freed, its memory reused)
    would read the copy of the old one, so it moves the library's generation on first. The
    addresses seen are the library's (kernels loaded from one library share its copies)."""

    def __init__(self, code: GeneratedCode, arguments: tuple[KernelArgument, ...],
                 library: Path) -> None:
        self.names = code.kept
        inputs = [a for a in arguments if a.is_input]
        self._where = tuple((i, a.spelling) for i, a in enumerate(inputs) if a.identifier in code.kept)
        self._seen: dict[int, weakref.ref[Any] | None] = {}
        if self.names:
            with _LOCK:
                self._seen = _KEPT_SEEN.setdefault(library, {})
        self._lock = _KEPT_LOCK
        self.changed: Callable[[], None] | None = None

    def bump(self) -> None:
        if self.changed is not None:
            self.changed()

    def note(self, args: tuple[Any, ...], named: dict[str, Any]) -> None:
        """Before a call that passed every check: bump where a kept input is an array other
        than the one last seen at its address."""
        for position, keyword in self._where:
            value = args[position] if position < len(args) else named.get(keyword)
            if not isinstance(value, np.ndarray):
                continue
            owner = _owner(value)
            address = value.__array_interface__["data"][0]
            with self._lock:
                known = address in self._seen
                seen = self._seen.get(address)
                if seen is None or seen() is not owner:
                    if known:
                        self.bump()
                    try:
                        self._seen[address] = weakref.ref(owner)
                    except TypeError:  # an owner that takes no weak reference: always a new one
                        self._seen[address] = None


def _owner(array: np.ndarray) -> Any:
    """The object that owns an array's memory (the end of its chain of bases)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base if array.base is not None else array


@dataclass(frozen=True, slots=True)
class _Slot:
    """What a call checks of one argument, and how it reaches C."""

    argument: KernelArgument
    spelling: str  # the keyword it is passed by
    position: int  # where it may come positionally; outputs, by name only, lie past any call's
    shape: tuple[int, ...]
    dtype: np.dtype  # the numpy dtype of the array C reads
    c_array: Any  # the cffi type `<c_type>[]` ffi.from_buffer gives it; None: a scalar input
    is_output: bool
    is_bfloat16: bool  # ml_dtypes.bfloat16 arrays are accepted and viewed as their bits
    is_float: bool  # a float or double scalar


class CallPlan:
    """A kernel's arguments resolved once for all its calls. `bind` accepts the common call
    (every array an ndarray of the right dtype, shape and layout, no output sharing memory)
    with plain comparisons; anything else it answers None, and `bind_host`'s full checks then
    raise the exact error (or accept what is unusual but right, an ndarray subclass say)."""

    def __init__(self, ffi: cffi.FFI, arguments: tuple[KernelArgument, ...]) -> None:
        self.ffi = ffi
        position = {a.name: i for i, a in enumerate(a for a in arguments if a.is_input)}
        self.input_count = len(position)
        self.slots = tuple(
            _Slot(a, a.spelling, position.get(a.name, sys.maxsize), a.shape,
                  NUMPY_DTYPES[a.dtype], ffi.typeof(f"{a.c_type}[]") if a.shape else None,
                  not a.is_input, a.dtype == "bfloat16", a.dtype in ("float32", "float64"))
            for a in arguments
        )
        # the pairs of arrays (by slot) that may not share memory: those with an output
        self.separate_pairs = tuple(
            (i, j) for j, b in enumerate(self.slots) for i, a in enumerate(self.slots[:j])
            if a.shape and b.shape and (a.is_output or b.is_output)
        )

    def bind(self, args: tuple[Any, ...], named: dict[str, Any]) -> BoundCall | None:
        """The C arguments and the outputs of a call that passes every check; None if the call
        may not (too many, unknown, repeated or missing arguments, a wrong or unusual value)."""
        positional = len(args)
        if positional > self.input_count:
            return None
        from_buffer = self.ffi.from_buffer
        c_values: list[Any] = []  # its from_buffer cdata keep the arrays alive
        arrays: list[np.ndarray | None] = []  # by slot; None for a scalar or an output not given
        owning: list[bool] = []  # by slot: an array given that owns its memory (its own allocation)
        outputs: list[Any] = []  # None for an output not given
        named_taken = missing_outputs = 0
        for slot in self.slots:
            if slot.position < positional:
                value = args[slot.position]
            else:
                value = named.get(slot.spelling, _MISSING)
                if value is _MISSING:
                    if not slot.is_output:  # a missing input
                        return None
                    c_values.append(None)
                    arrays.append(None)
                    owning.append(False)
                    outputs.append(None)
                    missing_outputs += 1
                    continue
                named_taken += 1
            if slot.c_array is None:
                # a float for a float or double parameter goes as it is: cffi rounds it to float
                # as numpy does
                number = value if slot.is_float and type(value) is float else _scalar_value(slot.argument, value)
                if number is None:
                    return None
                c_values.append(number)
                arrays.append(None)
                owning.append(False)
                continue
            array = _checked_quickly(slot, value)
            if array is None:
                return None
            c_values.append(from_buffer(slot.c_array, array))
            arrays.append(array)
            owning.append(array.base is None and array.flags.owndata)
            if slot.is_output:
                outputs.append(value)  # as given: a bfloat16 array, not its bits
        if named_taken != len(named):  # an unknown name, or an input given twice
            return None
        if self._any_overlap(arrays, owning):
            return None
        if missing_outputs:
            self._allocate_outputs(c_values, outputs)
        return c_values, outputs

    def _any_overlap(self, arrays: list[np.ndarray | None], owning: list[bool]) -> bool:
        """Whether two of the arrays given that may not share memory may. Two arrays that
        each own their memory are two allocations, unless they are one array."""
        for i, j in self.separate_pairs:
            first, second = arrays[i], arrays[j]
            if first is None or second is None:
                continue
            if first is second or not (owning[i] and owning[j]) and _may_share_memory(first, second):
                return True
        return False

    def _allocate_outputs(self, c_values: list[Any], outputs: list[Any]) -> None:
        """Zero-filled arrays for the outputs not given, in `outputs` and `c_values`."""
        output = 0
        for i, slot in enumerate(self.slots):
            if not slot.is_output:
                continue
            if outputs[output] is None:
                outputs[output] = zero_output(slot.argument)
                c_values[i] = self.ffi.from_buffer(slot.c_array, outputs[output])
            output += 1


def _checked_quickly(slot: _Slot, value: Any) -> np.ndarray | None:
    """The array C reads for `value` (bfloat16 viewed as its bits) if it passes every check of
    `bind_host`; None if it may not."""
    if type(value) is not np.ndarray:  # no array, or a subclass: checked in full
        return None
    array, dtype = value, value.dtype
    if dtype is not slot.dtype and dtype != slot.dtype:  # (numpy's dtypes are mostly singletons)
        if not (slot.is_bfloat16 and is_bfloat16(dtype)):
            return None
        array = value.view(np.uint16)
    if array.shape != slot.shape:
        return None
    flags = array.flags
    if not flags.c_contiguous or (slot.is_output and not flags.writeable):
        return None
    return array


def _scalar_value(arg: KernelArgument, value: Any) -> Any:
    """A scalar parameter's C value, or None where `checked_scalar` refuses it."""
    try:
        return checked_scalar(arg, value).item()
    except ShapeError:
        return None


# np.may_share_memory without its __array_function__ dispatch, which has nothing to do for the
# exact ndarrays `_checked_quickly` lets through (half the time of a call through numpy's)
_may_share_memory = getattr(np.may_share_memory, "_implementation", np.may_share_memory)


# Loaded libraries stay loaded for the life of the process, the interpreter's exit included
# (`load_for_life`): unloading one whose OpenMP runtime came in with it would unmap code that
# OpenMP's idle worker threads still run, and LIBXSMM putenv()s strings that live inside the
# library.
_LOADED: dict[Path, tuple[cffi.FFI, Any, Any]] = {}
_LOCK = threading.Lock()
# per library with kept copies: the owner of the array last passed at each address
_KEPT_SEEN: dict[Path, dict[int, weakref.ref[Any] | None]] = {}
_KEPT_LOCK = threading.Lock()


def _load(library_path: Path, code: GeneratedCode) -> tuple[cffi.FFI, Any, Any, Any]:
    """(ffi, the kernel's function, its `_constants_changed` function or None, its
    `_index_fault` function or None)."""
    with _LOCK:
        if library_path not in _LOADED:
            ffi = cffi.FFI()
            ffi.cdef(f"int {code.function}({', '.join(c_parameters(code.arguments))});")
            if code.kept:
                ffi.cdef(f"void {code.function}_constants_changed(void);")
            if code.index_checks:
                ffi.cdef(f"void {code.function}_index_fault(long *position, long *value);")
            require_runtime()
            try:
                lib = load_for_life(ffi, library_path)
            except OSError as exc:  # a truncated file, a foreign compiler's output, ...
                raise CompileError("dlopen", str(library_path), f"cannot load the kernel: {exc}") from None
            _LOADED[library_path] = (ffi, getattr(lib, code.function), lib)
        ffi, function, lib = _LOADED[library_path]
        changed = getattr(lib, f"{code.function}_constants_changed") if code.kept else None
        fault = getattr(lib, f"{code.function}_index_fault") if code.index_checks else None
        return ffi, function, changed, fault
