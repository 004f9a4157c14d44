"""C value expressions -> IR value expressions (`Expr`), typed as C types them.

Takes pycparser expression nodes, the names in scope and the index reader; returns IR values
or raises a `SpecError` at the offending node. As in C, an operation whose operands are all
integers (loop variables, sizes, integer constants, elements of integer arrays) is computed in
integers: affine ones of loop variables and sizes become an `IndexValue`, the others `IntOp`
(`/` rounding toward zero, `%` with the dividend's sign). Where an integer meets a floating-point
operand, a math function or a floating-point destination it is converted (`ToFloat`); casts to
an integer type are `ToInt`. Everything else is computed in floating point.
"""

from __future__ import annotations

import math

from pycparser import c_ast

from polydl.dtypes import DTYPES
from polydl.frontends.c_expressions import (
    COMPARISONS,
    FLOAT_MAX,
    INT_LIMIT,
    MAX_DEPTH,
    ExpressionReader,
    Scope,
    element_dtype,
    float_literal,
    is_int_constant,
    pointer_refusal,
    unassigned_read,
)
from polydl.frontends.c_header_names import FUNCTIONS, math_functions_listed
from polydl.ir import (
    MATH_FUNCTIONS,
    Access,
    Binary,
    Call,
    Const,
    Expr,
    IndexValue,
    IntBinary,
    IntConst,
    IntExpr,
    IntNeg,
    IntOp,
    Load,
    Select,
    ToFloat,
    ToInt,
    Unary,
    is_integer_value,
)

_CAST_HINT = ("casts are allowed to float, double and the integer element types (char, short, "
              "int, long, signed or unsigned char and short)")


def _c_quotient(a: int, b: int) -> tuple[int, int]:
    """C's `a / b` and `a % b` (toward zero), as `IntOp` defines them at 0 and -1."""
    if b == 0:
        return 0, 0
    quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    return quotient, a - b * quotient


class ValueReader:
    def __init__(self, scope: Scope, indices: ExpressionReader) -> None:
        self.scope = scope
        self.indices = indices

    # ------------------------------------------------------------------ types

    @property
    def integer_arrays(self) -> set[str]:
        return {n for n, a in self.scope.arrays.items() if DTYPES[a.dtype].is_integer} | (
            self.scope.integer_locals)

    def is_integer(self, expr: Expr) -> bool:
        return is_integer_value(expr, self.integer_arrays)

    def as_float(self, expr: Expr) -> Expr:
        """`expr` where floating-point arithmetic uses it: integers converted."""
        if not self.is_integer(expr):
            return expr
        if isinstance(expr, IndexValue):
            if isinstance(expr.expr, IntConst):
                return Const(float(expr.expr.value))
            return expr  # converted where used, as it always was
        if isinstance(expr, Select):  # converting the chosen value is choosing converted ones
            return Select(expr.op, expr.left, expr.right, self.as_float(expr.if_true),
                          self.as_float(expr.if_false))
        return ToFloat(expr)

    def select(self, op: str, left: Expr, right: Expr, yes: Expr, no: Expr) -> Select:
        """`left op right ? yes : no` with C's conversions: a comparison of integers stays in
        integers (of loop variables and sizes alone it was always made in floating point, which
        is exact for them), a choice between integers is an integer."""
        if not (self.is_integer(left) and self.is_integer(right)) or (
                isinstance(left, IndexValue) and isinstance(right, IndexValue)):
            left, right = self.as_float(left), self.as_float(right)
        if not (self.is_integer(yes) and self.is_integer(no)):
            yes, no = self.as_float(yes), self.as_float(no)
        return Select(op, left, right, yes, no)

    def assignment(self, target: Access, op: str, value: Expr) -> tuple[str, Expr]:
        """The op and value of `target op value`. Into an integer array, C computes `t op= v`
        as `t = t op v` in the operands' type and converts the result on the store: so written,
        it is never taken for an accumulation (a microkernel's, or one reordered)."""
        if target.array not in self.integer_arrays:
            return op, self.as_float(value)
        if op == "=":
            return op, value
        current = Load(target)
        if self.is_integer(value):
            return "=", IntOp(op[0], current, value)
        return "=", Binary(op[0], ToFloat(current), self.as_float(value))

    # ------------------------------------------------------------------ expressions

    def value(self, node: c_ast.Node) -> Expr:
        """A value in floating point (integers converted)."""
        return self.as_float(self._typed(node, 0))

    def typed(self, node: c_ast.Node) -> Expr:
        """A value of the type C gives it (integer or floating point)."""
        return self._typed(node, 0)

    def _typed(self, node: c_ast.Node, depth: int) -> Expr:
        if depth > MAX_DEPTH:
            raise self.scope.error(
                f"expression nested too deeply (more than {MAX_DEPTH} levels)", node
            )
        depth += 1
        error = self.scope.error
        if isinstance(node, c_ast.Constant):
            return self._constant(node)
        if isinstance(node, c_ast.ID):
            return self._name(node)
        if isinstance(node, c_ast.ArrayRef):
            return Load(self.indices.access(node, write=False))
        if isinstance(node, c_ast.BinaryOp):
            return self._binary(node, depth)
        if isinstance(node, c_ast.UnaryOp):
            if node.op == "+":
                return self._typed(node.expr, depth)
            if node.op == "-":
                return self._negation(self._typed(node.expr, depth))
            if node.op in ("++", "--", "p++", "p--"):
                raise error("increments are only allowed in the header of a for loop", node)
            pointer = pointer_refusal(node.op)
            if pointer is not None:
                raise error(pointer, node)
            raise error(f"unary operator '{node.op}' is not allowed on values; values use "
                        "+ - * / %, ?: and math functions", node)
        if isinstance(node, c_ast.Cast):
            return self._cast(node, depth)
        if isinstance(node, c_ast.FuncCall):
            return self._call(node, depth)
        if isinstance(node, c_ast.TernaryOp):
            cond = node.cond
            if not (isinstance(cond, c_ast.BinaryOp) and cond.op in COMPARISONS):
                raise error(
                    "the condition of ?: must compare two values (a < b, a == b, ...); "
                    "&&, || and other conditions are not allowed",
                    cond,
                )
            return self.select(cond.op, self._typed(cond.left, depth),
                               self._typed(cond.right, depth), self._typed(node.iftrue, depth),
                               self._typed(node.iffalse, depth))
        if isinstance(node, c_ast.Assignment):
            raise error("an assignment cannot be used as a value", node)
        if isinstance(node, c_ast.ExprList):
            raise error("the comma operator is not allowed", node)
        raise error(
            "this expression is not allowed; values are numbers, array elements, loop "
            "variables, + - * / %, ?: and math functions",
            node,
        )

    def _constant(self, node: c_ast.Constant) -> Expr:
        error = self.scope.error
        if is_int_constant(node):
            index = self.indices.index(node, "an integer value")
            return IndexValue(index)
        if node.type in ("char", "string"):
            raise error(f"{node.type} constants are not allowed; use numbers", node)
        value = float_literal(node.value)
        if value is None or not math.isfinite(value):
            raise error(f"floating-point constant {node.value} is not a finite number", node)
        if node.value.lower().endswith("f") and abs(value) > FLOAT_MAX:
            # C rounds it to infinity; the float64 reference would not
            raise error(
                f"floating-point constant {node.value} is beyond the range of float "
                f"(largest {FLOAT_MAX:.7g}); drop the 'f' suffix for a double constant",
                node,
            )
        return Const(value)

    def _name(self, node: c_ast.ID) -> Expr:
        kind = self.scope.kind(node.name)
        if kind is None:
            raise self.scope.undeclared(node.name, node)
        if kind in ("loop variable", "size parameter"):
            return IndexValue(self.indices.index(node, "an integer value"))
        if kind == "local variable":
            if node.name in self.scope.unassigned:
                raise self.scope.error(unassigned_read(node.name), node)
            return Load(self.scope.local_scalars[node.name])
        if kind == "array":
            rank = len(self.scope.arrays[node.name].shape)
            if rank == 0:  # a scalar parameter
                return Load(Access(node.name, ()))
            raise self.scope.error(
                f"array '{node.name}' must be used with {rank} subscript(s)", node
            )
        raise self.scope.error(f"the {kind} '{node.name}' cannot be used as a value", node)

    def _binary(self, node: c_ast.BinaryOp, depth: int) -> Expr:
        error = self.scope.error
        if node.op in COMPARISONS:
            raise error(
                f"a comparison is only allowed as the condition of ?: (a {node.op} b ? x : y)",
                node,
            )
        if node.op not in ("+", "-", "*", "/", "%"):
            raise error(f"operator '{node.op}' is not allowed; use + - * / on values", node)
        left, right = self._typed(node.left, depth), self._typed(node.right, depth)
        if not (self.is_integer(left) and self.is_integer(right)):
            if node.op == "%":
                raise error(
                    "'%' needs integer operands (loop variables, size parameters, integers, "
                    "elements of integer arrays)",
                    node,
                )
            return Binary(node.op, self.as_float(left), self.as_float(right))
        if isinstance(left, IndexValue) and isinstance(right, IndexValue):
            folded = _affine(node.op, left.expr, right.expr)
            if isinstance(folded, IntConst) and abs(folded.value) > INT_LIMIT:
                raise error(f"the constant {folded.value} is out of range", node)
            if folded is not None:
                return IndexValue(folded)
        return IntOp(node.op, left, right)

    def _negation(self, operand: Expr) -> Expr:
        if isinstance(operand, IndexValue):
            inner = operand.expr
            return IndexValue(IntConst(-inner.value) if isinstance(inner, IntConst)
                              else IntNeg(inner))
        if self.is_integer(operand):
            return IntOp("-", IndexValue(IntConst(0)), operand)
        if isinstance(operand, Const):
            return Const(-operand.value)
        return Unary("-", operand)

    def _cast(self, node: c_ast.Cast, depth: int) -> Expr:
        decl = node.to_type.type
        words = (decl.type.names if isinstance(decl, c_ast.TypeDecl)
                 and isinstance(decl.type, c_ast.IdentifierType) else None)
        dtype = element_dtype(words) if words else None
        if dtype is None or dtype == "bfloat16":
            raise self.scope.error(f"this cast is not allowed; {_CAST_HINT}", node)
        operand = self._typed(node.expr, depth)
        if not DTYPES[dtype].is_integer:
            converted = self.as_float(operand)
            # an index value left as it is would still be an integer to the arithmetic around
            # it: `(float)k / D` divides in floating point
            return ToFloat(converted) if isinstance(converted, IndexValue) else converted
        if self.is_integer(operand) and (dtype == "int64" or (
                dtype == "int32" and isinstance(operand, IndexValue))):
            return operand  # nothing to convert: loop variables and sizes are C ints
        return ToInt(dtype, operand)

    def _call(self, node: c_ast.FuncCall, depth: int) -> Expr:
        error = self.scope.error
        if not isinstance(node.name, c_ast.ID):
            raise error("only math functions can be called, by name", node)
        name = node.name.name
        if name in MATH_FUNCTIONS:
            function = name
        elif name + "f" in MATH_FUNCTIONS:
            function = name + "f"
        elif name in ("min", "max"):
            raise error(
                f"{name}() is only allowed in loop bounds; for values use f{name}f()", node
            )
        elif name in FUNCTIONS:
            raise error(
                f"function '{name}' of the C library is not one polydl compiles: its <math.h> "
                f"is polydl's own stand-in, not the C library's, and declares only "
                f"{math_functions_listed()}",
                node,
            )
        else:
            raise error(
                f"function '{name}' is neither defined in this file (as a helper) nor a math "
                f"function polydl compiles: {math_functions_listed()}",
                node,
            )
        args = node.args.exprs if node.args is not None else []
        arity = MATH_FUNCTIONS[function]
        if len(args) != arity:
            raise error(f"{name}() takes {arity} argument(s), not {len(args)}", node)
        return Call(function, tuple(self.as_float(self._typed(a, depth)) for a in args))


def _affine(op: str, left: IntExpr, right: IntExpr) -> IntExpr | None:
    """`left op right` of two index expressions as one, where it stays affine and means what C
    means: sums, differences, products with a constant, and division of constants."""
    if isinstance(left, IntConst) and isinstance(right, IntConst):
        a, b = left.value, right.value
        if op in ("/", "%"):
            quotient, remainder = _c_quotient(a, b)
            return IntConst(quotient if op == "/" else remainder)
        return IntConst(a + b if op == "+" else a - b if op == "-" else a * b)
    if op in ("+", "-"):
        return IntBinary(op, left, right)
    if op == "*" and (isinstance(left, IntConst) or isinstance(right, IntConst)):
        return IntBinary(op, left, right)
    return None
