"""Kernels of the statements that are not GEMMs: one thread a point of the thread loops
(`plain.j2`), or a layout copy by tiles through shared memory (`transpose.j2`).

Takes the model, a `GpuKernelPlan` without a GEMM and the statement printer; returns a
`KernelLaunch`. The C expressions of the statements come from `codegen.c_expr`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from polydl.codegen.c_expr import StatementPrinter
from polydl.codegen.gpu.launch import KernelLaunch, kernel_pointers
from polydl.codegen.templating import render
from polydl.ir import Guard, Loop
from polydl.poly.model import PolyModel
from polydl.schedules.gpu.plans import GpuKernelPlan

MAX_GRID_X = 1 << 20  # generic kernels loop over the rest (grid-stride)
TRANSPOSE_TILE = 32  # a warp's lanes along one side of a tile ...
TRANSPOSE_ROWS = 8  # ... and rows of threads a block


@dataclass(frozen=True)
class Comparison:
    left: str
    op: str
    right: str


@dataclass(frozen=True)
class Opener:
    """A sequential loop (`loop`) or a guard around a statement, as `nest.j2` opens it."""

    loop: bool
    var: str = ""
    lower: str = ""
    upper: str = ""
    step: int = 1
    conditions: tuple[Comparison, ...] = ()


@dataclass(frozen=True)
class Accumulator:
    """A reduction into one cell summed in a register `_pd_acc`, then added into the cell."""

    value: str  # the summand
    cell: str
    load: str  # the cell's value, as float
    op: str  # "+=" | "-="
    bf16: bool

    @property
    def sign(self) -> str:
        return self.op[0]


@dataclass(frozen=True)
class Sibling:
    openers: tuple[Opener, ...]
    statement: str


def _openers(enclosing: tuple[Loop | Guard, ...], mapped: set[str]) -> tuple[Opener, ...]:
    """The loops and guards around a statement, less the loops mapped to threads."""
    openers = []
    for node in enclosing:
        if isinstance(node, Loop) and node.var not in mapped:
            openers.append(Opener(True, node.var, node.lower.to_c(), node.upper.to_c(), node.step))
        elif isinstance(node, Guard):
            openers.append(Opener(False, conditions=tuple(
                Comparison(c.left.to_c(), c.op, c.right.to_c()) for c in node.conditions)))
    return tuple(openers)


def plain_kernel(model: PolyModel, plan: GpuKernelPlan, kernel: str, printer: StatementPrinter) -> KernelLaunch:
    """Threads over the product of the thread-loop extents, a block of `plan.block`."""
    total = math.prod(t.extent for t in plan.threads)
    mapped = {t.var for t in plan.threads}
    stmt = plan.statement.statement
    accumulator = None
    if plan.register_accumulator:
        accumulator = Accumulator(printer.expr(stmt.value), printer.element(stmt.target), printer.load(stmt.target),
                                  stmt.op, printer.layouts[stmt.target.array].dtype == "bfloat16")
    text = render(
        "gpu/plain.j2", kernel=kernel, block=plan.block, params=kernel_pointers(model), total=total,
        threads=list(reversed(plan.threads)),  # the innermost varies fastest
        openers=_openers(plan.enclosing, mapped), ctype=printer.ctype, accumulator=accumulator,
        statement=printer.statement(stmt) if accumulator is None else "",
        # every loop on threads: only guards open
        siblings=[Sibling(_openers(enclosing, mapped), printer.statement(sibling.statement))
                  for sibling, enclosing in plan.siblings],
    )
    grid = max(1, min(math.ceil(total / plan.block), MAX_GRID_X))
    return KernelLaunch(text, (grid,), plan.block, 0)


def transpose_kernel(model: PolyModel, plan: GpuKernelPlan, kernel: str, printer: StatementPrinter) -> KernelLaunch:
    """A copy into another layout by tiles: `plan.transpose` is (u, v), the thread loops
    along which the source and the target run."""
    assert plan.transpose is not None
    u, v = plan.transpose
    loops = {t.var: t for t in plan.threads}
    tile = TRANSPOSE_TILE
    tiles = {x: math.ceil(loops[x].extent / tile) for x in (u, v)}
    others = [t for t in plan.threads if t.var not in (u, v)]
    stmt = plan.statement.statement
    text = render(
        "gpu/transpose.j2", kernel=kernel, params=kernel_pointers(model), threads=tile * TRANSPOSE_ROWS,
        tile=tile, padded=tile + 1, rows=TRANSPOSE_ROWS, tiles_u=tiles[u], tiles_v=tiles[v],
        u=loops[u], v=loops[v], others=list(reversed(others)),
        value=printer.expr(stmt.value), cell=printer.element(stmt.target), ctype=printer.ctype,
        bf16=printer.layouts[stmt.target.array].dtype == "bfloat16",
    )
    blocks = tiles[u] * tiles[v] * math.prod(t.extent for t in others)
    return KernelLaunch(text, (blocks,), tile * TRANSPOSE_ROWS, 0)
