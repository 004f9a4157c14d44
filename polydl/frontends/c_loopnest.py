"""The C loop-nest frontend: one C function -> `LoopNest`.

Takes the text of a spec `void NAME(int N, ..., float A[N][M], const float B[...], ...) {...}`
and its file name; returns a `LoopNest` whose loops, guards, statements, accesses and arrays
carry their source positions. The body is for loops with affine bounds and constant positive
steps, counting up or down (the variable declared in the header or as `int i, j;` before), `if` guards of
affine comparisons under `&&`, `||`, `!` (with `else`), and assignments `=`, `+=`, `-=`, `*=`, `/=`
to array elements and locals (chains `a = b = v;` right to left), locals with or without a
value (read only once assigned on every path) and local arrays sized by parameters. A subscript
is affine, or an element of an int or long array plus or minus a constant (a gather or scatter:
`c_expressions`). Anything else is a `SpecError` at the construct, saying what is allowed.
Helper functions of the file are inlined into the kernel first (`c_inline`).

One module over 600 lines: a single reader walks the function's syntax tree, and its parts
(parameters, loops, guards, statements, locals) share one scope and one error collector.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pycparser import c_ast

from polydl.dtypes import C_SPELLINGS, DTYPES
from polydl.errors import ErrorCollector, SourcePosition, SpecError
from polydl.frontends.c_expressions import (
    Conversion,
    ExpressionReader,
    Scope,
    Unusable,
    constant_value,
    element_dtype,
    is_int_constant,
    plus_one,
    type_words,
    unassigned_read,
)
from polydl.frontends.c_inline import kernel_function
from polydl.frontends.c_names import refusal
from polydl.frontends.c_preprocess import Preprocessing
from polydl.frontends.c_source import parse_translation_unit
from polydl.frontends.c_values import ValueReader
from polydl.ir import (
    Access,
    Array,
    Condition,
    Const,
    Expr,
    Guard,
    IntBinary,
    IntConst,
    IntExpr,
    IntMinMax,
    IntVar,
    Load,
    Loop,
    LoopNest,
    Node,
    Statement,
    expr_loads,
    int_vars,
    renamed,
    replace_loads,
    substitute,
    walk_statements,
)
from polydl.names import internal_name

ELEMENT_TYPES = C_SPELLINGS  # C spelling -> polydl dtype
# Deepest nesting of loops, guards and blocks: real nests are far shallower, and every later
# stage walks the nest recursively.
MAX_NESTING = 50
# Statements and parameters of one spec: dependence analysis and scheduling grow faster than
# linearly with them, and real primitives (with fused epilogues) have a handful.
MAX_STATEMENTS = 64
MAX_PARAMETERS = 256
# pycparser recurses per nesting level; Python's recursion limit must trip before the C stack.
PARSER_STACK_BYTES = 256 * 1024 * 1024
_STACK_LOCK = threading.Lock()
T = TypeVar("T")
STATEMENT_OPS = ("=", "+=", "-=", "*=", "/=")
_LOOP_FORM = "for (int i = LO; i < HI; i++)"
_ELEMENT_FORM = ("float, double, bfloat16 or an integer type (char, short, int, long, signed or "
                 "unsigned char and short, int8_t ... int64_t); unsigned int and unsigned long "
                 "are not supported")
_BODY_FORM = "the body holds for loops, if guards and assignments to array elements"


@dataclass(frozen=True)
class CSpec:
    """A parsed C spec: the nest and where each size parameter is declared."""

    nest: LoopNest
    size_positions: dict[str, SourcePosition]


def parse_c(text: str, filename: str = "<spec>", function: str | None = None,
            preprocessing: Preprocessing | None = None) -> LoopNest:
    """Parse a C loop-nest spec into a `LoopNest` (sizes stay symbolic)."""
    return read_c(text, filename, function, preprocessing).nest


def read_c(text: str, filename: str = "<spec>", function: str | None = None,
           preprocessing: Preprocessing | None = None) -> CSpec:
    """`function`: which function of the file is the kernel (default: the only one, or the
    only one no other function calls that could be a kernel; `c_inline`); `preprocessing`:
    macros and header folders for the C preprocessor."""
    return on_large_stack(_read_c, text, filename, function, preprocessing)


def _read_c(text: str, filename: str, function: str | None,
            preprocessing: Preprocessing | None) -> CSpec:
    ast, source_map = parse_translation_unit(text, filename, preprocessing)
    try:
        return _FunctionReader(Scope(filename, text, source_map=source_map)).read(ast, function)
    except RecursionError:
        raise SpecError("the spec is nested too deeply", filename) from None


def on_large_stack(function: Callable[..., T], *args: object) -> T:
    """Run `function` in a thread with a large C stack, so that deep input ends in Python's
    RecursionError (a SpecError) and not in a stack overflow: callers' threads (test
    runners, servers) may have small stacks."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(function(*args))
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)

    with _STACK_LOCK:
        previous = threading.stack_size(PARSER_STACK_BYTES)
        try:
            worker = threading.Thread(target=run, name="polydl-parse")
            worker.start()
        finally:
            threading.stack_size(previous)
    worker.join()
    if failure:
        raise failure[0]
    return result[0]


class _Fatal(Exception):
    """An error after which reading on is not safe (a limit passed): reported with those
    found before it, and reading stops."""

    def __init__(self, error: SpecError) -> None:
        self.error = error


class _FunctionReader:
    """Reads the function; an error in one parameter or one statement is recorded and reading
    goes on with the next, so that one run reports every independent error (up to
    `MAX_SPEC_ERRORS`). Constructs that use a name whose declaration failed are skipped
    silently (`Unusable`): their errors would only repeat the first."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.diagnostics = ErrorCollector()
        self.declared: set[str] = set()  # every name the spec declares
        self.exprs = ExpressionReader(scope)
        self.values = ValueReader(scope, self.exprs)
        self.statements = 0
        self.locals: list[Array] = []  # expanded local scalars and local arrays
        # (variable, lowest value, end) of the loops around the construct being read
        self.loop_ranges: list[tuple[str, IntExpr, IntExpr]] = []

    def error(self, message: str, node: c_ast.Node | None) -> SpecError:
        return self.scope.error(message, node)

    def fatal(self, message: str, node: c_ast.Node | None) -> _Fatal:
        return _Fatal(self.scope.error(message, node))

    # ------------------------------------------------------------------ the function

    def read(self, ast: c_ast.FileAST, function: str | None = None) -> CSpec:
        # the kernel, its calls of helper functions inlined
        func = kernel_function(ast, function, self.scope)
        decl = func.decl
        self._check_name(decl.name, decl, "function")
        # static and inline say how the function links, nothing polydl compiles differently
        if set(decl.storage) - {"static"} or set(decl.funcspec) - {"inline"} or decl.quals:
            raise self.error(
                "the function must be declared as 'void NAME(...)' (static and inline are "
                "allowed), without extern or qualifiers",
                decl,
            )
        if func.param_decls:
            raise self.error("old-style (K&R) parameter declarations are not allowed", decl)
        ret = decl.type.type
        if not (
            isinstance(ret, c_ast.TypeDecl)
            and isinstance(ret.type, c_ast.IdentifierType)
            and ret.type.names == ["void"]
            and not ret.quals
        ):
            raise self.error("the function must return void; outputs are array parameters", decl)
        self.scope.function = decl.name
        params = decl.type.args.params if decl.type.args is not None else []
        if len(params) == 1 and _is_void(params[0]):
            params = []
        if len(params) > MAX_PARAMETERS:
            raise self.error(
                f"more than {MAX_PARAMETERS} parameters; polydl compiles one primitive per spec",
                params[MAX_PARAMETERS],
            )
        self.scope.declared_later = {p.name for p in params if isinstance(p, c_ast.Decl)}
        body: tuple[Node, ...] = ()
        try:
            for p in params:
                try:
                    self._parameter(p)
                except (SpecError, Unusable) as error:
                    if isinstance(error, SpecError):
                        self.diagnostics.add(error)
                    if isinstance(p, c_ast.Decl) and p.name:
                        self.scope.declared_later.discard(p.name)
                        self.scope.broken.add(p.name)
            if not any(not a.is_input for a in self.scope.arrays.values()) and not (
                    self.scope.broken):
                self.diagnostics.add(self.error(
                    "the function has no output: declare at least one array parameter "
                    "without const (const arrays are inputs, the others outputs)",
                    decl,
                ))
            body = self._block(func.body.block_items or [], 1)
        except _Fatal as stop:
            self.diagnostics.add(stop.error)
        self.diagnostics.raise_if_any()
        nest = LoopNest(
            name=decl.name,
            params=tuple(self.scope.sizes),
            arrays=(*(a for a in self.scope.arrays.values() if not a.local), *self.locals),
            body=body,
            source=self.scope.text,
            filename=self.scope.filename,
        )
        # names that begin with '_' belong to generated code: the IR holds the spec's renamed
        underscored = {n: internal_name(n) for n in self.declared if n.startswith("_")}
        return CSpec(renamed(nest, underscored), dict(self.scope.sizes))

    def _check_name(self, name: str, node: c_ast.Node, what: str) -> None:
        self.declared.add(name)
        why = refusal(name, is_function=what == "function")
        if why is not None:
            raise self.error(why, node)
        kind = self.scope.kind(name)
        if kind is not None:
            if what == "loop variable":
                raise self.error(
                    f"loop variable '{name}' shadows the {kind} '{name}'; choose another name",
                    node,
                )
            raise self.error(f"'{name}' is already declared as the {kind}", node)

    def _parameter(self, p: c_ast.Node) -> None:
        if isinstance(p, c_ast.EllipsisParam):
            raise self.error("variadic functions are not allowed", p)
        if not isinstance(p, c_ast.Decl) or not p.name:
            raise self.error("every parameter needs a type and a name", p)
        self.scope.declared_later.discard(p.name)
        self._check_name(p.name, p, "parameter")
        if p.storage or p.funcspec:
            raise self.error(f"parameter '{p.name}' cannot have storage specifiers", p)
        position = self.scope.position(p)
        t = p.type
        if isinstance(t, c_ast.TypeDecl):
            names = t.type.names if isinstance(t.type, c_ast.IdentifierType) else []
            if names == ["int"] and set(p.quals) <= {"const"}:
                assert position is not None
                self.scope.sizes[p.name] = position
                return
            scalar = element_dtype(names) if names else None
            if scalar is not None and not DTYPES[scalar].is_integer:
                if set(p.quals) - {"const"}:
                    raise self.error(
                        f"qualifier(s) {sorted(set(p.quals) - {'const'})} not allowed on "
                        f"'{p.name}'", p
                    )
                # a call-time scalar (alpha, beta, eps): an input with no extents
                self.scope.arrays[p.name] = Array(p.name, scalar, (), True, position)
                return
            raise self.error(
                f"size parameter '{p.name}' must be declared 'int'", p
            )
        if isinstance(t, c_ast.PtrDecl):
            raise self.error(
                f"pointer parameter '{p.name}' is not allowed; declare an array with its "
                f"extents, e.g. float {p.name}[N][M]",
                p,
            )
        if not isinstance(t, c_ast.ArrayDecl):
            raise self.error(f"parameter '{p.name}' must be an int or an array", p)
        dims: list[c_ast.ArrayDecl] = []
        while isinstance(t, c_ast.ArrayDecl):
            dims.append(t)
            t = t.type
        if isinstance(t, c_ast.PtrDecl):
            raise self.error(f"'{p.name}' is an array of pointers; only arrays of numbers", p)
        names = t.type.names if isinstance(t, c_ast.TypeDecl) and isinstance(
            t.type, c_ast.IdentifierType
        ) else []
        dtype = element_dtype(names) if names else None
        if dtype is None:
            raise self.error(f"array '{p.name}' must have elements of {_ELEMENT_FORM}", p)
        # restrict promises what polydl proves itself (its arrays never alias): accepted
        quals = set(p.quals) | set(t.quals)
        if quals - {"const", "restrict"}:
            raise self.error(
                f"qualifier(s) {sorted(quals - {'const', 'restrict'})} not allowed on '{p.name}'", p
            )
        shape: list[IntExpr] = []
        for d in dims:
            if set(d.dim_quals) - {"restrict", "const"}:
                raise self.error(
                    f"qualifiers inside the brackets of '{p.name}' other than restrict and "
                    "const are not allowed", d)
            if d.dim is None:
                raise self.error(
                    f"array '{p.name}' needs an extent in every dimension, e.g. {p.name}[N]", p
                )
            extent = self.exprs.index(d.dim, "an array extent")
            value = constant_value(extent)
            if value is not None and value < 1:
                raise self.error(f"extent {value} of array '{p.name}' must be >= 1", d.dim)
            shape.append(extent)
        self.scope.arrays[p.name] = Array(
            name=p.name,
            dtype=dtype,
            shape=tuple(shape),
            is_input="const" in quals,
            position=position,
        )

    # ------------------------------------------------------------------ statements

    def _block(self, items: list[c_ast.Node], depth: int) -> tuple[Node, ...]:
        out: list[Node] = []
        visible = dict(self.scope.local_scalars)  # a block's locals end with it
        try:
            for item in items:
                try:
                    out.extend(self._item(item, depth))
                except SpecError as error:
                    self.diagnostics.add(error)
                    self._break_declared(item)
                except Unusable:
                    self._break_declared(item)
        finally:
            self.scope.local_scalars = visible
        return tuple(out)

    def _break_declared(self, item: c_ast.Node) -> None:
        """After a failed declaration, its names are known to be broken: their uses are
        skipped instead of each being reported as undeclared."""
        decls = item.decls if isinstance(item, c_ast.DeclList) else [item]
        for decl in decls:
            if isinstance(decl, c_ast.Decl) and decl.name and self.scope.kind(decl.name) is None:
                self.scope.broken.add(decl.name)

    def _body(self, node: c_ast.Node, depth: int) -> tuple[Node, ...]:
        if isinstance(node, c_ast.Compound):
            return self._block(node.block_items or [], depth)
        return self._item(node, depth)

    def _item(self, node: c_ast.Node, depth: int) -> tuple[Node, ...]:
        if depth > MAX_NESTING:
            raise self.fatal(
                f"loops, ifs and blocks nested too deeply (more than {MAX_NESTING} levels)", node
            )
        if isinstance(node, c_ast.Compound):
            return self._block(node.block_items or [], depth + 1)
        if isinstance(node, c_ast.For):
            return (self._loop(node, depth + 1),)
        if isinstance(node, c_ast.If):
            return self._guard(node, depth + 1)
        if isinstance(node, c_ast.Assignment):
            return self._assignments(node)
        if isinstance(node, c_ast.EmptyStatement):
            return ()
        if isinstance(node, (c_ast.Decl, c_ast.DeclList)):
            decls = node.decls if isinstance(node, c_ast.DeclList) else [node]
            out: list[Node] = []
            for decl in decls:
                if self._is_local_scalar(decl):
                    out += self._local_scalar(decl)
                elif isinstance(decl, c_ast.Decl) and isinstance(decl.type, c_ast.ArrayDecl):
                    self._local_array(decl)
                else:
                    self._declare_loop_variables([decl])
            return tuple(out)
        if isinstance(node, (c_ast.While, c_ast.DoWhile)):
            raise self.error(
                f"while and do loops are not allowed; use a for loop with affine bounds: "
                f"{_LOOP_FORM}",
                node,
            )
        if isinstance(node, c_ast.UnaryOp) and node.op in ("++", "--", "p++", "p--"):
            self._check_assignable(node.expr)
            raise self.error(
                "increments are only allowed in the header of a for loop; write A[i] += 1",
                node,
            )
        if isinstance(node, c_ast.Pragma):
            raise self.error("#pragma is not allowed", node)
        keyword = {
            c_ast.Goto: "goto",
            c_ast.Label: "labels",
            c_ast.Return: "return",
            c_ast.Break: "break",
            c_ast.Continue: "continue",
            c_ast.Switch: "switch",
            c_ast.Case: "case",
            c_ast.Default: "default",
        }.get(type(node))
        if keyword is not None:
            raise self.error(f"'{keyword}' is not allowed; {_BODY_FORM}", node)
        if isinstance(node, c_ast.FuncCall):
            raise self.error(f"a function call is not a statement here; {_BODY_FORM}", node)
        raise self.error(f"this statement is not allowed; {_BODY_FORM}", node)

    def _check_assignable(self, target: c_ast.Node) -> None:
        """Refuse writes to anything but an array element or a local, naming what it is."""
        if isinstance(target, c_ast.ArrayRef):
            return
        if isinstance(target, c_ast.ID) and target.name in self.scope.local_scalars:
            return
        if isinstance(target, c_ast.ID):
            kind = self.scope.kind(target.name)
            if kind == "loop variable":
                raise self.error(
                    f"loop variable '{target.name}' may only be changed in its for header",
                    target,
                )
            if kind == "size parameter":
                raise self.error(f"size parameter '{target.name}' cannot be assigned", target)
            if kind == "array":
                raise self.error(
                    f"assign to an element of '{target.name}', with subscripts, not to the "
                    "array itself",
                    target,
                )
            if kind is None:
                raise self.scope.undeclared(target.name, target)
        raise self.error("the left side of an assignment must be an array element", target)

    def _assignments(self, node: c_ast.Assignment) -> tuple[Statement, ...]:
        """`a = b = v;` (PolyBench's deriche): C assigns right to left, each value converted to
        its target's type, and an assignment's value is its target's after it: `b = v; a = b;`."""
        chain = [node]
        while isinstance(chain[-1].rvalue, c_ast.Assignment):
            chain.append(chain[-1].rvalue)
        out: list[Statement] = []
        value = chain[-1].rvalue
        for link in reversed(chain):
            out.append(self._statement(c_ast.Assignment(link.op, link.lvalue, value, link.coord)))
            value = link.lvalue
        return tuple(out)

    def _statement(self, node: c_ast.Assignment) -> Statement:
        self._check_assignable(node.lvalue)
        if node.op not in STATEMENT_OPS:
            raise self.error(
                f"operator '{node.op}' is not allowed; statements use =, +=, -=, *= or /=", node
            )
        local = node.lvalue.name if isinstance(node.lvalue, c_ast.ID) and (
            node.lvalue.name in self.scope.local_scalars) else None
        if local is not None:
            if node.op != "=" and local in self.scope.unassigned:  # `s += v` reads s
                raise self.error(unassigned_read(local), node.lvalue)
            target = self.scope.local_scalars[local]
        else:
            target = self.exprs.access(node.lvalue, write=True)
        op, value = self.values.assignment(target, node.op, self.values.typed(node.rvalue))
        if local is not None:
            self.scope.unassigned.discard(local)
        if self.statements >= MAX_STATEMENTS:
            raise self.fatal(
                f"more than {MAX_STATEMENTS} statements: polydl compiles loop nests of "
                "primitives; split the spec into several",
                node,
            )
        name = f"S{self.statements}"
        self.statements += 1
        return Statement(name, target, op, value, self.scope.position(node))

    # ------------------------------------------------------------------ loops and guards

    def _loop(self, node: c_ast.For, depth: int) -> Loop:
        var, start = self._loop_init(node)
        self.scope.loops.append(var)
        try:
            step, down = self._loop_step(node, var)
            if down:
                lowest = self._loop_lowest(node, var)
                self.loop_ranges.append((var, lowest, plus_one(start)))
            else:
                upper = self._loop_condition(node, var)
                self.loop_ranges.append((var, start, upper))
            # the body may run zero times: what it assigns is not assigned after the loop
            unassigned = set(self.scope.unassigned)
            try:
                body = self._body(node.stmt, depth)
            finally:
                self.loop_ranges.pop()
                self.scope.unassigned = unassigned
        finally:
            self.scope.loops.pop()
        position = self.scope.position(node)
        if not down:
            return Loop(var, start, upper, step, body, position)
        # counting down from START: the loop runs var' = 0, step, ... up to START - LOWEST, and
        # the body sees START - var' where it wrote var, so iterations keep their order
        if isinstance(start, IntMinMax):
            raise self.error("the start of a loop that counts down must be affine (no min or "
                             "max); count up instead", node.init)
        count = IntBinary("+", IntBinary("-", start, lowest), IntConst(1))
        body = substitute(body, var, IntBinary("-", start, IntVar(var)))
        return Loop(var, IntConst(0), count, step, body, position)

    def _is_local_scalar(self, decl: c_ast.Decl) -> bool:
        t = decl.type
        return (
            isinstance(t, c_ast.TypeDecl)
            and isinstance(t.type, c_ast.IdentifierType)
            and len(t.type.names) == 1
            and t.type.names[0] in ELEMENT_TYPES
            # an integer declared without a value names the variable of a later loop
            and (not DTYPES[ELEMENT_TYPES[t.type.names[0]]].is_integer or decl.init is not None)
            and not decl.storage
            and set(decl.quals) <= {"const"}
        )

    def _expanded_local(self, name: str, dtype: str, position: SourcePosition | None) -> Access:
        """The access of a new local array holding the scalar `name` with one cell per
        iteration of the loops around here, except loops whose bounds move with outer loops (a
        triangle): their iterations share the cell, each assigning it before reading it."""
        shape: list[IntExpr] = []
        index: list[IntExpr] = []
        for var, lowest, end in self.loop_ranges:
            if (int_vars(lowest) - set(self.scope.sizes) or int_vars(end) - set(self.scope.sizes)
                    or isinstance(lowest, IntMinMax) or isinstance(end, IntMinMax)):
                continue
            # at least one cell where the loop runs no iteration at some sizes (1 .. D - 1)
            extent = IntBinary("-", end, lowest)
            shape.append(extent if (constant_value(extent) or 0) >= 1
                         else IntMinMax("max", (extent, IntConst(1))))
            index.append(IntBinary("-", IntVar(var), lowest))
        if not shape:
            shape, index = [IntConst(1)], [IntConst(0)]
        # `_pd_` and an IR name: a name only generated code uses (see polydl.names)
        internal = f"_pd_{internal_name(name)}_{len(self.locals)}"
        self.locals.append(Array(internal, dtype, tuple(shape), False, position, local=True))
        if DTYPES[dtype].is_integer:
            self.scope.integer_locals.add(internal)
        return Access(internal, tuple(index), position)

    def _local_scalar(self, decl: c_ast.Decl) -> tuple[Node, ...]:
        """`float s = v;` in a loop body: expanded to one cell per iteration of the loops around
        it (`s[i][j]`, zero-filled on each call), so iterations do not share it and the model
        stays affine; its initialiser is a statement. Loops with bounds that depend on outer
        loops are left out of the expansion (their iterations share the cell, in order)."""
        self._check_name(decl.name, decl, "local variable")
        t = decl.type
        access = self._expanded_local(decl.name, ELEMENT_TYPES[t.type.names[0]],
                                      self.scope.position(decl))
        self.scope.local_scalars[decl.name] = access
        # assigned later, before any read (checked at each read); with a value, after it
        self.scope.unassigned.add(decl.name)
        if decl.init is None:
            return ()
        if self.statements >= MAX_STATEMENTS:
            raise self.fatal(f"more than {MAX_STATEMENTS} statements", decl)
        target = self.scope.local_scalars[decl.name]
        _, value = self.values.assignment(target, "=", self.values.typed(decl.init))
        self.scope.unassigned.discard(decl.name)
        statement = Statement(f"S{self.statements}", target, "=", value, self.scope.position(decl))
        self.statements += 1
        return (statement,)

    def _local_array(self, decl: c_ast.Decl) -> None:
        """`double tmp[N][M];` in the function body (PolyBench's durbin `z[n]`): a local array of
        the kernel, neither input nor output, its extents sizes and constants; zero-filled on
        each call."""
        self._check_name(decl.name, decl, "local array")
        if self.scope.loops:
            raise self.error(
                f"local array '{decl.name}' must be declared outside the loops, in the function "
                "body", decl)
        if decl.storage or decl.quals or decl.init is not None:
            raise self.error(
                f"local array '{decl.name}' is declared as `TYPE {decl.name}[N]...;`, without "
                "storage class, qualifiers or a value", decl)
        dims: list[c_ast.ArrayDecl] = []
        t: c_ast.Node = decl.type
        while isinstance(t, c_ast.ArrayDecl):
            dims.append(t)
            t = t.type
        names = t.type.names if isinstance(t, c_ast.TypeDecl) and isinstance(
            t.type, c_ast.IdentifierType) and not t.quals else []
        dtype = element_dtype(names) if names else None
        if dtype is None:
            raise self.error(f"local array '{decl.name}' must have elements of {_ELEMENT_FORM}", decl)
        shape: list[IntExpr] = []
        for d in dims:
            if d.dim is None or d.dim_quals:
                raise self.error(
                    f"local array '{decl.name}' needs an extent in every dimension, e.g. "
                    f"{decl.name}[N]", decl)
            extent = self.exprs.index(d.dim, "an array extent")
            if int_vars(extent) - set(self.scope.sizes):
                raise self.error("the extent of a local array is made of size parameters and "
                                 "constants", d.dim)
            value = constant_value(extent)
            if value is not None and value < 1:
                raise self.error(f"extent {value} of array '{decl.name}' must be >= 1", d.dim)
            shape.append(extent)
        array = Array(decl.name, dtype, tuple(shape), False, self.scope.position(decl), local=True)
        self.scope.arrays[decl.name] = array
        self.locals.append(array)

    def _declare_loop_variables(self, decls: list[c_ast.Decl]) -> None:
        """`int i, j;`: names for the loops that follow (`for (i = 0; ...)`), as C code written
        before C99 declares them; anything else declared in the body is refused."""
        for decl in decls:
            t = decl.type
            if not (
                isinstance(t, c_ast.TypeDecl)
                and isinstance(t.type, c_ast.IdentifierType)
                and t.type.names == ["int"]
                and not decl.quals
                and not decl.storage
                and decl.init is None
            ):
                raise self.error(
                    "declarations in the body are locals (`float s = 0.0f;`, `double t;`, an "
                    "integer with a value: `int arg = 0;`), "
                    "local arrays (`float z[N];`) or loop variables, `int i, j;` without a "
                    "value, used as `for (i = LO; i < HI; i++)`; or declare it in the loop: "
                    f"{_LOOP_FORM}",
                    decl,
                )
            self._check_name(decl.name, decl, "loop variable")
            self.scope.loop_names.add(decl.name)

    def _loop_init(self, node: c_ast.For) -> tuple[str, IntExpr]:
        init = node.init
        if (
            isinstance(init, c_ast.Assignment)
            and init.op == "="
            and isinstance(init.lvalue, c_ast.ID)
            and init.lvalue.name in self.scope.loop_names
        ):
            name = init.lvalue.name
            if name in self.scope.loops:
                raise self.error(f"'{name}' is already the variable of an enclosing loop", init)
            return name, self.exprs.index(init.rvalue, "a loop bound", min_max=True)
        if isinstance(init, c_ast.Assignment):
            self._check_assignable(init.lvalue)
        if isinstance(init, c_ast.DeclList) and len(init.decls) > 1:
            raise self.error(
                f"the loop must declare exactly one variable: {_LOOP_FORM}", init.decls[1]
            )
        if not isinstance(init, c_ast.DeclList):
            raise self.error(
                f"the loop must declare exactly one variable: {_LOOP_FORM}", init or node
            )
        decl = init.decls[0]
        t = decl.type
        if not (
            isinstance(t, c_ast.TypeDecl)
            and isinstance(t.type, c_ast.IdentifierType)
            and t.type.names == ["int"]
            and not decl.quals
            and not decl.storage
        ):
            raise self.error(f"the loop variable must be a plain int: {_LOOP_FORM}", decl)
        self._check_name(decl.name, decl, "loop variable")
        if decl.init is None:
            raise self.error(f"the loop variable needs a start value: {_LOOP_FORM}", decl)
        return decl.name, self.exprs.index(decl.init, "a loop bound", min_max=True)

    def _loop_condition(self, node: c_ast.For, var: str) -> IntExpr:
        cond = node.cond
        if not (
            isinstance(cond, c_ast.BinaryOp)
            and cond.op in ("<", "<=")
            and isinstance(cond.left, c_ast.ID)
            and cond.left.name == var
        ):
            raise self.error(
                f"the loop condition must be '{var} < UPPER' or '{var} <= UPPER' with an "
                "affine UPPER",
                cond or node,
            )
        upper = self.exprs.index(cond.right, "a loop bound", min_max=True)
        if var in int_vars(upper):
            raise self.error(
                f"the upper bound must not depend on the loop variable '{var}'", cond.right
            )
        return plus_one(upper) if cond.op == "<=" else upper

    def _loop_step(self, node: c_ast.For, var: str) -> tuple[int, bool]:
        """The step (positive) and whether the loop counts down."""
        nxt = node.next
        form = (
            f"the increment must be {var}++, {var}--, {var} += STEP, {var} -= STEP or "
            f"{var} = {var} + STEP with a positive constant STEP"
        )
        if isinstance(nxt, c_ast.UnaryOp) and isinstance(nxt.expr, c_ast.ID):
            if nxt.expr.name != var:
                raise self.error(f"the increment must update the loop variable '{var}'", nxt)
            if nxt.op in ("++", "p++"):
                return 1, False
            if nxt.op in ("--", "p--"):
                return 1, True
        if isinstance(nxt, c_ast.Assignment) and isinstance(nxt.lvalue, c_ast.ID):
            if nxt.lvalue.name != var:
                raise self.error(f"the increment must update the loop variable '{var}'", nxt)
            step_node: c_ast.Node | None = None
            down = False
            if nxt.op in ("+=", "-="):
                step_node, down = nxt.rvalue, nxt.op == "-="
            elif nxt.op == "=" and isinstance(nxt.rvalue, c_ast.BinaryOp) and nxt.rvalue.op == "+":
                left, right = nxt.rvalue.left, nxt.rvalue.right
                if isinstance(left, c_ast.ID) and left.name == var:
                    step_node = right
                elif isinstance(right, c_ast.ID) and right.name == var:
                    step_node = left
            elif nxt.op == "=" and isinstance(nxt.rvalue, c_ast.BinaryOp) and nxt.rvalue.op == "-":
                left = nxt.rvalue.left
                if isinstance(left, c_ast.ID) and left.name == var:
                    step_node, down = nxt.rvalue.right, True
            if step_node is not None:
                step = constant_value(self.exprs.index(step_node, "a loop step"))
                if step is None:
                    raise self.error(f"the step must be a constant; {form}", step_node)
                if step <= 0:
                    raise self.error(f"the step must be positive, not {step}; {form}", step_node)
                return step, down
        raise self.error(form, nxt or node)

    def _loop_lowest(self, node: c_ast.For, var: str) -> IntExpr:
        """The last value a down-counting loop may take: `var >= LOWEST` or `var > LOWEST - 1`."""
        cond = node.cond
        if not (
            isinstance(cond, c_ast.BinaryOp)
            and cond.op in (">", ">=")
            and isinstance(cond.left, c_ast.ID)
            and cond.left.name == var
        ):
            raise self.error(
                f"a loop that counts down needs the condition '{var} >= LOWER' or "
                f"'{var} > LOWER' with an affine LOWER",
                cond or node,
            )
        lowest = self.exprs.index(cond.right, "a loop bound", min_max=True)
        if var in int_vars(lowest):
            raise self.error(
                f"the lower bound must not depend on the loop variable '{var}'", cond.right
            )
        return plus_one(lowest) if cond.op == ">" else lowest

    def _guard(self, node: c_ast.If, depth: int) -> tuple[Node, ...]:
        """`if (C) A else B` as guards of disjoint conjunctions of affine comparisons: C in
        disjunctive normal form, made disjoint (each piece excludes the ones before it), with
        A read once per piece; B likewise under the negation of C. One iteration runs exactly
        the statements C selects, whatever order the pieces take."""
        if self._reads_data(node.cond):
            return self._predicated(node, depth)
        position = self.scope.position(node)
        before = set(self.scope.unassigned)
        formula = self._dnf(node.cond, negate=False)
        guards = [Guard(piece, self._branch(node.iftrue, depth, before), position)
                  for piece in self._disjoint(formula, node.cond)]
        unassigned = set(self.scope.unassigned) if guards else before
        if node.iffalse is not None:
            negation = self._dnf(node.cond, negate=True)
            otherwise = [Guard(piece, self._branch(node.iffalse, depth, before), position)
                         for piece in self._disjoint(negation, node.cond)]
            unassigned |= self.scope.unassigned if otherwise else before
            guards += otherwise
        else:
            unassigned |= before
        self.scope.unassigned = unassigned
        return tuple(guards)

    def _branch(self, node: c_ast.Node, depth: int, unassigned: set[str]) -> tuple[Node, ...]:
        """One branch of an if, read from the locals assigned before the if (a local is
        assigned after the if where each branch assigns it)."""
        self.scope.unassigned = set(unassigned)
        return self._body(node, depth)

    def _reads_data(self, cond: c_ast.Node) -> bool:
        """Whether a condition reads array elements or scalar parameters (then it is a choice
        between values per iteration, not a bound on the iterations)."""
        pending = [cond]
        while pending:
            n = pending.pop()
            if isinstance(n, c_ast.ArrayRef):
                return True
            if isinstance(n, c_ast.ID) and (self.scope.kind(n.name) == "array"
                                            or n.name in self.scope.local_scalars):
                return True
            if isinstance(n, c_ast.Constant) and not is_int_constant(n):
                return True
            if isinstance(n, Conversion) and element_dtype(type_words(n.to_type) or []) not in (
                    "int32", "int64"):
                return True  # a helper's floating-point value: compared per iteration
            pending += [child for _, child in n.children()]
        return False

    def _predicated(self, node: c_ast.If, depth: int) -> tuple[Node, ...]:
        """`if (COND on data) A else B`: each assignment of A and B keeps its place and takes
        its new value only where COND holds (A) or fails (B), as a select; the iterations are
        not split, so the model stays affine. Each select evaluates COND again: what COND reads
        and a branch writes before its last assignment is copied into a local first
        (`if (x > v) { v = x; arg = j; }` compares with v as it was before the if)."""
        before = set(self.scope.unassigned)
        copies, copied = self._condition_copies(node)
        then = self._branch(node.iftrue, depth, before)
        unassigned = set(self.scope.unassigned)
        other = self._branch(node.iffalse, depth, before) if node.iffalse is not None else ()
        unassigned |= self.scope.unassigned if node.iffalse is not None else before
        self.scope.unassigned = before  # the condition is read before either branch runs
        read = {acc.array for acc in expr_loads(
            self._select(node.cond, Const(1.0), Const(0.0), copied))}
        self.scope.unassigned = unassigned
        statements = walk_statements(then + other)
        for k, (stmt, enclosing) in enumerate(statements):
            if any(isinstance(e, Loop) for e in enclosing):
                raise self.error(
                    "a loop under a condition on data is not allowed; put the condition "
                    "inside the loop", node)
            # left only where a subscript of the condition reads what the branch writes
            if stmt.target.array in read and k < len(statements) - 1:
                raise self.error(
                    f"the condition reads '{self._spelling(stmt.target.array)}', which its "
                    "branch writes before another assignment; compute the condition into "
                    "another array first", node)
        if (len(then) == 1 and len(other) == 1 and isinstance(then[0], Statement)
                and isinstance(other[0], Statement) and then[0].target == other[0].target
                and then[0].op == other[0].op):
            # one assignment to the same cell either way: one select of the two values, which
            # reads the cell only where its own value does (an output a chain of cases writes
            # is then not read first, nor stored three times)
            yes, no = then[0], other[0]
            return copies + (Statement(yes.name, yes.target, yes.op, self._select(
                node.cond, yes.value, no.value, copied), yes.position),)
        return copies + tuple(self._predicate(n, node.cond, True, copied) for n in then) + tuple(
            self._predicate(n, node.cond, False, copied) for n in other)

    def _condition_copies(self, node: c_ast.If) -> tuple[tuple[Statement, ...], dict[Access, Access]]:
        """The statements that copy what the condition of `node` reads and its branches assign
        (where they make more than one assignment) into new locals, and each read's copy."""
        assigned = [_assigned_name(n) for branch in (node.iftrue, node.iffalse)
                    if branch is not None for n in _walk(branch)
                    if isinstance(n, c_ast.Assignment | c_ast.Decl)]
        if len(assigned) < 2:
            return (), {}
        written = {self.scope.local_scalars[n].array if n in self.scope.local_scalars else n
                   for n in assigned if n is not None}
        copies: list[Statement] = []
        copied: dict[Access, Access] = {}
        for acc in expr_loads(self._select(node.cond, Const(1.0), Const(0.0))):
            if acc.array not in written or acc in copied:
                continue
            if self.statements >= MAX_STATEMENTS:
                raise self.fatal(f"more than {MAX_STATEMENTS} statements", node)
            dtype = next((a.dtype for a in self.locals if a.name == acc.array), None) or (
                self.scope.arrays[acc.array].dtype)
            position = self.scope.position(node)
            copied[acc] = self._expanded_local(self._spelling(acc.array), dtype, position)
            copies.append(Statement(f"S{self.statements}", copied[acc], "=", Load(acc), position))
            self.statements += 1
        return tuple(copies), copied

    def _spelling(self, array: str) -> str:
        """The name the user wrote for `array`: a local scalar's C name, else its own."""
        return next((name for name, acc in self.scope.local_scalars.items()
                     if acc.array == array), array)

    def _predicate(self, n: Node, cond: c_ast.Node, taken: bool,
                   copied: dict[Access, Access]) -> Node:
        if isinstance(n, Guard):
            return Guard(n.conditions, tuple(self._predicate(c, cond, taken, copied)
                                             for c in n.body), n.position)
        assert isinstance(n, Statement)  # loops were refused
        # the value where the branch does not run: the target unchanged
        keep: Expr = (Load(n.target) if n.op == "=" else
                      Const(0.0) if n.op in ("+=", "-=") else Const(1.0))
        value = (self._select(cond, n.value, keep, copied) if taken
                 else self._select(cond, keep, n.value, copied))
        return Statement(n.name, n.target, n.op, value, n.position)

    def _select(self, cond: c_ast.Node, yes: Expr, no: Expr,
                copied: dict[Access, Access] | None = None) -> Expr:
        """`cond ? yes : no` from comparisons joined by &&, || and !; the values `cond` reads
        that `copied` names are read from their copies."""
        if isinstance(cond, c_ast.UnaryOp) and cond.op == "!":
            return self._select(cond.expr, no, yes, copied)
        if isinstance(cond, c_ast.BinaryOp) and cond.op == "&&":
            return self._select(cond.left, self._select(cond.right, yes, no, copied), no, copied)
        if isinstance(cond, c_ast.BinaryOp) and cond.op == "||":
            return self._select(cond.left, yes, self._select(cond.right, yes, no, copied), copied)
        if isinstance(cond, c_ast.BinaryOp) and cond.op in _NEGATION:
            left, right = self.values.typed(cond.left), self.values.typed(cond.right)
            if copied:
                left, right = replace_loads(left, copied), replace_loads(right, copied)
            return self.values.select(cond.op, left, right, yes, no)
        raise self.error(
            "a condition on data compares values (<, <=, >, >=, ==, !=) joined by &&, || and !",
            cond,
        )

    def _dnf(self, cond: c_ast.Node, negate: bool) -> list[tuple[Condition, ...]]:
        """The condition (or its negation) as a disjunction of conjunctions."""
        while isinstance(cond, c_ast.UnaryOp) and cond.op == "!":
            cond, negate = cond.expr, not negate
        if isinstance(cond, c_ast.BinaryOp) and cond.op in ("&&", "||"):
            parts = [self._dnf(c, negate) for c in _chain(cond, cond.op)]
            if (cond.op == "&&") != negate:  # a conjunction: every combination of the parts
                out: list[tuple[Condition, ...]] = [()]
                for part in parts:
                    out = [a + b for a in out for b in part]
                    self._check_pieces(len(out), cond)
                return out
            return [conj for part in parts for conj in part]  # a disjunction
        return [(c,) for c in self._atom(cond, negate)]

    def _atom(self, cond: c_ast.Node, negate: bool) -> list[Condition]:
        """One comparison (negated if asked) as disjoint alternatives: `!=` and a negated
        `==` are `<` or `>`."""
        if not (isinstance(cond, c_ast.BinaryOp) and cond.op in _NEGATION):
            raise self.error(
                "the condition of an if must be affine comparisons (<, <=, >, >=, ==, !=) "
                "joined by &&, || and !",
                cond,
            )
        left = self.exprs.index(cond.left, "a condition")
        right = self.exprs.index(cond.right, "a condition")
        op = _NEGATION[cond.op] if negate else cond.op
        if op == "!=":
            return [Condition("<", left, right), Condition(">", left, right)]
        return [Condition(op, left, right)]

    def _disjoint(
        self, formula: list[tuple[Condition, ...]], node: c_ast.Node
    ) -> list[tuple[Condition, ...]]:
        """Pieces that cover the formula with no iteration in two: conjunction k without the
        iterations of conjunctions 0..k-1."""
        pieces: list[tuple[Condition, ...]] = []
        for k, conj in enumerate(formula):
            current = [conj]
            for earlier in formula[:k]:
                current = [c + e for c in current for e in _excluded(earlier)]
                self._check_pieces(len(pieces) + len(current), node)
            pieces += current
        self._check_pieces(len(pieces), node)
        return pieces

    def _check_pieces(self, count: int, node: c_ast.Node) -> None:
        if count > MAX_GUARD_PIECES:
            raise self.error(
                f"this condition splits into more than {MAX_GUARD_PIECES} disjoint pieces; "
                "write it as nested ifs",
                node,
            )

_NEGATION = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
MAX_GUARD_PIECES = 32


def _chain(node: c_ast.BinaryOp, op: str) -> list[c_ast.Node]:
    """The operands of a chain `a op b op c ...`, left to right (iterative: a long chain is a
    deep tree)."""
    out: list[c_ast.Node] = []
    pending: list[c_ast.Node] = [node]
    while pending:
        cur = pending.pop()
        if isinstance(cur, c_ast.BinaryOp) and cur.op == op:
            pending += [cur.right, cur.left]
        else:
            out.append(cur)
    return out


def _excluded(conj: tuple[Condition, ...]) -> list[tuple[Condition, ...]]:
    """The negation of a conjunction as disjoint conjunctions: not a, or a and not b, ..."""
    out: list[tuple[Condition, ...]] = []
    for i, atom in enumerate(conj):
        negated = _NEGATION[atom.op]
        alternatives = ([Condition("<", atom.left, atom.right), Condition(">", atom.left, atom.right)]
                        if negated == "!=" else [Condition(negated, atom.left, atom.right)])
        out += [conj[:i] + (alt,) for alt in alternatives]
    return out


def _is_void(p: c_ast.Node) -> bool:
    return (
        isinstance(p, c_ast.Typename)
        and isinstance(p.type, c_ast.TypeDecl)
        and isinstance(p.type.type, c_ast.IdentifierType)
        and p.type.type.names == ["void"]
    )


__all__ = ["CSpec", "parse_c", "read_c"]


def _walk(node: c_ast.Node) -> list[c_ast.Node]:
    """`node` and every node below it."""
    out, pending = [], [node]
    while pending:
        n = pending.pop()
        out.append(n)
        pending += [child for _, child in n.children()]
    return out


def _assigned_name(node: c_ast.Assignment | c_ast.Decl) -> str | None:
    """The variable or array an assignment (or a declaration) assigns."""
    if isinstance(node, c_ast.Decl):
        return node.name if node.init is not None else None
    target = node.lvalue
    while isinstance(target, c_ast.ArrayRef):
        target = target.name
    return target.name if isinstance(target, c_ast.ID) else None
