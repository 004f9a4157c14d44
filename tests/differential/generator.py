"""Random affine C loop nests in the subset polydl accepts, for differential testing against
gcc -O0 of the same C.

`generate(seed, options)` returns a `Program`: one function of 1-3 size parameters, float or
double arrays (and int ones), and a body of 1-4 nests mixing imperfect nests, guards
(`i > j`, `(i + 1) % 2 == 0`, `&&`, `||`, `!`, else), triangular and reversed loops, strided
steps, stencils over a time loop (Jacobi forms that need skewing, Gauss-Seidel in place),
reductions (into a local scalar, into array cells, a single cell), locals tested on data
(`float t = ...; if (t > 0) ... else ...`), selects, `fmaxf`/`fminf` and math calls. Int index
arrays for gathers (`x[idx[i]]`) come only with `Options.gathers`.

Values stay finite: a plain assignment is a weighted sum whose weights add to at most 1 over
loads, plus bounded terms; sums (`+=`) read the arrays the program writes only through a
bounded function, so nothing grows faster than the count of statement instances; `*=` takes a
factor in [-1, 1] and `/=` a divisor of at least 1.

The generator lives beside the tests (not in the `polydl` package): it is test
infrastructure, shared by `tests/differential/test_differential.py` and
`tools/differential.py`, and the package's import graph and public surface stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tests.differential.program import (
    Access,
    Affine,
    Array,
    Assign,
    Binary,
    Call,
    Compare,
    Cond,
    Convert,
    DataIf,
    Declare,
    Divisible,
    Expr,
    Extent,
    If,
    IndexValue,
    Literal,
    Load,
    LocalRef,
    Logic,
    Loop,
    Node,
    Program,
    Select,
    Unary,
    access_tree,
    children,
    const,
    expr_accesses,
    expr_children,
    statements,
    var,
    walk_domains,
    with_children,
)

# Sizes a program runs at: small, with 1, 2 and primes over-represented.
EDGE_SIZES = (1, 2, 3, 5, 7)
SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16, 17, 19, 23, 29)
TIME_SIZES = (1, 2, 3, 4, 5)
# Upper bound on the iteration points of one nest at one size set: keeps gcc -O0 and the
# domain walk fast.
MAX_POINTS = 60_000
# Statements of one program: enough for several nests, few enough for isl's scheduler to take
# well under a second and for a failure to shrink quickly.
MAX_STATEMENTS = 14
LOOP_VARS = ("i", "j", "k", "l")
FLOAT_FUNCTIONS = ("tanhf", "sinf", "cosf", "erff", "fabsf", "expf", "logf", "sqrtf", "powf")


@dataclass(frozen=True)
class Options:
    """What the generator may write.

    Attributes:
        gathers: subscripts read from int index arrays (`x[idx[i]]`).
        int_arrays: int arrays (exact integer arithmetic, conversions to and from float).
        size_sets: how many size assignments each program is compiled at.
        zero_size: probability that a size set holds a 0 (polydl refuses sizes below 1).
        max_depth: deepest loop nesting.
    """

    gathers: bool = False
    int_arrays: bool = True
    size_sets: int = 2
    zero_size: float = 0.02
    max_depth: int = 3


@dataclass(frozen=True)
class _Scope:
    loops: tuple[tuple[str, str], ...]  # (variable, size class) outermost first
    locals: tuple[str, ...]

    def of_class(self, cls: str) -> list[str]:
        return [v for v, c in self.loops if c == cls]


class _Generator:
    def __init__(self, seed: int, options: Options) -> None:
        self.rng = np.random.default_rng(seed)
        self.options = options
        self.seed = seed
        self.ftype = "double" if self.rng.random() < 0.3 else "float"
        self.suffix = "f" if self.ftype == "float" else ""
        n_params = int(self.rng.choice([1, 2, 2, 3]))
        self.params: list[str] = ["N", "M", "K"][:n_params]
        self.time = self.rng.random() < 0.35
        if self.time:
            self.params.append("T")
        self.arrays: dict[str, Array] = {}
        self.locals = 0
        self.scalars: list[tuple[str, str]] = []
        self._last_class = self.params[0]

    # ------------------------------------------------------------------ helpers

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, items):  # type: ignore[no-untyped-def]
        return items[int(self.rng.integers(len(items)))]

    def lit(self, value: float) -> Literal:
        text = repr(round(float(value), 4))
        if "e" not in text and "." not in text:
            text += ".0"
        return Literal(text + self.suffix)

    def fn(self, name: str) -> str:
        return name if self.ftype == "float" else name[:-1]  # tanhf -> tanh

    def space_classes(self) -> list[str]:
        return [p for p in self.params if p != "T"]

    # ------------------------------------------------------------------ arrays

    def new_array(self, dims: tuple[Extent, ...], *, is_input: bool, ctype: str | None = None,
                  gathers: tuple[str, int] | None = None) -> Array:
        ctype = ctype or self.ftype
        prefix = ("ix" if gathers else "q" if ctype == "int" else "x" if is_input else "y")
        name = f"{prefix}{sum(a.name.startswith(prefix) for a in self.arrays.values())}"
        array = Array(name, ctype, dims, is_input, gathers)
        self.arrays[name] = array
        return array

    def array_for(self, scope: _Scope, *, write: bool, ctype: str | None = None) -> Array:
        """An existing array or a new one shaped after the loops in scope."""
        ctype = ctype or self.ftype
        pool = [a for a in self.arrays.values() if a.ctype == ctype and a.gathers is None
                and (not write or not a.is_input)]
        # reuse more as arrays pile up: few arrays, many dependences between the nests
        if pool and self.chance(min(0.9, 0.35 + 0.12 * len(pool))):
            return self.pick(pool)
        classes = [c for _, c in scope.loops if c != "T"] or [self.pick(self.space_classes())]
        rank = int(self.rng.integers(1, min(3, len(classes) + 1) + (1 if self.chance(0.1) else 0)))
        picked = list(classes[-rank:]) if self.chance(0.7) else [self.pick(classes) for _ in range(rank)]
        dims = tuple(Extent(c, 2 if self.chance(0.08) else 1) for c in picked)
        if self.chance(0.1):
            dims = (Extent(None, 1, int(self.rng.integers(1, 4))),) + dims
        return self.new_array(dims, is_input=not write and self.chance(0.6), ctype=ctype)

    def subscript(self, dim: Extent, scope: _Scope, *, target: bool) -> Affine | Access:
        if dim.param is None:
            return const(int(self.rng.integers(0, dim.const)))
        vs = scope.of_class(dim.param)
        if not vs or self.chance(0.05):
            return const(int(self.pick([0, 0, 1, 2])))
        v = vs[-1] if (target or self.chance(0.6)) else self.pick(vs)
        offset = 0 if target and self.chance(0.7) else int(self.pick([-2, -1, -1, 0, 0, 0, 1, 1, 2]))
        roll = self.rng.random()
        if dim.scale == 2 and roll < 0.4:
            return Affine(((v, 2),), offset)
        if dim.scale == 2 and len(vs) > 1 and roll < 0.8:
            w = self.pick([u for u in vs if u != v])
            return Affine(((v, 1), (w, 1)), offset)
        if not target and roll < 0.07:  # reversed
            return Affine(((v, -1), (dim.param, 1)), -1 + offset)
        return var(v, offset)

    def access(self, array: Array, scope: _Scope, *, target: bool = False) -> Access:
        subs: list[Affine | Access] = [self.subscript(d, scope, target=target) for d in array.dims]
        if self.options.gathers and not target and self.chance(0.25):
            k = int(self.rng.integers(len(subs)))
            dim = array.dims[k]
            if dim.param is not None and scope.loops:
                index_array = self.new_array((Extent(dim.param),), is_input=True, ctype="int",
                                             gathers=(array.name, k))
                subs[k] = Access(index_array.name, (self.subscript(Extent(dim.param), scope,
                                                                   target=False),))
        return Access(array.name, tuple(subs))

    # ------------------------------------------------------------------ values

    def bounded(self, e: Expr) -> Expr:
        """A function of `e` whose value is within [-1, 1] (or [0, 3] for the growing ones)."""
        f = self.pick(["tanhf", "sinf", "cosf", "erff", "ratio", "clamp", "expneg", "logp"])
        if f == "ratio":
            return Binary("/", e, Binary("+", self.lit(1.0), Call(self.fn("fabsf"), (e,))))
        if f == "clamp":
            lo, hi = self.lit(-1.0), self.lit(1.0)
            return Call(self.fn("fmaxf"), (lo, Call(self.fn("fminf"), (hi, e))))
        if f == "expneg":
            return Call(self.fn("expf"), (Unary("-", Call(self.fn("fabsf"), (e,))),))
        if f == "logp":
            return Call(self.fn("logf"), (Binary("+", self.lit(1.0), Call(self.fn("fabsf"), (e,))),))
        return Call(self.fn(f), (e,))

    def term(self, scope: _Scope, depth: int, *, growing_ok: bool) -> Expr:
        """One term of a value, |term| bounded by the arrays it reads (or by 1)."""
        roll = self.rng.random()
        if roll < 0.5 or depth > 2:
            return self.read(scope, growing_ok=growing_ok)
        if roll < 0.6 and scope.locals:
            return LocalRef(self.pick(list(scope.locals)))
        if roll < 0.72:
            inner = self.value(scope, depth + 1, growing_ok=True)
            return self.bounded(inner)
        if roll < 0.8:
            a, b = self.read(scope, growing_ok=growing_ok), self.read(scope, growing_ok=growing_ok)
            return Call(self.fn(self.pick(["fmaxf", "fminf"])), (a, b))
        if roll < 0.87:
            a = self.read(scope, growing_ok=True)
            op = self.pick(["<", "<=", ">", ">=", "!="])
            return Select(op, a, self.lit(self.rng.uniform(-0.5, 0.5)),
                          self.read(scope, growing_ok=growing_ok), self.read(scope, growing_ok=growing_ok))
        if roll < 0.92 and scope.loops:
            v, _ = self.pick(list(scope.loops))
            return Binary("*", self.lit(0.03125), IndexValue(var(v, int(self.rng.integers(-1, 3)))))
        if roll < 0.96:
            e = self.read(scope, growing_ok=True)
            f = self.pick(["sqrtf", "powf"])
            arg = Call(self.fn("fabsf"), (e,))
            if f == "powf":
                return Call(self.fn("powf"), (Binary("+", self.lit(1.0), arg), self.lit(0.75)))
            return Call(self.fn("sqrtf"), (arg,))
        if self.options.int_arrays and self.chance(0.7):
            array = self.array_for(scope, write=False, ctype="int")
            return Binary("*", self.lit(0.01), Load(self.access(array, scope)))
        return self.lit(self.rng.uniform(-1, 1))

    def read(self, scope: _Scope, *, growing_ok: bool) -> Expr:
        array = self.array_for(scope, write=False)
        e: Expr = Load(self.access(array, scope))
        if not growing_ok and not array.is_input:
            e = self.bounded(e)
        return e

    def value(self, scope: _Scope, depth: int = 0, *, growing_ok: bool) -> Expr:
        """A weighted sum of 1-3 terms, the weights' magnitudes adding to at most 1."""
        n = int(self.rng.integers(1, 4)) if depth == 0 else int(self.rng.integers(1, 3))
        weights = self.rng.dirichlet(np.ones(n)) * self.rng.uniform(0.5, 1.0)
        out: Expr | None = None
        for w in weights:
            t = self.term(scope, depth, growing_ok=growing_ok)
            if self.chance(0.3) and n == 1:
                part: Expr = t
            else:
                part = Binary("*", self.lit(max(w, 0.0625)), t)
            out = part if out is None else Binary(self.pick(["+", "+", "-"]), out, part)
        assert out is not None
        return out

    def int_value(self, scope: _Scope) -> Expr:
        """An int expression of int arrays and loop variables, reduced modulo a prime."""
        terms: list[Expr] = []
        for _ in range(int(self.rng.integers(1, 4))):
            roll = self.rng.random()
            if roll < 0.55:
                array = self.array_for(scope, write=False, ctype="int")
                t: Expr = Load(self.access(array, scope))
                if not array.is_input:
                    t = Binary("%", t, Literal(str(self.pick([7, 97, 101]))))
            elif roll < 0.75 and scope.loops:
                v, _ = self.pick(list(scope.loops))
                t = IndexValue(var(v, int(self.rng.integers(0, 3))))
                if self.chance(0.5):
                    t = Binary(self.pick(["/", "%"]), t, Literal(str(self.pick([2, 3, 5]))))
            elif roll < 0.9:
                f = self.read(scope, growing_ok=True)
                t = Convert("int", Binary("*", self.lit(8.0), self.bounded(f)))
            else:
                t = Literal(str(int(self.rng.integers(-9, 10))))
            if self.chance(0.3):
                t = Binary("*", Literal(str(int(self.rng.integers(-3, 4)))), t)
            terms.append(t)
        out = terms[0]
        for t in terms[1:]:
            out = Binary(self.pick(["+", "-", "+"]), out, t)
        return Binary("%", out, Literal(str(self.pick([13, 97, 1009]))))

    # ------------------------------------------------------------------ statements

    def assignment(self, scope: _Scope) -> Node:
        if self.options.int_arrays and self.chance(0.1):
            array = self.array_for(scope, write=True, ctype="int")
            target = self.access(array, scope, target=True)
            return Assign(target, self.pick(["=", "+=", "-="]), self.int_value(scope))
        array = self.array_for(scope, write=True)
        target = self.access(array, scope, target=True)
        used = {n for s in target.subscripts if isinstance(s, Affine) for n in s.names()}
        reduction = any(v not in used for v, _ in scope.loops)
        roll = self.rng.random()
        if (reduction and roll < 0.7) or roll < 0.2:
            return Assign(target, self.pick(["+=", "+=", "-="]), self.value(scope, growing_ok=False))
        if roll < 0.27:
            return Assign(target, "*=", self.bounded(self.value(scope, growing_ok=True)))
        if roll < 0.32:
            divisor = Binary("+", self.lit(1.0), Call(self.fn("fabsf"), (self.value(scope, growing_ok=True),)))
            return Assign(target, "/=", divisor)
        value = self.value(scope, growing_ok=True)
        if self.chance(0.25):  # read the cell itself: in-place updates
            value = Binary("+", Binary("*", self.lit(0.5), Load(target)),
                           Binary("*", self.lit(0.5), value))
        return Assign(target, "=", value)

    def local_block(self, scope: _Scope, depth: int) -> tuple[Node, ...]:
        """`float s = init; <loops summing into s>; use s` or `float t = v; if (t > c) ...`."""
        name = f"s{self.locals}"
        self.locals += 1
        inner = replace(scope, locals=scope.locals + (name,))
        if self.chance(0.5) and depth < self.options.max_depth:
            init = self.lit(0.0) if self.chance(0.6) else self.value(scope, growing_ok=True)
            body_scope = inner
            loop = self.loop(scope, depth + 1, body=None)
            loop_scope = replace(body_scope, loops=body_scope.loops + ((loop.var, self._last_class),))
            op = self.pick(["+=", "+=", "-=", "="])
            value = self.value(loop_scope, growing_ok=False)
            if op == "=":
                value = Call(self.fn(self.pick(["fmaxf", "fminf"])), (LocalRef(name), value))
            body: tuple[Node, ...] = (Assign(name, op, value),)
            if self.chance(0.3):
                body = (If(self.guard(loop_scope), body),)
            loop = replace(loop, body=body)
            array = self.array_for(scope, write=True)
            use = Assign(self.access(array, inner, target=True), self.pick(["=", "+="]),
                         self.value(inner, growing_ok=False) if self.chance(0.5) else
                         Binary("*", self.lit(0.5), LocalRef(name)))
            return (Declare(name, self.ftype, init), loop, use)
        init = self.value(scope, growing_ok=True)
        threshold = self.lit(self.rng.uniform(-0.3, 0.3))
        then = self.branch(inner)
        otherwise = self.branch(inner) if self.chance(0.7) else ()
        return (Declare(name, self.ftype, init), DataIf(self.pick([">", "<", ">=", "<="]),
                                                        LocalRef(name), threshold, then, otherwise))

    def branch(self, scope: _Scope) -> tuple[Node, ...]:
        out: list[Node] = []
        for _ in range(int(self.rng.integers(1, 3))):
            array = self.array_for(scope, write=True)
            value = self.value(scope, growing_ok=True)
            if scope.locals and self.chance(0.6):
                value = Binary("+", Binary("*", self.lit(0.5), LocalRef(scope.locals[-1])), value)
            out.append(Assign(self.access(array, scope, target=True), "=", value))
        return tuple(out)

    def running_extreme(self, scope: _Scope) -> tuple[Node, ...]:
        """`if (x[...] > m[c]) m[c] = x[...];`: the condition reads what its branch writes last."""
        source = self.array_for(scope, write=False)
        dest = self.new_array((Extent(None, 1, 1),), is_input=False)
        cell = Access(dest.name, (const(0),))
        read = Load(self.access(source, scope))
        return (DataIf(self.pick([">", "<"]), read, Load(cell), (Assign(cell, "=", read),)),)

    # ------------------------------------------------------------------ loops and guards

    def guard(self, scope: _Scope) -> Cond:
        vs = [v for v, _ in scope.loops]
        v = self.pick(vs)
        cls = dict(scope.loops)[v]
        roll = self.rng.random()
        if roll < 0.25:
            return Divisible(var(v, int(self.rng.integers(0, 3))), int(self.pick([2, 2, 3])),
                             int(self.rng.integers(0, 2)))
        if roll < 0.5 and len(vs) > 1:
            w = self.pick([u for u in vs if u != v])
            return Compare(self.pick(["<", "<=", ">", ">=", "!=", "=="]), var(v), var(w, int(self.rng.integers(-1, 2))))
        if roll < 0.6 and len(vs) > 1:
            w = self.pick([u for u in vs if u != v])
            return Compare("<", Affine(((v, 1), (w, 1))), Affine(((cls, 1),), int(self.rng.integers(-1, 2))))
        if roll < 0.8:
            a = Compare(">=", var(v), const(int(self.rng.integers(0, 3))))
            b = Compare("<", var(v), Affine(((cls, 1),), -int(self.rng.integers(0, 3))))
            return Logic(self.pick(["&&", "||"]), (a, b))
        if roll < 0.88:
            return Logic("!", (Compare("==", var(v), const(int(self.rng.integers(0, 3)))),))
        bound = (Affine(((cls, 1),), -int(self.rng.integers(1, 4))) if self.chance(0.5)
                 else const(int(self.rng.integers(0, 4))))
        return Compare(self.pick(["<", ">", "<=", ">="]), var(v), bound)

    def loop(self, scope: _Scope, depth: int, body: tuple[Node, ...] | None) -> Loop:
        name = LOOP_VARS[len(scope.loops)]
        space = self.space_classes()
        if self.time and not any(c == "T" for _, c in scope.loops) and not scope.loops and self.chance(0.2):
            cls = "T"
        else:
            cls = self.pick(space)
        self._last_class = cls
        outer = scope.of_class(cls)
        step = 1 if self.chance(0.85) else int(self.pick([2, 3]))
        roll = self.rng.random()
        if cls == "T":
            return Loop(name, const(int(self.pick([0, 1]))), var("T"), body or (), inclusive=self.chance(0.5))
        if outer and roll < 0.35:  # triangular
            u = self.pick(outer)
            if self.chance(0.5):
                return Loop(name, var(u, int(self.pick([0, 1]))), var(cls), body or (), step)
            return Loop(name, const(0), var(u), body or (), step, inclusive=self.chance(0.6))
        if roll < 0.45:
            stop = const(0) if not outer or self.chance(0.6) else var(self.pick(outer))
            return Loop(name, var(cls, -1), stop, body or (), step, down=True)
        start = int(self.pick([0, 0, 0, 1, 1, 2]))
        if self.chance(0.3):
            return Loop(name, const(start), var(cls, -int(self.pick([0, 1, 1]))), body or (), step, inclusive=True)
        return Loop(name, const(start), var(cls, -int(self.pick([0, 0, 1, 2]))), body or (), step)

    def items(self, scope: _Scope, depth: int) -> tuple[Node, ...]:
        out: list[Node] = []
        count = int(self.rng.choice([1, 2, 3], p=[0.45, 0.4, 0.15]))
        for _ in range(count):
            roll = self.rng.random()
            if roll < 0.3 and depth < self.options.max_depth:
                out.append(self.nest(scope, depth + 1))
            elif roll < 0.42 and scope.loops:
                then = self.items_leaf(scope)
                otherwise = self.items_leaf(scope) if self.chance(0.35) else ()
                out.append(If(self.guard(scope), then, otherwise))
            elif roll < 0.55 and scope.loops:
                out += self.local_block(scope, depth)
            elif roll < 0.6 and scope.loops:
                out += self.running_extreme(scope)
            else:
                out.append(self.assignment(scope))
        return tuple(out)

    def items_leaf(self, scope: _Scope) -> tuple[Node, ...]:
        return tuple(self.assignment(scope) for _ in range(int(self.rng.integers(1, 3))))

    def nest(self, scope: _Scope, depth: int) -> Loop:
        loop = self.loop(scope, depth, body=None)
        inner = replace(scope, loops=scope.loops + ((loop.var, self._last_class),))
        return replace(loop, body=self.items(inner, depth))

    # ------------------------------------------------------------------ stencils

    def stencil(self) -> tuple[Node, ...]:
        """A time loop over a stencil: `a[t][i] = f(a[t-1][i-1..i+1])`, Jacobi with a second
        array, or Gauss-Seidel in place."""
        space = self.space_classes()
        dims = [self.pick(space) for _ in range(1 if self.chance(0.55) else 2)]
        kind = self.pick(["time_rows", "jacobi", "seidel", "dp"])
        tcls = "T" if self.time else dims[0]
        tname, names = "t", ["i", "j"][: len(dims)]
        inner_scope = _Scope((("t", tcls),) + tuple(zip(names, dims, strict=True)), ())
        w = self.rng.dirichlet(np.ones(2 * len(dims) + 1)) * self.rng.uniform(0.6, 1.0)
        offsets = [(0,) * len(dims)] + [tuple((s if k == d else 0) for k in range(len(dims)))
                                        for d in range(len(dims)) for s in (-1, 1)]
        space_loops = lambda body: _nest_loops(names, dims, body, self)  # noqa: E731
        extra = Binary("*", self.lit(0.1), self.read(inner_scope, growing_ok=True))
        if kind == "time_rows":
            a = self.new_array((Extent(tcls, 1),) + tuple(Extent(c) for c in dims), is_input=False)
            reads = [Load(Access(a.name, (var(tname, -1),) + tuple(var(n, o) for n, o in zip(names, off, strict=True))))
                     for off in offsets]
            value = _weighted(reads, w, self) if self.chance(0.7) else Binary(
                "+", Call(self.fn("fmaxf"), (reads[0], reads[1])), extra)
            target = Access(a.name, (var(tname),) + tuple(var(n) for n in names))
            body: tuple[Node, ...] = (Assign(target, "=", value),)
            return (Loop(tname, const(1), var(tcls), space_loops(body), inclusive=True),)
        a = self.new_array(tuple(Extent(c) for c in dims), is_input=False)
        here = tuple(var(n) for n in names)
        reads = [Load(Access(a.name, tuple(var(n, o) for n, o in zip(names, off, strict=True)))) for off in offsets]
        if kind == "jacobi":
            b = self.new_array(tuple(Extent(c) for c in dims), is_input=False)
            first = space_loops((Assign(Access(b.name, here), "=", _weighted(reads, w, self)),))
            second = space_loops((Assign(Access(a.name, here), "=", Binary(
                "+", Load(Access(b.name, here)), extra) if self.chance(0.3) else Load(Access(b.name, here))),))
            return (Loop(tname, const(0), var(tcls), first + second),)
        if kind == "dp":  # a wavefront: each cell from its upper and left neighbours
            extra = Binary("*", self.lit(0.1), self.read(_Scope(inner_scope.loops[1:], ()), growing_ok=True))
            back = [Load(Access(a.name, tuple(var(n, -1 if k == d else 0) for k, n in enumerate(names))))
                    for d in range(len(dims))]
            best = back[0] if len(back) == 1 else Call(self.fn(self.pick(["fmaxf", "fminf"])), tuple(back))
            value = Binary("+", Binary("*", self.lit(0.9), best), extra)
            return space_loops((Assign(Access(a.name, here), "=", value),))
        body = (Assign(Access(a.name, here), "=", _weighted(reads, w, self)),)
        return (Loop(tname, const(0), var(tcls), space_loops(body)),)

    # ------------------------------------------------------------------ the program

    def program(self) -> Program:
        body: list[Node] = []
        top = _Scope((), ())
        if self.chance(0.1):
            self.scalars.append(("alpha", self.ftype))
        for _ in range(int(self.rng.integers(1, 4))):
            roll = self.rng.random()
            if roll < 0.25:
                body += self.stencil()
            elif roll < 0.35:  # a sum over a whole nest into a function-scope local, then used
                name = f"s{self.locals}"
                self.locals += 1
                with_local = replace(top, locals=(name,))
                nest = self.nest(top, 1)
                inner = _innermost_scope(nest, self)
                summand = self.value(replace(inner, locals=()), growing_ok=False)
                nest = _append_innermost(nest, Assign(name, "+=", summand))
                use = self.nest(with_local, 1)
                body += [Declare(name, self.ftype, self.lit(0.0)), nest, use]
            else:
                body.append(self.nest(top, 1))
        if self.scalars:
            body = [_scaled_by_alpha(body[0], self)] + body[1:]
        program = Program(f"fz{self.seed % 100000}", tuple(self.params), tuple(self.scalars),
                          tuple(self.arrays.values()), tuple(body), self.ftype,
                          tuple(tuple(sorted(s.items())) for s in self.size_sets()))
        return program

    def size_sets(self) -> list[dict[str, int]]:
        out = []
        for k in range(self.options.size_sets):
            pool = EDGE_SIZES if k == 0 else SIZES
            sizes = {p: int(self.pick(TIME_SIZES if p == "T" else pool)) for p in self.params}
            if self.chance(self.options.zero_size):
                sizes[self.pick(self.params)] = 0
            out.append(sizes)
        return out


def _weighted(reads: list[Expr], w: np.ndarray, g: _Generator) -> Expr:
    out: Expr | None = None
    for r, k in zip(reads, w, strict=False):
        part = Binary("*", g.lit(max(float(k), 0.0625 / len(reads))), r)
        out = part if out is None else Binary("+", out, part)
    assert out is not None
    return out


def _nest_loops(names: list[str], classes: list[str], body: tuple[Node, ...], g: _Generator) -> tuple[Node, ...]:
    for name, cls in reversed(list(zip(names, classes, strict=True))):
        body = (Loop(name, const(1), var(cls, -1), body) if g.chance(0.7)
                else Loop(name, const(1), var(cls, -2), body, inclusive=True),)
    return body


def _innermost_scope(loop: Loop, g: _Generator) -> _Scope:
    """The loops from `loop` down its last nested loops (their classes read from the bounds)."""
    loops: list[tuple[str, str]] = []
    node: Node = loop
    while isinstance(node, Loop):
        names = node.start.names() | node.stop.names()
        cls = next((n for n in names if n in g.params), None)
        if cls is None:
            cls = next(c for v, c in loops if v in names)
        loops.append((node.var, cls))
        nxt = [n for n in node.body if isinstance(n, Loop)]
        if not nxt:
            break
        node = nxt[-1]
    return _Scope(tuple(loops), ())


def _append_innermost(loop: Loop, stmt: Node) -> Loop:
    nxt = [k for k, n in enumerate(loop.body) if isinstance(n, Loop)]
    if not nxt:
        return replace(loop, body=loop.body + (stmt,))
    k = nxt[-1]
    inner = loop.body[k]
    assert isinstance(inner, Loop)
    return replace(loop, body=loop.body[:k] + (_append_innermost(inner, stmt),) + loop.body[k + 1:])


def _scaled_by_alpha(node: Node, g: _Generator) -> Node:
    """The first plain assignment of `node` multiplied by the scalar parameter `alpha`."""
    if isinstance(node, Assign) and node.op == "=" and not isinstance(node.target, str):
        return replace(node, value=Binary("*", Call(g.fn("tanhf"), (Literal("alpha"),)), node.value))
    blocks = children(node)
    for b, block in enumerate(blocks):
        for k, n in enumerate(block):
            new = _scaled_by_alpha(n, g)
            if new != n:
                nb = list(blocks)
                nb[b] = block[:k] + (new,) + block[k + 1:]
                return with_children(node, tuple(nb))
    return node


# ----------------------------------------------------------------------------- fitting the arrays


def fit_extents(program: Program) -> Program:
    """The program with each subscript shifted up where it would go below 0 and each array's
    extents the smallest `scale * P + c` holding every access at every size set."""
    lows: dict[tuple[Access, int], int] = {}

    def see_low(stmt: Assign | Declare, env: dict[str, np.ndarray]) -> None:
        for a in _statement_accesses(stmt):
            for d, s in enumerate(a.subscripts):
                if isinstance(s, Affine):
                    v = np.broadcast_to(np.asarray(s.value(env)), len(env[next(iter(env))]))
                    if v.size:
                        lows[(a, d)] = min(lows.get((a, d), 0), int(v.min()))

    for sizes in program.sizes():
        walk_domains(program, sizes, see_low)
    shifts = {key: -low for key, low in lows.items() if low < 0}
    program = _shift(program, shifts) if shifts else program

    need: dict[tuple[str, int], int] = {}  # (array, dim) -> extent constant

    for sizes in program.sizes():
        highs: dict[tuple[str, int], int] = {}

        def see_high(stmt: Assign | Declare, env: dict[str, np.ndarray]) -> None:
            for a in _statement_accesses(stmt):  # noqa: B023
                for d, s in enumerate(a.subscripts):
                    if isinstance(s, Affine):
                        v = np.asarray(s.value(env))
                        if v.size:
                            highs[(a.array, d)] = max(highs.get((a.array, d), 0), int(v.max()) + 1)  # noqa: B023

        walk_domains(program, sizes, see_high)
        for array in program.arrays:
            for d, dim in enumerate(array.dims):
                scaled = dim.scale * sizes[dim.param] if dim.param else 0
                c = max(highs.get((array.name, d), 1), 1) - scaled
                need[(array.name, d)] = max(need.get((array.name, d), -10**9), c)
    # a dimension of a size is at least that size (a gathered one is read at every index the
    # index array holds, drawn in its extent)
    arrays = tuple(
        replace(a, dims=tuple(replace(dim, const=need[(a.name, d)] if dim.param is None else
                                      max(need[(a.name, d)], 0))
                              for d, dim in enumerate(a.dims)))
        for a in program.arrays)
    return replace(program, arrays=arrays)


def _statement_accesses(stmt: Assign | Declare) -> list[Access]:
    out: list[Access] = []
    if isinstance(stmt, Assign) and not isinstance(stmt.target, str):
        out += list(access_tree(stmt.target))
    out += list(expr_accesses(stmt.value))
    return out


def _shift(program: Program, shifts: dict[tuple[Access, int], int]) -> Program:
    def acc(a: Access) -> Access:
        subs = []
        for d, s in enumerate(a.subscripts):
            if isinstance(s, Access):
                subs.append(acc(s))
            else:
                subs.append(s.plus(shifts.get((a, d), 0)))
        return Access(a.array, tuple(subs))

    def expr(e: Expr) -> Expr:
        if isinstance(e, Load):
            return Load(acc(e.access))
        kids = expr_children(e)
        if not kids:
            return e
        new = tuple(expr(k) for k in kids)
        if isinstance(e, Binary):
            return Binary(e.op, new[0], new[1])
        if isinstance(e, Call):
            return Call(e.function, new)
        if isinstance(e, Select):
            return Select(e.op, *new)
        return replace(e, operand=new[0])  # type: ignore[arg-type]

    def node(n: Node) -> Node:
        if isinstance(n, Assign):
            target = n.target if isinstance(n.target, str) else acc(n.target)
            return Assign(target, n.op, expr(n.value))
        if isinstance(n, Declare):
            return Declare(n.name, n.ctype, expr(n.value))
        if isinstance(n, DataIf):
            return DataIf(n.op, expr(n.left), expr(n.right), tuple(node(c) for c in n.then),
                          tuple(node(c) for c in n.otherwise))
        return with_children(n, tuple(tuple(node(c) for c in b) for b in children(n)))

    return replace(program, body=tuple(node(n) for n in program.body))


def points_of(program: Program, sizes: dict[str, int]) -> int:
    total = 0

    def see(stmt: Assign | Declare, env: dict[str, np.ndarray]) -> None:
        nonlocal total
        total += len(env[next(iter(env))])

    walk_domains(program, sizes, see)
    return total


def generate(seed: int, options: Options = Options()) -> Program:
    """The random program of `seed`: the same seed and options give the same program."""
    for attempt in range(20):
        g = _Generator(seed * 1000 + attempt, options)
        program = g.program()
        program = replace(program, name=f"fz{seed}")
        if (sum(1 for _ in statements(program.body)) <= MAX_STATEMENTS
                and all(points_of(program, s) <= MAX_POINTS for s in program.sizes())):
            return fit_extents(program)
    return fit_extents(program)
