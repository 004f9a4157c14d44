"""Random arrays for a kernel's arguments (for `polydl run`, tuning and benchmarks)."""

from __future__ import annotations

import numpy as np

from polydl.codegen.artifact import IndexCheck, KernelArgument
from polydl.dtypes import DTYPES, f32_to_bf16
from polydl.runtime.kernel import NUMPY_DTYPES


def random_array(arg: KernelArgument, rng: np.random.Generator) -> np.ndarray:
    """Uniform values in [-1, 1): small enough that long reductions stay well conditioned; a
    scalar parameter (alpha, eps, a slope) in [0.5, 1.5), so a square root or a division by it
    stays defined. Integers in [-8, 8] ([0, 16] unsigned): small, both signs where the type
    has them, and zero among them."""
    if DTYPES[arg.dtype].is_integer:
        signed = np.dtype(DTYPES[arg.dtype].numpy).kind == "i"
        low, high = (-8, 9) if signed else (0, 17)
        return rng.integers(low, high, size=arg.shape).astype(NUMPY_DTYPES[arg.dtype])
    values = np.asarray(rng.uniform(0.5, 1.5) if not arg.shape else rng.uniform(-1.0, 1.0, size=arg.shape))
    if arg.dtype == "bfloat16":
        return f32_to_bf16(values.astype(np.float32))
    return values.astype(NUMPY_DTYPES[arg.dtype])


def random_inputs(arguments: tuple[KernelArgument, ...], seed: int = 0,
                  index_checks: tuple[IndexCheck, ...] = ()) -> list[np.ndarray]:
    """Random values for the inputs, in declaration order. An index array among them
    (`index_checks`, the kernel's `code.index_checks`) holds values every dimension it selects
    in accepts, uniform over them."""
    rng = np.random.default_rng(seed)
    out = []
    for a in arguments:
        if not a.is_input:
            continue
        checks = [c for c in index_checks if c.index_array == a.identifier]
        low = max((-c.offset for c in checks), default=0)
        high = min((c.extent - 1 - c.offset for c in checks), default=-1)
        if checks and low <= high:
            out.append(rng.integers(low, high + 1, size=a.shape).astype(NUMPY_DTYPES[a.dtype]))
        else:
            out.append(random_array(a, rng))
    return out
