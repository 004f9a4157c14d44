"""Convolution windows staged channels-last for the Hopper tensor-core kernels.

A bf16 convolution over NCHW arrays reads its windows (`x[n][c][p + r][q + s]`) along neither
GEMM index in runs the tensor cores can take: the input runs along the output row and only
three taps along K, the weights (`w[k][c][r][s]`) run along (c, r, s). The warp-level MMA
kernel then gathers every element on its own (a 3 x 3 layer at 0.1-0.25 of cuDNN, which
transposes too). Staged, the window reads a copy of its array with the channels last, the
weights a copy with the channels last, and the reduction runs with c innermost: a TMA-fed
window GEMM, 16-byte runs along K in both operands. The copies are layout transposes
(`transpose_loops`: 32 x 32 shared-memory tiles); a zero-padded copy that only this GEMM reads
is itself laid out channels-last instead of copied twice.

The rewrite changes the order in which the products of one output are summed (c innermost);
everything else is the same loop nest: the reference of the user's nest checks the kernels."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

from polydl.ir import (
    Access,
    Binary,
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
    walk_statements,
)
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


def _perfect(node: Node) -> tuple[tuple[Loop, ...], Statement] | None:
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
    """The body's node `index` as a window GEMM worth staging, or None: bf16 operands, loops
    from 0 in steps of 1, the reduction loops innermost, a channel loop that `_alone` finds in
    both operands over a multiple of 8 channels, and a window along A's rows (its last
    subscript moves with another reduction loop: 3 x 3 taps), while A's channels are not its
    last dimension already."""
    found = _perfect(nest.body[index])
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
    if any(lp.step != 1 or lp.lower != IntConst(0) or int_vars(lp.upper) - set(params) for lp in loops):
        return None
    outputs = set().union(*(int_vars(e) for e in stmt.target.indices))
    reduction = [lp.var for lp in loops if lp.var not in outputs]
    if not reduction or [lp.var for lp in loops[len(loops) - len(reduction):]] != reduction:
        return None
    for channel in reduction:
        a_dim, b_dim = _alone(a, channel), _alone(b, channel)
        if a_dim is None or b_dim is None or a_dim == len(a.indices) - 1:
            continue
        extents = {lp.var: eval_int(lp.upper, params) for lp in loops}
        taps = [v for v in int_vars(a.indices[-1]) & set(reduction) if v != channel and extents[v] > 1]
        if extents[channel] % RUN == 0 and taps:
            return WindowGemm(index, loops, stmt, a, b, channel, a_dim, b_dim)
    return None


def _last(seq: tuple[T, ...], dim: int) -> tuple[T, ...]:
    """`seq` with element `dim` moved to the end."""
    return seq[:dim] + seq[dim + 1:] + (seq[dim],)


def _only_copy(nest: LoopNest, array: str, reader: str) -> int | None:
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
    return i if stmt.op == "=" and isinstance(stmt.value, Load) and _perfect(nest.body[i]) else None


def _fresh(taken: set[str], stem: str) -> str:
    name, k = stem, 0
    while name in taken:
        k += 1
        name = f"{stem}{k}"
    taken.add(name)
    return name


def stage_channels_last(nest: LoopNest, params: dict[str, int], device: GpuTarget) -> LoopNest:
    """`nest` with every window GEMM reading channels-last copies of its operands (above), for
    devices whose TMA kernels take such windows; otherwise `nest` itself."""
    if not (device.tensor_memory_accelerator and device.warpgroup_mma):
        return nest
    taken = {a.name for a in nest.arrays} | set(nest.params) | {
        lp.var for _, chain in walk_statements(nest.body) for lp in chain if isinstance(lp, Loop)}
    staged = False
    index = 0
    while index < len(nest.body):
        g = window_gemm(nest, params, index)
        if g is None:
            index += 1
            continue
        nest, inserted = _staged(nest, g, taken)
        staged = True
        index += inserted + 1
    if not staged:
        return nest
    return replace(nest, body=tuple(_renumbered(list(nest.body))))


def _staged(nest: LoopNest, g: WindowGemm, taken: set[str]) -> tuple[LoopNest, int]:
    """`nest` with window GEMM `g` staged, and the number of copy nests put before it."""
    body, arrays = list(nest.body), list(nest.arrays)
    reads: dict[str, str] = {}
    copies: list[tuple[Node, str]] = []  # (copy nest, the array it reads)
    for acc, dim in ((g.a, g.a_dim), (g.b, g.b_dim)):
        array = nest.array(acc.array)
        moved = replace(array, shape=_last(array.shape, dim))
        writer = _only_copy(nest, acc.array, g.statement.name)
        if writer is not None:  # the padded copy writes its cells channels-last
            padding_loops, padding = _perfect(body[writer])  # type: ignore[misc]
            body[writer] = _rebuilt(padding_loops, replace(padding, target=replace(
                padding.target, indices=_last(padding.target.indices, dim))))
            arrays = [moved if a.name == array.name else a for a in arrays]
            reads[acc.array] = acc.array
            continue
        name = _fresh(taken, f"{acc.array}_cl")
        arrays.append(replace(moved, name=name, is_input=False, local=True, filled=True, position=None))
        reads[acc.array] = name
        variables = [_fresh(taken, f"{acc.array}{d}") for d in range(len(array.shape))]
        cell = Access(acc.array, tuple(IntVar(v) for v in variables))
        loops = tuple(Loop(v, IntConst(0), extent, 1, ()) for v, extent in zip(variables, array.shape, strict=True))
        copy = Statement("copy", Access(name, _last(cell.indices, dim)), "=", Load(cell))
        copies.append((_rebuilt(loops, copy), acc.array))
    value = g.statement.value
    assert isinstance(value, Binary)
    a = replace(g.a, array=reads[g.a.array], indices=_last(g.a.indices, g.a_dim))
    b = replace(g.b, array=reads[g.b.array], indices=_last(g.b.indices, g.b_dim))
    stmt = replace(g.statement, value=replace(value, left=Load(a), right=Load(b)))
    # the channel loop innermost: the products of one output summed in another order
    order = tuple(lp for lp in g.loops if lp.var != g.channel) + tuple(lp for lp in g.loops if lp.var == g.channel)
    body[g.index] = _rebuilt(order, stmt)
    # each copy right after the last nest writing its source (at the start for an input)
    for node, source in copies:
        at = 1 + max((i for i, other in enumerate(body)
                      if any(s.target.array == source for s, _ in walk_statements((other,)))), default=-1)
        body.insert(at, node)
    return replace(nest, arrays=tuple(arrays), body=tuple(body)), len(copies)


def _rebuilt(loops: tuple[Loop, ...], stmt: Statement) -> Node:
    node: Node = stmt
    for lp in reversed(loops):
        node = replace(lp, body=(node,))
    return node


def _renumbered(body: list[Node]) -> list[Node]:
    """Statements named S0, S1, ... in source order again (copies were inserted)."""
    counter = iter(range(1 << 30))

    def walk(node: Node) -> Node:
        if isinstance(node, Statement):
            return replace(node, name=f"S{next(counter)}")
        return replace(node, body=tuple(walk(n) for n in node.body))

    return [walk(n) for n in body]
