"""Sizes to verify a kernel at: the user's, or smaller ones where the numpy reference would
take minutes at the user's.

The reference runs every loop it cannot batch as Python iterations (a Floyd-Warshall or a
Gauss-Seidel carries a dependence through every loop). Where that is more than
`STEP_BUDGET` numpy operations, the sizes are halved (all of them, together) until it is not;
the kernel built for those sizes, from the same nest by the same compiler, is what gets
checked, and the caller says so.
"""

from __future__ import annotations

from collections.abc import Mapping

from polydl.errors import PolyDLError
from polydl.ir import LoopNest
from polydl.poly.model import build_model
from polydl.poly.reference import python_steps

STEP_BUDGET = 200_000  # about ten seconds of the reference's Python loop


def verification_sizes(nest: LoopNest, params: Mapping[str, int]) -> dict[str, int]:
    """`params` where the reference is fast enough, else the largest halving of them that is
    (or the smallest valid one tried)."""
    sizes = dict(params)
    if python_steps(build_model(nest, sizes)) <= STEP_BUDGET:
        return sizes
    while any(v > 1 for v in sizes.values()):
        smaller = {k: max(1, v // 2) for k, v in sizes.items()}
        try:
            steps = python_steps(build_model(nest, smaller))
        except PolyDLError:
            return sizes  # the nest needs larger sizes: the last valid ones
        sizes = smaller
        if steps <= STEP_BUDGET:
            break
    return sizes
