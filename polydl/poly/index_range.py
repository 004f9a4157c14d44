"""Refuse sizes whose index arithmetic would overflow the 64-bit integers of generated code.

Takes a loop nest, its bound sizes and the statements' isl domains; raises a positioned
`SpecError` when an array's byte size, a loop variable's range, or any intermediate value of
a subscript or loop bound could leave `INDEX_LIMIT`. Generated C computes indices, tile
bounds and linearised offsets in `long`, and the numpy reference in int64.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.errors import SourcePosition
from polydl.ir import (
    Indirect,
    IntBinary,
    IntConst,
    IntExpr,
    IntMinMax,
    IntNeg,
    IntVar,
    Loop,
    LoopNest,
    Statement,
    eval_int,
)
from polydl.names import respell

# 2**62: a margin below 2**63 for what codegen adds on top of checked values (one tile step,
# `upper + 1`, a linearised offset that stays below the array's element count).
INDEX_LIMIT = 2**62
ELEMENT_BYTES = {name: d.bytes for name, d in DTYPES.items()}
Interval = tuple[int, int]


def check_array_sizes(nest: LoopNest, params: Mapping[str, int]) -> None:
    for array in nest.arrays:
        count = 1
        for extent in array.shape:
            count *= eval_int(extent, dict(params))
        size = count * ELEMENT_BYTES.get(array.dtype, 8)
        if size > INDEX_LIMIT:
            raise nest.error_at(
                respell(f"array '{array.name}' would hold {count} elements ({size} bytes): its "
                        "offsets overflow 64-bit index arithmetic; use smaller sizes"),
                array.position
            )


def check_index_ranges(
    nest: LoopNest,
    params: Mapping[str, int],
    statements: Iterable[tuple[Statement, tuple[Loop, ...], isl.Set]],
) -> None:
    """Every loop variable's range, and every value met while evaluating a loop bound or a
    subscript over it, fits in `INDEX_LIMIT`."""
    for stmt, loops, domain in statements:
        if domain.is_empty():
            continue
        env: dict[str, Interval] = {k: (v, v) for k, v in params.items()}
        for d, loop in enumerate(loops):
            for expr in (loop.lower, loop.upper):
                _check(expr, env, nest, loop.position, f"a bound of loop '{loop.var}'")
            env[loop.var] = (
                domain.dim_min_val(d).to_python(), domain.dim_max_val(d).to_python()
            )
        for access in (stmt.target, *stmt.reads):
            for index in access.indices:
                # a subscript read from an index array is checked against its extent when the
                # kernel runs (its own subscripts are among the reads); its constant is not
                _check(
                    IntConst(index.offset) if isinstance(index, Indirect) else index, env, nest,
                    access.position or stmt.position, f"a subscript of '{access.array}'",
                )


def _check(
    expr: IntExpr, env: dict[str, Interval], nest: LoopNest, position: SourcePosition | None,
    what: str,
) -> None:
    low, high, widest = _interval(expr, env)
    if widest > INDEX_LIMIT:
        raise nest.error_at(
            respell(f"{what}, {expr.to_c()}, reaches {widest} in magnitude at these sizes: it "
                    "overflows 64-bit index arithmetic; use smaller sizes"),
            position
        )


def _interval(expr: IntExpr, env: dict[str, Interval]) -> tuple[int, int, int]:
    """(lowest, highest) value of `expr`, and the largest magnitude of any subexpression."""
    if isinstance(expr, IntConst):
        return expr.value, expr.value, abs(expr.value)
    if isinstance(expr, IntVar):
        low, high = env.get(expr.name, (0, 0))
        return low, high, max(abs(low), abs(high))
    if isinstance(expr, IntNeg):
        low, high, widest = _interval(expr.operand, env)
        return -high, -low, widest
    if isinstance(expr, IntMinMax):
        parts = [_interval(a, env) for a in expr.args]
        pick = min if expr.op == "min" else max
        low, high = pick(p[0] for p in parts), pick(p[1] for p in parts)
        return low, high, max(p[2] for p in parts)
    assert isinstance(expr, IntBinary)
    a_low, a_high, a_wide = _interval(expr.left, env)
    b_low, b_high, b_wide = _interval(expr.right, env)
    if expr.op == "+":
        low, high = a_low + b_low, a_high + b_high
    elif expr.op == "-":
        low, high = a_low - b_high, a_high - b_low
    elif expr.op == "*":
        products = [a_low * b_low, a_low * b_high, a_high * b_low, a_high * b_high]
        low, high = min(products), max(products)
    elif expr.op == "/" and b_low > 0:
        low, high = a_low // b_high, a_high // b_low
    elif expr.op == "%" and b_low > 0:
        low, high = 0, b_high - 1
    else:  # not produced by the frontends; stay conservative
        widest = max(a_wide, b_wide, abs(a_low), abs(a_high))
        return -widest, widest, widest
    return low, high, max(a_wide, b_wide, abs(low), abs(high))
