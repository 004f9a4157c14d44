"""C expressions -> IR index expressions (`IntExpr`) and array accesses.

Takes pycparser expression nodes and the names in scope (`Scope`); returns IR values or raises
a `SpecError` at the offending node saying what is allowed instead. Index expressions are affine
in loop variables and size parameters (constant multiples, floor `/` and `%` by positive
constants); a subscript may instead be an element of an int or long array, alone or plus or
minus a constant (`ir.Indirect`). Value expressions are read by `c_values`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pycparser import c_ast

from polydl.dtypes import C_SPELLINGS
from polydl.errors import SourcePosition, SpecError
from polydl.frontends.c_header_names import undeclared_hint
from polydl.frontends.c_source_map import SourceMap
from polydl.ir import (
    Access,
    Array,
    Index,
    Indirect,
    IntBinary,
    IntConst,
    IntExpr,
    IntMinMax,
    IntNeg,
    IntVar,
    eval_int,
    int_vars,
)

# Deepest expression or statement nesting accepted: keeps every recursive pass (here and in
# the later stages) far from Python's recursion limit on hostile input.
MAX_DEPTH = 100

INT_LIMIT = 2**63 - 1
FLOAT_MAX = 3.4028234663852886e38  # FLT_MAX
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
# Prefix operators whose errors point at the operator itself: pycparser places every prefix
# operator at its operand, and the errors of the others have always pointed there.
_POINTER_OPERATORS = ("*", "&")
_AFFINE_HINT = "only affine expressions of loop variables and size parameters are allowed"


class Unusable(Exception):
    """A construct that uses a name whose declaration failed: skipped without an error, as
    the declaration's error already says what is wrong."""


class Conversion(c_ast.Cast):
    """A conversion C makes without a cast being written: a helper function's argument to its
    parameter's type, its result to its return type (`c_inline`). Read as a cast; in index
    expressions one to int or long is the value itself (loop variables and sizes are ints)."""

    __slots__ = ()


def c_type_name(words: list[str]) -> str:
    """The canonical spelling of an arithmetic type's words (`short int` is `short`, `char
    unsigned` is `unsigned char`, `signed int` is `int`), as the dtype table spells types."""
    sign = [w for w in words if w in ("signed", "unsigned")]
    rest = sorted(w for w in words if w not in ("signed", "unsigned"))
    if "int" in rest and len(rest) > 1 and set(rest) <= {"int", "short", "long"}:
        rest.remove("int")
    base = " ".join(rest) or "int"
    if not sign:
        return base
    if sign == ["signed"] and base in ("short", "int", "long", "long long"):
        return base
    return " ".join([*sign, base])


def element_dtype(words: list[str]) -> str | None:
    """The dtype of a C element type's words, or None."""
    return C_SPELLINGS.get(c_type_name(words))


def type_words(node: c_ast.Node | None) -> list[str] | None:
    """The words of a plain arithmetic type (a `TypeDecl` of an `IdentifierType`), or None."""
    if isinstance(node, c_ast.Typename):
        node = node.type
    if isinstance(node, c_ast.TypeDecl) and isinstance(node.type, c_ast.IdentifierType):
        return list(node.type.names)
    return None


def pointer_refusal(op: str) -> str | None:
    """The message for unary `*` or `&`, which are about pointers, not arithmetic."""
    if op == "*":
        return ("unary '*' dereferences a pointer, and pointers are not allowed; values are "
                "numbers, array elements (A[i]) and their arithmetic")
    if op == "&":
        return ("unary '&' takes an address, and pointers are not allowed; values are "
                "numbers, array elements (A[i]) and their arithmetic")
    return None


@dataclass
class Scope:
    """The names a spec declares, and where errors point."""

    filename: str
    text: str
    function: str = ""
    # positions of the parsed text -> the user's files (the identity without preprocessing)
    source_map: SourceMap | None = None
    sizes: dict[str, SourcePosition] = field(default_factory=dict)
    arrays: dict[str, Array] = field(default_factory=dict)
    loops: list[str] = field(default_factory=list)
    declared_later: set[str] = field(default_factory=set)
    loop_names: set[str] = field(default_factory=set)  # `int i, j;` declared for later loops
    # local scalars in scope: name -> the access of its expanded array (one cell per iteration
    # of the loops around its declaration)
    local_scalars: dict[str, Access] = field(default_factory=dict)
    # the expanded arrays of integer local scalars (`int arg = 0;`): integers to arithmetic
    integer_locals: set[str] = field(default_factory=set)
    # local scalars declared without a value and not yet assigned on every path to here
    unassigned: set[str] = field(default_factory=set)
    broken: set[str] = field(default_factory=set)  # names whose declaration was refused

    def __post_init__(self) -> None:
        if self.source_map is None:
            self.source_map = SourceMap.identity(self.filename, self.text)

    def position(self, node: c_ast.Node | None) -> SourcePosition | None:
        """Where `node` starts; a node pycparser left without one takes its first child's.

        A cast or compound literal starts at its opening parenthesis, found from its type name
        in the text: pycparser versions disagree on where such a node's own position is."""
        if isinstance(node, c_ast.Cast | c_ast.CompoundLiteral):
            inner = self.position(node.to_type if isinstance(node, c_ast.Cast) else node.type)
            if inner is not None:
                return self._opening_paren(inner)
        if isinstance(node, c_ast.UnaryOp) and node.op in _POINTER_OPERATORS and node.coord:
            assert self.source_map is not None
            return self._operator(self.source_map.position(node.coord.line,
                                                           node.coord.column or 1), node.op)
        pending = [node] if node is not None else []
        for _ in range(64):
            if not pending:
                break
            current = pending.pop(0)
            coord = getattr(current, "coord", None)
            if coord is not None and coord.line:
                assert self.source_map is not None
                return self.source_map.position(coord.line, coord.column or 1)
            pending.extend(child for _, child in current.children())
        return None

    def _operator(self, operand: SourcePosition, op: str) -> SourcePosition:
        """Where the prefix operator `op` stands before its operand (parentheses between)."""
        assert self.source_map is not None
        line = self.source_map.source_line(operand)
        if line is None:
            return operand
        before = line[: operand.column - 1].rstrip(" \t(")
        if before.endswith(op):
            return SourcePosition(operand.file, operand.line, len(before) - len(op) + 1)
        return operand

    def _opening_paren(self, inner: SourcePosition) -> SourcePosition:
        assert self.source_map is not None
        line = self.source_map.source_line(inner)
        if line is None:
            return inner
        before = line[: inner.column - 1].rstrip()
        if before.endswith("("):
            return SourcePosition(inner.file, inner.line, len(before))
        return inner

    def error(self, message: str, node: c_ast.Node | None) -> SpecError:
        position = self.position(node)
        if position is None:
            return SpecError(message, self.filename)
        assert self.source_map is not None
        return self.source_map.error(message, position)

    def kind(self, name: str) -> str | None:
        if name in self.loops:
            return "loop variable"
        if name in self.loop_names:
            return "declared loop variable"
        if name in self.local_scalars:
            return "local variable"
        if name in self.sizes:
            return "size parameter"
        if name in self.arrays:
            return "array"
        if name == self.function:
            return "function"
        return None

    def undeclared(self, name: str, node: c_ast.Node) -> SpecError | Unusable:
        if name in self.broken:
            return Unusable(name)
        if name in self.declared_later:
            return self.error(
                f"'{name}' is used before its declaration; declare size parameters before "
                "the arrays whose extents use them",
                node,
            )
        assert self.source_map is not None
        hint = undeclared_hint(name, self.source_map.texts)
        if hint is not None:
            return self.error(f"undeclared identifier '{name}': {hint}", node)
        return self.error(
            f"undeclared identifier '{name}' (names are size parameters, arrays and the "
            "variables of enclosing for loops)",
            node,
        )


def unassigned_read(name: str) -> str:
    """The message for a read of a local that some path reaches without assigning it."""
    return (f"'{name}' is read before it is assigned; assign it on every path before this read "
            f"(or declare it with a value: float {name} = ...;)")


def int_literal(text: str) -> int | None:
    digits = text.rstrip("uUlL")
    try:
        if digits[:2].lower() == "0x":
            return int(digits, 16)
        if digits[:2].lower() == "0b":
            return int(digits[2:], 2)
        if len(digits) > 1 and digits.startswith("0"):
            return int(digits, 8)
        return int(digits)
    except ValueError:
        return None


def float_literal(text: str) -> float | None:
    # a floating constant's exponent is decimal, so a trailing f/F is always the suffix
    digits = text.rstrip("lL")
    digits = digits[:-1] if digits[-1:] in ("f", "F") else digits
    try:
        return float.fromhex(digits) if digits[:2].lower() == "0x" else float(digits)
    except ValueError:
        return None


def is_int_constant(node: c_ast.Node) -> bool:
    return isinstance(node, c_ast.Constant) and node.type.endswith("int")


def constant_value(expr: IntExpr) -> int | None:
    """The value of an index expression without variables, else None."""
    return eval_int(expr, {}) if not int_vars(expr) else None


def _fold(op: str, left: IntExpr, right: IntExpr) -> IntExpr:
    if isinstance(left, IntConst) and isinstance(right, IntConst):
        return IntConst(eval_int(IntBinary(op, left, right), {}))
    return IntBinary(op, left, right)


def plus_one(expr: IntExpr) -> IntExpr:
    """`expr + 1`, pushed into min/max arguments so bounds stay readable."""
    if isinstance(expr, IntMinMax):
        return IntMinMax(expr.op, tuple(plus_one(a) for a in expr.args))
    if isinstance(expr, IntConst):
        return IntConst(expr.value + 1)
    return IntBinary("+", expr, IntConst(1))


class ExpressionReader:
    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def _deeper(self, node: c_ast.Node, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise self.scope.error(
                f"expression nested too deeply (more than {MAX_DEPTH} levels)", node
            )
        return depth + 1

    # ------------------------------------------------------------------ index expressions

    def index(self, node: c_ast.Node, what: str, *, min_max: bool = False) -> IntExpr:
        """An affine index expression; `what` names the context in messages ("subscript")."""
        return self._index(node, what, min_max, 0)

    def _index(self, node: c_ast.Node, what: str, min_max: bool, depth: int) -> IntExpr:
        depth = self._deeper(node, depth)
        error = self.scope.error
        if isinstance(node, c_ast.Constant):
            if not is_int_constant(node):
                raise error(
                    f"{what} must be an integer expression, not the {node.type} constant "
                    f"{node.value}",
                    node,
                )
            value = int_literal(node.value)
            if value is None or value > INT_LIMIT:
                raise error(f"integer constant {node.value} is out of range", node)
            return IntConst(value)
        if isinstance(node, c_ast.ID):
            kind = self.scope.kind(node.name)
            if kind in ("loop variable", "size parameter"):
                return IntVar(node.name)
            if kind is None:
                raise self.scope.undeclared(node.name, node)
            raise error(f"the {kind} '{node.name}' cannot be used in {what}; {_AFFINE_HINT}", node)
        if isinstance(node, c_ast.BinaryOp):
            expr = self._index_binary(node, what, min_max, depth)
            if isinstance(expr, IntConst) and abs(expr.value) > INT_LIMIT:
                raise error(f"the constant {expr.value} in {what} is out of range", node)
            return expr
        if isinstance(node, c_ast.UnaryOp):
            if node.op == "+":
                return self._index(node.expr, what, min_max, depth)
            if node.op == "-":
                operand = self._index(node.expr, what, min_max, depth)
                if isinstance(operand, IntConst):
                    return IntConst(-operand.value)
                return IntNeg(operand)
            if node.op in ("++", "--", "p++", "p--"):
                raise error("increments are only allowed in the header of a for loop", node)
            pointer = pointer_refusal(node.op)
            if pointer is not None:
                raise error(pointer, node)
            raise error(f"operator '{node.op}' is not allowed in {what}; {_AFFINE_HINT}", node)
        if isinstance(node, c_ast.FuncCall):
            name = node.name.name if isinstance(node.name, c_ast.ID) else None
            if name in ("min", "max"):
                if not min_max:
                    raise error(
                        f"{name}() is only allowed in loop bounds, not in {what}", node
                    )
                args = node.args.exprs if node.args is not None else []
                if len(args) < 2:
                    raise error(f"{name}() needs at least two arguments", node)
                return IntMinMax(
                    name, tuple(self._index(a, what, min_max, depth) for a in args)
                )
            raise error(
                f"function calls are not allowed in {what}"
                + ("; min() and max() are allowed in loop bounds" if min_max else ""),
                node,
            )
        if isinstance(node, c_ast.ArrayRef):
            if what == "a subscript":
                raise error("indirect indexing: an element of an index array must be the whole "
                            "subscript, or plus or minus a constant (x[idx[k]], x[idx[k] + 1])",
                            node)
            raise error(
                f"indirect indexing: an array element cannot be used in {what}; {_AFFINE_HINT}",
                node,
            )
        if isinstance(node, Conversion):
            words = type_words(node.to_type) or []
            if element_dtype(words) in ("int32", "int64"):
                return self._index(node.expr, what, min_max, depth)
            raise error(f"{what} must be an integer expression, not a value converted to "
                        f"{' '.join(words)} (a helper function's parameter or result)", node)
        if isinstance(node, c_ast.Cast):
            raise error(f"casts are not allowed in {what}", node)
        raise error(f"this expression is not allowed in {what}; {_AFFINE_HINT}", node)

    def _index_binary(
        self, node: c_ast.BinaryOp, what: str, min_max: bool, depth: int
    ) -> IntExpr:
        error = self.scope.error
        left = self._index(node.left, what, min_max, depth)
        right = self._index(node.right, what, min_max, depth)
        if node.op in ("+", "-"):
            return _fold(node.op, left, right)
        if node.op == "*":
            left_value, right_value = constant_value(left), constant_value(right)
            if left_value is None and right_value is None:
                raise error(
                    f"{what} is not affine: a product of two variable expressions; one "
                    "factor must be a constant",
                    node,
                )
            # the constant factor as a literal: isl reads only `16 * (x)`
            if left_value is not None:
                left = IntConst(left_value)
            if right_value is not None:
                right = IntConst(right_value)
            return _fold("*", left, right)
        if node.op in ("/", "%"):
            divisor = constant_value(right)
            if divisor is None or divisor <= 0:
                raise error(
                    f"'{node.op}' in {what} must be by a positive integer constant",
                    node.right,
                )
            return _fold(node.op, left, IntConst(divisor))
        raise error(
            f"operator '{node.op}' is not allowed in {what}; use + - * / % with constant "
            "factors and divisors",
            node,
        )

    # ------------------------------------------------------------------ array accesses

    def access(self, node: c_ast.ArrayRef, *, write: bool) -> Access:
        subscripts: list[c_ast.Node] = []
        base: c_ast.Node = node
        while isinstance(base, c_ast.ArrayRef):
            subscripts.insert(0, base.subscript)
            base = base.name
        if not isinstance(base, c_ast.ID):
            raise self.scope.error("only a named array can be subscripted", base)
        name = base.name
        kind = self.scope.kind(name)
        if kind is None:
            raise self.scope.undeclared(name, base)
        if kind != "array":
            raise self.scope.error(f"the {kind} '{name}' is not an array", base)
        array = self.scope.arrays[name]
        if len(subscripts) != len(array.shape):
            raise self.scope.error(
                f"array '{name}' has {len(array.shape)} dimension(s) but is used with "
                f"{len(subscripts)} subscript(s)",
                node,
            )
        if write and array.is_input:
            raise self.scope.error(
                f"cannot write to '{name}': it is declared const (an input); remove const "
                "to make it an output",
                node,
            )
        indices = tuple(self._subscript(s) for s in subscripts)
        return Access(name, indices, self.scope.position(node))

    def _subscript(self, node: c_ast.Node) -> Index:
        """An affine subscript, or an element of an integer array plus or minus a constant."""
        gathered, offset = _indirect_parts(node)
        if gathered is None:
            return self.index(node, "a subscript")
        constant = 0
        if offset is not None:
            value = constant_value(self.index(offset, "a subscript"))
            if value is None:
                raise self.scope.error(
                    "an element of an index array may only be offset by a constant "
                    "(x[idx[k] + 1]); loop variables and sizes cannot be added to it", offset)
            constant = value if node.op == "+" else -value
        inner = self.access(gathered, write=False)
        dtype = self.scope.arrays[inner.array].dtype
        if dtype not in ("int32", "int64"):
            raise self.scope.error(
                f"indirect indexing: the index array '{inner.array}' holds {dtype} elements; a "
                "subscript read from an array needs int or long elements", gathered)
        if inner.is_indirect:
            raise self.scope.error(
                "nested indirect indexing (a[b[c[i]]]) is not supported; read b[c[i]] into an "
                "integer array in a loop of its own first", gathered)
        return Indirect(inner, constant)


def _indirect_parts(node: c_ast.Node) -> tuple[c_ast.ArrayRef | None, c_ast.Node | None]:
    """(the array element, the other operand) of `a[...]`, `a[...] + c`, `c + a[...]` or
    `a[...] - c`; (None, None) for anything else."""
    if isinstance(node, c_ast.ArrayRef):
        return node, None
    if isinstance(node, c_ast.BinaryOp) and node.op in ("+", "-"):
        if isinstance(node.left, c_ast.ArrayRef) and not _holds_array(node.right):
            return node.left, node.right
        if (node.op == "+" and isinstance(node.right, c_ast.ArrayRef)
                and not _holds_array(node.left)):
            return node.right, node.left
    return None, None


def _holds_array(node: c_ast.Node) -> bool:
    return isinstance(node, c_ast.ArrayRef) or any(_holds_array(c) for _, c in node.children())
