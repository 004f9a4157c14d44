"""Statements that sum into one array cell: `c += e`, `c -= e`, `c = c + e`, `c = e + c`;
and those that take an extremum into it: `c = fmaxf(c, e)`, `c = e > c ? e : c`, ...

Facts the scheduler (which order keeps such sums in an innermost loop) and the C code
generator (which holds them in a register) both read.
"""

from __future__ import annotations

from polydl.ir import Binary, Call, Expr, Load, Select, Statement, expr_loads
from polydl.poly.model import PolyModel, StatementModel


def addend_of(s: Statement) -> tuple[Expr, str] | None:
    """`(e, sign)` for `c += e`, `c -= e`, `c = c + e` and `c = e + c`."""
    if s.op in ("+=", "-="):
        addend, sign = s.value, s.op[0]
    elif s.op == "=" and isinstance(s.value, Binary) and s.value.op == "+":
        if s.value.left == Load(s.target):
            addend, sign = s.value.right, "+"
        elif s.value.right == Load(s.target):
            addend, sign = s.value.left, "+"
        else:
            return None
    else:
        return None
    return addend, sign


# The float32 math functions a reduction into a cell may take the extremum by.
EXTREMA = {"fmaxf": "max", "fminf": "min"}


def extremum_of(s: Statement) -> tuple[Expr, str] | None:
    """`(e, "max")` for `c = fmaxf(c, e)`, `c = fmaxf(e, c)`, `c = e > c ? e : c` or
    `c = c < e ? e : c` (each keeps c where e is NaN); `(e, "min")` for their minima."""
    cell = Load(s.target)
    if s.op != "=":
        return None
    value = s.value
    if isinstance(value, Call) and value.function in EXTREMA:
        left, right = value.args
        if left == cell:
            return right, EXTREMA[value.function]
        if right == cell:
            return left, EXTREMA[value.function]
        return None
    if not isinstance(value, Select) or value.if_false != cell or value.if_true == cell:
        return None
    e = value.if_true
    greater = value.op in (">", ">=")
    if not greater and value.op not in ("<", "<="):
        return None
    if (value.left, value.right) == (e, cell):  # e > c ? e : c
        return e, "max" if greater else "min"
    if (value.left, value.right) == (cell, e):  # c < e ? e : c
        return e, "min" if greater else "max"
    return None


def reads_own_cell(s: StatementModel, addend: Expr) -> bool:
    """Whether some instance's addend reads the cell the instance accumulates into (a read
    of another cell of the array, such as `x[j]` beside `x[i] -= L[i][j] * x[j]` with
    j < i, is fine: the loop writes only its one cell)."""
    write = s.write.relation
    for access in s.accesses:
        if access.is_write or access.access.array != s.statement.target.array:
            continue
        if access.access in expr_loads(addend) and not access.relation.intersect(write).is_empty():
            return True
    return False


def reduction_statements(model: PolyModel) -> frozenset[str]:
    """The statements of `model` that sum or take an extremum into one cell (`addend_of`,
    `extremum_of`): along a loop they run in registers."""
    return frozenset(s.name for s in model.statements
                     if addend_of(s.statement) is not None or extremum_of(s.statement) is not None)
