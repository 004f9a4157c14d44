"""The element types polydl compiles for, each fact about them in one table.

Every stage reads it: the frontends (the C spellings a spec may use), the cost model (element
size, the dtype products accumulate in), code generation (the C type), the runtime (numpy and
DLPack types, what a kernel's arrays hold) and verification (the tolerance against the float64
reference). bfloat16 arrays hold raw 16-bit patterns (`uint16`; `ml_dtypes.bfloat16` arrays are
accepted and viewed so); products of bfloat16 accumulate in float32, as the hardware's bf16
dot products do. The integer types are data, computed as C computes integers (in 64 bits here:
every C integer type of a spec fits, and what C leaves undefined, overflow, may do anything);
their results must equal the reference's exactly. C spellings are in canonical word order
(`unsigned char`, `long long`; the C frontend puts a spec's words in that order); plain `char`
is signed, as on x86-64 and in the generated code's `int8_t`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polydl.errors import PolyDLError

# DLPack type codes (dlpack.h): kDLInt, kDLUInt, kDLFloat, kDLBfloat
DLPACK_INT, DLPACK_UINT, DLPACK_FLOAT, DLPACK_BFLOAT = 0, 1, 2, 4


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
    is_integer: bool = False  # integer data (never a microkernel's operand)


def _integer(name: str, bits: int, signed: bool, spellings: tuple[str, ...]) -> DataType:
    byte_order = "|" if bits == 8 else "<"
    return DataType(name, bits // 8, f"{name}_t", name, (DLPACK_INT if signed else DLPACK_UINT, bits),
                    (f"{byte_order}{'i' if signed else 'u'}{bits // 8}",), 0.0, name,
                    (*spellings, f"{name}_t"), is_integer=True)


DTYPES: dict[str, DataType] = {
    d.name: d
    for d in (
        DataType("float32", 4, "float", "float32", (DLPACK_FLOAT, 32), ("<f4",), 1e-4,
                 "float32", ("float",)),
        DataType("float64", 8, "double", "float64", (DLPACK_FLOAT, 64), ("<f8",), 1e-10,
                 "float64", ("double",)),
        DataType("bfloat16", 2, "uint16_t", "uint16", (DLPACK_BFLOAT, 16), ("<V2", "<u2", "|V2"),
                 2e-2, "float32", ("bfloat16", "__bf16")),
        _integer("int8", 8, True, ("char", "signed char")),
        _integer("uint8", 8, False, ("unsigned char",)),
        _integer("int16", 16, True, ("short",)),
        _integer("uint16", 16, False, ("unsigned short",)),
        _integer("int32", 32, True, ("int",)),
        _integer("int64", 64, True, ("long", "long long")),
    )
}
FLOAT_DTYPES = tuple(name for name, d in DTYPES.items() if not d.is_integer)
INTEGER_DTYPES = tuple(name for name, d in DTYPES.items() if d.is_integer)
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
