"""Integer division in subscripts, bounds and conditions: polydl's meaning is C's, or refused.

Index expressions divide by positive constants with floor semantics (what isl models), while C
rounds a quotient toward zero: the two agree wherever the value divided is >= 0. Takes a
statement with its domain, its loops and the conditions of its guards; raises a `SpecError` at
the construct where a division's dividend can be negative on an iteration that runs, naming that
iteration. A remainder compared with 0 (`x % 2 == 0`, a divisibility test, or `!=`, which the C
frontend splits into `< 0` and `> 0`) is exempt: its truth is the same under both roundings.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import islpy as isl

from polydl.errors import SourcePosition
from polydl.ir import (
    Condition,
    Indirect,
    IntBinary,
    IntConst,
    IntExpr,
    IntMinMax,
    IntNeg,
    Loop,
    LoopNest,
    Statement,
)
from polydl.names import respell


def _divisions(expr: IntExpr) -> Iterator[IntBinary]:
    if isinstance(expr, IntBinary):
        if expr.op in ("/", "%"):
            yield expr
        yield from _divisions(expr.left)
        yield from _divisions(expr.right)
    elif isinstance(expr, IntNeg):
        yield from _divisions(expr.operand)
    elif isinstance(expr, IntMinMax):
        for a in expr.args:
            yield from _divisions(a)


def _condition_divisions(cond: Condition) -> Iterator[IntBinary]:
    for side, other in ((cond.left, cond.right), (cond.right, cond.left)):
        if (isinstance(side, IntBinary) and side.op == "%" and isinstance(other, IntConst)
                and other.value == 0):
            yield from _divisions(side.left)  # the remainder itself is exempt
        else:
            yield from _divisions(side)


def check_index_division(
    nest: LoopNest, params: Mapping[str, int], statement: Statement, loops: tuple[Loop, ...],
    domain: isl.Set, conditions: tuple[Condition, ...],
) -> None:
    found: list[tuple[IntBinary, str, SourcePosition | None]] = []
    for access in (statement.target, *statement.reads):
        for index in access.indices:
            if isinstance(index, Indirect):  # no division; its index array's read is a read
                continue
            found += [(d, f"a subscript of '{access.array}'", access.position or
                       statement.position) for d in _divisions(index)]
    for loop in loops:
        for bound in (loop.lower, loop.upper):
            found += [(d, f"a bound of loop '{loop.var}'", loop.position)
                      for d in _divisions(bound)]
    for cond in conditions:
        found += [(d, "the condition of an if around this statement", statement.position)
                  for d in _condition_divisions(cond)]
    if not found or domain.is_empty():
        return
    iterators = [loop.var for loop in loops]
    for division, what, position in found:
        negative = domain.intersect(_set(statement.name, iterators, division.left, params))
        if negative.is_empty():
            continue
        point = negative.sample_point()
        at = ", ".join(
            f"{v}={point.get_coordinate_val(isl.dim_type.set, d).to_python()}"
            for d, v in enumerate(iterators)) or "the only iteration"
        raise nest.error_at(respell(
            f"'{division.op}' in {what} divides {division.left.to_c()}, which is negative at "
            f"iteration {at}: C rounds such a quotient toward zero, polydl's index arithmetic "
            "rounds down; write it so that the value divided stays >= 0"), position)


def _set(name: str, iterators: list[str], dividend: IntExpr, params: Mapping[str, int]) -> isl.Set:
    """The iterations where `dividend` < 0, over bound size parameters."""
    names = list(params)
    head = f"[{', '.join(names)}] -> " if names else ""
    out = isl.Set(f"{head}{{ {name}[{', '.join(iterators)}] : {dividend.to_isl()} < 0 }}")
    if names:
        values = " and ".join(f"{n} = {v}" for n, v in params.items())
        out = out.intersect_params(isl.Set(f"{head}{{ : {values} }}"))
        out = out.project_out(isl.dim_type.param, 0, len(names))
    return out
