"""Inputs over each math function's whole range and errors in ulp against float64 numpy.

A float32 result is compared with the float64 value of the same function at the same (float32)
input: its distance in units of the last place of the float32 nearest that value (subnormals
have the smallest normal's spacing; beyond the largest finite float, 2^128 stands for infinity,
so an overflow to infinity where the true value is past the rounding threshold is no error).
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.finfo(np.float32)
# 2^128: where float32 rounding reaches infinity; results are measured as if it were finite
_INFINITY_AT = 2.0**128

# Where float32 functions change regime: overflow and underflow of expf, its subnormal results,
# the saturation of tanhf and erff, multiples of pi/2 for sinf and cosf, 1 for logf.
EDGES = (
    0.0, 1.0, 2.0, 0.5, 88.72283, 88.7228394, 89.0, -87.33654, -87.3365479, -103.27893,
    -103.972084, -104.0, 9.010913, 9.0, 3.9192059, 3.832506, 1e-4, 2.0**-12, 2.0**-126,
    2.0**-149, 1.5707964, 3.1415927, 4.712389, 6.2831855, 1e4, 1e6, 1e8, 1e30, F32.max,
)


def inputs(count: int = 200_000, seed: int = 0) -> np.ndarray:
    """float32 inputs: every sign and exponent (uniform bit patterns), dense samples of
    [-110, 110], a sweep of neighbouring floats at each edge of `EDGES` and its negation, and
    +-0, +-inf, NaN, the smallest subnormals, the largest float."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, size=count // 2, dtype=np.uint64).astype(np.uint32)
    patterns = bits.view(np.float32)
    dense = rng.uniform(-110.0, 110.0, size=count // 4).astype(np.float32)
    sweep = []
    for edge in EDGES:
        for sign in (1.0, -1.0):
            start = np.float32(sign * edge)
            steps = np.arange(-300, 301, dtype=np.int64)
            if start == 0.0:
                steps = np.arange(0, 601, dtype=np.int64)
            base = np.array([start], dtype=np.float32).view(np.int32).astype(np.int64)
            neighbours = (base + steps * (1 if start >= 0 else 1)).clip(-2**31, 2**31 - 1)
            sweep.append(neighbours.astype(np.int32).view(np.float32))
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, F32.max, -F32.max, F32.tiny,
                        -F32.tiny, F32.smallest_subnormal, -F32.smallest_subnormal],
                       dtype=np.float32)
    out = np.concatenate([patterns, dense, *sweep, special]).astype(np.float32)
    return out[~np.isnan(out) | (np.arange(out.size) >= out.size - special.size)]


def ulp_errors(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Each float32 result's error in ulp against the float64 value `exact` (0 where both are
    NaN or the same infinity; inf where one is NaN and the other is not)."""
    got64 = np.asarray(got, dtype=np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    errors = np.zeros(got64.shape)
    nan_got, nan_exact = np.isnan(got64), np.isnan(exact)
    errors[nan_got != nan_exact] = np.inf
    both = ~nan_got & ~nan_exact
    g = np.clip(np.where(np.isinf(got64), np.sign(got64) * _INFINITY_AT, got64),
                -_INFINITY_AT, _INFINITY_AT)
    e = np.clip(exact, -_INFINITY_AT, _INFINITY_AT)
    # the float32 spacing at |exact|: 2^(exponent - 23), never below the subnormals' 2^-149
    magnitude = np.maximum(np.abs(e[both]), F32.tiny)
    exponent = np.floor(np.log2(magnitude))
    spacing = np.exp2(np.minimum(exponent, 127.0) - 23.0)
    errors[both] = np.abs(g[both] - e[both]) / spacing
    return errors


def erf64(x: np.ndarray) -> np.ndarray:
    """erf in float64 (numpy has none): math.erf element by element."""
    return np.fromiter((math.erf(v) for v in np.asarray(x, dtype=np.float64)), np.float64,
                       count=np.size(x))
