"""Lower a `LoopNest` with bound size parameters to isl: domains, accesses, original schedule.

Takes a `LoopNest` and the size-parameter values; returns a `PolyModel` whose sets and maps are
concrete (parameters substituted), so that every later count (`card()`) is a number.
Statement instance `S3[i, j, k]` has the statement's enclosing loop variables as its tuple, and
the original execution order is the classic 2d+1 schedule `[pos0, i, pos1, j, pos2, k, pos3]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

import islpy as isl

from polydl.errors import SpecError
from polydl.ir import (
    Access,
    Condition,
    Guard,
    Indirect,
    IntExpr,
    Loop,
    LoopNest,
    Node,
    Statement,
)
from polydl.names import respell
from polydl.poly.counting import count_points
from polydl.poly.index_range import check_array_sizes, check_index_ranges
from polydl.poly.rounding import check_index_division

SetOrMap = TypeVar("SetOrMap", isl.Set, isl.Map)


@dataclass(frozen=True, eq=False)
class AccessModel:
    access: Access
    is_write: bool
    relation: isl.Map  # statement instance -> array cell, restricted to the domain

    @property
    def is_may(self) -> bool:
        """Whether the relation holds every cell an instance may touch rather than the one it
        does: a subscript read from an index array (`Indirect`) spans its whole dimension."""
        return self.access.is_indirect


@dataclass(frozen=True, eq=False)
class StatementModel:
    statement: Statement
    group: int  # index of the top-level node (loop nest) the statement belongs to
    loops: tuple[Loop, ...]  # enclosing loops, outermost first
    positions: tuple[int, ...]  # textual position at each depth (len(loops) + 1 entries)
    domain: isl.Set
    accesses: tuple[AccessModel, ...]

    @property
    def name(self) -> str:
        return self.statement.name

    @property
    def iterators(self) -> tuple[str, ...]:
        return tuple(loop.var for loop in self.loops)

    @property
    def flops(self) -> int:
        """Floating-point operations of all the statement's instances."""
        return count_points(self.domain) * self.statement.flops

    @property
    def write(self) -> AccessModel:
        return next(a for a in self.accesses if a.is_write)

    def original_schedule(self, width: int) -> isl.Map:
        """`S[i,j] -> [p0, i, p1, j, p2, 0, 0 ...]` padded to `width` output dimensions."""
        out: list[str] = []
        for depth, var in enumerate(self.iterators):
            out += [str(self.positions[depth]), var]
        out.append(str(self.positions[len(self.iterators)]))
        out += ["0"] * (width - len(out))
        its = ", ".join(self.iterators)
        return isl.Map(f"{{ {self.name}[{its}] -> [{', '.join(out)}] }}").intersect_domain(
            self.domain
        )


@dataclass(frozen=True, eq=False)
class PolyModel:
    nest: LoopNest
    params: dict[str, int]
    statements: tuple[StatementModel, ...]
    extents: dict[str, isl.Set] = field(repr=False)  # array name -> set of its cells

    def statement(self, name: str) -> StatementModel:
        return next(s for s in self.statements if s.name == name)

    @cached_property
    def flops(self) -> int:
        return sum(s.flops for s in self.statements)

    @cached_property
    def schedule_width(self) -> int:
        return 2 * max((len(s.loops) for s in self.statements), default=0) + 1

    @cached_property
    def original_schedule(self) -> isl.UnionMap:
        return _union_map(s.original_schedule(self.schedule_width) for s in self.statements)

    @cached_property
    def domains(self) -> isl.UnionSet:
        out = isl.UnionSet("{ }")
        for s in self.statements:
            out = out.union(isl.UnionSet.from_set(s.domain))
        return out

    def _accesses(self, write: bool) -> isl.UnionMap:
        return _union_map(
            a.relation for s in self.statements for a in s.accesses if a.is_write == write
        )

    @cached_property
    def writes(self) -> isl.UnionMap:
        """Every cell each instance may write (scatters through an index array included)."""
        return self._accesses(True)

    @cached_property
    def must_writes(self) -> isl.UnionMap:
        """The cells each instance certainly writes: the writes less the scatters."""
        return _union_map(a.relation for s in self.statements for a in s.accesses
                          if a.is_write and not a.is_may)

    @cached_property
    def may_writes(self) -> isl.UnionMap:
        """The scatters' writes: any cell of an indexed dimension (`AccessModel.is_may`)."""
        return _union_map(a.relation for s in self.statements for a in s.accesses
                          if a.is_write and a.is_may)

    @cached_property
    def reads(self) -> isl.UnionMap:
        return self._accesses(False)


def _union_map(maps) -> isl.UnionMap:
    out = isl.UnionMap("{ }")
    for m in maps:
        out = out.union(isl.UnionMap.from_map(m))
    return out


def _bind(text: str, params: dict[str, int], kind: type[SetOrMap]) -> SetOrMap:
    """Parse an isl object written over the size parameters and substitute their values."""
    names = list(params)
    head = f"[{', '.join(names)}] -> " if names else ""
    obj = kind(head + text)
    if names:
        ctx = isl.Set(head + "{ : " + " and ".join(f"{n} = {v}" for n, v in params.items()) + " }")
        obj = obj.intersect_params(ctx).project_out(isl.dim_type.param, 0, len(names))
    return obj


def _loop_constraints(loop: Loop) -> list[str]:
    v = loop.var
    cons = [f"{loop.lower.to_isl()} <= {v}", f"{v} < {loop.upper.to_isl()}"]
    if loop.step != 1:
        # i = lower + step * e: written with mod so the lower bound may be a max(); isl
        # accepts `(v - lower) mod step = 0` only for affine lower bounds, so fall back to
        # an existential when lower contains min/max.
        cons.append(f"exists (e: {v} = {loop.lower.to_isl()} + {loop.step}e)")
    return cons


def _condition_constraints(cond: Condition) -> list[str]:
    if cond.op == "!=":
        raise SpecError("'!=' is not allowed in an affine condition")
    return [cond.to_isl()]


def _flatten_guards(body: tuple[Node, ...]) -> list[tuple[Loop | Statement, tuple[Condition, ...]]]:
    """Inline guard bodies into the enclosing sequence, carrying their conditions along.

    A guard opens no loop depth, so its children take consecutive positions among their
    siblings in the 2d+1 schedule."""
    out: list[tuple[Loop | Statement, tuple[Condition, ...]]] = []
    for node in body:
        if isinstance(node, Guard):
            out.extend((child, node.conditions + inner)
                       for child, inner in _flatten_guards(node.body))
        else:
            out.append((node, ()))
    return out


def build_model(nest: LoopNest, params: dict[str, int]) -> PolyModel:
    """Lower the nest to isl and prove that every access stays inside its array."""
    check_array_sizes(nest, params)
    extents: dict[str, isl.Set] = {}
    for arr in nest.arrays:
        dims = [f"a{d}" for d in range(len(arr.shape))]
        cons = " and ".join(
            f"0 <= {d} < {e.to_isl()}" for d, e in zip(dims, arr.shape, strict=True)
        )
        extents[arr.name] = _bind(f"{{ {arr.name}[{', '.join(dims)}] : {cons or 'true'} }}",
                                  params, isl.Set)

    statements: list[StatementModel] = []

    def visit(
        body: tuple[Node, ...],
        group: int | None,
        loops: tuple[Loop, ...],
        positions: tuple[int, ...],
        constraints: tuple[str, ...],
        conditions: tuple[Condition, ...],
    ) -> None:
        for index, (node, guard_conditions) in enumerate(_flatten_guards(body)):
            g = index if group is None else group
            pos = positions + (index,)
            cons = constraints + tuple(c for cond in guard_conditions
                                       for c in _condition_constraints(cond))
            if isinstance(node, Loop):
                visit(node.body, g, loops + (node,), pos, cons + tuple(_loop_constraints(node)),
                      conditions + guard_conditions)
            else:
                model = _statement_model(nest, params, node, g, loops, pos, cons, extents)
                check_index_division(nest, params, node, loops, model.domain,
                                     conditions + guard_conditions)
                statements.append(model)

    visit(nest.body, None, (), (), (), ())
    # A statement that never runs at these sizes (e.g. a guard no iteration meets) has no
    # effect; later stages measure domains and need them non-empty.
    statements = [s for s in statements if not s.domain.is_empty()]
    check_index_ranges(nest, params, ((s.statement, s.loops, s.domain) for s in statements))
    if not statements:
        sizes = ", ".join(f"{k}={v}" for k, v in params.items())
        raise nest.error_at(
            respell(f"no statement of '{nest.name}' runs at {sizes or 'these sizes'}: every "
                    "iteration domain is empty, so the kernel would do nothing"),
            nest.statements()[0].position if nest.statements() else None
        )
    return PolyModel(nest=nest, params=dict(params), statements=tuple(statements), extents=extents)


def _statement_model(
    nest: LoopNest,
    params: dict[str, int],
    stmt: Statement,
    group: int,
    loops: tuple[Loop, ...],
    positions: tuple[int, ...],
    constraints: tuple[str, ...],
    extents: dict[str, isl.Set],
) -> StatementModel:
    its = ", ".join(loop.var for loop in loops)
    domain = _bind(
        f"{{ {stmt.name}[{its}] : {' and '.join(constraints) or 'true'} }}", params, isl.Set
    )
    shapes = {a.name: a.shape for a in nest.arrays}
    accesses = [AccessModel(stmt.target, True,
                            _access_map(stmt, stmt.target, its, params, domain, shapes))]
    for acc in stmt.reads:
        accesses.append(AccessModel(acc, False, _access_map(stmt, acc, its, params, domain, shapes)))
    model = StatementModel(stmt, group, loops, positions, domain, tuple(accesses))
    for relation in model.accesses:
        _prove_in_bounds(nest, model, relation, extents[relation.access.array])
    return model


def _access_map(
    stmt: Statement, acc: Access, its: str, params: dict[str, int], domain: isl.Set,
    nest_shape: dict[str, tuple[IntExpr, ...]],
) -> isl.Map:
    # a subscript read from an index array may select any cell of its dimension: a fresh
    # variable bounded by the extent (the kernel checks each value at run time)
    shape = nest_shape[acc.array]
    idx = ", ".join(f"_pd_cell{d}" if isinstance(i, Indirect) else i.to_isl()
                    for d, i in enumerate(acc.indices))
    spans = [f"0 <= _pd_cell{d} < {shape[d].to_isl()}"
             for d, i in enumerate(acc.indices) if isinstance(i, Indirect)]
    rel = _bind(f"{{ {stmt.name}[{its}] -> {acc.array}[{idx}] : {' and '.join(spans) or 'true'} }}",
                params, isl.Map)
    return rel.intersect_domain(domain)


def _prove_in_bounds(nest: LoopNest, model: StatementModel, acc: AccessModel, extent: isl.Set) -> None:
    outside = acc.relation.subtract_range(extent)
    if outside.is_empty():
        return
    point = outside.domain().sample_point()
    iteration = _point_values(point, len(model.iterators))
    env = dict(zip(model.iterators, iteration, strict=True))
    cell = outside.intersect_domain(isl.Set.from_point(point)).range().sample_point()
    index = _point_values(cell, len(acc.access.indices))
    arr = nest.array(acc.access.array)
    shape = "x".join(respell(_fmt_extent(e)) for e in arr.shape)
    at = ", ".join(f"{k}={v}" for k, v in env.items()) or "the only iteration"
    verb = "writes" if acc.is_write else "reads"
    raise nest.error_at(
        respell(f"access {_fmt_access(acc.access)} {verb} outside array '{arr.name}' "
                f"(extent {shape}) at iteration {at}: index [{', '.join(map(str, index))}]"),
        acc.access.position or model.statement.position
    )


def _point_values(point: isl.Point, n: int) -> list[int]:
    return [point.get_coordinate_val(isl.dim_type.set, d).to_python() for d in range(n)]


def _fmt_extent(e: IntExpr) -> str:
    return e.to_c()


def _fmt_access(acc: Access) -> str:
    return acc.array + "".join(f"[{i.to_c()}]" for i in acc.indices)
