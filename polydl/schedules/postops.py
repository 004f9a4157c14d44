"""Fused epilogues as post-ops: applied to the accumulators inside the microkernel, in
registers, right before the C tile is stored (as LIBXSMM and oneDNN apply theirs).

Takes a `PolyModel` and the main `GroupPlan`; returns a `PostOpPlan` (the element-wise chain as
a small expression over the accumulator and per-cell operands, with each operand's element
strides along the call's m and n and its offset as an affine function of the producer's
iterators), or the reason the fused epilogue loop stays.

Legality rests on the fusion check (`fusion.fuse_at`): the chain is fused into the loops
around the call, so every dependence with the rest of the nest is already kept. Moving an
epilogue instance from there into the call that makes its cell final is legal when it updates
exactly the cells the producer writes, each once, touches no other cell of C, reads only arrays
nothing in the nest writes (then nothing between that call and its old place can observe or
change it), and the call's A and B are not C. Where one call reduces each tile, that call
applies the post-ops; where the reduction is split over several calls (a reduction loop outside
the call), isl finds the calls after which none of their cells is written again, and only
those apply them (a test on the outer loops at the call). Each of these is checked here.

The statement right before the producer's nest that sets exactly its cells from values the
nest does not write (`C = 0`, `C = bias[k]`: a convolution with `accumulate=False`) is fused
as C's start: the calls that begin a tile's reduction overwrite C (the microkernel's beta 0)
instead of adding to it, and a start other than zero is their first post-op. That nest then
runs nowhere, so C is written once and never read before: no clearing pass over the output.
It is legal when the start statement reads nothing the nest writes (so it may run at the
first call instead of before the nest) and the producer's nest holds no other statement.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import islpy as isl

from polydl.ir import Binary, Call, Const, Expr, Load, Select, Unary
from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.apply import GroupPlan
from polydl.schedules.microkernel import MicrokernelCall

# -------------------------------------------------------------------------- the post-op IR


@dataclass(frozen=True)
class Acc:
    """The accumulator: the value of the C cell so far."""


@dataclass(frozen=True)
class Operand:
    """The cell of operand `index` that belongs to the current C cell."""

    index: int


@dataclass(frozen=True)
class Literal:
    value: float


@dataclass(frozen=True)
class Apply:
    """`op` over `args`: "+", "-", "*", "/" (two), "neg" (one), "max"/"min" (two: exactly
    `a > b ? a : b` / `a < b ? a : b`), "fmax"/"fmin" (two: C's fmaxf/fminf, which return the
    other argument where one is NaN), or "select<" .. "select!=" (four: `a OP b ? t : f`)."""

    op: str
    args: tuple[PostExpr, ...]


PostExpr = Acc | Operand | Literal | Apply

CMP_OPS = ("<", "<=", ">", ">=", "==", "!=")
FMAX_FMIN = {"fmaxf": "fmax", "fmax": "fmax", "fminf": "fmin", "fmin": "fmin"}


@dataclass(frozen=True)
class OperandStrides:
    """Element strides of one operand along the call's m and n (and its n blocks)."""

    m: int
    n: int
    nb: int = 0


@dataclass(frozen=True)
class PostOps:
    """What a microkernel applies to each C cell before storing it: `acc = step(acc)` for each
    step in order. A value (part of the microkernel's spec and of its name)."""

    operands: tuple[OperandStrides, ...]
    steps: tuple[PostExpr, ...]

    def transposed(self) -> PostOps:
        return PostOps(tuple(OperandStrides(o.n, o.m) for o in self.operands), self.steps)

    def one_block(self) -> PostOps:
        return PostOps(tuple(OperandStrides(o.m, o.n) for o in self.operands), self.steps)

    def describe(self) -> str:
        return "; ".join(f"acc = {expr_text(s)}" for s in self.steps)


def expr_text(e: PostExpr) -> str:
    if isinstance(e, Acc):
        return "acc"
    if isinstance(e, Operand):
        return f"e{e.index}"
    if isinstance(e, Literal):
        return repr(e.value)
    if e.op == "neg":
        return f"-{expr_text(e.args[0])}"
    if e.op in ("max", "min", "fmax", "fmin"):
        return f"{e.op}({expr_text(e.args[0])}, {expr_text(e.args[1])})"
    if e.op.startswith("select"):
        a, b, t, f = (expr_text(x) for x in e.args)
        return f"({a} {e.op[6:]} {b} ? {t} : {f})"
    return f"({expr_text(e.args[0])} {e.op} {expr_text(e.args[1])})"


# ----------------------------------------------------------------------------- the plan

# A set of the call's outer loop values, as a union of conjunctions of affine constraints
# `sum(coefficients[d] * t_d) + constant (== | >=) 0`.
Constraint = tuple[tuple[int, ...], int, bool]  # (coefficients, constant, is_equality)
Condition = tuple[tuple[Constraint, ...], ...]



@dataclass(frozen=True, eq=False)
class PostOpOperand:
    array: str
    offset: isl.Aff  # producer instance -> element offset of the operand cell in `array`


@dataclass(frozen=True, eq=False)
class PostOpPlan:
    """The fused chain of `statement`'s call as post-ops."""

    statement: str  # the producer (the microkernel's statement)
    epilogues: tuple[str, ...]
    ops: PostOps
    operands: tuple[PostOpOperand, ...] = field(default=())
    # where the reduction of a tile is split over several calls: the calls that finish it
    last_call: Condition | None = None
    # the fused start statement: the calls that begin a tile overwrite C and then apply
    # `start_steps` (none where C starts at zero), before `ops` where they also finish it
    start: str | None = None
    start_steps: tuple[PostExpr, ...] = ()
    first_call: Condition | None = None  # where the reduction is split: the calls that begin it

    def variant(self, first: bool, last: bool) -> tuple[bool, PostOps]:
        """(overwrite C, post-ops) of a call that begins (`first`) and/or finishes (`last`) its
        tiles' reduction."""
        steps = (self.start_steps if first else ()) + (self.ops.steps if last else ())
        return first and self.start is not None, PostOps(self.ops.operands if steps else (), steps)

    def describe(self) -> str:
        arrays = ", ".join(f"e{i} = {o.array}" for i, o in enumerate(self.operands))
        parts = []
        if self.start is not None:
            value = expr_text(self.start_steps[0].args[1]) if self.start_steps else "0"  # type: ignore[union-attr]
            where = (" on the first of the calls that reduce each tile"
                     if self.first_call is not None else "")
            parts.append(f"C starts at {value} ({self.start} fused: the microkernel overwrites C"
                         f"{where})")
        if self.ops.steps:
            text = self.ops.describe()
            if self.last_call is not None:
                text += " on the last of the calls that reduce each tile"
            parts.append(text)
        return "; ".join(parts) + (f" ({arrays})" if arrays else "")


def postop_plan(model: PolyModel, plan: GroupPlan,
                start: StatementModel | None = None) -> PostOpPlan | str:
    """The plan's fused epilogues (and `start`, the statement before its nest, as C's start)
    as post-ops of its microkernel call, or why not."""
    if not plan.epilogues and start is None:
        return "nothing is fused"
    if len(plan.calls) != 1:
        return "the fused nest has no microkernel call"
    (call,) = plan.calls.values()
    c_array = call.c.array
    if c_array in (call.a.array, call.b.array):
        return f"the call reads {c_array}, which the epilogue writes"
    producer = call.statement
    written = {
        acc.access.array
        for s in (*plan.statements, *plan.epilogues, *((start,) if start else ()))
        for acc in s.accesses
        if acc.is_write
    }
    cell_of = write_relation(producer, c_array)
    operands: list[tuple[str, isl.Map]] = []  # (array, producer instance -> operand cell)
    start_steps: list[PostExpr] = []
    first: Condition | None = None
    if start is not None:
        found_start = _start_value(model, plan, start, producer, cell_of, c_array, written, operands)
        if isinstance(found_start, str):
            return f"{start.name}: {found_start}"
        if found_start != Literal(0.0):
            start_steps.append(Apply("+", (Acc(), found_start)))
        found_first = _edge_calls(plan, call, cell_of, first=True)
        if isinstance(found_first, str):
            return found_first
        first = found_first
    last: Condition | None = None
    if plan.epilogues and plan.fusion_level != len(call.outer):
        # the reduction of a tile is split over several calls: apply them on the last one
        found_last = _edge_calls(plan, call, cell_of, first=False)
        if isinstance(found_last, str):
            return found_last
        last = found_last
    steps: list[PostExpr] = []
    for s in plan.epilogues:
        found = elementwise_step(model, s, producer, cell_of, c_array, written, operands)
        if isinstance(found, str):
            return f"{s.name}: {found}"
        steps.append(found)
    strides, offsets = [], []
    for array, relation in operands:
        offset = flat_offset(model, array, relation)
        if offset is None:
            return f"the cells of {array} read are not an affine function of the call's loops"
        d_m = producer.iterators.index(call.binding.m)
        d_n = producer.iterators.index(call.binding.n)
        blocks = call.binding.blocks
        nb = coefficient(offset, producer.iterators.index(blocks)) if blocks else 0
        strides.append(OperandStrides(coefficient(offset, d_m), coefficient(offset, d_n), nb))
        offsets.append(PostOpOperand(array, offset))
    ops = PostOps(tuple(strides), tuple(steps))
    return PostOpPlan(producer.name, tuple(s.name for s in plan.epilogues), ops, tuple(offsets),
                      last, start.name if start else None, tuple(start_steps), first)


def _start_value(model: PolyModel, plan: GroupPlan, start: StatementModel,
                 producer: StatementModel, cell_of: isl.Map, c_array: str, written: set[str],
                 operands: list[tuple[str, isl.Map]]) -> PostExpr | str:
    """The value `start` gives each cell of C before the reduction, or why it cannot be the
    calls' start."""
    if len(plan.statements) != 1:
        return "the producer's nest holds other statements"
    if start.statement.op != "=":
        return "it is not an assignment"
    mark = len(operands)
    found = elementwise_step(model, start, producer, cell_of, c_array, written, operands)
    if not isinstance(found, str) and reads_acc(found):
        found = f"it reads {c_array}"
    if isinstance(found, str):
        del operands[mark:]
    return found


def reads_acc(e: PostExpr) -> bool:
    if isinstance(e, Acc):
        return True
    return isinstance(e, Apply) and any(reads_acc(a) for a in e.args)


def _edge_calls(plan: GroupPlan, call: MicrokernelCall, cell_of: isl.Map,
                first: bool) -> Condition | None | str:
    """The calls before which no earlier call (`first`), or after which no later call, writes
    any of their cells: the calls that begin / finish their tile's reduction, as constraints on
    the call's outer loops; None where every call does (one call reduces each tile); or why
    there are none that begin / finish whole tiles."""
    if plan.instance_map is None:
        return "the nest's schedule has no statement-level map"
    producer = call.statement
    outer = len(call.outer)
    timed = isl.Map.from_union_map(
        plan.instance_map.intersect_domain(isl.UnionSet.from_set(producer.domain))
    )
    to_call = timed.project_out(isl.dim_type.out, outer, timed.dim(isl.dim_type.out) - outer)
    cells = to_call.reverse().apply_range(cell_of)  # call -> the cells it writes
    space = cells.domain().get_space()
    other = isl.Map.lex_gt(space) if first else isl.Map.lex_lt(space)
    sharing = cells.apply_range(cells.reverse()).intersect(other)
    edge = cells.subtract(sharing.apply_range(cells).intersect(cells))
    calls = edge.domain()
    what = "begins" if first else "finishes"
    if not edge.is_equal(cells.intersect_domain(calls)):
        return f"the reduction is split over calls, and some call {what} only part of its tile"
    if calls.is_equal(cells.domain()):
        return None
    out: list[tuple[Constraint, ...]] = []
    for bset in calls.gist(cells.domain()).get_basic_sets():
        if bset.dim(isl.dim_type.div):
            return f"the reduction is split over calls whose {'first' if first else 'last'} one has no affine test"
        conj = []
        for c in bset.get_constraints():
            coeffs = tuple(int(c.get_coefficient_val(isl.dim_type.set, d).to_python()) for d in range(outer))
            conj.append((coeffs, int(c.get_constant_val().to_python()), bool(c.is_equality())))
        out.append(tuple(conj))
    return tuple(out)


def condition_c(condition: Condition, values: list[str]) -> str:
    """The condition as C text over the C expressions of the call's outer loop values."""
    disjuncts = []
    for conj in condition:
        parts = []
        for coeffs, const, equality in conj:
            terms = [v if c == 1 else f"{c} * ({v})" for c, v in zip(coeffs, values, strict=True) if c]
            lhs = " + ".join(terms) or "0"
            parts.append(f"{lhs} {'==' if equality else '>='} {-const}")
        disjuncts.append(" && ".join(parts) or "1")
    return " || ".join(f"({d})" for d in disjuncts) or "0"


def write_relation(s: StatementModel, array: str) -> isl.Map:
    return next(acc.relation for acc in s.accesses if acc.is_write and acc.access.array == array)


def elementwise_step(
    model: PolyModel,
    s: StatementModel,
    producer: StatementModel,
    cell_of: isl.Map,
    c_array: str,
    written: set[str],
    operands: list[tuple[str, isl.Map]],
) -> PostExpr | str:
    """The new accumulator value that `s` computes, with its operands appended to
    `operands`; or why `s` is not an element-wise update of the producer's cells."""
    target = s.statement.target
    if target.array != c_array:
        return f"it writes {target.array}, not the call's output {c_array}"
    write = write_relation(s, c_array)
    if not write.is_injective():
        return f"it writes a cell of {c_array} more than once"
    if not write.range().is_equal(cell_of.range()):
        return f"it does not update exactly the cells of {c_array} the call computes"
    # producer instance -> the epilogue instance at the same cell (one, by injectivity)
    to_epilogue = cell_of.apply_range(write.reverse())
    relations = {id(acc.access): acc.relation for acc in s.accesses}

    def convert(e: Expr) -> PostExpr | str:
        if isinstance(e, Const):
            return Literal(e.value)
        if isinstance(e, Load):
            rel = relations[id(e.access)]
            if e.access.array == c_array:
                return Acc() if rel.is_equal(write) else f"it reads another cell of {c_array}"
            if e.access.array in written:
                return f"it reads {e.access.array}, which the nest writes"
            if model.nest.array(e.access.array).dtype != model.nest.array(c_array).dtype:
                return f"{e.access.array} is not of {c_array}'s type"
            operands.append((e.access.array, to_epilogue.apply_range(rel)))
            return Operand(len(operands) - 1)
        if isinstance(e, Unary) and e.op == "-":
            inner = convert(e.operand)
            return inner if isinstance(inner, str) else Apply("neg", (inner,))
        if isinstance(e, Binary) and e.op in ("+", "-", "*", "/"):
            return _apply(e.op, [convert(e.left), convert(e.right)])
        if isinstance(e, Select) and e.op in CMP_OPS:
            parts = [convert(x) for x in (e.left, e.right, e.if_true, e.if_false)]
            if any(isinstance(p, str) for p in parts):
                return next(p for p in parts if isinstance(p, str))
            a, b, t, f = parts
            # `a > b ? a : b` is exactly the vector max (which returns b on NaN), and so on
            if (e.op == ">" and (t, f) == (a, b)) or (e.op == "<" and (t, f) == (b, a)):
                return Apply("max", (a, b) if e.op == ">" else (b, a))  # type: ignore[arg-type]
            if (e.op == "<" and (t, f) == (a, b)) or (e.op == ">" and (t, f) == (b, a)):
                return Apply("min", (a, b) if e.op == "<" else (b, a))  # type: ignore[arg-type]
            return Apply("select" + e.op, (a, b, t, f))  # type: ignore[arg-type]
        if isinstance(e, Call) and e.function in FMAX_FMIN and len(e.args) == 2:
            return _apply(FMAX_FMIN[e.function], [convert(e.args[0]), convert(e.args[1])])
        return (f"its expression uses {type(e).__name__.lower()} "
                f"{getattr(e, 'op', '') or getattr(e, 'function', '')}").rstrip()

    value = convert(s.statement.value)
    if isinstance(value, str):
        return value
    op = s.statement.op
    if op == "=":
        return value
    if op in ("+=", "-=", "*=", "/="):
        return _apply(op[0], [Acc(), value])
    return f"its update `{op}` has no post-op form"


def _apply(op: str, parts: list[PostExpr | str]) -> PostExpr | str:
    for p in parts:
        if isinstance(p, str):
            return p
    return Apply(op, tuple(parts))  # type: ignore[arg-type]


def flat_offset(model: PolyModel, array: str, relation: isl.Map) -> isl.Aff | None:
    """producer instance -> element offset of the cell, if one affine piece without divisions."""
    shape = model.nest.array(array).concrete_shape(model.params)
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    strides.reverse()
    names = [f"i{d}" for d in range(len(shape))]
    flat = " + ".join(f"{st}*{v}" for st, v in zip(strides, names, strict=True)) or "0"
    linear = isl.Map(f"{{ {array}[{', '.join(names)}] -> [{flat}] }}")
    mapped = relation.apply_range(linear)
    if not mapped.is_single_valued():
        return None
    pieces: list[isl.Aff] = []
    isl.PwMultiAff.from_map(mapped).get_pw_aff(0).foreach_piece(lambda _, aff: pieces.append(aff))
    if len(pieces) != 1 or pieces[0].dim(isl.dim_type.div) != 0:
        return None
    return pieces[0]


def coefficient(aff: isl.Aff, dim: int) -> int:
    return int(aff.get_coefficient_val(isl.dim_type.in_, dim).to_python())


def offset_c(aff: isl.Aff, names: tuple[str, ...]) -> str:
    """The offset as C text over the producer's iterator names."""
    terms = []
    for d, name in enumerate(names):
        coeff = coefficient(aff, d)
        if coeff:
            terms.append(name if coeff == 1 else f"{coeff}L * {name}")
    const = int(aff.get_constant_val().to_python())
    if const or not terms:
        terms.append(f"{const}L")
    return " + ".join(terms)


def without_epilogues(plan: GroupPlan) -> GroupPlan:
    """The plan with its fused epilogues left out of the loops (they run as post-ops)."""
    domains = isl.UnionSet("{ }")
    for s in plan.epilogues:
        domains = domains.union(isl.UnionSet.from_set(s.domain))
    return replace(plan, schedule_map=plan.schedule_map.subtract_domain(domains), epilogues=())
