"""Convolution operands staged channels-last for the Hopper tensor-core kernels.

A bf16 convolution over NCHW arrays reads its windows (`x[n][c][p + r][q + s]`) along neither
GEMM index in runs the tensor cores can take: the input runs along the output row and only
three taps along K, the weights (`w[k][c][r][s]`) run along (c, r, s). The warp-level MMA
kernel then gathers every element on its own (see decisions: GPU convolutions staged
channels-last). Staged, the window reads a copy of its array with the channels last, the
weights a copy with the channels last, and the reduction runs with c innermost: a TMA-fed
window GEMM, 16-byte runs along K in both operands. A zero-padded copy that only this GEMM
reads is itself laid out channels-last instead of copied twice.

A 1 x 1 whose rows of positions are no 16-byte runs (stride 2: `x[n][c][2p][2q]`; 14 x 14
and 7 x 7 images) copies only the cells it reads, `x_cl[n][p][q][c]`; one with such rows
reads x as it is (`planning._gemm_dims` makes the images a batch of B). The copies are layout
transposes (`planning.transpose_loops`: 32 x 32 shared-memory tiles).

The rewrite changes the order in which the products of one output are summed (c innermost);
everything else is the same loop nest: the reference of the user's nest checks the kernels."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

from polydl.ir import (
    Access,
    Binary,
    Index,
    IntConst,
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
from polydl.target.gpu import GpuTarget

# 16 bytes of bf16: the runs TMA boxes and cp.async copy
RUN = 8
T = TypeVar("T")


@dataclass(frozen=True)
class WindowGemm:
    """A top-level perfect nest `y[..] += a[..] * b[..]` whose channel loop `channel` indexes
    one dimension of each operand on its own (`a_dim`, `b_dim`)."""

    index: int  # its place in the nest's body
    loops: tuple[Loop, ...]
    statement: Statement
    a: Access
    b: Access
    channel: str
    a_dim: int
    b_dim: int
    # A's cells as a grid of its own loops (a strided 1 x 1: x[n][c][2p][2q]): the copy takes
    # only the cells the GEMM reads, x_cl[n][p][q][c], not the whole array
    gathered: tuple[str, ...] = ()


def perfect_nest(node: Node) -> tuple[tuple[Loop, ...], Statement] | None:
    """The loops of a perfect nest from `node` down and its one statement; None otherwise."""
    loops: list[Loop] = []
    while isinstance(node, Loop):
        if len(node.body) != 1:
            return None
        loops.append(node)
        node = node.body[0]
    return (tuple(loops), node) if isinstance(node, Statement) else None


def _alone(acc: Access, var: str) -> int | None:
    """The one dimension whose subscript is exactly `var`, where no other mentions it."""
    dims = [d for d, e in enumerate(acc.indices) if var in int_vars(e)]
    if len(dims) != 1 or acc.indices[dims[0]] != IntVar(var):
        return None
    return dims[0]


def window_gemm(nest: LoopNest, params: dict[str, int], index: int) -> WindowGemm | None:
    """The body's node `index` as a GEMM worth staging, or None: bf16 operands, loops from 0
    in steps of 1, the reduction loops innermost, a channel loop that `_alone` finds in both
    operands over a multiple of 8 channels while A's channels are not its last dimension
    already, and a window along A's rows (its last subscript moves with another reduction
    loop: 3 x 3 taps) or A's cells a grid without 16-byte rows (`_grid`)."""
    found = perfect_nest(nest.body[index])
    if found is None:
        return None
    loops, stmt = found
    value = stmt.value
    if stmt.op != "+=" or not (isinstance(value, Binary) and value.op == "*"
                               and isinstance(value.left, Load) and isinstance(value.right, Load)):
        return None
    a, b = value.left.access, value.right.access
    if any(nest.array(x.array).dtype != "bfloat16" for x in (a, b)) or a.array == b.array:
        return None
    if stmt.target.array in (a.array, b.array):
        return None  # a copy taken before the sum would miss what it writes
    if any(lp.step != 1 or lp.lower != IntConst(0) or int_vars(lp.upper) - set(params) for lp in loops):
        return None
    outputs = set().union(*(int_vars(e) for e in stmt.target.indices))
    reduction = [lp.var for lp in loops if lp.var not in outputs]
    if not reduction or [lp.var for lp in loops[len(loops) - len(reduction):]] != reduction:
        return None
    extents = {lp.var: eval_int(lp.upper, params) for lp in loops}
    for channel in reduction:
        a_dim, b_dim = _alone(a, channel), _alone(b, channel)
        if a_dim is None or b_dim is None or a_dim == len(a.indices) - 1:
            continue
        if extents[channel] % RUN:
            continue
        taps = [v for v in int_vars(a.indices[-1]) & set(reduction) if v != channel and extents[v] > 1]
        if taps:
            return WindowGemm(index, loops, stmt, a, b, channel, a_dim, b_dim)
        gathered = _grid(a, extents, nest.array(a.array).concrete_shape(params), outputs)
        if gathered:
            return WindowGemm(index, loops, stmt, a, b, channel, a_dim, b_dim, gathered)
    return None


def _moving(expr: Index, extents: dict[str, int]) -> list[str]:
    return sorted(v for v in int_vars(expr) if extents.get(v, 2) > 1)


def _grid(acc: Access, extents: dict[str, int], shape: tuple[int, ...], outputs: set[str]) -> tuple[str, ...]:
    """The loops of `acc`'s subscripts, one each, where the cells it reads form a grid of
    those loops that the MMA kernel cannot copy in 16-byte runs: its last subscript strides
    (`2 * q`), or its rows of output positions run a number of cells 8 does not divide (a
    1 x 1 over 14 x 14 or 7 x 7 images); otherwise ()."""
    moving = [_moving(e, extents) for e in acc.indices]
    if any(len(m) > 1 for m in moving) or acc.is_indirect:
        return ()
    names = [m[0] for m in moving if m]
    if len(set(names)) != len(names) or not moving[-1]:
        return ()
    strides = []
    for e, m in zip(acc.indices, moving, strict=True):
        zeros = dict.fromkeys(int_vars(e), 0)
        strides.append(eval_int(e, {**zeros, m[0]: 1}) - eval_int(e, zeros) if m else 0)
    if strides[-1] > 1:
        return tuple(names)
    run = 1  # cells in a row of consecutive positions: whole trailing dimensions, then one
    for d in reversed(range(len(shape))):
        if strides[d] != 1 or moving[d][0] not in outputs:
            break
        run *= extents[moving[d][0]]
        if extents[moving[d][0]] != shape[d]:
            break
    return tuple(names) if run % RUN else ()


def _flat(expr: Index, extents: dict[str, int]) -> Index:
    """`expr` with the loops of one iteration (r = s = 0 of a 1 x 1 window) set to 0."""
    for v in int_vars(expr):
        if extents.get(v) == 1:
            expr = substitute(expr, v, IntConst(0))
    return expr


def _last(seq: tuple[T, ...], dim: int) -> tuple[T, ...]:
    """`seq` with element `dim` moved to the end."""
    return seq[:dim] + seq[dim + 1:] + (seq[dim],)


def only_copy(nest: LoopNest, array: str, reader: str) -> int | None:
    """The body index of the one top-level nest writing local `array` (a plain copy), where
    statement `reader` alone reads it."""
    if not nest.array(array).local:
        return None
    writers, readers = [], set()
    for i, node in enumerate(nest.body):
        for stmt, _ in walk_statements((node,)):
            if stmt.target.array == array:
                writers.append((i, stmt))
            readers |= {stmt.name for acc in expr_loads(stmt.value) if acc.array == array}
    if len(writers) != 1 or readers != {reader}:
        return None
    i, stmt = writers[0]
    plain = stmt.op == "=" and isinstance(stmt.value, Load) and stmt.value.access.array != array
    return i if plain and perfect_nest(nest.body[i]) else None  # its loops may then run in any order


def stage_channels_last(nest: LoopNest, params: dict[str, int], target: GpuTarget) -> LoopNest:
    """`nest` with every window GEMM reading channels-last copies of its operands (above), for
    targets whose TMA kernels take such windows; otherwise `nest` itself."""
    if not (target.tensor_memory_accelerator and target.warpgroup_mma):
        return nest
    staged = False
    index = 0
    while index < len(nest.body):
        g = window_gemm(nest, params, index)
        if g is None:
            index += 1
            continue
        nest, inserted = _staged(nest, params, g)
        staged = True
        index += inserted + 1
    if not staged:
        return nest
    return replace(nest, body=tuple(renumbered(list(nest.body))))


def _staged(nest: LoopNest, params: dict[str, int], g: WindowGemm) -> tuple[LoopNest, int]:
    """`nest` with window GEMM `g` staged, and the number of copy nests put before it."""
    body, arrays = list(nest.body), list(nest.arrays)

    def copy_name(source: str) -> str:  # generated names begin with _pd_ (polydl.names)
        return fresh_name(f"_pd_{source}_cl", {a.name for a in arrays})

    reads: dict[str, str] = {}  # operand array -> the array the GEMM reads instead
    copies: list[tuple[Node, str]] = []  # (copy nest, the array it reads)
    extents = {lp.var: lp.upper for lp in g.loops}
    if g.gathered:  # A's cells as a grid: the copy reads them where the GEMM would
        name = copy_name(g.a.array)
        grid = _last(g.gathered, g.gathered.index(g.channel))
        arrays.append(replace(nest.array(g.a.array), name=name, shape=tuple(extents[v] for v in grid),
                              is_input=False, local=True, filled=True, position=None))
        sizes = {lp.var: eval_int(lp.upper, params) for lp in g.loops}
        gathered = replace(g.a, indices=tuple(_flat(e, sizes) for e in g.a.indices))
        a_read = Access(name, tuple(IntVar(v) for v in grid))
        grid_loops = tuple(Loop(v, IntConst(0), extents[v], 1, ()) for v in grid)
        copies.append((_rebuilt(grid_loops, Statement("copy", a_read, "=", Load(gathered))), g.a.array))
    operands = [(g.b, g.b_dim)] if g.gathered else [(g.a, g.a_dim), (g.b, g.b_dim)]
    for acc, dim in operands:
        array = nest.array(acc.array)
        if acc is g.b and all(eval_int(e, params) == 1 for e in array.shape[dim + 1:]):
            continue  # its channels already run along K (a 1 x 1's w[k][c][0][0])
        moved = replace(array, shape=_last(array.shape, dim))
        writer = only_copy(nest, acc.array, g.statement.name)
        if writer is not None:  # the padded copy writes its cells channels-last, its
            # channel loop innermost as in the copies below
            padding_loops, padding = perfect_nest(body[writer])  # type: ignore[misc]
            target = replace(padding.target, indices=_last(padding.target.indices, dim))
            order = _innermost(padding_loops, int_vars(target.indices[-1]))
            body[writer] = _rebuilt(order, replace(padding, target=target))
            arrays = [moved if a.name == array.name else a for a in arrays]
            reads[acc.array] = acc.array
            continue
        name = copy_name(acc.array)
        arrays.append(replace(moved, name=name, is_input=False, local=True, filled=True, position=None))
        reads[acc.array] = name
        variables = [f"_pd_a{d}" for d in range(len(array.shape))]  # a nest of its own
        cell = Access(acc.array, tuple(IntVar(v) for v in variables))
        loops = tuple(Loop(v, IntConst(0), extent, 1, ()) for v, extent in zip(variables, array.shape, strict=True))
        copy = Statement("copy", Access(name, _last(cell.indices, dim)), "=", Load(cell))
        loops = _last(loops, dim)  # in the copy's order: its channels innermost
        copies.append((_rebuilt(loops, copy), acc.array))
    value = g.statement.value
    assert isinstance(value, Binary)
    a = a_read if g.gathered else replace(g.a, array=reads[g.a.array], indices=_last(g.a.indices, g.a_dim))
    b = g.b if g.b.array not in reads else replace(
        g.b, array=reads[g.b.array], indices=_last(g.b.indices, g.b_dim))
    stmt = replace(g.statement, value=replace(value, left=Load(a), right=Load(b)))
    # the channel loop innermost: the products of one output summed in another order
    body[g.index] = _rebuilt(_innermost(g.loops, {g.channel}), stmt)
    # each copy right after the last nest before the GEMM writing its source (at the start
    # for an input)
    gemm_at = g.index
    for node, source in copies:
        at = 1 + max((i for i, other in enumerate(body[:gemm_at])
                      if any(s.target.array == source for s, _ in walk_statements((other,)))), default=-1)
        body.insert(at, node)
        gemm_at += 1
    return replace(nest, arrays=tuple(arrays), body=tuple(body)), len(copies)


def _innermost(loops: tuple[Loop, ...], names: frozenset[str] | set[str]) -> tuple[Loop, ...]:
    """`loops` with those named in `names` moved innermost, each keeping its order."""
    return (tuple(lp for lp in loops if lp.var not in names)
            + tuple(lp for lp in loops if lp.var in names))


def _rebuilt(loops: tuple[Loop, ...], stmt: Statement) -> Node:
    node: Node = stmt
    for lp in reversed(loops):
        node = replace(lp, body=(node,))
    return node


def renumbered(body: list[Node]) -> list[Node]:
    """Statements named S0, S1, ... in source order again (copies were inserted)."""
    counter = iter(range(1 << 30))

    def walk(node: Node) -> Node:
        if isinstance(node, Statement):
            return replace(node, name=f"S{next(counter)}")
        return replace(node, body=tuple(walk(n) for n in node.body))

    return [walk(n) for n in body]
