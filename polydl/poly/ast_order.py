"""The order in which an isl AST runs its statement instances, as a schedule map.

isl's AST generator can print code that breaks the order of the schedule tree it is given
(seen on a tree whose outer band steps its statements by different strides, 4i and 6i, above a
band that orders them by constants): the code generator checks the AST it will print, not only
the tree. Takes an `isl.AstNode`; returns `{ S[i...] -> [time] }`, where the time interleaves each
enclosing block's position with each enclosing loop's iterator, so that its lexicographic order
is the order in which the code runs the instances.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polydl.poly.isl_parts import out_width

# Loop iterators of the generated code start with "_t" (the frontends reject user names with
# "_"), then the loop's depth.
ITERATOR_PREFIX = "_t"

_OP = isl.ast_expr_op_type
_BINARY: dict[object, str] = {_OP.add: "+", _OP.sub: "-", _OP.mul: "*"}
_COMPARE: dict[object, str] = {_OP.eq: "=", _OP.le: "<=", _OP.lt: "<", _OP.ge: ">=", _OP.gt: ">"}
# islpy's type stubs lack the members named after C keywords (and_, or_)
_LOGIC: dict[object, str] = {_OP.and_: "and", _OP.and_then: "and",  # type: ignore[attr-defined]
                             _OP.or_: "or", _OP.or_else: "or"}  # type: ignore[attr-defined]


class Unreadable(Exception):
    """An AST expression with no isl syntax (a select, a call): its order is not checked."""


@dataclass(frozen=True)
class _Place:
    """Where a node sits: its enclosing loops' iterators, its time so far, the conditions it
    runs under (isl syntax over the iterators)."""

    iterators: tuple[str, ...] = ()
    time: tuple[str, ...] = ()
    conditions: tuple[str, ...] = ()

    def at(self, position: int) -> _Place:
        return _Place(self.iterators, (*self.time, str(position)), self.conditions)

    def under(self, condition: str) -> _Place:
        return _Place(self.iterators, self.time, (*self.conditions, condition))


def tree_ast(tree: isl.Schedule) -> isl.AstNode:
    """isl's AST of a schedule tree, its loops' iterators named `ITERATOR_PREFIX` and their
    depth: the one code is printed from and the one checked here, built once (isl takes
    seconds on some trees; `_ASTS`)."""
    key = tree.to_str()
    node = _ASTS.get(key)
    if node is None:
        ctx = tree.get_ctx()
        # a tree's bands may have been tiled and split: its map's width, plus room, bounds
        # the loops on any path
        width = out_width(tree.get_map()) + 8
        iterators = isl.IdList.alloc(ctx, width)
        for d in range(width):
            iterators = iterators.add(isl.Id(f"{ITERATOR_PREFIX}{d}", context=ctx))
        build = isl.AstBuild.from_context(isl.Set("{ : }")).set_iterators(iterators)
        node = build.node_from_schedule(tree)
        if len(_ASTS) >= _KEPT_ASTS:
            _ASTS.pop(next(iter(_ASTS)))
        _ASTS[key] = node
    return node


# the ASTs of the last trees built, by the tree's text
_ASTS: dict[str, isl.AstNode] = {}
_KEPT_ASTS = 16


def ast_schedule(root: isl.AstNode) -> isl.UnionMap | None:
    """The AST's order of execution over its statement instances (None where an expression
    has no isl syntax)."""
    parts: list[tuple[str, list[str], _Place]] = []
    try:
        _collect(root, _Place(), parts)
    except Unreadable:
        return None
    if not parts:
        return None
    width = max(len(place.time) for _, _, place in parts)
    out: isl.UnionMap | None = None
    for name, args, place in parts:
        time = [*place.time, *("0" for _ in range(width - len(place.time)))]
        loops = ", ".join(place.iterators)
        where = " and ".join(place.conditions) or "true"
        instances = isl.Map(f"{{ [{loops}] -> {name}[{', '.join(args)}] : {where} }}")
        times = isl.Map(f"{{ [{loops}] -> [{', '.join(time)}] }}")
        part = isl.UnionMap.from_map(instances.reverse().apply_range(times))
        out = part if out is None else out.union(part)
    return out


def _collect(node: isl.AstNode, place: _Place, parts: list[tuple[str, list[str], _Place]]) -> None:
    kind = node.get_type()
    if kind == isl.ast_node_type.block:
        children = node.block_get_children()
        for i in range(children.n_ast_node()):
            _collect(children.get_at(i), place.at(i), parts)
    elif kind == isl.ast_node_type.for_:  # type: ignore[attr-defined]
        it = node.for_get_iterator().get_id().get_name()
        init = _value(node.for_get_init())
        step = _value(node.for_get_inc())
        inside = _Place((*place.iterators, it), (*place.time, it), place.conditions)
        inside = inside.under(f"{it} >= {init}").under(_test(node.for_get_cond()))
        if step != "1":
            inside = inside.under(f"({it} - ({init})) mod {step} = 0")
        _collect(node.for_get_body(), inside.at(0), parts)
    elif kind == isl.ast_node_type.if_:  # type: ignore[attr-defined]
        condition = _test(node.if_get_cond())
        _collect(node.if_get_then_node(), place.under(condition), parts)
        if node.if_has_else_node():
            _collect(node.if_get_else_node(), place.under(f"not ({condition})"), parts)
    elif kind == isl.ast_node_type.mark:
        _collect(node.mark_get_node(), place, parts)
    elif kind == isl.ast_node_type.user:
        call = node.user_get_expr()
        name = call.get_op_arg(0).get_id().get_name()
        args = [_value(call.get_op_arg(i)) for i in range(1, call.get_op_n_arg())]
        parts.append((name, args, place.at(0)))
    else:
        raise Unreadable(str(kind))


def _value(e: isl.AstExpr) -> str:
    kind = e.get_type()
    if kind == isl.ast_expr_type.int:
        return str(e.get_val().to_python())
    if kind == isl.ast_expr_type.id:
        return e.get_id().get_name()
    op = e.get_op_type()
    args = [e.get_op_arg(i) for i in range(e.get_op_n_arg())]
    if op in _BINARY:
        return f"({_value(args[0])} {_BINARY[op]} {_value(args[1])})"
    if op == _OP.minus:
        return f"(-{_value(args[0])})"
    if op in (_OP.min, _OP.max):
        return f"{'min' if op == _OP.min else 'max'}({', '.join(_value(a) for a in args)})"
    if op in (_OP.fdiv_q, _OP.pdiv_q, _OP.div):  # the divisor is a constant in isl's ASTs
        return f"floor(({_value(args[0])}) / {_value(args[1])})"
    if op in (_OP.pdiv_r, _OP.zdiv_r):  # zdiv_r is only ever compared with 0
        return f"(({_value(args[0])}) mod {_value(args[1])})"
    raise Unreadable(str(op))


def _test(e: isl.AstExpr) -> str:
    if e.get_type() != isl.ast_expr_type.op:
        raise Unreadable("a condition that is no comparison")
    op = e.get_op_type()
    args = [e.get_op_arg(i) for i in range(e.get_op_n_arg())]
    if op in _COMPARE:
        return f"{_value(args[0])} {_COMPARE[op]} {_value(args[1])}"
    if op in _LOGIC:
        return f"(({_test(args[0])}) {_LOGIC[op]} ({_test(args[1])}))"
    raise Unreadable(str(op))


def keeps(order: isl.UnionMap, dependences: isl.UnionMap) -> bool:
    """Whether `order` (an `ast_schedule`) runs the source of every dependence before its sink:
    no dependence's time difference (sink's minus source's) is zero or lexicographically
    negative. The differences form one set, far smaller than the order's relation over all
    instance pairs; it is tested against one piece of "not positive" at a time."""
    differences = dependences.apply_domain(order).apply_range(order).deltas()
    if differences.is_empty():
        return True
    deltas = isl.Set.from_union_set(differences)
    names = [f"d{i}" for i in range(deltas.dim(isl.dim_type.set))]
    for first in range(len(names) + 1):  # the first non-zero difference is negative, or none is
        zero = [f"{n} = 0" for n in names[:first]]
        negative = [f"{names[first]} < 0"] if first < len(names) else []
        piece = isl.Set(f"{{ [{', '.join(names)}] : {' and '.join([*zero, *negative]) or 'true'} }}")
        if not deltas.intersect(piece).is_empty():
            return False
    return True
