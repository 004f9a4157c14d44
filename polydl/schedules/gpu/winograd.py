"""3 x 3 convolutions of stride 1 on the GPU's FMA units by Winograd's F(m x m, 3 x 3).

A float32 window GEMM `y[n][k][p][q] += x[n][c][p + r][q + s] * w[k][c][r][s]` (its dimensions
in any order: NCHW or channels-last) does 9 multiply-adds an output and input channel; the
FMA kernels that read its windows ran well behind cuDNN, which runs Winograd there (see
decisions: Winograd on the GPU's FMA units). The rewrite puts in its place, as loop nests
that the GPU schedule plans like any other:
1. `U[xi][k][c] = (G w[k][c] G^T)[xi]` for every (k, c): the weights' transform, every call,
2. `V[xi][c][t] = (B^T d B)[xi]` for every m x m tile t of every image and channel,
3. `M[xi][k][t] = sum_c U[xi][k][c] V[xi][c][t]`: (m+2)^2 GEMMs, batched,
4. `y = A^T M A` of every tile, cut at the output's edges.
The (m+2)^2 statements of each transform share their loops, so `planning.sibling_groups` runs them
as one kernel (a tile read once, the sums they share computed once). The statement that sets
y before the sum (`y = 0`, `y = b[k]`) and the element-wise ones after it on the same cells
(bias, ReLU, a residual add) are folded into the output transform's store, as the CPU
post-ops are: one write of y, no separate passes. Products are summed in another order and
rounded in the transforms (`schedules.winograd` gives the error); the reference of the user's
nest checks the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

from polydl.ir import (
    Access,
    Binary,
    Condition,
    Const,
    Expr,
    Guard,
    Index,
    Indirect,
    IntBinary,
    IntConst,
    IntExpr,
    IntVar,
    Load,
    Loop,
    LoopNest,
    Node,
    Statement,
    eval_int,
    expr_loads,
    int_vars,
    substitute,
    walk_statements,
)
from polydl.names import fresh_name
from polydl.schedules.gpu.staging import only_copy, perfect_nest, renumbered
from polydl.schedules.winograd import MATRICES, combination
from polydl.target.gpu import GpuTarget

# Tiles of one call below which the direct kernel stays: the products are then (m+2)^2 thin
# GEMMs and the five launches cost more than they save.
MIN_TILES = 512
MIN_CHANNELS = 16


@dataclass(frozen=True)
class Window3x3:
    """A perfect nest `y[..] += a[..] * b[..]` that is a 3 x 3 correlation of stride 1: the
    roles of its loops (n, k, p, q outputs; c, r, s reductions) and of each operand dimension."""

    index: int  # its place in the nest's body
    loops: tuple[Loop, ...]
    statement: Statement
    x: Access  # the window operand: n, c, p + r, q + s
    w: Access  # the weights: k, c, r, s
    role: dict[str, str]  # role ("n", "k", "p", "q", "c", "r", "s") -> loop variable
    extent: dict[str, int]  # role -> trip count


def _exact(expr: Index, variables: tuple[str, ...]) -> bool:
    """Whether `expr` is exactly the sum of `variables` (each once, no constant)."""
    if isinstance(expr, Indirect):
        return False
    if set(int_vars(expr)) != set(variables):
        return False
    zeros = dict.fromkeys(variables, 0)
    return eval_int(expr, zeros) == 0 and all(eval_int(expr, {**zeros, v: 1}) == 1 for v in variables) \
        and eval_int(expr, dict.fromkeys(variables, 1)) == len(variables)


def _roles(target: Access, x: Access, w: Access, reduction: set[str]) -> dict[str, str] | None:
    """role -> loop variable where the subscripts have the window's form, else None."""
    plain = [e.name for e in target.indices if isinstance(e, IntVar)]
    if len(plain) != 4 or len(set(plain)) != 4 or len(w.indices) != 4 or len(x.indices) != 4:
        return None
    w_plain = [e.name for e in w.indices if isinstance(e, IntVar)]
    if len(w_plain) != 4:
        return None
    k = [v for v in w_plain if v in plain]
    c = [v for v in w_plain if v in reduction]
    if len(k) != 1 or len(c) != 3:
        return None
    x_plain = [e.name for e in x.indices if isinstance(e, IntVar)]
    sums = [e for e in x.indices if not isinstance(e, IntVar)]
    if len(x_plain) != 2 or len(sums) != 2:
        return None
    n = [v for v in x_plain if v in plain and v != k[0]]
    channel = [v for v in x_plain if v in reduction]
    if len(n) != 1 or len(channel) != 1:
        return None
    taps = [v for v in c if v != channel[0]]
    outputs = [v for v in plain if v not in (n[0], k[0])]
    pairs = []
    for e in sums:
        found = [(o, t) for o in outputs for t in taps if _exact(e, (o, t))]
        if len(found) != 1:
            return None
        pairs.append(found[0])
    (p, r), (q, s) = pairs
    if len({p, q}) != 2 or len({r, s}) != 2:
        return None
    return {"n": n[0], "k": k[0], "p": p, "q": q, "c": channel[0], "r": r, "s": s}


def window_3x3(nest: LoopNest, params: dict[str, int], index: int) -> Window3x3 | None:
    """The body's node `index` as a float32 3 x 3 correlation of stride 1, or None."""
    found = perfect_nest(nest.body[index])
    if found is None:
        return None
    loops, stmt = found
    value = stmt.value
    if stmt.op != "+=" or len(loops) != 7 or not (
            isinstance(value, Binary) and value.op == "*"
            and isinstance(value.left, Load) and isinstance(value.right, Load)):
        return None
    if any(lp.step != 1 or lp.lower != IntConst(0) or int_vars(lp.upper) - set(params) for lp in loops):
        return None
    outputs = {e.name for e in stmt.target.indices if isinstance(e, IntVar)}
    reduction = {lp.var for lp in loops} - outputs
    for x, w in ((value.left.access, value.right.access), (value.right.access, value.left.access)):
        arrays = {x.array, w.array, stmt.target.array}
        if len(arrays) != 3 or any(nest.array(a).dtype != "float32" for a in arrays):
            return None
        role = _roles(stmt.target, x, w, reduction)
        if role is None:
            continue
        extent = {name: eval_int(next(lp.upper for lp in loops if lp.var == var), params)
                  for name, var in role.items()}
        if extent["r"] != 3 or extent["s"] != 3:
            return None
        return Window3x3(index, loops, stmt, x, w, role, extent)
    return None


def tile_size(P: int, Q: int) -> int:
    """F(4x4) (a quarter of the direct multiplications) from 12 outputs a side, its tiles cut
    at the edge where they do not divide the output, else F(2x2) (one tile an image leaves the
    products too thin). See decisions: Winograd on the GPU's FMA units."""
    return 4 if min(P, Q) >= 12 else 2


def winograd_convolutions(nest: LoopNest, params: dict[str, int], target: GpuTarget) -> LoopNest:
    """`nest` with every 3 x 3 float32 correlation of stride 1 that pays computed by
    Winograd's F(m x m, 3 x 3) (above), for FMA kernels (not where TF32 is allowed: the tensor
    cores take those); otherwise `nest` itself."""
    if target.allow_tf32:
        return nest
    changed = False
    index = 0
    while index < len(nest.body):
        g = window_3x3(nest, params, index)
        rewritten = _rewritten(nest, params, g) if g is not None else None
        if rewritten is None:
            index += 1
            continue
        nest, index = rewritten
        changed = True
    return replace(nest, body=tuple(renumbered(list(nest.body)))) if changed else nest


def _iv(name: str) -> IntVar:
    return IntVar(name)


def _plus(*terms: IntExpr) -> IntExpr:
    out = terms[0]
    for term in terms[1:]:
        out = IntBinary("+", out, term)
    return out


def _times(factor: int, term: IntExpr) -> IntExpr:
    return IntBinary("*", IntConst(factor), term)


def _nest(loops: list[tuple[str, int]], body: tuple[Node, ...]) -> Node:
    node: Node | None = None
    for var, extent in reversed(loops):
        node = Loop(var, IntConst(0), IntConst(extent), 1, body if node is None else (node,))
    assert node is not None
    return node


def _at(access: Access, by_role: dict[str, IntExpr], role: dict[str, str]) -> Access:
    """`access` with the loop variable of each role in `by_role` replaced by its expression
    (which mentions new variables only, so the replacements do not interfere)."""
    indices = access.indices
    for name, expr in by_role.items():
        indices = substitute(indices, role[name], expr)
    return Access(access.array, indices)


def _replaced(expr: Any, cell: Access, by: Expr) -> Any:
    """`expr` with every load of `cell` replaced by `by`."""
    if isinstance(expr, Load) and expr.access == cell:
        return by
    if isinstance(expr, tuple):
        return tuple(_replaced(e, cell, by) for e in expr)
    if is_dataclass(expr) and not isinstance(expr, type) and not isinstance(expr, Access):
        return replace(expr, **{f.name: _replaced(getattr(expr, f.name), cell, by) for f in fields(expr)
                                if f.name != "position"})
    return expr


def _same_cells(node: Node, g: Window3x3, params: dict[str, int]) -> Statement | None:
    """The statement of `node` where it is a perfect nest over exactly the window's output
    loops (same variables, same trip counts) that updates the window's target cell."""
    found = perfect_nest(node)
    if found is None:
        return None
    loops, stmt = found
    outputs = {g.role[r]: g.extent[r] for r in ("n", "k", "p", "q")}
    if len(loops) != 4 or any(lp.step != 1 or lp.lower != IntConst(0) for lp in loops):
        return None
    if {lp.var: eval_int(lp.upper, params) for lp in loops if not int_vars(lp.upper) - set(params)} != outputs:
        return None
    return stmt if stmt.target == g.statement.target else None


def _written(nest: LoopNest) -> set[str]:
    return {s.target.array for s, _ in walk_statements(nest.body)}


def _reads_only_inputs(stmt: Statement, cell: Access, written: set[str]) -> bool:
    """Whether `stmt` reads nothing the nest writes but the cell it updates."""
    return all(a == cell or a.array not in written for a in expr_loads(stmt.value))


def _rewritten(nest: LoopNest, params: dict[str, int], g: Window3x3) -> tuple[LoopNest, int] | None:
    """`nest` with window `g` computed by Winograd, and the body index after its nests; None
    where it does not pay or its input cannot be read in whole tiles."""
    e = g.extent
    N, K, C, P, Q = e["n"], e["k"], e["c"], e["p"], e["q"]
    if min(C, K) < MIN_CHANNELS:
        return None
    arrays = list(nest.arrays)
    body = list(nest.body)
    x_array = nest.array(g.x.array)
    shape = list(x_array.concrete_shape(params))
    dims = {name: next(d for d, sub in enumerate(g.x.indices) if g.role[name] in int_vars(sub))
            for name in ("p", "q")}
    # the last tiles may read past the input: it then grows where it is a scratch copy that
    # this window alone reads (a padded copy, zeros past the data); otherwise the tiles must fit
    growable = only_copy(nest, g.x.array, g.statement.name) is not None
    first = tile_size(P, Q)
    for m in (first, 6 - first):
        TH, TW = -(-P // m), -(-Q // m)
        need = {"p": TH * m + 2, "q": TW * m + 2}
        if growable or all(need[name] <= shape[dims[name]] for name in need):
            break
    else:
        return None
    alpha = m + 2
    T = N * TH * TW
    if T < MIN_TILES:
        return None
    if any(need[name] > shape[dims[name]] for name in need):
        for name in need:
            shape[dims[name]] = max(shape[dims[name]], need[name])
        grown = replace(x_array, shape=tuple(IntConst(v) for v in shape), filled=False)
        arrays = [grown if a.name == x_array.name else a for a in arrays]
    taken = {a.name for a in arrays} | set(params) | {
        lp.var for s, enclosing in walk_statements(nest.body) for lp in enclosing if isinstance(lp, Loop)}

    def scratch(base: str, extents: tuple[int, ...]) -> str:
        name = fresh_name(f"_pd_{base}", taken)
        taken.add(name)
        arrays.append(replace(x_array, name=name, shape=tuple(IntConst(v) for v in extents),
                              is_input=False, local=True, filled=True, position=None))
        return name

    BT, G, AT = MATRICES[m]
    u = scratch("wino_u", (alpha * alpha, K, C))
    v = scratch("wino_v", (alpha * alpha, C, T))
    mm = scratch("wino_m", (alpha * alpha, K, T))
    # loop variables: names the generated code keeps (not _pd_, which the code generators use)
    n, k, c, th, tw, xi, t = (fresh_name(f"wino_{base}", taken) for base in ("n", "k", "c", "th", "tw", "xi", "t"))
    tile = _plus(_times(TW, _plus(_times(TH, _iv(n)), _iv(th))), _iv(tw))
    # 1. U = G w G^T
    taps = [[Load(_at(g.w, {"k": _iv(k), "c": _iv(c), "r": IntConst(r), "s": IntConst(s)}, g.role))
             for s in range(3)] for r in range(3)]
    weights = []
    for a in range(alpha):
        rows = [combination(G[a], [taps[r][s] for r in range(3)]) for s in range(3)]
        for b in range(alpha):
            cell = Access(u, (IntConst(a * alpha + b), _iv(k), _iv(c)))
            weights.append(Statement("U", cell, "=", combination(G[b], rows)))
    # 2. V = B^T d B, a tile of one channel
    d = [[Load(_at(g.x, {"n": _iv(n), "c": _iv(c), "p": _plus(_times(m, _iv(th)), IntConst(i)),
                         "q": _plus(_times(m, _iv(tw)), IntConst(j)), "r": IntConst(0),
                         "s": IntConst(0)}, g.role))
          for j in range(alpha)] for i in range(alpha)]
    inputs = []
    for a in range(alpha):
        columns = [combination(BT[a], [d[i][j] for i in range(alpha)]) for j in range(alpha)]
        for b in range(alpha):
            cell = Access(v, (IntConst(a * alpha + b), _iv(c), tile))
            inputs.append(Statement("V", cell, "=", combination(BT[b], columns)))
    # 3. the products, from zero
    product = Binary("*", Load(Access(u, (_iv(xi), _iv(k), _iv(c)))), Load(Access(v, (_iv(xi), _iv(c), _iv(t)))))
    products = [
        _nest([(xi, alpha * alpha), (k, K), (t, T)],
              (Statement("M0", Access(mm, (_iv(xi), _iv(k), _iv(t))), "=", Const(0.0)),)),
        _nest([(xi, alpha * alpha), (k, K), (t, T), (c, C)],
              (Statement("M", Access(mm, (_iv(xi), _iv(k), _iv(t))), "+=", product),)),
    ]
    # 4. Y = A^T M A, with the statements around the sum that set or update its cells folded in
    start, end = g.index, g.index + 1
    written = _written(nest)
    init = _same_cells(body[start - 1], g, params) if start > 0 else None
    if init is not None and not (init.op == "=" and all(a.array not in written for a in expr_loads(init.value))):
        init = None
    if init is not None:
        start -= 1
    after: list[Statement] = []
    while end < len(body):
        stmt = _same_cells(body[end], g, params)
        if stmt is None or stmt.op not in ("=", "+=", "-=", "*=") \
                or not _reads_only_inputs(stmt, g.statement.target, written):
            break
        after.append(stmt)
        end += 1
    sums = [[Load(Access(mm, (IntConst(i * alpha + j), _iv(k), tile))) for j in range(alpha)]
            for i in range(alpha)]
    outputs: list[Node] = []
    for a in range(m):
        for b in range(m):
            rows = [combination(AT[b], sums[i]) for i in range(alpha)]
            value: Expr = combination(AT[a], rows)
            at = {"n": _iv(n), "k": _iv(k), "p": _plus(_times(m, _iv(th)), IntConst(a)),
                  "q": _plus(_times(m, _iv(tw)), IntConst(b))}
            cell = _at(g.statement.target, at, g.role)

            def here(expr: Expr, at: dict[str, IntExpr] = at) -> Expr:
                for name in ("n", "k", "p", "q"):
                    expr = substitute(expr, g.role[name], at[name])
                return expr

            op = "+="
            if init is not None:
                op, value = "=", Binary("+", here(init.value), value)
            for stmt in after:
                if op == "+=":
                    op, value = "=", Binary("+", Load(cell), value)
                update = _replaced(here(stmt.value), cell, value)
                value = update if stmt.op == "=" else Binary(stmt.op[0], value, update)
            store: Node = Statement("Y", cell, op, value)
            cut = [Condition("<", at[name], IntConst(e[name]))
                   for name, size, last in (("p", P, a), ("q", Q, b)) if size % m and last >= size % m]
            if cut:
                store = Guard(tuple(cut), (store,))
            outputs.append(store)
    nests = [
        _nest([(k, K), (c, C)], tuple(weights)),
        _nest([(n, N), (c, C), (th, TH), (tw, TW)], tuple(inputs)),
        *products,
        _nest([(n, N), (k, K), (th, TH), (tw, TW)], tuple(outputs)),
    ]
    body[start:end] = nests
    return replace(nest, arrays=tuple(arrays), body=tuple(body)), start + len(nests)
