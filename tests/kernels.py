"""One helper for every end-to-end test: compile, run, compare with the reference and numpy."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

import polydl
from polydl.runtime.inputs import random_inputs
from polydl.runtime.verify import compare


def with_bf16(nest, names):  # type: ignore[no-untyped-def]
    """The nest with the arrays `names` retyped to bfloat16."""
    from dataclasses import replace

    return replace(nest, arrays=tuple(replace(a, dtype="bfloat16") if a.name in names else a
                                      for a in nest.arrays))


def run_and_check(
    kernel: polydl.runtime.c.kernel.Kernel,  # type: ignore[name-defined]
    expected: Callable[..., object] | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, ...]:
    """Run `kernel` on random inputs; its outputs must match `kernel.reference` and, when given,
    an independent numpy formula `expected(*inputs)` (an array or a tuple of arrays)."""
    inputs = random_inputs(kernel.arguments, seed=seed)
    got = kernel(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    ref = kernel.reference(*inputs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    outputs = [a for a in kernel.arguments if not a.is_input]
    for arg, g, r in zip(outputs, got, ref, strict=True):
        ok, err = compare(g, r, arg.dtype)
        assert ok, f"{arg.name}: kernel differs from reference, relative error {err:.3e}"
    if expected is not None:
        want = expected(*inputs)
        want = want if isinstance(want, tuple) else (want,)
        for arg, g, w in zip(outputs, got, want, strict=True):
            ok, err = compare(g, np.asarray(w), arg.dtype)
            assert ok, f"{arg.name}: kernel differs from numpy, relative error {err:.3e}"
    return tuple(got)


def compile_c(text: str, params: Mapping[str, int], **kw: object) -> polydl.runtime.c.kernel.Kernel:  # type: ignore[name-defined]
    return polydl.compile(text, params, **kw)  # type: ignore[arg-type]


# Two outputs from one input: the calling convention's tuple return.
TWO_OUTPUTS = """
void split(int N, float lo[N], float hi[N], const float x[N]) {
  for (int i = 0; i < N; i++) {
    lo[i] = fminf(x[i], 0.0f);
    hi[i] = fmaxf(x[i], 0.0f);
  }
}
"""


# Specs the GPU tests share: a dependence along both loops, and a per-thread reduction.
WAVEFRONT = """
void wave(int N, float A[N][N]) {
  for (int i = 1; i < N; i++)
    for (int j = 1; j < N; j++)
      A[i][j] = A[i - 1][j] + A[i][j - 1];
}
"""

ROWSUM = """
void rowsum(int N, int M, float s[N], const float A[N][M]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++)
      s[i] += A[i][j] * A[i][j];
}
"""
