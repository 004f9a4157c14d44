"""The element types polydl compiles for, each fact about them in one table.

Every stage reads it: the frontends (the C spellings a spec may use), the cost model (element
size, the dtype products accumulate in), code generation (the C type), the runtime (numpy and
DLPack types, what a kernel's arrays hold) and verification (the tolerance against the float64
reference). bfloat16 arrays hold raw 16-bit patterns (`uint16`; `ml_dtypes.bfloat16` arrays are
accepted and viewed so); products of bfloat16 accumulate in float32, as the hardware's bf16
dot products do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polydl.errors import PolyDLError

# DLPack type codes (dlpack.h): kDLFloat, kDLBfloat
DLPACK_FLOAT, DLPACK_BFLOAT = 2, 4


@dataclass(frozen=True)
class DataType:
    name: str  # polydl's name: what specs, builders and errors say
    bytes: int
    c_type: str  # the element type of generated C/CUDA/HIP code
    numpy: str  # numpy dtype of the arrays a kernel takes and returns
    dlpack: tuple[int, int]  # (type code, bits) of a DLPack tensor of this type
    cuda_typestrs: tuple[str, ...]  # __cuda_array_interface__ typestrs accepted
    tolerance: float  # relative error accepted against the float64 reference
    accumulates_in: str  # the dtype its products are summed in
    c_spellings: tuple[str, ...]  # how a C spec declares an array of it


DTYPES: dict[str, DataType] = {
    d.name: d
    for d in (
        DataType("float32", 4, "float", "float32", (DLPACK_FLOAT, 32), ("<f4",), 1e-4,
                 "float32", ("float",)),
        DataType("float64", 8, "double", "float64", (DLPACK_FLOAT, 64), ("<f8",), 1e-10,
                 "float64", ("double",)),
        DataType("bfloat16", 2, "uint16_t", "uint16", (DLPACK_BFLOAT, 16), ("<V2", "<u2", "|V2"),
                 2e-2, "float32", ("bfloat16", "__bf16")),
    )
}
# C spelling -> polydl dtype name
C_SPELLINGS: dict[str, str] = {s: d.name for d in DTYPES.values() for s in d.c_spellings}


def dtype(name: str) -> DataType:
    try:
        return DTYPES[name]
    except KeyError:
        raise PolyDLError(f"unknown dtype '{name}'; known: {', '.join(DTYPES)}") from None


# bfloat16 values as the 16-bit patterns kernels take: the upper half of a float32.
def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits, nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded
