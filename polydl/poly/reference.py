"""Plain numpy evaluation of a loop nest: the independent reference every kernel is checked against.

Takes a `PolyModel`; returns a function that evaluates the nest in place on a dict of numpy
arrays, in the original statement order, computing in float64 (integer values in int64, with
C's integer division, each stored value converted to its array's type). It runs the inner loops of a
statement as one numpy operation only where that cannot change the result: the statement is the
only one in those loops and no dependence between its instances inside them exists other than
accumulation into its own target (`+=` becomes `np.add.at`). A top-level loop whose iterations
are independent (`vector_loops`) runs its body once for all its iterations. Everything else runs
loop by loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import islpy as isl
import numpy as np

from polydl.dtypes import DTYPES, bf16_to_f32, f32_to_bf16
from polydl.errors import IndexRangeError
from polydl.ir import (
    Access,
    Binary,
    Call,
    Condition,
    Const,
    Expr,
    Guard,
    IndexValue,
    Indirect,
    IntBinary,
    IntConst,
    IntExpr,
    IntMinMax,
    IntNeg,
    IntOp,
    IntVar,
    Load,
    Loop,
    Node,
    Select,
    Statement,
    ToFloat,
    ToInt,
    Unary,
    expr_loads,
    int_vars,
)
from polydl.poly.counting import count_points
from polydl.poly.dependences import dependences_of
from polydl.poly.model import PolyModel, StatementModel

# Largest number of statement instances evaluated as one numpy operation (memory bound).
MAX_BATCH_POINTS = 1 << 22

_UFUNCS: dict[str, Callable[..., np.ndarray]] = {
    "expf": np.exp,
    "logf": np.log,
    "sqrtf": np.sqrt,
    "tanhf": np.tanh,
    "fabsf": np.abs,
    "sinf": np.sin,
    "cosf": np.cos,
    "erff": np.vectorize(math.erf, otypes=[np.float64]),
    "fmaxf": np.fmax,
    "fminf": np.fmin,
    "powf": np.power,
}

_STORE_UFUNC = {"+=": np.add, "-=": np.subtract, "*=": np.multiply, "/=": np.divide}

_COMPARE = {
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
    "==": np.equal,
    "!=": np.not_equal,
}


def batch_depth(s: StatementModel) -> int:
    """The outermost loop depth from which the statement's loops may run as one batch."""
    write = s.write.relation
    target = s.statement.target.array
    same_array_reads = [
        a.relation
        for a in s.accesses[1:]
        if a.access.array == target and not (s.statement.op != "=" and a.access is s.statement.target)
    ]
    # Fixing more iterators removes pairs, so the first depth without a conflict is the answer.
    n = len(s.iterators)
    for depth in range(n + 1):
        if not _conflicts(s, write, same_array_reads, depth):
            return depth
    return n


def _conflicts(s: StatementModel, write: isl.Map, reads: list[isl.Map], depth: int) -> bool:
    """True if two distinct instances agreeing on the first `depth` iterators conflict."""
    n = len(s.iterators)
    distinct = isl.Map.identity(isl.Space.map_from_set(s.domain.get_space())).complement()
    for d in range(depth):
        distinct = distinct.equate(isl.dim_type.in_, d, isl.dim_type.out, d)
    distinct = distinct.intersect_domain(s.domain).intersect_range(s.domain)
    for r in reads:
        if not write.apply_range(r.reverse()).intersect(distinct).is_empty():
            return True
    if s.statement.op == "=" and n > 0:
        if not write.apply_range(write.reverse()).intersect(distinct).is_empty():
            return True
    return False


def vector_loops(model: PolyModel) -> frozenset[int]:
    """Top-level loops (by position in the nest's body) whose iterations are independent:
    no dependence joins two of them, and no bound or condition inside reads the loop's
    variable. The reference runs their body once, for all iterations at once (a softmax's
    rows, a stencil's time loop aside)."""
    deps = dependences_of(model).all
    out = set()
    for index, node in enumerate(model.nest.body):
        if not isinstance(node, Loop) or node.var in _inner_control_vars(node.body):
            continue
        names = {s.name for s in model.statements if s.group == index}
        if names and not _crosses_outer(deps, names):
            out.add(index)
    return frozenset(out)


def _inner_control_vars(nodes: tuple[Node, ...]) -> set[str]:
    """Variables read by the bounds and conditions of the loops and guards in `nodes`."""
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, Loop):
            out |= int_vars(node.lower) | int_vars(node.upper)
        elif isinstance(node, Guard):
            for c in node.conditions:
                out |= int_vars(c.left) | int_vars(c.right)
        if not isinstance(node, Statement):
            out |= _inner_control_vars(node.body)
    return out


def _crosses_outer(deps: isl.UnionMap, names: set[str]) -> bool:
    """Whether a dependence among the named statements joins two values of their first
    iterator."""
    found = False

    def check(m: isl.Map) -> None:
        nonlocal found
        if m.get_tuple_name(isl.dim_type.in_) in names and m.get_tuple_name(isl.dim_type.out) in names:
            same = m.equate(isl.dim_type.in_, 0, isl.dim_type.out, 0)
            found |= not m.subtract(same).is_empty()

    deps.foreach_map(check)
    return found


def python_steps(model: PolyModel) -> int:
    """How many numpy operations the reference runs (one per iteration of the loops it does
    not batch): what its running time follows."""
    vectors = vector_loops(model)
    steps = 0
    for s in model.statements:
        outer = 1 if s.group in vectors else 0
        depth = max(batch_depth(s), outer)
        domain = s.domain
        kept = domain.project_out(isl.dim_type.set, depth, len(s.iterators) - depth)
        steps += count_points(kept.project_out(isl.dim_type.set, 0, outer)) if depth else 1
    return steps


def make_reference(model: PolyModel) -> Callable[[dict[str, np.ndarray]], None]:
    nest = model.nest
    depths = {s.name: batch_depth(s) for s in model.statements}
    params = dict(model.params)
    vectors = vector_loops(model)

    def run(arrays: dict[str, np.ndarray]) -> None:
        work = {name: _to_work(arr, nest.array(name).dtype) for name, arr in arrays.items()}
        for local in nest.locals:
            work[local.name] = np.zeros(local.concrete_shape(params), dtype=np.float64)
        env = {k: np.array([v], dtype=np.int64) for k, v in params.items()}
        evaluator = _Evaluator(work, depths, {a.name: a.dtype for a in nest.arrays})
        for index, node in enumerate(nest.body):
            if index in vectors:
                evaluator.vector_loop(node, env)
            else:
                evaluator.node(node, env, 0)
        for arr in nest.outputs:
            out = arrays[arr.name]
            if arr.dtype == "bfloat16":
                out[...] = f32_to_bf16(work[arr.name].astype(np.float32)).view(out.dtype)
            else:
                out[...] = work[arr.name].astype(out.dtype)

    return run


def _to_work(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return bf16_to_f32(arr.view(np.uint16)).astype(np.float64)
    if DTYPES[dtype].is_integer:
        return arr.astype(np.int64)
    return arr.astype(np.float64)


def _as_integer(values: np.ndarray, dtype: str) -> np.ndarray:
    """`values` converted to the integer `dtype` as C converts (a float rounded toward zero,
    an integer keeping its low bits), held in int64."""
    values = np.asarray(values)
    with np.errstate(all="ignore"):
        if values.dtype.kind == "f":
            values = np.trunc(values).astype(np.int64)
        return values.astype(DTYPES[dtype].numpy).astype(np.int64)


def _c_division(a: np.ndarray, b: np.ndarray, op: str) -> np.ndarray:
    """C's integer `a / b` or `a % b` (toward zero), with `ir.IntOp`'s values at 0 and -1."""
    a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
    special = (b == 0) | (b == -1)
    divisor = np.where(special, 1, b)
    with np.errstate(all="ignore"):
        quotient = np.floor_divide(a, divisor)
        # floor and truncation differ where the exact quotient is negative and not whole
        quotient = quotient + ((a - quotient * divisor != 0) & ((a < 0) != (divisor < 0)))
        if op == "%":
            return np.where(special, 0, a - quotient * divisor)
        return np.where(b == 0, 0, np.where(b == -1, np.negative(a), quotient))


class _TooLarge(Exception):
    pass


class _Evaluator:
    def __init__(self, arrays: dict[str, np.ndarray], depths: dict[str, int],
                 dtypes: dict[str, str]) -> None:
        self.arrays = arrays
        self.depths = depths
        self.integer = {name for name, d in dtypes.items() if DTYPES[d].is_integer}
        self.dtypes = dtypes

    def body(self, nodes: tuple[Node, ...], env: dict[str, np.ndarray], depth: int) -> None:
        for node in nodes:
            self.node(node, env, depth)

    def node(self, node: Node, env: dict[str, np.ndarray], depth: int) -> None:
        if isinstance(node, Statement):
            self.store(node, env)
        elif isinstance(node, Guard):
            if all(_cond(c, env).all() for c in node.conditions):
                self.body(node.body, env, depth)
        else:
            single = _single_statement(node)
            # a statement the model dropped (it never runs at these sizes) takes the plain loop
            if single is not None and depth >= self.depths.get(single.name, len(self.depths) + 99):
                try:
                    points = _expand(node, env)
                except _TooLarge:
                    points = None
                if points is not None:
                    if np.broadcast_shapes(*(v.shape for v in points.values()))[0]:
                        self.store(single, points)
                    return
            lo = int(_int(node.lower, env)[0])
            hi = int(_int(node.upper, env)[0])
            for value in range(lo, hi, node.step):
                inner = dict(env)
                inner[node.var] = np.array([value], dtype=np.int64)
                self.body(node.body, inner, depth + 1)

    def vector_loop(self, loop: Node, env: dict[str, np.ndarray]) -> None:
        """Run the body once with the loop variable holding all its values."""
        assert isinstance(loop, Loop)
        lo = int(_int(loop.lower, env)[0])
        hi = int(_int(loop.upper, env)[0])
        if hi <= lo:
            return
        inner = dict(env)
        inner[loop.var] = np.arange(lo, hi, loop.step, dtype=np.int64)
        self.body(loop.body, inner, 1)

    def store(self, s: Statement, env: dict[str, np.ndarray]) -> None:
        target = self.arrays[s.target.array]
        # one entry per statement instance: a subscript that does not vary over the batched
        # loops (O[0] += ...) must still be applied once per instance
        # (at least one instance: a statement outside every loop runs once)
        shape = np.broadcast_shapes((1,), *(v.shape for v in env.values()))
        index = tuple(np.broadcast_to(self.subscript(s.target, d, env), shape)
                      for d in range(len(s.target.indices)))
        value = np.broadcast_to(self.value(s.value, env), shape)
        if not index:
            index = (np.zeros(shape, dtype=np.int64),)
            target = target.reshape(1)
        if s.target.array in self.integer:
            self._store_integer(s, target, index, value)
        elif s.op == "=":
            target[index] = value
        elif s.op in ("+=", "-=") and value.size > 1:
            _accumulate(target, index, value, s.op == "-=")
        else:
            _STORE_UFUNC[s.op].at(target, index, value)

    def _store_integer(self, s: Statement, target: np.ndarray, index: tuple[np.ndarray, ...],
                       value: np.ndarray) -> None:
        """A store into an integer array: the value computed in the operands' type, converted
        to the element type. The C frontend writes every such update as `=` (so that no
        instance of it is batched with another of the same cell); `+=`, `-=` and `*=` are
        exact modulo the width in any order, and the rest are taken one cell at a time."""
        dtype = self.dtypes[s.target.array]
        if s.op == "=":
            target[index] = _as_integer(value, dtype)
            return
        if value.dtype.kind != "f" and s.op in ("+=", "-=", "*="):
            ufunc = {"+=": np.add, "-=": np.subtract, "*=": np.multiply}[s.op]
            with np.errstate(all="ignore"):
                ufunc.at(target, index, value.astype(np.int64))
            target[index] = _as_integer(target[index], dtype)
            return
        current = target[index]
        if value.dtype.kind != "f":
            updated = _c_division(current, value, "/")
        else:
            with np.errstate(all="ignore"):
                updated = _STORE_UFUNC[s.op](current.astype(np.float64), value)
        target[index] = _as_integer(updated, dtype)

    def subscript(self, acc: Access, d: int, env: dict[str, np.ndarray]) -> np.ndarray:
        """The values of subscript `d` of `acc`; one read from an index array checked against
        the dimension's extent, as the kernels check it."""
        index = acc.indices[d]
        if not isinstance(index, Indirect):
            return _int(index, env)
        values = np.asarray(self.value(Load(index.access), env), dtype=np.int64) + index.offset
        extent = self.arrays[acc.array].shape[d]
        bad = (values < 0) | (values >= extent)
        if bad.any():
            source = self.arrays[index.access.array]
            flat = np.broadcast_to(sum((self.subscript(index.access, k, env) * stride
                                        for k, stride in enumerate(_strides(source))),
                                       np.zeros(1, dtype=np.int64)), values.shape)
            first = int(flat[bad].min())
            value = int(source.reshape(-1)[first])
            where = tuple(int(p) for p in np.unravel_index(first, source.shape)) if source.ndim else ()
            raise IndexRangeError(index.access.array, where, value, acc.array, d, extent,
                                  index.offset)
        return values

    def value(self, e: Expr, env: dict[str, np.ndarray]) -> np.ndarray:
        if isinstance(e, Const):
            return np.float64(e.value)  # type: ignore[return-value]  # a scalar broadcasts as an array
        if isinstance(e, Load):
            arr = self.arrays[e.access.array]
            if not e.access.indices:
                return arr.reshape(1)[np.zeros(1, dtype=np.int64)]
            # one flat offset per point, then `take`: faster than a multi-index gather
            flat: np.ndarray | int = 0
            for d, stride in enumerate(_strides(arr)):
                flat = flat + self.subscript(e.access, d, env) * stride
            return np.take(arr.reshape(-1), flat)
        if isinstance(e, IndexValue):
            return _int(e.expr, env)
        if isinstance(e, IntOp):
            a, b = self.value(e.left, env), self.value(e.right, env)
            if e.op in ("/", "%"):
                return _c_division(a, b, e.op)
            with np.errstate(all="ignore"):  # int64 wraps, as the kernels' long does in practice
                return a + b if e.op == "+" else a - b if e.op == "-" else a * b
        if isinstance(e, ToFloat):
            return self.value(e.operand, env).astype(np.float64)
        if isinstance(e, ToInt):
            return _as_integer(self.value(e.operand, env), e.dtype)
        if isinstance(e, Unary):
            return -self.value(e.operand, env)
        if isinstance(e, Binary):
            a = np.asarray(self.value(e.left, env), dtype=np.float64)
            b = np.asarray(self.value(e.right, env), dtype=np.float64)
            with np.errstate(all="ignore"):
                if e.op == "+":
                    return a + b
                if e.op == "-":
                    return a - b
                if e.op == "*":
                    return a * b
                return a / b
        if isinstance(e, Call):
            with np.errstate(all="ignore"):
                return _UFUNCS[e.function](
                    *(np.asarray(self.value(a, env), dtype=np.float64) for a in e.args))
        if isinstance(e, Select):
            test = _COMPARE[e.op](self.value(e.left, env), self.value(e.right, env))
            return np.where(test, self.value(e.if_true, env), self.value(e.if_false, env))
        raise TypeError(e)


def _strides(arr: np.ndarray) -> tuple[int, ...]:
    """Element strides of a C-contiguous array."""
    return tuple(s // arr.itemsize for s in arr.strides)


def _accumulate(target: np.ndarray, index: tuple[np.ndarray, ...], value: np.ndarray,
                subtract: bool) -> None:
    """`target[index] += value` with repeated cells summed (what `np.add.at` does), by one
    `bincount` over the span of cells the batch touches: several times faster on the large
    reductions of a GEMM or a convolution."""
    flat = np.ravel_multi_index(tuple(np.ravel(i) for i in index), target.shape)
    low = int(flat.min())
    sums = np.bincount(flat - low, weights=np.ravel(value).astype(np.float64, copy=False))
    view = target.reshape(-1)  # the work arrays are contiguous float64: a view, not a copy
    if subtract:
        view[low:low + len(sums)] -= sums
    else:
        view[low:low + len(sums)] += sums


def _single_statement(loop: Loop) -> Statement | None:
    """The statement if `loop` holds exactly one, through loops and guards only."""
    found: list[Statement] = []

    def walk(nodes: tuple[Node, ...]) -> None:
        for n in nodes:
            if isinstance(n, Statement):
                found.append(n)
            else:
                walk(n.body)

    walk(loop.body)
    return found[0] if len(found) == 1 else None


def _expand(node: Node, env: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """Every instance of the single statement under `node`, as arrays of iterator values."""
    if isinstance(node, Statement):
        return env
    if isinstance(node, Guard):
        size = max((len(v) for v in env.values()), default=1)
        mask = np.ones(size, dtype=bool)
        for c in node.conditions:
            mask &= np.broadcast_to(_cond(c, env), mask.shape)
        # values the batch shares (sizes, fixed outer iterators) stay one element, unless no
        # point is left: then every value is empty
        env = {k: v if len(v) == 1 and size > 1 and mask.any() else np.broadcast_to(v, mask.shape)[mask]
               for k, v in env.items()}
        for child in node.body:
            return _expand(child, env)
        return env
    assert isinstance(node, Loop)
    size = max((len(v) for v in env.values()), default=1)
    lo = np.broadcast_to(_int(node.lower, env), (size,))
    hi = np.broadcast_to(_int(node.upper, env), (size,))
    counts = np.maximum(0, -((lo - hi) // node.step))
    total = int(counts.sum())
    if total > MAX_BATCH_POINTS:
        raise _TooLarge
    if size and (counts == counts[0]).all() and (lo == lo[0]).all():
        # a rectangular loop: every outer point takes the same values (an outer product);
        # values the batch shares stay one element
        count = int(counts[0])
        repeat = {k: v if len(v) == 1 and total else np.repeat(np.broadcast_to(v, (size,)), count)
                  for k, v in env.items()}
        repeat[node.var] = np.tile(lo[0] + node.step * np.arange(count, dtype=np.int64), size)
    else:
        repeat = {k: np.repeat(np.broadcast_to(v, (size,)), counts) for k, v in env.items()}
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        repeat[node.var] = np.repeat(lo, counts) + node.step * (np.arange(total) - starts)
    for child in node.body:
        return _expand(child, repeat)
    return repeat


def _cond(c: Condition, env: dict[str, np.ndarray]) -> np.ndarray:
    return _COMPARE[c.op](_int(c.left, env), _int(c.right, env))


def _int(e: IntExpr, env: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(e, IntConst):
        return np.array([e.value], dtype=np.int64)
    if isinstance(e, IntVar):
        return env[e.name]
    if isinstance(e, IntNeg):
        return -_int(e.operand, env)
    if isinstance(e, IntMinMax):
        vals = [_int(a, env) for a in e.args]
        out = vals[0]
        for v in vals[1:]:
            out = np.minimum(out, v) if e.op == "min" else np.maximum(out, v)
        return out
    assert isinstance(e, IntBinary)
    a, b = _int(e.left, env), _int(e.right, env)
    if e.op == "+":
        return a + b
    if e.op == "-":
        return a - b
    if e.op == "*":
        return a * b
    if e.op == "/":
        return np.floor_divide(a, b)
    return np.mod(a, b)


__all__ = ["make_reference", "batch_depth", "expr_loads", "python_steps", "vector_loops"]
