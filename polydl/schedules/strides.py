"""Element strides of array accesses along loops, and the loop ranges a microkernel call covers.

Facts both the microkernel binding and the packed-operand plans read: how far an access moves
in its flat array per step of a loop variable (None where that is not constant), and the
bounds and tile of each loop a call spans.
"""

from __future__ import annotations

from dataclasses import dataclass

from polydl.ir import (
    Access,
    Indirect,
    IntBinary,
    IntConst,
    IntExpr,
    IntMinMax,
    IntNeg,
    IntVar,
    int_vars,
)
from polydl.poly.model import PolyModel


def linear_coefficient(expr: IntExpr | Indirect, var: str) -> int | None:
    """The constant coefficient of `var` in an affine expression, None if `var` sits under a
    division, modulo or min/max, or selects the index an `Indirect` subscript reads (then the
    stride is not constant)."""
    if isinstance(expr, Indirect):
        return None if var in int_vars(expr) else 0
    if isinstance(expr, IntConst):
        return 0
    if isinstance(expr, IntVar):
        return 1 if expr.name == var else 0
    if isinstance(expr, IntNeg):
        inner = linear_coefficient(expr.operand, var)
        return None if inner is None else -inner
    if isinstance(expr, IntMinMax):
        return None if any(linear_coefficient(a, var) != 0 for a in expr.args) else 0
    assert isinstance(expr, IntBinary)
    left = linear_coefficient(expr.left, var)
    right = linear_coefficient(expr.right, var)
    if left is None or right is None:
        return None
    if expr.op in ("/", "%"):
        return 0 if left == 0 and right == 0 else None
    if expr.op == "+":
        return left + right
    if expr.op == "-":
        return left - right
    # '*': the frontends guarantee one side is constant
    if left == 0 and right == 0:
        return 0
    const = _constant(expr.right) if left != 0 else _constant(expr.left)
    if const is None:
        return None
    return (left if left != 0 else right) * const


def _constant(expr: IntExpr) -> int | None:
    if isinstance(expr, IntConst):
        return expr.value
    if isinstance(expr, IntNeg):
        inner = _constant(expr.operand)
        return None if inner is None else -inner
    if isinstance(expr, IntBinary):
        a, b = _constant(expr.left), _constant(expr.right)
        if a is None or b is None:
            return None
        return {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else None, "%": a % b if b else None}[expr.op]
    return None


def element_stride(model: PolyModel, access: Access, var: str) -> int | None:
    """Elements advanced in the flat array per unit step of `var` (None if not constant).

    Two neighbouring subscripts `[e / Q][e % Q]` over a dimension of extent Q address the flat
    position `e` of both dimensions (Q * (e / Q) + e % Q = e, for the e >= 0 that the bounds
    proof leaves), so a loop that runs over both at once, the positions of a 7 x 7 image as one
    row of 49, has the constant stride of `e`."""
    shape = model.nest.array(access.array).concrete_shape(model.params)
    indices = access.indices
    stride, total = 1, 0
    d = len(shape) - 1
    while d >= 0:
        merged = _merged_position(indices[d - 1], indices[d], shape[d]) if d > 0 else None
        coeff = linear_coefficient(merged if merged is not None else indices[d], var)
        if coeff is None:
            return None
        total += coeff * stride
        stride *= shape[d] * (shape[d - 1] if merged is not None else 1)
        d -= 2 if merged is not None else 1
    return total


def _merged_position(outer: IntExpr | Indirect, inner: IntExpr | Indirect,
                     extent: int) -> IntExpr | None:
    """`e` where the subscripts are `[e / extent][e % extent]`, else None."""
    if not (isinstance(outer, IntBinary) and isinstance(inner, IntBinary)
            and outer.op == "/" and inner.op == "%" and outer.left == inner.left):
        return None
    divisors = (_constant(outer.right), _constant(inner.right))
    return outer.left if divisors == (extent, extent) else None


def streams(model: PolyModel, access: Access, var: str) -> bool:
    """Whether `access` moves by at most one element per step of `var` (a unit stride, or
    none: a value that stays in a register), as in a loop the compiler vectorises."""
    stride = element_stride(model, access, var)
    return stride is not None and abs(stride) <= 1



@dataclass(frozen=True)
class LoopRange:
    var: str
    lower: int
    extent: int
    tile: int | None  # tile size if the loop is tiled (then the call covers one tile)


def distinct_blocks(m: int, c_m: int, n: int, c_n: int, blocks: int, c_nb: int) -> bool:
    """Whether `blocks` blocks `c_nb` apart of an m x n tile of C (strides c_m, c_n) share no
    cell: each block's cells lie in a span shorter than the block stride, or (small shapes)
    every cell is checked. Blocks that share cells would sum into them within one call."""
    span = (m - 1) * abs(c_m) + (n - 1) * abs(c_n) + 1
    if abs(c_nb) >= span:
        return True
    cells = m * n * blocks
    if cells > 1 << 16:
        return False
    return len({b * c_nb + i * c_m + j * c_n for b in range(blocks)
                for i in range(m) for j in range(n)}) == cells
