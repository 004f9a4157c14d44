"""Compare a kernel's output with the reference: error relative to the result's magnitude.

Kernels may reassociate reductions (tiles, microkernels, vector lanes), so results differ from
the float64 reference by rounding; the tolerance is a few units of the dtype's precision.
"""

from __future__ import annotations

import numpy as np

from polydl.dtypes import DTYPES, bf16_to_f32

TOLERANCE = {name: d.tolerance for name, d in DTYPES.items()}


def as_float(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return bf16_to_f32(np.asarray(values).view(np.uint16)).astype(np.float64)
    return np.asarray(values, dtype=np.float64)


def relative_error(out: np.ndarray, ref: np.ndarray, dtype: str) -> float:
    a, b = as_float(out, dtype), as_float(ref, dtype)
    if a.size == 0:
        return 0.0
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return float("inf")
    # an infinity is right only as the same infinity (inf - inf would be NaN, not an error)
    infinite = np.isinf(b)
    if not np.array_equal(a[infinite], b[infinite]) or np.isinf(a[~infinite]).any():
        return float("inf")
    finite = np.isfinite(b)
    scale = max(float(np.max(np.abs(b[finite]), initial=0.0)), 1e-30)
    return float(np.max(np.abs(a[finite] - b[finite]), initial=0.0)) / scale


def compare(out: np.ndarray, ref: np.ndarray, dtype: str) -> tuple[bool, float]:
    err = relative_error(out, ref, dtype)
    return err <= TOLERANCE[dtype], err
