"""Identifiers a spec may not use, because generated C, C++ (HIP/CUDA) or its headers own them.

Takes a name; says why it is refused, or None. Keywords of C are already syntax errors; the
names here are the library functions, macros and types the generated code includes or calls,
C++ keywords (the GPU targets compile as C++), and, for the function only, the prefix `_` kept
for generated names. Other names that begin with `_` are accepted: the IR holds them renamed
(`polydl.names`), so they meet neither generated names nor the headers' macros.
"""

from __future__ import annotations

import re

from polydl.frontends.c_header_names import FUNCTIONS, MACROS, TYPES
from polydl.ir import MATH_FUNCTIONS

# math.h functions worth protecting: those generated code may call (MATH_FUNCTIONS) and the
# common ones a reader would take for the function, each in its float and double form.
_MATH = {
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "cbrt", "pow", "hypot",
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh",
    "acosh", "atanh", "erf", "erfc", "tgamma", "lgamma", "fabs", "fmax", "fmin", "fma", "fmod",
    "floor", "ceil", "round", "trunc", "rint", "copysign", "ldexp", "frexp", "modf", "nan",
}

_LIBC = {
    "main", "malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign", "memset",
    "memcpy", "memmove", "abort", "exit", "printf", "fprintf", "puts", "abs", "labs", "div",
    "min", "max", "assert", "errno", "isnan", "isinf", "isfinite", "signbit",
    "NULL", "INFINITY", "NAN", "HUGE_VAL", "HUGE_VALF", "M_PI", "M_E", "EOF",
    "size_t", "ptrdiff_t", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t",
    "uint32_t", "uint64_t", "intptr_t", "uintptr_t", "float_t", "double_t", "FILE",
    "stdin", "stdout", "stderr", "offsetof",
}

_CXX = {
    "and", "and_eq", "asm", "bitand", "bitor", "bool", "catch", "char8_t", "char16_t",
    "char32_t", "class", "compl", "concept", "const_cast", "consteval", "constexpr", "constinit",
    "co_await", "co_return", "co_yield", "decltype", "delete", "dynamic_cast", "explicit",
    "export", "false", "friend", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
    "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "reinterpret_cast",
    "requires", "static_assert", "static_cast", "template", "this", "thread_local", "throw",
    "true", "try", "typeid", "typename", "using", "virtual", "wchar_t", "xor", "xor_eq",
    "alignas", "alignof",
    # CUDA / HIP built-in variables and types
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "dim3",
}

RESERVED: frozenset[str] = frozenset(
    _LIBC
    | _CXX
    | _MATH
    | {name + "f" for name in _MATH}
    | set(MATH_FUNCTIONS)
    | {name[:-1] for name in MATH_FUNCTIONS}
)


# Families owned by the generated code, its headers and its runtime libraries.
RESERVED_PREFIXES = ("polydl_", "POLYDL_", "libxsmm_", "LIBXSMM_", "omp_")
_FORMAT_MACRO = re.compile(r"^(PRI|SCN)[a-zA-Z]")


def refusal(name: str, is_function: bool = False) -> str | None:
    """Why `name` cannot name a function (`is_function`), parameter or loop variable; None if
    it can."""
    if name.startswith("_"):
        if not is_function:
            return None  # renamed inside polydl (see polydl.names)
        return (
            f"function name '{name}' starts with '_', which is reserved for generated code; "
            "use a name starting with a letter"
        )
    if name.startswith(RESERVED_PREFIXES):
        prefix = next(p for p in RESERVED_PREFIXES if name.startswith(p))
        return (
            f"identifier '{name}' starts with '{prefix}', which generated code and its "
            "libraries use; choose another name"
        )
    if name in RESERVED:
        return (
            f"identifier '{name}' is reserved (a C library, math or C++ name the generated "
            "code relies on); choose another name"
        )
    if name in MACROS or _FORMAT_MACRO.match(name):
        return (
            f"identifier '{name}' is a macro of the C headers generated code includes; "
            "choose another name"
        )
    if name in TYPES:
        return (
            f"identifier '{name}' is a type of the C headers generated code includes; "
            "choose another name"
        )
    if is_function and name in FUNCTIONS:
        return (
            f"function name '{name}' is already declared by the C headers generated code "
            "includes; choose another name"
        )
    return None
