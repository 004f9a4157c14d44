"""The loop-nest IR: immutable values produced by every frontend and read by the polyhedral model.

A `LoopNest` is a function: integer size parameters, arrays, and a body of loops, guards and
statements. Index expressions (`IntExpr`) are affine in loop variables and size parameters, with
integer division and modulo by positive constants; value expressions (`Expr`) compute array
elements. Nothing here knows about isl or C beyond the small renderers `to_isl` and `to_c`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

from polydl.errors import ArgumentError, SourcePosition, SpecError

# ----------------------------------------------------------------------------- index expressions


@dataclass(frozen=True)
class IntConst:
    value: int

    def to_isl(self) -> str:
        return str(self.value)

    def to_c(self) -> str:
        return f"{self.value}L" if abs(self.value) > 2**31 - 1 else str(self.value)


@dataclass(frozen=True)
class IntVar:
    """A loop variable or a size parameter."""

    name: str

    def to_isl(self) -> str:
        return self.name

    def to_c(self) -> str:
        return self.name


@dataclass(frozen=True)
class IntBinary:
    """`+`, `-`, `*` (one side constant), `/` (floor division by a positive constant), `%`."""

    op: str
    left: IntExpr
    right: IntExpr

    def to_isl(self) -> str:
        a, b = self.left.to_isl(), self.right.to_isl()
        # isl's parser wants a bare constant divisor
        if self.op == "/":
            return f"floor(({a})/{b})"
        if self.op == "%":
            return f"(({a}) mod {b})"
        # ... and a bare constant factor: `16 * (k)` parses, `(k) * (16)` does not
        if self.op == "*" and isinstance(self.right, IntConst):
            return f"{b} * ({a})"
        if self.op == "*" and isinstance(self.left, IntConst):
            return f"{a} * ({b})"
        return f"({a}) {self.op} ({b})"

    def to_c(self) -> str:
        a, b = self.left.to_c(), self.right.to_c()
        if self.op == "/":
            return f"_pd_floord({a}, {b})"
        if self.op == "%":
            return f"_pd_mod({a}, {b})"
        return f"({a} {self.op} {b})"


@dataclass(frozen=True)
class IntNeg:
    operand: IntExpr

    def to_isl(self) -> str:
        return f"-({self.operand.to_isl()})"

    def to_c(self) -> str:
        return f"(-{self.operand.to_c()})"


@dataclass(frozen=True)
class IntMinMax:
    """`min(a, b, ...)` / `max(...)`: allowed only as a loop bound."""

    op: str  # "min" | "max"
    args: tuple[IntExpr, ...]

    def to_isl(self) -> str:
        return f"{self.op}(" + ", ".join(a.to_isl() for a in self.args) + ")"

    def to_c(self) -> str:
        text = self.args[0].to_c()
        for a in self.args[1:]:
            text = f"_pd_{self.op}({text}, {a.to_c()})"
        return text


IntExpr = IntConst | IntVar | IntBinary | IntNeg | IntMinMax


def int_vars(expr: IntExpr | Indirect) -> frozenset[str]:
    """Names of variables an index expression mentions (for an `Indirect` subscript, those of
    the index array's subscripts: the loops along which the cell it selects may change)."""
    if isinstance(expr, Indirect):
        out_: frozenset[str] = frozenset()
        for i in expr.access.indices:
            out_ |= int_vars(i)
        return out_
    if isinstance(expr, IntVar):
        return frozenset({expr.name})
    if isinstance(expr, IntBinary):
        return int_vars(expr.left) | int_vars(expr.right)
    if isinstance(expr, IntNeg):
        return int_vars(expr.operand)
    if isinstance(expr, IntMinMax):
        out: frozenset[str] = frozenset()
        for a in expr.args:
            out |= int_vars(a)
        return out
    return frozenset()


def access_vars(access: Access) -> frozenset[str]:
    """Names of variables any subscript of `access` mentions (`int_vars` of each)."""
    out: frozenset[str] = frozenset()
    for index in access.indices:
        out |= int_vars(index)
    return out


def substitute(value: Any, name: str, by: IntExpr) -> Any:
    """`value` (an IR node, an expression, or a tuple of them) with every index use of the
    variable `name` replaced by `by` (positions kept)."""
    if isinstance(value, IntVar):
        return by if value.name == name else value
    if isinstance(value, tuple):
        return tuple(substitute(v, name, by) for v in value)
    if is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: substitute(getattr(value, f.name), name, by)
            for f in fields(value)
            if f.name != "position"
        }
        return replace(value, **changes)
    return value


def renamed(value: Any, names: dict[str, str]) -> Any:
    """`value` (an IR node, an expression, a nest, or a tuple of them) with every variable,
    array and size parameter named in `names` renamed (positions kept)."""
    if not names:
        return value
    if isinstance(value, tuple):
        return tuple(renamed(v, names) for v in value)
    if not (is_dataclass(value) and not isinstance(value, type)):
        return value
    changes = {f.name: renamed(getattr(value, f.name), names)
               for f in fields(value) if f.name != "position"}
    if isinstance(value, IntVar | Array):
        changes["name"] = names.get(value.name, value.name)
    elif isinstance(value, Access):
        changes["array"] = names.get(value.array, value.array)
    elif isinstance(value, Loop):
        changes["var"] = names.get(value.var, value.var)
    elif isinstance(value, LoopNest):
        changes["params"] = tuple(names.get(p, p) for p in value.params)
    return replace(value, **changes)


def eval_int(expr: IntExpr | Indirect, env: dict[str, int]) -> int:
    """Evaluate an index expression with C-style floor semantics for `/` and `%` by constants.
    An `Indirect` subscript has no value without the arrays: a TypeError."""
    if isinstance(expr, Indirect):
        raise TypeError(f"the subscript {expr.to_c()} reads an array")
    if isinstance(expr, IntConst):
        return expr.value
    if isinstance(expr, IntVar):
        return env[expr.name]
    if isinstance(expr, IntNeg):
        return -eval_int(expr.operand, env)
    if isinstance(expr, IntMinMax):
        vals = [eval_int(a, env) for a in expr.args]
        return min(vals) if expr.op == "min" else max(vals)
    a, b = eval_int(expr.left, env), eval_int(expr.right, env)
    if expr.op == "+":
        return a + b
    if expr.op == "-":
        return a - b
    if expr.op == "*":
        return a * b
    if expr.op == "/":
        return a // b
    if expr.op == "%":
        return a % b
    raise ValueError(expr.op)


# ----------------------------------------------------------------------------- value expressions


@dataclass(frozen=True)
class Access:
    """A reference to one array element: `array[indices...]`."""

    array: str
    indices: tuple[Index, ...]
    position: SourcePosition | None = field(default=None, compare=False)

    @property
    def is_indirect(self) -> bool:
        """Whether a subscript is read from an index array (the access is a may-access)."""
        return any(isinstance(i, Indirect) for i in self.indices)


@dataclass(frozen=True)
class Indirect:
    """A subscript read from an integer array, plus a constant: `tok[i]` in `emb[tok[i]][j]`,
    `idx[k] + 1` in `x[idx[k] + 1]`. The polyhedral model cannot know which cell it selects,
    so the access may touch any cell along that dimension; the kernel checks each value
    against the dimension's extent at run time. The index array's own subscripts are affine."""

    access: Access
    offset: int = 0

    def to_isl(self) -> str:
        raise TypeError(f"the subscript {self.to_c()} is not affine")

    def to_c(self) -> str:
        """The subscript as a spec writes it (for messages; code generation lays arrays out)."""
        text = self.access.array + "".join(f"[{i.to_c()}]" for i in self.access.indices)
        if self.offset:
            text += f" {'+' if self.offset > 0 else '-'} {abs(self.offset)}"
        return text


Index = IntExpr | Indirect


def index_loads(access: Access) -> list[Access]:
    """The reads of index arrays that `access`'s subscripts make."""
    return [i.access for i in access.indices if isinstance(i, Indirect)]


@dataclass(frozen=True)
class Const:
    value: float


@dataclass(frozen=True)
class Load:
    access: Access


@dataclass(frozen=True)
class IndexValue:
    """An index expression used as a value: an integer, converted to the element type where
    floating-point arithmetic uses it."""

    expr: IntExpr


@dataclass(frozen=True)
class Unary:
    op: str  # "-"
    operand: Expr


@dataclass(frozen=True)
class Binary:
    op: str  # "+", "-", "*", "/"
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Call:
    """A math function from `MATH_FUNCTIONS`, named by its float form (`expf`, `fmaxf`, ...)."""

    function: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Select:
    """`cond ? a : b` where cond compares two values."""

    op: str  # "<", "<=", ">", ">=", "==", "!="
    left: Expr
    right: Expr
    if_true: Expr
    if_false: Expr


@dataclass(frozen=True)
class IntOp:
    """Integer arithmetic on integer values, as C does it (in 64 bits): `+`, `-`, `*`, `/`
    rounding toward zero and `%` with the dividend's sign. Where C leaves a result undefined
    and the hardware would trap, it is defined instead: a division or remainder by zero gives
    0, a division by -1 negates (wrapping), a remainder by -1 is 0."""

    op: str  # "+", "-", "*", "/", "%"
    left: Expr
    right: Expr


@dataclass(frozen=True)
class ToFloat:
    """An integer value (an element of an integer array, integer arithmetic) where
    floating-point arithmetic uses it: C's usual arithmetic conversion."""

    operand: Expr


@dataclass(frozen=True)
class ToInt:
    """A value converted to an integer dtype, as a C cast converts: a floating-point value
    rounds toward zero, an integer keeps the low bits of the type's width."""

    dtype: str
    operand: Expr


Expr = Const | Load | IndexValue | Unary | Binary | Call | Select | IntOp | ToFloat | ToInt


def is_integer_value(expr: Expr, integer_arrays: frozenset[str] | set[str]) -> bool:
    """Whether C computes `expr` as an integer, given the arrays of integer elements: loads of
    them, index values, integer arithmetic and conversions, and selects between integers.
    Everything else (`Binary`, `Unary`, `Call`, constants) is floating point."""
    if isinstance(expr, Load):
        return expr.access.array in integer_arrays
    if isinstance(expr, IndexValue | IntOp | ToInt):
        return True
    if isinstance(expr, Select):
        return (is_integer_value(expr.if_true, integer_arrays)
                and is_integer_value(expr.if_false, integer_arrays))
    return False

# float function name -> number of arguments. The double form drops the trailing "f".
MATH_FUNCTIONS: dict[str, int] = {
    "expf": 1,
    "logf": 1,
    "sqrtf": 1,
    "tanhf": 1,
    "fabsf": 1,
    "sinf": 1,
    "cosf": 1,
    "erff": 1,
    "fmaxf": 2,
    "fminf": 2,
    "powf": 2,
}


def replace_loads(value: Any, by: Mapping[Access, Access]) -> Any:
    """`value` (an expression or a tuple of them) with each load of an access of `by` reading
    its replacement instead (the loads inside subscripts are kept)."""
    if isinstance(value, Load):
        return Load(by.get(value.access, value.access))
    if isinstance(value, tuple):
        return tuple(replace_loads(v, by) for v in value)
    if isinstance(value, Unary | Binary | Call | Select | IntOp | ToFloat | ToInt):
        return replace(value, **{f.name: replace_loads(getattr(value, f.name), by)
                                 for f in fields(value)})
    return value


def expr_loads(expr: Expr) -> list[Access]:
    """Every array access an expression reads, in source order (an index array's read before
    the gather that uses it)."""
    if isinstance(expr, Load):
        return [*index_loads(expr.access), expr.access]
    if isinstance(expr, Unary):
        return expr_loads(expr.operand)
    if isinstance(expr, Binary):
        return expr_loads(expr.left) + expr_loads(expr.right)
    if isinstance(expr, Call):
        return [a for arg in expr.args for a in expr_loads(arg)]
    if isinstance(expr, Select):
        return (
            expr_loads(expr.left)
            + expr_loads(expr.right)
            + expr_loads(expr.if_true)
            + expr_loads(expr.if_false)
        )
    if isinstance(expr, IntOp):
        return expr_loads(expr.left) + expr_loads(expr.right)
    if isinstance(expr, ToFloat | ToInt):
        return expr_loads(expr.operand)
    return []


def count_flops(expr: Expr) -> int:
    """Floating-point operations of one evaluation (a call or a select counts as one)."""
    if isinstance(expr, Unary):
        return 1 + count_flops(expr.operand)
    if isinstance(expr, Binary):
        return 1 + count_flops(expr.left) + count_flops(expr.right)
    if isinstance(expr, Call):
        return 1 + sum(count_flops(a) for a in expr.args)
    if isinstance(expr, Select):
        return 1 + sum(count_flops(e) for e in (expr.left, expr.right, expr.if_true, expr.if_false))
    if isinstance(expr, IntOp):  # integer operations are no flops; their operands may hold some
        return count_flops(expr.left) + count_flops(expr.right)
    if isinstance(expr, ToFloat | ToInt):
        return count_flops(expr.operand)
    return 0


# functions that are one instruction, or a compare and a blend, in scalar and in vector form
INSTRUCTION_FUNCTIONS = frozenset({"fmaxf", "fminf", "fabsf", "fmax", "fmin", "fabs"})


def math_calls(expr: Expr) -> int:
    """The math calls of one evaluation that are no single instruction (`expf`, not `fmaxf`)."""
    if isinstance(expr, Call):
        own = 0 if expr.function in INSTRUCTION_FUNCTIONS else 1
        return own + sum(math_calls(a) for a in expr.args)
    if isinstance(expr, Unary | ToFloat | ToInt):
        return math_calls(expr.operand)
    if isinstance(expr, Binary | IntOp):
        return math_calls(expr.left) + math_calls(expr.right)
    if isinstance(expr, Select):
        return sum(math_calls(e) for e in (expr.left, expr.right, expr.if_true, expr.if_false))
    return 0


# ----------------------------------------------------------------------------- structure


@dataclass(frozen=True)
class Condition:
    """An affine comparison `left op right` used by guards."""

    op: str  # "<", "<=", ">", ">=", "=="
    left: IntExpr
    right: IntExpr

    def to_isl(self) -> str:
        op = "=" if self.op == "==" else self.op
        return f"{self.left.to_isl()} {op} {self.right.to_isl()}"


@dataclass(frozen=True)
class Statement:
    """`target op value` with op one of `=`, `+=`, `-=`, `*=`, `/=`.

    `name` is unique in the nest (S0, S1, ... in source order).
    """

    name: str
    target: Access
    op: str
    value: Expr
    position: SourcePosition | None = field(default=None, compare=False)

    @property
    def reads(self) -> list[Access]:
        loads = expr_loads(self.value)
        return ([self.target] if self.op != "=" else []) + index_loads(self.target) + loads

    @property
    def is_indirect(self) -> bool:
        """Whether the statement gathers or scatters through an index array."""
        return self.target.is_indirect or any(a.is_indirect for a in expr_loads(self.value))

    @property
    def flops(self) -> int:
        return count_flops(self.value) + (0 if self.op == "=" else 1)


@dataclass(frozen=True)
class Loop:
    """`for (var = lower; var < upper; var += step)`; `upper` is exclusive."""

    var: str
    lower: IntExpr
    upper: IntExpr
    step: int
    body: tuple[Node, ...]
    position: SourcePosition | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Guard:
    """`if (c1 && c2 ...) { body }` with affine conditions."""

    conditions: tuple[Condition, ...]
    body: tuple[Node, ...]
    position: SourcePosition | None = field(default=None, compare=False)


Node = Loop | Guard | Statement

@dataclass(frozen=True)
class Array:
    """An array parameter. `is_input` arrays are `const`; the others are outputs.

    A `local` array is scratch space of the kernel (e.g. a zero-padded copy of an input): not
    a parameter, allocated zero-filled on every call, unless `filled` (written in full before
    anything reads it, such as a scaled copy of an operand: no zeroing pass).

    A `kept` input is one the caller keeps unchanged between calls (weights at inference): a
    packed copy of it is made at the first call and kept for the next ones (see
    `LoopNest.keeping`)."""

    name: str
    dtype: str
    shape: tuple[IntExpr, ...]
    is_input: bool
    position: SourcePosition | None = field(default=None, compare=False)
    local: bool = False
    filled: bool = False
    # left out of the fingerprint while False (stored lowerings key a nest by it) and out of
    # repr (tuning records key a problem by the repr of its arrays): a nest that keeps nothing
    # keeps both identities
    kept: bool = field(default=False, repr=False, metadata={"fingerprint": "when set"})

    def concrete_shape(self, params: dict[str, int]) -> tuple[int, ...]:
        return tuple(eval_int(e, params) for e in self.shape)


@dataclass(frozen=True)
class LoopNest:
    """A primitive as a loop nest: the value every frontend produces."""

    name: str
    params: tuple[str, ...]
    arrays: tuple[Array, ...]
    body: tuple[Node, ...]
    source: str | None = field(default=None, compare=False)
    filename: str = field(default="<spec>", compare=False)
    # math functions as the C library's scalar calls (`with_exact_math`); left out of the
    # fingerprint and repr while False, as `Array.kept`
    exact_math: bool = field(default=False, repr=False, metadata={"fingerprint": "when set"})

    def array(self, name: str) -> Array:
        for a in self.arrays:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def parameters(self) -> tuple[Array, ...]:
        """The arrays a caller passes, in declaration order."""
        return tuple(a for a in self.arrays if not a.local)

    @property
    def inputs(self) -> tuple[Array, ...]:
        return tuple(a for a in self.arrays if a.is_input and not a.local)

    @property
    def outputs(self) -> tuple[Array, ...]:
        return tuple(a for a in self.arrays if not a.is_input and not a.local)

    @property
    def locals(self) -> tuple[Array, ...]:
        return tuple(a for a in self.arrays if a.local)

    def statements(self) -> list[Statement]:
        return [s for s, _ in walk_statements(self.body)]

    def error_at(self, message: str, position: SourcePosition | None) -> SpecError:
        """An error at a position of the spec (shown without its line where the position is
        in another file: a header the spec included)."""
        same_file = position is not None and position.file == self.filename
        return SpecError.at(message, position, self.source if same_file else None)

    def with_name(self, name: str) -> LoopNest:
        return replace(self, name=name)

    def keeping(self, names: Iterable[str]) -> LoopNest:
        """This nest with the inputs `names` kept between calls (`Array.kept`): inputs the
        caller promises not to change from one call to the next, except where it says so
        (`Kernel.constants_changed()`). A name that is not an input is an ArgumentError."""
        names = (names,) if isinstance(names, str) else tuple(dict.fromkeys(names))
        inputs = {a.name for a in self.inputs}
        for name in names:
            if name not in inputs:
                raise ArgumentError("constant", (
                    f"'{name}' is not an input array of {self.name}; its inputs: "
                    f"{', '.join(sorted(inputs)) or 'none'}"))
        if not names:
            return self
        return replace(self, arrays=tuple(replace(a, kept=True) if a.name in names else a
                                          for a in self.arrays))

    def with_exact_math(self, exact: bool = True) -> LoopNest:
        """This nest with its math functions computed by the C library's scalar calls, each
        result exactly libm's, where `exact`; else by vector forms within the error bounds
        docs/contract.md states (the default)."""
        return self if exact == self.exact_math else replace(self, exact_math=exact)

    @property
    def kept(self) -> tuple[str, ...]:
        """The inputs kept between calls (`keeping`)."""
        return tuple(a.name for a in self.inputs if a.kept)


def walk_statements(
    body: tuple[Node, ...], enclosing: tuple[Loop | Guard, ...] = ()
) -> list[tuple[Statement, tuple[Loop | Guard, ...]]]:
    """Statements in source order, each with its enclosing loops and guards (outermost first)."""
    out: list[tuple[Statement, tuple[Loop | Guard, ...]]] = []
    for node in body:
        if isinstance(node, Statement):
            out.append((node, enclosing))
        else:
            out.extend(walk_statements(node.body, enclosing + (node,)))
    return out


def fingerprint(value: object) -> str:
    """A text identity of IR that ignores source positions and spelling: what the code depends on."""
    if is_dataclass(value) and not isinstance(value, type):
        inner = ", ".join(
            f"{f.name}={fingerprint(getattr(value, f.name))}" for f in fields(value)
            if f.compare and (f.metadata.get("fingerprint") != "when set" or getattr(value, f.name))
        )
        return f"{type(value).__name__}({inner})"
    if isinstance(value, tuple | list):
        return "(" + ", ".join(fingerprint(v) for v in value) + ")"
    return repr(value)
