"""`GpuKernel`: a compiled CUDA loop nest as a Python callable.

Takes the generated code and its launcher library (loaded with cffi); returns a callable with the
CPU `Kernel`'s calling convention and argument checks (`ShapeError` naming the array, the
expected and the given shape/dtype). Arguments are either all numpy arrays (copied to the
device and the outputs back) or all device arrays, taken without copies through
`__cuda_array_interface__` or DLPack (CuPy, PyTorch). With device arrays the launch is
asynchronous on the default stream, and outputs not passed are allocated with the inputs'
library (zero-filled).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cffi
import numpy as np

from polydl.codegen.artifact import GeneratedCode, KernelArgument
from polydl.dtypes import DTYPES
from polydl.errors import PolyDLError, ShapeError
from polydl.ir import LoopNest
from polydl.names import spelling
from polydl.runtime.kernel import CompiledKernel, ReferenceImpl, bind_host, call_result
from polydl.runtime.loading import load_for_life

# DLPack device types (dlpack.h); the type codes are in the dtype table
_DL_CUDA, _DL_CUDA_MANAGED = 2, 13
_DL_TYPES = {name: d.dlpack for name, d in DTYPES.items()}
_CAI_TYPES = {name: d.cuda_typestrs for name, d in DTYPES.items()}


@dataclass(frozen=True)
class DeviceArray:
    """A device buffer seen through one of the two protocols: pointer, shape, dtype, strides."""

    pointer: int
    shape: tuple[int, ...]
    dtype: str | None  # polydl dtype name, None if not one polydl knows
    given_dtype: str
    contiguous: bool
    readonly: bool
    owner: Any  # keeps the buffer alive while the kernel runs


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for extent, stride in zip(reversed(shape), reversed(strides), strict=True):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def _from_cai(value: Any) -> DeviceArray:
    cai = value.__cuda_array_interface__
    shape = tuple(int(x) for x in cai["shape"])
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    dtype = next((name for name, codes in _CAI_TYPES.items() if typestr in codes), None)
    if dtype == "bfloat16" and "bfloat16" not in str(getattr(value, "dtype", "")):
        dtype = "uint16"  # plain 16-bit integers are accepted as bfloat16 bits below
    pointer, readonly = cai["data"]
    strides = cai.get("strides")
    return DeviceArray(
        int(pointer or 0), shape, dtype, typestr,
        _contiguous(shape, tuple(strides) if strides else None, itemsize), bool(readonly), value,
    )


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _from_dlpack(value: Any) -> DeviceArray:
    device_type, _ = value.__dlpack_device__()
    if int(device_type) not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise ShapeError("<call>", "DLPack array is not on a CUDA device",
                         expected="a CUDA array", given=f"DLPack device type {device_type}")
    capsule = value.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    # A DLManagedTensor starts with its DLTensor; the capsule (and so the tensor) stays alive
    # until `capsule` is dropped, after the launch.
    tensor = _DLTensor.from_address(get(capsule, b"dltensor"))
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    strides = tuple(tensor.strides[i] for i in range(tensor.ndim)) if tensor.strides else None
    code, bits = tensor.dtype.code, tensor.dtype.bits
    dtype = next((n for n, t in _DL_TYPES.items() if t == (code, bits)), None)
    if dtype is None and code == 1 and bits == 16:  # uint16 bits stand for bfloat16
        dtype = "uint16"
    given = f"dlpack(code={code}, bits={bits})"
    return DeviceArray(
        int(tensor.data or 0) + int(tensor.byte_offset), shape, dtype, given,
        _contiguous(shape, strides, 1) if strides is None else
        _contiguous(shape, tuple(s * (bits // 8) for s in strides), bits // 8),
        False, (value, capsule),
    )


def is_device_array(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return False
    if type(value).__module__.startswith("torch"):
        return True  # (hasattr would evaluate torch's costly __cuda_array_interface__ property)
    return hasattr(value, "__cuda_array_interface__") or hasattr(value, "__dlpack_device__")


_TORCH_DTYPES = {"torch.float32": "float32", "torch.float64": "float64",
                 "torch.bfloat16": "bfloat16", "torch.uint16": "uint16", "torch.int8": "int8",
                 "torch.uint8": "uint8", "torch.int16": "int16", "torch.int32": "int32",
                 "torch.int64": "int64"}


def _from_torch(value: Any) -> DeviceArray:
    """PyTorch tensors directly: the same facts as the protocols give, without their cost."""
    if not value.is_cuda:
        raise ShapeError("<call>", "PyTorch tensor is not on a CUDA device",
                         expected="a CUDA tensor", given=str(value.device))
    given = str(value.dtype)
    return DeviceArray(
        value.data_ptr(), tuple(value.shape), _TORCH_DTYPES.get(given), given,
        value.is_contiguous(), False, value,
    )


def device_view(value: Any) -> DeviceArray:
    if type(value).__module__.startswith("torch"):
        return _from_torch(value)
    if hasattr(value, "__cuda_array_interface__"):
        try:
            return _from_cai(value)
        except (TypeError, ValueError, KeyError, AttributeError):
            pass  # e.g. a bfloat16 torch tensor refuses the interface: DLPack below
    return _from_dlpack(value)


def _dtype_ok(expected: str, given: str | None) -> bool:
    """Whether an array of polydl dtype `given` serves an argument of `expected` (16-bit
    integers stand for bfloat16 bits)."""
    return given == expected or (expected == "bfloat16" and given == "uint16")


def _check_device(arg: KernelArgument, view: DeviceArray, alignment: int = 1) -> None:
    role = "input" if arg.is_input else "output"
    if not _dtype_ok(arg.dtype, view.dtype):
        raise ShapeError(arg.name, f"{role} has the wrong dtype", expected=arg.dtype, given=view.given_dtype)
    if view.shape != arg.shape:
        raise ShapeError(arg.name, f"{role} has the wrong shape", expected=arg.shape, given=view.shape)
    if not view.contiguous:
        raise ShapeError(arg.name, f"{role} must be C-contiguous", expected="C-contiguous",
                         given="strided")
    if not arg.is_input and view.readonly:
        raise ShapeError(arg.name, "output is read-only", expected="writeable", given="read-only")
    if view.pointer % alignment:
        raise ShapeError(arg.name, f"{role} is not {alignment}-byte aligned (the kernel copies its "
                         f"operands in {alignment}-byte units)", expected=f"an address multiple of {alignment}",
                         given=f"address {view.pointer:#x}")


_LOADED: dict[Path, tuple[cffi.FFI, Any]] = {}
_LOCK = threading.Lock()


def _load(library_path: Path, code: GeneratedCode) -> tuple[cffi.FFI, Any]:
    with _LOCK:
        if library_path not in _LOADED:
            ffi = cffi.FFI()
            name = code.function
            addresses = ", ".join(["uintptr_t"] * (len(code.arguments) + 1))
            ffi.cdef(
                # The launcher takes pointers; declared here as integer addresses (passed alike
                # in the C calling convention) so a call needs no per-argument cast.
                f"int {name}({addresses});\n"
                f"void *{name}_device_alloc(long bytes);\n"
                f"int {name}_device_free(void *p);\n"
                f"int {name}_to_device(void *dst, const void *src, long bytes);\n"
                f"int {name}_to_host(void *dst, const void *src, long bytes);\n"
                f"int {name}_synchronize(void *stream);\n"
                f"int {name}_device_count(void);\n"
                f"int {name}_graph_time({', '.join(['uintptr_t'] * len(code.arguments))}, int count, "
                "float *milliseconds);\n"
                f"const char *{name}_error_string(int code);\n"
            )
            _LOADED[library_path] = (ffi, load_for_life(ffi, library_path))
        return _LOADED[library_path]


def loaded_libraries() -> set[Path]:
    with _LOCK:
        return set(_LOADED)


def unload(library_path: Path) -> None:
    """Close a launcher library no kernel uses any more (a timed candidate that lost): every
    library loaded keeps its kernels registered with the CUDA runtime, and with a thousand of
    them each launch of the others cost the host more (see decisions: Timed GPU candidates
    unloaded)."""
    with _LOCK:
        loaded = _LOADED.pop(library_path, None)
    if loaded is not None:
        ffi, lib = loaded
        ffi.dlclose(lib)


class GpuKernel(CompiledKernel):
    """A compiled GPU kernel. `k(*inputs, **named)` runs it; `k.reference(...)` runs numpy."""

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
        super().__init__(code, nest, params, schedule, flops, reference_impl, library_path)
        self._ffi, self._lib = _load(library_path, code)
        self._nbytes = {a.name: int(np.prod(a.shape)) * DTYPES[a.dtype].bytes for a in code.arguments}
        self._entry = getattr(self._lib, code.function)
        self._torch: _TorchCall | None = None

    @property
    def launcher(self) -> str:
        return self.code.launcher

    # ------------------------------------------------------------------ calling
    def _fn(self, suffix: str) -> Any:
        return getattr(self._lib, f"{self.name}{suffix}")

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            message = self._ffi.string(self._fn("_error_string")(status)).decode()
            raise PolyDLError(f"kernel {self.name}: {what} failed: {message} (error {status})")

    def __call__(self, *args: Any, **named: Any) -> Any:
        if args and type(args[0]).__module__ == "torch":
            if self._torch is None:
                self._torch = _TorchCall(self)
            done, result = self._torch(args, named)
            if done:
                return result
        given = self._gather(args, named)
        device = [n for n, v in given.items() if is_device_array(v)]
        if device and len(device) != len(given):
            host = next(n for n in given if n not in device)
            raise ShapeError(host, "mixes host and device arrays: pass all numpy arrays or all "
                             "device arrays", expected="same kind as " + device[0],
                             given=type(given[host]).__name__)
        if device:
            return self._call_device(given)
        return self._call_host(given)

    def _launch(self, pointers: list[int], stream: int = 0) -> None:
        status = self._entry(*pointers, stream)
        if status != 0:
            self._check(status, "launch")

    def has_device(self) -> bool:
        return int(self._fn("_device_count")()) > 0

    @contextlib.contextmanager
    def device_copies(self, arrays: Mapping[str, np.ndarray]) -> Iterator[list[int]]:
        """Device buffers holding copies of the host `arrays` (one per argument, by name),
        freed on leaving; yields their addresses in argument order."""
        buffers: dict[str, Any] = {}
        try:
            for arg in self.arguments:
                host = arrays[arg.name]
                ptr = self._fn("_device_alloc")(max(host.nbytes, 1))
                if ptr == self._ffi.NULL:
                    raise PolyDLError(f"kernel {self.name}: cannot allocate {host.nbytes} bytes "
                                      f"on the device for '{arg.name}'")
                buffers[arg.name] = ptr
                self._check(self._fn("_to_device")(ptr, self._ffi.cast("void *", host.ctypes.data),
                                                   host.nbytes), f"copy of '{arg.name}' to the device")
            yield [int(self._ffi.cast("uintptr_t", buffers[a.name])) for a in self.arguments]
        finally:
            for ptr in buffers.values():
                self._fn("_device_free")(ptr)

    def _call_host(self, given: dict[str, Any]) -> Any:
        arrays, outputs = bind_host(self.arguments, given)
        if not self.has_device():
            raise PolyDLError(f"kernel {self.name}: no CUDA device is available")
        with self.device_copies(arrays) as pointers:
            self._launch(pointers)
            addresses = dict(zip((a.name for a in self.arguments), pointers, strict=True))
            for arg in self.outputs:
                host = arrays[arg.name]
                self._check(self._fn("_to_host")(self._ffi.cast("void *", host.ctypes.data),
                                                 self._ffi.cast("void *", addresses[arg.name]), host.nbytes),
                            f"copy of '{arg.name}' to the host")
        return call_result(outputs)

    def _call_device(self, given: dict[str, Any]) -> Any:
        views: dict[str, DeviceArray] = {}
        outputs: list[Any] = []
        for arg in self.arguments:
            if arg.name in given:
                view = device_view(given[arg.name])
                _check_device(arg, view, self.code.pointer_alignment)
                views[arg.name] = view
        for arg in self.outputs:
            if arg.name not in given:
                template = given[self.inputs[0].name] if self.inputs else None
                value = _zeros_like_library(template, arg)
                given[arg.name] = value
                views[arg.name] = device_view(value)
            outputs.append(given[arg.name])
        self._check_overlap(views)
        self._launch([views[a.name].pointer for a in self.arguments], _current_stream(given))
        return call_result(outputs)

    def _check_overlap(self, views: dict[str, DeviceArray]) -> None:
        shared = _overlap({a.name: views[a.name].pointer for a in self.arguments}, self._nbytes,
                          [a.name for a in self.outputs])
        if shared is not None:
            out, other = shared
            raise ShapeError(out, f"output overlaps argument '{other}'",
                             expected="separate memory", given=f"shares memory with '{other}'")

    def synchronize(self) -> None:
        """Wait for the kernel's launches on the default stream."""
        self._check(self._fn("_synchronize")(self._ffi.NULL), "synchronize")


def _overlap(pointers: Mapping[str, int], nbytes: Mapping[str, int],
             outputs: list[str]) -> tuple[str, str] | None:
    """(an output, an argument whose memory it shares), or None."""
    for out in outputs:
        lo, hi = pointers[out], pointers[out] + nbytes[out]
        for other, start in pointers.items():
            if other != out and lo < start + nbytes[other] and start < hi:
                return out, other
    return None


class _TorchCall:
    """The common call with PyTorch tensors, checked in one pass over them: inputs by
    position, outputs by name or allocated. A host call costs about as much as the kernel
    on small layers, so this path reads each tensor's facts once. Anything it does not
    accept (another form of call, a check that fails) goes to the general path, which names
    the problem."""

    def __init__(self, kernel: GpuKernel) -> None:
        import torch

        self.tensor = torch.Tensor
        self.entry = kernel._entry
        self.status = kernel._check
        arguments = kernel.arguments
        known = {getattr(torch, name.split(".")[1]): dtype for name, dtype in _TORCH_DTYPES.items()
                 if hasattr(torch, name.split(".")[1])}
        self.accepts = {a.name: (tuple(t for t, d in known.items() if _dtype_ok(a.dtype, d)),
                                 torch.Size(a.shape)) for a in arguments}
        self.inputs = [a.name for a in kernel.inputs]
        self.outputs = {spelling(a.name): a for a in kernel.outputs}
        self.order = [a.name for a in arguments]
        self.alignment = kernel.code.pointer_alignment
        self.nbytes = kernel._nbytes
        self.raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

    def __call__(self, args: tuple[Any, ...], named: dict[str, Any]) -> tuple[bool, Any]:
        if len(args) != len(self.inputs) or self.raw_stream is None:
            return False, None
        values = dict(zip(self.inputs, args, strict=True))
        for spelled, value in named.items():
            output = self.outputs.get(spelled)
            if output is None:
                return False, None
            values[output.name] = value
        tensor = self.tensor
        for name, value in values.items():
            dtypes, shape = self.accepts[name]
            if (type(value) is not tensor or value.dtype not in dtypes or value.shape != shape
                    or not value.is_cuda or not value.is_contiguous()):
                return False, None
        device = args[0].get_device()
        outputs = [a.name for a in self.outputs.values()]
        for output in self.outputs.values():
            if output.name not in values:
                values[output.name] = _zeros_like_library(args[0], output)
        pointers = {name: value.data_ptr() for name, value in values.items()}
        for name, value in values.items():
            if pointers[name] % self.alignment or value.get_device() != device:
                return False, None
        if _overlap(pointers, self.nbytes, outputs) is not None:
            return False, None
        status = self.entry(*[pointers[name] for name in self.order], self.raw_stream(device))
        if status != 0:
            self.status(status, "launch")
        return True, call_result([values[name] for name in outputs])


def _current_stream(given: dict[str, Any]) -> int:
    """The stream the arrays' library is working on (0: the legacy default stream), so that a
    launch orders with the library's own work and is captured by its CUDA graphs."""
    first = next(iter(given.values()))
    module = type(first).__module__.split(".")[0]
    if module == "torch":
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object per call
        if raw is not None:
            return int(raw(first.device.index))
        return int(torch.cuda.current_stream(first.device).cuda_stream)
    if module == "cupy":
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def _zeros_like_library(template: Any, arg: KernelArgument) -> Any:
    """A zero-filled output on the device, from the library that made the inputs."""
    module = type(template).__module__.split(".")[0] if template is not None else ""
    if module == "torch":
        import torch

        dtype = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}[arg.dtype]
        return torch.zeros(arg.shape, dtype=dtype, device=template.device)
    if module == "cupy":
        import cupy

        if arg.dtype == "bfloat16":
            return cupy.zeros(arg.shape, dtype=cupy.uint16)
        return cupy.zeros(arg.shape, dtype=arg.dtype)
    raise ShapeError(arg.name, "output not given and the inputs' array library is unknown: "
                     "pass the output by name", expected="a device array", given="none")
