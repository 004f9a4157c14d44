"""Render IR statements and isl AST expressions as C text.

Takes IR values (statements, index and value expressions) and isl `AstExpr`s; returns strings.
Arrays are flat pointers indexed with their row-major strides (sizes are bound at compile time);
bfloat16 elements are stored as `uint16_t` and computed in float. Integer values are computed
in `long` (64 bits) and converted to an integer array's type where stored, as C converts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.ir import (
    Access,
    Binary,
    Call,
    Const,
    Expr,
    IndexValue,
    Indirect,
    IntBinary,
    IntConst,
    IntExpr,
    IntOp,
    IntVar,
    Load,
    Select,
    Statement,
    ToFloat,
    ToInt,
    Unary,
    int_vars,
    is_integer_value,
)

# Inside a lane loop (`codegen.c.loops`), an access a row apart along the lanes strides by its
# row times this variable: 1 at run time, opaque to the compiler. gcc vectorises no access of a
# large constant stride, while it loads one of an unknown stride element by element.
LANE_STEP = "_pd_lane_step"

# Generated identifiers start with "_pd" or "_t" (loop iterators, `poly.ast_order`); the
# frontends reject user names with "_".

C_HELPERS = """\
static inline long _pd_floord(long a, long b) { return (a >= 0) ? a / b : -((-a + b - 1) / b); }
static inline long _pd_mod(long a, long b) { long r = a % b; return r < 0 ? r + b : r; }
static inline long _pd_min(long a, long b) { return a < b ? a : b; }
static inline long _pd_max(long a, long b) { return a > b ? a : b; }
/* C's integer / and %, defined where C is not and the hardware traps (see ir.IntOp) */
static inline long _pd_idiv(long a, long b) {
  return b == 0 ? 0 : b == -1 ? (long)(0UL - (unsigned long)a) : a / b;
}
static inline long _pd_irem(long a, long b) { return (b == 0 || b == -1) ? 0 : a % b; }
static inline float _pd_bf16_to_f32(uint16_t v) {
  union { uint32_t u; float f; } x; x.u = (uint32_t)v << 16; return x.f;
}
static inline uint16_t _pd_f32_to_bf16(float f) {
  /* round to nearest even, as hardware conversions do */
  union { uint32_t u; float f; } x; x.f = f;
  if ((x.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x.u >> 16) | 0x40u);
  return (uint16_t)((x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16);
}
"""


@dataclass(frozen=True)
class ArrayLayout:
    name: str
    dtype: str
    shape: tuple[int, ...]
    # one slice of the first index per thread, the thread's own (`codegen.c.thread_scratch`)
    per_thread: bool = False
    # a local contracted to the cells one iteration of its loops touches
    # (`schedules.contraction`): the subscripts it keeps, each wrapped to its extent in `shape`
    # (a power of two); None: every subscript, unwrapped
    kept: tuple[int, ...] | None = None

    @property
    def strides(self) -> tuple[int, ...]:
        out = []
        acc = 1
        for extent in reversed(self.shape):
            out.append(acc)
            acc *= extent
        return tuple(reversed(out))

    @property
    def c_type(self) -> str:
        return DTYPES[self.dtype].c_type


def compute_type(layouts: dict[str, ArrayLayout]) -> str:
    """The C type arithmetic runs in: double if any array is float64, else float."""
    return "double" if any(a.dtype == "float64" for a in layouts.values()) else "float"


_INTEGER_CALLS = {"/": "_pd_idiv", "%": "_pd_irem"}


class MathCalls(Protocol):
    """How a backend writes math calls (the C target's vector forms: `codegen.c.vector_math`)."""

    def call(self, function: str, args: Sequence[Expr], texts: Sequence[str], ctype: str) -> str:
        """`function(args)` as C in `ctype`; `texts`: the arguments as C."""
        ...


# A subscript read from an index array: (index array, indexed array, dimension, constant)
IndexSite = tuple[str, str, int, int]


@dataclass(frozen=True)
class CheckedAt:
    """How the kernel checks the subscripts of one `IndexSite`: by check `number`, where the
    value is read (`at_access`) or before the loops (the subscript then reads it plainly)."""

    number: int
    low: int  # the lowest and highest value of the index array the dimension accepts
    high: int
    at_access: bool


@dataclass(frozen=True)
class _Wrapped:
    """A subscript of a contracted local (never negative: a cell's offset from the array's
    start) wrapped to `extent`, a power of two."""

    index: IntExpr
    extent: int

    def to_c(self) -> str:
        return f"(({self.index.to_c()}) & {self.extent - 1}L)"


def _affine(idx: IntExpr | Indirect) -> IntExpr:
    if isinstance(idx, Indirect):
        raise TypeError("a subscript read from an index array has no affine form")
    return idx


class StatementPrinter:
    def __init__(self, layouts: dict[str, ArrayLayout], math: MathCalls | None = None,
                 index_checks: dict[IndexSite, CheckedAt] | None = None) -> None:
        self.layouts = layouts
        self.math = math  # None: every call is the C library's function
        self.index_checks = index_checks or {}
        self.ctype = compute_type(layouts)
        self.integer_arrays = frozenset(
            name for name, a in layouts.items() if DTYPES[a.dtype].is_integer)
        # the statement being printed: its iterators that a lane loop runs (`statement`)
        self.lanes: dict[str, tuple[str, int]] = {}

    def is_integer(self, e: Expr) -> bool:
        return is_integer_value(e, self.integer_arrays)

    def element(self, acc: Access) -> str:
        layout = self.layouts[acc.array]
        if not layout.shape:  # a scalar parameter, passed by value
            return acc.array
        return f"{acc.array}[{self.offset(acc)}]"

    def offset(self, acc: Access) -> str:
        """The flat offset of `acc` in its array."""
        layout = self.layouts[acc.array]
        terms = []
        if layout.kept is None:
            texts = [self.subscript(acc, d, idx) for d, idx in enumerate(acc.indices)]
        else:  # a contracted local (never indexed through an index array): its kept subscripts
            texts = [self._kept(_affine(acc.indices[k]), extent)
                     for k, extent in zip(layout.kept, layout.shape, strict=True)]
        for d, (text, stride) in enumerate(zip(texts, layout.strides, strict=True)):
            if layout.per_thread and d == 0:
                text = "_pd_thread()"
            if stride != 1 and layout.kept is None and self._moves_with_lanes(acc.indices[d]):
                terms.append(f"({text}) * ({stride}L * {LANE_STEP})")
                continue
            terms.append(text if stride == 1 else f"({text}) * {stride}L")
        return " + ".join(terms) or "0"

    def _moves_with_lanes(self, index: IntExpr | Indirect) -> bool:
        return bool(self.lanes) and not isinstance(index, Indirect) and bool(
            int_vars(index) & self.lanes.keys())

    def _kept(self, index: IntExpr, extent: int) -> str:
        """A kept subscript wrapped to `extent`; inside a lane loop, one that is the lanes'
        iterator (less a multiple of `extent`) is the lane's counter, at unit stride: the lane
        loop runs the iterator less its strip, a multiple of the lanes (`schedules.cpu.lanes`)."""
        offset = 0
        var = index
        if (isinstance(index, IntBinary) and index.op in "+-" and isinstance(index.left, IntVar)
                and isinstance(index.right, IntConst)):
            var, offset = index.left, index.right.value
        if isinstance(var, IntVar) and var.name in self.lanes and offset % extent == 0:
            counter, lanes = self.lanes[var.name]
            if lanes % extent == 0:
                return counter if lanes == extent else f"({counter} & {extent - 1}L)"
        return _Wrapped(index, extent).to_c()

    def subscript(self, acc: Access, d: int, idx: IntExpr | Indirect) -> str:
        """One subscript; one read from an index array checked where `index_checks` says."""
        if not isinstance(idx, Indirect):
            return idx.to_c()
        value = f"(long){self.element(idx.access)}"
        check = self.index_checks[(idx.access.array, acc.array, d, idx.offset)]
        if check.at_access:
            value = (f"pd_checked({value}, {check.low}L, {check.high}L, {check.number}, "
                     f"{self.offset(idx.access)}, _pd_fault)")
        return f"({value} + {idx.offset}L)" if idx.offset else value

    def load(self, acc: Access) -> str:
        text = self.element(acc)
        if self.layouts[acc.array].dtype == "bfloat16":
            return f"_pd_bf16_to_f32({text})"
        return text

    def literal(self, value: float) -> str:
        if math.isinf(value) or math.isnan(value):
            raise ValueError(f"non-finite literal {value}")
        text = repr(float(value))
        return text + "f" if self.ctype == "float" else text

    def function(self, name: str) -> str:
        return name if self.ctype == "float" else name[:-1]

    def expr(self, e: Expr) -> str:
        """`e` as a value of the compute type (an integer value converted)."""
        if isinstance(e, Const):
            return self.literal(e.value)
        if isinstance(e, IndexValue):
            return f"(({self.ctype})({e.expr.to_c()}))"
        if isinstance(e, ToFloat) or self.is_integer(e):
            inner = e.operand if isinstance(e, ToFloat) else e
            return f"(({self.ctype}){self.integer(inner)})"
        if isinstance(e, Load):
            return self.load(e.access)
        if isinstance(e, Unary):
            return f"(-{self.expr(e.operand)})"
        if isinstance(e, Binary):
            return f"({self.expr(e.left)} {e.op} {self.expr(e.right)})"
        if isinstance(e, Call):
            texts = [self.expr(a) for a in e.args]
            if self.math is not None:
                return self.math.call(e.function, e.args, texts, self.ctype)
            return f"{self.function(e.function)}({', '.join(texts)})"
        if isinstance(e, Select):
            return f"({self.comparison(e)} ? {self.expr(e.if_true)} : {self.expr(e.if_false)})"
        raise TypeError(e)

    def integer(self, e: Expr) -> str:
        """An integer value `e` as a C `long`."""
        if isinstance(e, IndexValue):
            return f"((long)({e.expr.to_c()}))"
        if isinstance(e, Load):
            return f"((long){self.element(e.access)})"
        if isinstance(e, IntOp):
            a, b = self.integer(e.left), self.integer(e.right)
            if e.op in _INTEGER_CALLS:
                return f"{_INTEGER_CALLS[e.op]}({a}, {b})"
            return f"({a} {e.op} {b})"
        if isinstance(e, ToInt):
            # a float through long first: C leaves a float out of a narrow type's range
            # undefined (a vectorised conversion saturates), a long narrowed wraps
            inner = (self.integer(e.operand) if self.is_integer(e.operand)
                     else f"(long)({self.expr(e.operand)})")
            return f"((long)({DTYPES[e.dtype].c_type})({inner}))"
        if isinstance(e, Select):
            return (f"({self.comparison(e)} ? {self.integer(e.if_true)} : "
                    f"{self.integer(e.if_false)})")
        raise TypeError(e)

    def comparison(self, e: Select) -> str:
        """The condition of a select: in integers where both sides are integers."""
        if self.is_integer(e.left) and self.is_integer(e.right):
            return f"({self.integer(e.left)} {e.op} {self.integer(e.right)})"
        return f"({self.expr(e.left)} {e.op} {self.expr(e.right)})"

    def statement(self, s: Statement, lanes: dict[str, tuple[str, int]] | None = None) -> str:
        """The C of `s`; `lanes`: its iterators that a lane loop runs, each with the loop's
        counter and lanes (`codegen.c.loops`)."""
        self.lanes = lanes or {}
        try:
            return self._statement(s)
        finally:
            self.lanes = {}

    def _statement(self, s: Statement) -> str:
        target = self.element(s.target)
        dtype = DTYPES[self.layouts[s.target.array].dtype]
        if dtype.is_integer:
            # computed in long or the compute type, converted to the element type on the store
            if self.is_integer(s.value):
                value = self.integer(s.value)
                if s.op in ("/=", "%="):
                    value = f"{_INTEGER_CALLS[s.op[0]]}((long){target}, {value})"
                elif s.op != "=":
                    value = f"((long){target} {s.op[0]} {value})"
            else:
                value = self.expr(s.value)
                if s.op != "=":
                    value = f"(({self.ctype}){target} {s.op[0]} {value})"
            return f"{target} = ({dtype.c_type})({value});"
        if (dtype.name == "bfloat16" and s.op == "=" and isinstance(s.value, Load)
                and self.layouts[s.value.access.array].dtype == "bfloat16"):
            return f"{target} = {self.element(s.value.access)};"  # a copy: the same bits
        value = self.expr(s.value)
        if dtype.name == "bfloat16":
            if s.op != "=":
                value = f"{self.load(s.target)} {s.op[0]} {value}"
            return f"{target} = _pd_f32_to_bf16({value});"
        return f"{target} {s.op} {value};"


# islpy's type stubs lack the members named after C keywords (for_, if_, and_, or_)
AST_FOR = isl.ast_node_type.for_  # type: ignore[attr-defined]
AST_IF = isl.ast_node_type.if_  # type: ignore[attr-defined]

_BINARY_OPS = {
    isl.ast_expr_op_type.add: "+",
    isl.ast_expr_op_type.sub: "-",
    isl.ast_expr_op_type.mul: "*",
    isl.ast_expr_op_type.div: "/",
    isl.ast_expr_op_type.zdiv_r: "%",
    isl.ast_expr_op_type.pdiv_r: "%",
    isl.ast_expr_op_type.pdiv_q: "/",
    isl.ast_expr_op_type.eq: "==",
    isl.ast_expr_op_type.le: "<=",
    isl.ast_expr_op_type.lt: "<",
    isl.ast_expr_op_type.ge: ">=",
    isl.ast_expr_op_type.gt: ">",
    isl.ast_expr_op_type.and_: "&&",  # type: ignore[attr-defined]
    isl.ast_expr_op_type.and_then: "&&",
    isl.ast_expr_op_type.or_: "||",  # type: ignore[attr-defined]
    isl.ast_expr_op_type.or_else: "||",
}


def ast_expr_to_c(e: isl.AstExpr) -> str:
    """An isl AST expression (loop bounds, guards, statement arguments) as C over `long`."""
    kind = e.get_type()
    if kind == isl.ast_expr_type.int:
        return str(e.get_val().to_python())
    if kind == isl.ast_expr_type.id:
        return e.get_id().get_name()
    op = e.get_op_type()
    args = [ast_expr_to_c(e.get_op_arg(i)) for i in range(e.get_op_n_arg())]
    if op in _BINARY_OPS:
        return f"({args[0]} {_BINARY_OPS[op]} {args[1]})"
    if op == isl.ast_expr_op_type.minus:
        return f"(-{args[0]})"
    if op in (isl.ast_expr_op_type.min, isl.ast_expr_op_type.max):
        name = "_pd_min" if op == isl.ast_expr_op_type.min else "_pd_max"
        text = args[0]
        for a in args[1:]:
            text = f"{name}({text}, {a})"
        return text
    if op == isl.ast_expr_op_type.fdiv_q:
        return f"_pd_floord({args[0]}, {args[1]})"
    if op in (isl.ast_expr_op_type.cond, isl.ast_expr_op_type.select):
        return f"({args[0]} ? {args[1]} : {args[2]})"
    raise NotImplementedError(f"isl AST operation {op}")
