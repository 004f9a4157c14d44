"""Shrink a failing program while it still fails the same way: drop nests, loops, guards and
statements, replace a value by one of its parts, keep one size set and lower its sizes.

Each candidate is refitted (`generator.fit_extents`: arrays sized to what is left, unused
arrays dropped) and run through `runner.check`; a candidate gcc refuses (a local used after
its declaration was dropped) or that passes is discarded. Greedy, one change at a time, up to
a budget of checks: cheap next to reading a 14-statement program by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from tests.differential.generator import fit_extents
from tests.differential.oracle import ReferenceError
from tests.differential.program import (
    Assign,
    Binary,
    Call,
    DataIf,
    Declare,
    Expr,
    If,
    Loop,
    Node,
    Program,
    Select,
    access_tree,
    children,
    expr_accesses,
    expr_children,
    statements,
    with_children,
)
from tests.differential.runner import Outcome, check


def same_failure(status: str, reason: str) -> Callable[[Outcome], bool]:
    def still(o: Outcome) -> bool:
        return any(r.status == status and (status == "mismatch" or r.reason == reason) for r in o.runs)
    return still


def minimize(program: Program, index: int, machine: str, fails: Callable[[Outcome], bool],
             budget: int = 120) -> Program:
    """The smallest program found that still `fails` at size set `index` on `machine`."""
    sizes = program.size_sets[index]
    current = replace(program, size_sets=(sizes,))
    spent = 0

    def try_candidate(candidate: Program) -> bool:
        nonlocal spent
        spent += 1
        try:
            fitted = prune(fit_extents(candidate))
            outcome = check(fitted, machines={0: machine})
        except (ReferenceError, KeyError, ValueError, StopIteration):
            return False
        return fails(outcome)

    progress = True
    while progress and spent < budget:
        progress = False
        for candidate in _smaller(current):
            if spent >= budget:
                break
            if try_candidate(candidate):
                current = prune(fit_extents(candidate))
                progress = True
                break
    return current


def _smaller(p: Program) -> Iterator[Program]:
    """Candidates, the biggest cuts first."""
    for body in _cuts(p.body):
        yield replace(p, body=body)
    for body in _simpler_values(p.body):
        yield replace(p, body=body)
    sizes = dict(p.size_sets[0])
    for name, value in sizes.items():
        for smaller in sorted({1, 2, value // 2, value - 1}):
            if 1 <= smaller < value:
                yield replace(p, size_sets=(tuple(sorted({**sizes, name: smaller}.items())),))


def _cuts(block: tuple[Node, ...]) -> Iterator[tuple[Node, ...]]:
    """The block with one node removed, a loop or guard replaced by (part of) its body, or one
    of these inside a nested block."""
    for k in range(len(block)):
        yield block[:k] + block[k + 1:]
    for k, n in enumerate(block):
        if isinstance(n, If | DataIf):
            yield block[:k] + n.then + block[k + 1:]
            if n.otherwise:
                yield block[:k] + (replace(n, otherwise=()),) + block[k + 1:]
                yield block[:k] + n.otherwise + block[k + 1:]
        if isinstance(n, Loop) and n.step != 1:
            yield block[:k] + (replace(n, step=1),) + block[k + 1:]
        for b, inner in enumerate(children(n)):
            for smaller in _cuts(inner):
                blocks = list(children(n))
                blocks[b] = smaller
                yield block[:k] + (with_children(n, tuple(blocks)),) + block[k + 1:]


def _simpler_values(block: tuple[Node, ...]) -> Iterator[tuple[Node, ...]]:
    for k, n in enumerate(block):
        if isinstance(n, Assign | Declare):
            for part in _parts(n.value):
                yield block[:k] + (replace(n, value=part),) + block[k + 1:]
        if isinstance(n, Assign) and n.op != "=":
            yield block[:k] + (replace(n, op="="),) + block[k + 1:]
        for b, inner in enumerate(children(n)):
            for smaller in _simpler_values(inner):
                blocks = list(children(n))
                blocks[b] = smaller
                yield block[:k] + (with_children(n, tuple(blocks)),) + block[k + 1:]


def _parts(e: Expr) -> Iterator[Expr]:
    """Smaller values of `e`: each operand, and each value with one operand simplified."""
    for child in expr_children(e):
        if not isinstance(child, Binary) or child.op != "%":
            yield child
    if isinstance(e, Binary):
        for part in _parts(e.left):
            yield Binary(e.op, part, e.right)
        for part in _parts(e.right):
            yield Binary(e.op, e.left, part)
    if isinstance(e, Call):
        for k, arg in enumerate(e.args):
            for part in _parts(arg):
                yield Call(e.function, e.args[:k] + (part,) + e.args[k + 1:])
    if isinstance(e, Select):
        yield e.yes
        yield e.no


def prune(p: Program) -> Program:
    """The program without the arrays, scalars and size parameters nothing uses."""
    used: set[str] = set()
    for s in statements(p.body):
        accesses = list(expr_accesses(s.value))
        if isinstance(s, Assign) and not isinstance(s.target, str):
            accesses += list(access_tree(s.target))
        used |= {a.array for a in accesses}
    for n in _all_nodes(p.body):
        if isinstance(n, DataIf):
            used |= {a.array for e in (n.left, n.right) for a in expr_accesses(e)}
    text = p.c()
    arrays = tuple(a for a in p.arrays if a.name in used)
    scalars = tuple(s for s in p.scalars if s[0] in text.split("{", 1)[1])
    return replace(p, arrays=arrays, scalars=scalars)


def _all_nodes(block: tuple[Node, ...]) -> Iterator[Node]:
    for n in block:
        yield n
        for b in children(n):
            yield from _all_nodes(b)

