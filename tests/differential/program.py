"""A random C program as a value: arrays, loops, guards, locals and assignments, its C text, and
the iteration points of each statement at given sizes.

The differential tests build these values (`generator.py`), print them as the C polydl and
gcc both compile, and walk their domains here, in numpy, to size every array so each access is
in bounds at the sizes the program is compiled at (`fit_extents`). Values are frozen so a
program can be shrunk (`minimize.py`) by rebuilding parts of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

# ----------------------------------------------------------------------------- index expressions


@dataclass(frozen=True)
class Affine:
    """`sum(coefficient * name) + const` over loop variables and size parameters."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    def c(self) -> str:
        parts: list[str] = []
        for name, k in self.terms:
            if k == 0:
                continue
            mag = name if abs(k) == 1 else f"{abs(k)} * {name}"
            parts.append(("- " if k < 0 else "+ ") + mag if parts else ("-" if k < 0 else "") + mag)
        if self.const or not parts:
            if parts:
                parts.append(f"{'-' if self.const < 0 else '+'} {abs(self.const)}")
            else:
                parts.append(str(self.const))
        return " ".join(parts)

    def value(self, env: Mapping[str, np.ndarray | int]) -> np.ndarray | int:
        out: np.ndarray | int = self.const
        for name, k in self.terms:
            out = out + k * env[name]
        return out

    def plus(self, k: int) -> Affine:
        return Affine(self.terms, self.const + k)

    def names(self) -> set[str]:
        return {n for n, k in self.terms if k}


def var(name: str, const: int = 0) -> Affine:
    return Affine(((name, 1),), const)


def const(value: int) -> Affine:
    return Affine((), value)


# ----------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Access:
    """An array element; a subscript is affine or an element of an int array (a gather)."""

    array: str
    subscripts: tuple[Subscript, ...]

    def c(self) -> str:
        return self.array + "".join(f"[{s.c()}]" for s in self.subscripts)


Subscript = Affine | Access


@dataclass(frozen=True)
class Load:
    access: Access

    def c(self) -> str:
        return self.access.c()


@dataclass(frozen=True)
class LocalRef:
    name: str

    def c(self) -> str:
        return self.name


@dataclass(frozen=True)
class Literal:
    text: str  # as C spells it: 0.5f, 0.5, 3

    def c(self) -> str:
        return self.text


@dataclass(frozen=True)
class IndexValue:
    """A loop variable or size expression used as a value (an int)."""

    index: Affine

    def c(self) -> str:
        return f"({self.index.c()})"


@dataclass(frozen=True)
class Unary:
    op: str  # "-"
    operand: Expr

    def c(self) -> str:
        return f"({self.op}{self.operand.c()})"


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / %
    left: Expr
    right: Expr

    def c(self) -> str:
        return f"({self.left.c()} {self.op} {self.right.c()})"


@dataclass(frozen=True)
class Call:
    function: str
    args: tuple[Expr, ...]

    def c(self) -> str:
        return f"{self.function}({', '.join(a.c() for a in self.args)})"


@dataclass(frozen=True)
class Select:
    """`left OP right ? yes : no`."""

    op: str
    left: Expr
    right: Expr
    yes: Expr
    no: Expr

    def c(self) -> str:
        return f"({self.left.c()} {self.op} {self.right.c()} ? {self.yes.c()} : {self.no.c()})"


@dataclass(frozen=True)
class Convert:
    ctype: str
    operand: Expr

    def c(self) -> str:
        return f"(({self.ctype}){self.operand.c()})"


Expr = Load | LocalRef | Literal | IndexValue | Unary | Binary | Call | Select | Convert


def expr_children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Unary | Convert):
        return (e.operand,)
    if isinstance(e, Binary):
        return (e.left, e.right)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Select):
        return (e.left, e.right, e.yes, e.no)
    return ()


def expr_accesses(e: Expr) -> Iterator[Access]:
    if isinstance(e, Load):
        yield from access_tree(e.access)
    for child in expr_children(e):
        yield from expr_accesses(child)


def access_tree(a: Access) -> Iterator[Access]:
    """The access and the index arrays' accesses of its gathers."""
    yield a
    for s in a.subscripts:
        if isinstance(s, Access):
            yield from access_tree(s)


def expr_locals(e: Expr) -> set[str]:
    out = {e.name} if isinstance(e, LocalRef) else set()
    for child in expr_children(e):
        out |= expr_locals(child)
    return out


# ----------------------------------------------------------------------------- statements


@dataclass(frozen=True)
class Assign:
    target: Access | str  # an array element or a local's name
    op: str  # = += -= *= /=
    value: Expr

    def lines(self, indent: str) -> list[str]:
        target = self.target if isinstance(self.target, str) else self.target.c()
        return [f"{indent}{target} {self.op} {self.value.c()};"]


@dataclass(frozen=True)
class Declare:
    """`float s = value;`: a local scalar, visible to the items after it in its block."""

    name: str
    ctype: str
    value: Expr

    def lines(self, indent: str) -> list[str]:
        return [f"{indent}{self.ctype} {self.name} = {self.value.c()};"]


@dataclass(frozen=True)
class Loop:
    """Up: `for (int v = start; v < stop; v += step)` (`<=` where inclusive); down:
    `for (int v = start; v >= stop; v -= step)`."""

    var: str
    start: Affine
    stop: Affine
    body: tuple[Node, ...]
    step: int = 1
    down: bool = False
    inclusive: bool = False

    def lines(self, indent: str) -> list[str]:
        v = self.var
        if self.down:
            test = f"{v} >= {self.stop.c()}"
            inc = f"{v}--" if self.step == 1 else f"{v} -= {self.step}"
        else:
            test = f"{v} {'<=' if self.inclusive else '<'} {self.stop.c()}"
            inc = f"{v}++" if self.step == 1 else f"{v} += {self.step}"
        out = [f"{indent}for (int {v} = {self.start.c()}; {test}; {inc}) {{"]
        for n in self.body:
            out += n.lines(indent + "  ")
        return out + [f"{indent}}}"]

    def points(self, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The iterations of this loop for each point of `env` (arrays of equal length)."""
        lo = np.broadcast_to(np.asarray(self.start.value(env), np.int64), _length(env))
        hi = np.broadcast_to(np.asarray(self.stop.value(env), np.int64), _length(env))
        if self.down:
            count = np.maximum(0, (lo - hi) // self.step + 1)
        else:
            end = hi + 1 if self.inclusive else hi
            count = np.maximum(0, (end - lo + self.step - 1) // self.step)
        total = int(count.sum())
        out = {k: np.repeat(v, count) for k, v in env.items()}
        first = np.repeat(np.cumsum(count) - count, count)
        within = np.arange(total, dtype=np.int64) - first
        base = np.repeat(lo, count)
        out[self.var] = base - self.step * within if self.down else base + self.step * within
        return out


@dataclass(frozen=True)
class Compare:
    op: str
    left: Affine
    right: Affine

    def c(self) -> str:
        return f"{self.left.c()} {self.op} {self.right.c()}"

    def holds(self, env: Mapping[str, np.ndarray | int]) -> np.ndarray:
        a, b = np.asarray(self.left.value(env)), np.asarray(self.right.value(env))
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[self.op]


@dataclass(frozen=True)
class Divisible:
    """`(index) % modulus == remainder`, index >= 0 wherever it is tested."""

    index: Affine
    modulus: int
    remainder: int = 0

    def c(self) -> str:
        return f"({self.index.c()}) % {self.modulus} == {self.remainder}"

    def holds(self, env: Mapping[str, np.ndarray | int]) -> np.ndarray:
        return np.asarray(np.mod(self.index.value(env), self.modulus) == self.remainder)


@dataclass(frozen=True)
class Logic:
    op: str  # && ||, or ! with one part
    parts: tuple[Cond, ...]

    def c(self) -> str:
        if self.op == "!":
            return f"!({self.parts[0].c()})"
        return f" {self.op} ".join(f"({p.c()})" for p in self.parts)

    def holds(self, env: Mapping[str, np.ndarray | int]) -> np.ndarray:
        values = [p.holds(env) for p in self.parts]
        if self.op == "!":
            return ~values[0]
        out = values[0]
        for v in values[1:]:
            out = (out & v) if self.op == "&&" else (out | v)
        return out


Cond = Compare | Divisible | Logic


@dataclass(frozen=True)
class If:
    """A guard on loop variables and sizes (affine), with an optional else."""

    cond: Cond
    then: tuple[Node, ...]
    otherwise: tuple[Node, ...] = ()

    def lines(self, indent: str) -> list[str]:
        return _if_lines(indent, self.cond.c(), self.then, self.otherwise)


@dataclass(frozen=True)
class DataIf:
    """`if (left OP right)` on data (array elements, locals): each branch holds assignments."""

    op: str
    left: Expr
    right: Expr
    then: tuple[Node, ...]
    otherwise: tuple[Node, ...] = ()

    def lines(self, indent: str) -> list[str]:
        return _if_lines(indent, f"{self.left.c()} {self.op} {self.right.c()}", self.then,
                         self.otherwise)


Node = Assign | Declare | Loop | If | DataIf


def _if_lines(indent: str, condition: str, then: tuple[Node, ...],
              otherwise: tuple[Node, ...]) -> list[str]:
    """`if (condition) { then } else { otherwise }` as C lines (no else where it is empty)."""
    out = [f"{indent}if ({condition}) {{"]
    for n in then:
        out += n.lines(indent + "  ")
    if otherwise:
        out.append(f"{indent}}} else {{")
        for n in otherwise:
            out += n.lines(indent + "  ")
    return out + [f"{indent}}}"]


def children(n: Node) -> tuple[tuple[Node, ...], ...]:
    """The blocks directly inside a node."""
    if isinstance(n, Loop):
        return (n.body,)
    if isinstance(n, If | DataIf):
        return (n.then, n.otherwise)
    return ()


def with_children(n: Node, blocks: tuple[tuple[Node, ...], ...]) -> Node:
    if isinstance(n, Loop):
        return replace(n, body=blocks[0])
    if isinstance(n, If | DataIf):
        return replace(n, then=blocks[0], otherwise=blocks[1])
    return n


def statements(block: tuple[Node, ...]) -> Iterator[Assign | Declare]:
    for n in block:
        if isinstance(n, Assign | Declare):
            yield n
        for b in children(n):
            yield from statements(b)


def node_count(block: tuple[Node, ...]) -> int:
    return sum(1 + sum(node_count(b) for b in children(n)) for n in block)


# ----------------------------------------------------------------------------- the program


@dataclass(frozen=True)
class Extent:
    """`scale * param + const` (a constant where param is None)."""

    param: str | None
    scale: int = 1
    const: int = 0

    def c(self) -> str:
        if self.param is None:
            return str(self.const)
        head = self.param if self.scale == 1 else f"{self.scale} * {self.param}"
        return head if self.const == 0 else f"{head} {'+' if self.const > 0 else '-'} {abs(self.const)}"

    def value(self, sizes: Mapping[str, int]) -> int:
        return self.const + (self.scale * sizes[self.param] if self.param else 0)


@dataclass(frozen=True)
class Array:
    """A parameter array. `gathers` names the (array, dimension) an int index array's values
    subscript: its values are drawn in that dimension's extent."""

    name: str
    ctype: str  # float, double, int
    dims: tuple[Extent, ...]
    is_input: bool
    gathers: tuple[str, int] | None = None

    def c(self) -> str:
        const = "const " if self.is_input else ""
        return f"{const}{self.ctype} {self.name}" + "".join(f"[{d.c()}]" for d in self.dims)

    def shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(d.value(sizes) for d in self.dims)


NUMPY_TYPES = {"float": np.float32, "double": np.float64, "int": np.int32}


@dataclass(frozen=True)
class Program:
    """One C function `void NAME(int P..., scalars..., arrays...)` and the sizes it runs at."""

    name: str
    params: tuple[str, ...]
    scalars: tuple[tuple[str, str], ...]  # (name, ctype), inputs by value
    arrays: tuple[Array, ...]
    body: tuple[Node, ...]
    float_type: str = "float"
    size_sets: tuple[tuple[tuple[str, int], ...], ...] = field(default=())

    def c(self) -> str:
        args = [f"int {p}" for p in self.params]
        args += [f"{t} {n}" for n, t in self.scalars]
        args += [a.c() for a in self.arrays]
        lines = [f"void {self.name}({', '.join(args)}) {{"]
        for n in self.body:
            lines += n.lines("  ")
        return "\n".join(lines + ["}", ""])

    def array(self, name: str) -> Array:
        return next(a for a in self.arrays if a.name == name)

    def sizes(self) -> list[dict[str, int]]:
        return [dict(s) for s in self.size_sets]


def _length(env: Mapping[str, np.ndarray]) -> int:
    return len(next(iter(env.values())))


# ----------------------------------------------------------------------------- domains


def walk_domains(program: Program, sizes: Mapping[str, int],
                 visit: Callable[[Assign | Declare, dict[str, np.ndarray]], None]) -> None:
    """Call `visit(statement, points)` for every statement with its iteration points (loop
    variables and sizes as arrays of equal length; both branches of a condition on data)."""
    env: dict[str, np.ndarray] = {p: np.asarray([v], np.int64) for p, v in sizes.items()}

    def block(nodes: tuple[Node, ...], env: dict[str, np.ndarray]) -> None:
        for n in nodes:
            if _length(env) == 0:
                return
            if isinstance(n, Assign | Declare):
                visit(n, env)
            elif isinstance(n, Loop):
                block(n.body, n.points(env))
            elif isinstance(n, If):
                mask = np.broadcast_to(n.cond.holds(env), _length(env))
                block(n.then, {k: v[mask] for k, v in env.items()})
                block(n.otherwise, {k: v[~mask] for k, v in env.items()})
            else:  # a condition on data: its reads, then both branches on every point
                visit(Declare("", "", Binary(n.op, n.left, n.right)), env)
                block(n.then, env)
                block(n.otherwise, env)

    block(program.body, env)

