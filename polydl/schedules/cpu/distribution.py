"""Isolate GEMM-shaped statements of imperfect loop nests, so a microkernel can take them.

Takes a `PolyModel`; returns the model of an equivalent nest (or the same model when nothing
changes). Two rewrites, both exact:

- **Distribution.** A loop nest holding a multiply-accumulate statement (`C += A*B`, with the
  loops of a GEMM) beside others, such as BLAS's `C[i][j] *= beta` inside the `i` loop or an
  initialisation `C[i][j] = 0` around the `k` loop, is split into one nest per strongly
  connected component of its statements' dependence graph, in an order that keeps every
  dependence (Kennedy and Allen's loop distribution). It happens only where the GEMM statement
  is a component of its own.
- **Scaled operands.** `C += alpha * A * B` (a call-time scalar or a literal times two loads)
  reads a scaled copy of `A`, computed once before the nest, `A' = alpha * A`, so the
  statement is `C += A' * B`: the products are the same floating-point values, since C
  evaluates `alpha * A` first. Only where nothing in the nest writes `A`.

The reference the kernel is checked against runs the nest as written.
"""

from __future__ import annotations

import weakref
from dataclasses import replace

import islpy as isl

from polydl.ir import (
    Access,
    Array,
    Binary,
    Const,
    Expr,
    IntConst,
    IntVar,
    Load,
    Loop,
    LoopNest,
    Node,
    Statement,
    access_vars,
)
from polydl.names import fresh_name
from polydl.poly.dependences import dependences_of
from polydl.poly.model import PolyModel, StatementModel, build_model

GEMM_LOOPS = 3  # m, n and k


def isolate_gemms(model: PolyModel) -> PolyModel:
    """The model of the nest with its GEMM statements distributed and unscaled (cached)."""
    if model not in _ISOLATED:
        nest = _scale_operands(_distribute(model))
        _ISOLATED[model] = model if nest is model.nest else build_model(nest, model.params)
    return _ISOLATED[model]


_ISOLATED: weakref.WeakKeyDictionary[PolyModel, PolyModel] = weakref.WeakKeyDictionary()


# ------------------------------------------------------------------------------- distribution


def is_gemm_shaped(statement: Statement, depth: int) -> bool:
    """`C += X * Y` (or with a scalar factor) inside at least the three loops of a GEMM, each
    operand indexed as a GEMM's: by a loop that C and one operand follow and the other does not
    (m, n), and by one both operands follow and C does not (k). A gather or scatter through an
    index array is none (no microkernel reads it), nor a dot product `s += d * d`."""
    if statement.op != "+=" or depth < GEMM_LOOPS or statement.is_indirect:
        return False
    form = _product_loads(statement.value)
    if form is None:
        return False
    c, x, y = (access_vars(a) for a in (statement.target, form[1].access, form[2].access))
    return bool((c & x) - y and (c & y) - x and (x & y) - c)


def _distribute(model: PolyModel) -> LoopNest:
    nest = model.nest
    by_group: dict[int, list[StatementModel]] = {}
    for s in model.statements:
        by_group.setdefault(s.group, []).append(s)
    body: list[Node] = []
    changed = False
    for index, node in enumerate(nest.body):
        parts = _components(model, node, by_group.get(index, []))
        changed |= len(parts) > 1
        body += [_prune(node, part) for part in parts] if len(parts) > 1 else [node]
    return replace(nest, body=tuple(body)) if changed else nest


def _components(model: PolyModel, node: Node, statements: list[StatementModel]) -> list[set[str]]:
    """The statement sets the top-level `node` splits into, in execution order; one set when
    it stays whole."""
    written = [s for s, _ in _walk(node)]
    if len(statements) < 2 or len(statements) != len(written):
        return [{s.name for s in statements}]  # a statement that never runs: leave the nest
    if not any(is_gemm_shaped(s.statement, len(s.loops)) for s in statements):
        return [{s.name for s in statements}]
    names = [s.name for s in statements]
    edges = _statement_edges(model, set(names))
    sccs = _strongly_connected(names, edges)
    lonely_gemm = any(
        len(c) == 1 and is_gemm_shaped(model.statement(next(iter(c))).statement,
                                       len(model.statement(next(iter(c))).loops))
        for c in sccs
    )
    if len(sccs) < 2 or not lonely_gemm:
        return [set(names)]
    return _topological(sccs, edges, names)


def _statement_edges(model: PolyModel, names: set[str]) -> set[tuple[str, str]]:
    edges: set[tuple[str, str]] = set()

    def add(m: isl.Map) -> None:
        src = m.get_tuple_name(isl.dim_type.in_)
        dst = m.get_tuple_name(isl.dim_type.out)
        if src != dst and src in names and dst in names and not m.is_empty():
            edges.add((src, dst))

    dependences_of(model).all.foreach_map(add)
    return edges


def _strongly_connected(names: list[str], edges: set[tuple[str, str]]) -> list[set[str]]:
    """Components by mutual reachability (few statements: the quadratic closure is fine)."""
    reach = {n: {n} for n in names}
    changed = True
    while changed:
        changed = False
        for a, b in edges:
            new = reach[b] - reach[a]
            if new:
                reach[a] |= new
                changed = True
        for n in names:
            for m in list(reach[n]):
                new = reach[m] - reach[n]
                if new:
                    reach[n] |= new
                    changed = True
    out: list[set[str]] = []
    for n in names:
        if not any(n in c for c in out):
            out.append({m for m in names if m in reach[n] and n in reach[m]})
    return out


def _topological(
    sccs: list[set[str]], edges: set[tuple[str, str]], names: list[str]
) -> list[set[str]]:
    """The components in dependence order, ties broken by textual order."""
    first = {i: min(names.index(n) for n in c) for i, c in enumerate(sccs)}
    owner = {n: i for i, c in enumerate(sccs) for n in c}
    preds = {i: {owner[a] for a, b in edges if owner[b] == i and owner[a] != i} for i in first}
    done: list[int] = []
    while len(done) < len(sccs):
        ready = [i for i in first if i not in done and preds[i] <= set(done)]
        done.append(min(ready, key=first.__getitem__))
    return [sccs[i] for i in done]


def _walk(node: Node) -> list[tuple[Statement, int]]:
    if isinstance(node, Statement):
        return [(node, 0)]
    return [(s, d + isinstance(node, Loop)) for child in node.body for s, d in _walk(child)]


def _prune(node: Node, keep: set[str]) -> Node:
    pruned = _pruned(node, keep)
    assert pruned is not None
    return pruned


def _pruned(node: Node, keep: set[str]) -> Node | None:
    if isinstance(node, Statement):
        return node if node.name in keep else None
    body = tuple(p for child in node.body if (p := _pruned(child, keep)) is not None)
    return replace(node, body=body) if body else None


# ---------------------------------------------------------------------------- scaled operands


def _is_scalar(expr: Expr) -> bool:
    return isinstance(expr, Const) or (isinstance(expr, Load) and not expr.access.indices)


def _product_loads(value: Expr) -> tuple[Expr | None, Load, Load, int] | None:
    """`(scale, X, Y, scaled)` for `X * Y` and the forms with one scalar factor; `scaled` is
    0 when the scale multiplies X first, 1 when it multiplies Y (`scale` None: no scale)."""
    if not (isinstance(value, Binary) and value.op == "*"):
        return None
    left, right = value.left, value.right
    if _indexed(left) and _indexed(right):
        return None, left, right, 0  # type: ignore[return-value]
    if isinstance(left, Binary) and left.op == "*" and _indexed(right):
        if _is_scalar(left.left) and _indexed(left.right):  # (s * X) * Y
            return left.left, left.right, right, 0  # type: ignore[return-value]
        if _indexed(left.left) and _is_scalar(left.right):  # (X * s) * Y
            return left.right, left.left, right, 0  # type: ignore[return-value]
    if isinstance(right, Binary) and right.op == "*" and _indexed(left):
        if _is_scalar(right.left) and _indexed(right.right):  # X * (s * Y)
            return right.left, left, right.right, 1  # type: ignore[return-value]
    return None


def _indexed(expr: Expr) -> bool:
    return isinstance(expr, Load) and bool(expr.access.indices)


def _scale_operands(nest: LoopNest) -> LoopNest:
    return _OperandScaling(nest).run()


class _OperandScaling:
    """Rewrites `C += s * X * Y` to read a scaled copy of X made by a nest placed before."""

    def __init__(self, nest: LoopNest) -> None:
        self.nest = nest
        self.written = {s.target.array for s in nest.statements()}
        self.arrays = {a.name: a for a in nest.arrays}
        self.names = {s.name for s in nest.statements()}
        self.copies: list[Array] = []
        self.prepared: list[Node] = []

    def run(self) -> LoopNest:
        body: list[Node] = []
        for node in self.nest.body:
            self.prepared = []
            node = self._rewrite(node, 0)
            body += self.prepared + [node]
        if not self.copies:
            return self.nest
        return replace(self.nest, arrays=self.nest.arrays + tuple(self.copies), body=tuple(body))

    def _rewrite(self, node: Node, depth: int) -> Node:
        if isinstance(node, Statement):
            return self._unscaled(node, depth)
        inner = depth + isinstance(node, Loop)
        return replace(node, body=tuple(self._rewrite(c, inner) for c in node.body))

    def _unscaled(self, s: Statement, depth: int) -> Statement:
        form = _product_loads(s.value) if is_gemm_shaped(s, depth) else None
        if form is None:
            return s
        scale, x, y, which = form
        if scale is None:
            return s
        operand = (x, y)[which]
        source = self.arrays[operand.access.array]
        if source.name in self.written or (
            isinstance(scale, Load) and scale.access.array in self.written
        ):
            return s  # the copy made before the nest would miss a write inside it
        copy = Array(fresh_name(f"_pd_{source.name}_scaled", set(self.arrays)), source.dtype,
                     source.shape, is_input=False, position=source.position, local=True,
                     filled=True)
        self.arrays[copy.name] = copy
        self.copies.append(copy)
        name = fresh_name(f"S{len(self.names)}", self.names)
        self.names.add(name)
        self.prepared.append(_scale_nest(name, copy, source, scale, s))
        scaled = Load(Access(copy.name, operand.access.indices, operand.access.position))
        return replace(s, value=Binary("*", scaled, y) if which == 0 else Binary("*", x, scaled))


def _scale_nest(name: str, copy: Array, source: Array, scale: Expr, at: Statement) -> Node:
    """`for a0 .. for an: copy[a0..an] = scale * source[a0..an]` over the whole array."""
    dims = tuple(f"_pd_a{d}" for d in range(len(source.shape)))
    index = tuple(IntVar(d) for d in dims)
    node: Node = Statement(
        name, Access(copy.name, index), "=",
        Binary("*", scale, Load(Access(source.name, index))), at.position,
    )
    for d, extent in reversed(list(zip(dims, source.shape, strict=True))):
        node = Loop(d, IntConst(0), extent, 1, (node,), at.position)
    return node
