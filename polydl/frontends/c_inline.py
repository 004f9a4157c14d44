"""Helper functions of a C spec, inlined into its kernel on pycparser's syntax tree.

Takes the parsed file (`FileAST`), the function asked for (or None) and the `Scope` errors are
positioned by; returns the kernel's `FuncDef`, its calls of the file's other functions (helpers)
replaced by the value each computes, so that the loop-nest reader sees one function of plain
expressions. The kernel is the function asked for, else the only one, else the only function
no other calls that returns void or takes arrays.

A helper returns a value computed from its scalar parameters (float, double or an integer type):
its body is local scalars, assignments to them and to its parameters, `if`/`else` and `return`,
read as one expression (an `if` is a `?:`). Arguments and results are converted to the declared
types as C converts them (`Conversion`, read as a cast). Helpers may call helpers; recursion,
loops, array writes, pointers and names from outside the helper are refused at the construct.
Inlined expressions keep their positions: an argument's are the call site's, the rest the
helper's own text, and each conversion of the result stands at the call.

One module over 600 lines: one pass, whose parts (choosing the kernel, the call graph's
recursion check, a helper body read as one expression, conversions) share the syntax tree walk
and its positions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

from pycparser import c_ast

from polydl.errors import SourcePosition, SpecError
from polydl.frontends.c_expressions import (
    COMPARISONS,
    Conversion,
    Scope,
    element_dtype,
    pointer_refusal,
    type_words,
)
from polydl.frontends.c_header_names import is_stand_in
from polydl.frontends.c_names import refusal

# Largest expression one call may inline to (syntax-tree nodes, each use of a parameter counting
# its argument again): well above real activations, far below what makes reading slow.
MAX_INLINED_NODES = 4096
# Statements one inlining may execute, every path through the ifs counted: bounds the paths of
# a helper whose ifs return.
MAX_HELPER_STEPS = 4096
_TYPES = "float, double or an integer type (char, short, int, long, int8_t ... int64_t)"
_BODY = ("a helper's body holds local scalars (float v = ...;), assignments to them and to its "
         "parameters, if/else and return")
# Where a statement stands in its parent: a call there computes a value nothing uses.
_STATEMENT_SLOTS = {
    c_ast.Compound: ("block_items",), c_ast.If: ("iftrue", "iffalse"), c_ast.For: ("stmt",),
    c_ast.While: ("stmt",), c_ast.DoWhile: ("stmt",), c_ast.Label: ("stmt",),
    c_ast.Case: ("stmts",), c_ast.Default: ("stmts",), c_ast.Switch: ("stmt",),
}


def kernel_function(ast: c_ast.FileAST, function: str | None, scope: Scope) -> c_ast.FuncDef:
    """The kernel's definition, its helpers' calls inlined (in place: `ast` is read once)."""
    functions = _functions(ast, scope)
    kernel = _choose(functions, function, scope)
    helpers = {f.decl.name: f for f in functions if f is not kernel}
    inliner = _Inliner(helpers, kernel.decl.name, scope)
    inliner.expand(kernel.decl)  # array extents may call helpers too
    inliner.expand(kernel.body)
    return kernel


def _functions(ast: c_ast.FileAST, scope: Scope) -> list[c_ast.FuncDef]:
    """The file's function definitions; its other items are refused, except declarations of
    polydl's stand-in headers and prototypes of functions the file defines."""
    functions = [e for e in ast.ext if isinstance(e, c_ast.FuncDef)]
    defined = {f.decl.name: f for f in functions}
    for item in ast.ext:
        if isinstance(item, c_ast.Pragma):
            raise scope.error("#pragma is not allowed", item)
        if isinstance(item, c_ast.FuncDef):
            continue
        position = scope.position(item)
        if position is not None and is_stand_in(position.file):
            continue  # math.h's prototypes
        if (isinstance(item, c_ast.Decl) and isinstance(item.type, c_ast.FuncDecl)
                and item.name in defined):
            _check_prototype(item, defined[item.name], scope)
            continue
        raise scope.error(
            "at file scope a spec defines functions only (the kernel and its helpers); global "
            "declarations, typedefs and prototypes of functions it does not define are not "
            "allowed",
            item,
        )
    if not functions:
        raise SpecError.at(
            "the spec has no function; expected "
            "void NAME(int N, ..., float A[N], const float B[N]) { for loops }",
            SourcePosition(scope.filename, 1, 1),
            scope.text,
        )
    seen: set[str] = set()
    for f in functions:
        if f.decl.name in seen:
            raise scope.error(f"function '{f.decl.name}' is defined twice", f.decl)
        seen.add(f.decl.name)
    return functions


def _signature(decl: c_ast.Decl) -> tuple[object, ...]:
    """What a declaration says of a function's types, names of parameters aside."""
    func = decl.type
    params = func.args.params if func.args is not None else []
    return (_type_text(func.type), tuple(_type_text(getattr(p, "type", None)) for p in params))


def _type_text(node: c_ast.Node | None) -> object:
    if isinstance(node, c_ast.TypeDecl):
        words = type_words(node)
        return (tuple(sorted(words)) if words is not None else None, tuple(sorted(node.quals)))
    if isinstance(node, (c_ast.ArrayDecl, c_ast.PtrDecl)):
        return type(node).__name__, _type_text(node.type)
    return type(node).__name__


def _check_prototype(proto: c_ast.Decl, definition: c_ast.FuncDef, scope: Scope) -> None:
    if _signature(proto) != _signature(definition.decl):
        raise scope.error(
            f"this prototype of '{proto.name}' does not match its definition's types", proto
        )


def _calls(node: c_ast.Node) -> list[c_ast.FuncCall]:
    """The calls by name under `node`, in no particular order."""
    out: list[c_ast.FuncCall] = []
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, c_ast.FuncCall) and isinstance(current.name, c_ast.ID):
            out.append(current)
        pending.extend(child for _, child in current.children())
    return out


def _choose(functions: list[c_ast.FuncDef], function: str | None,
            scope: Scope) -> c_ast.FuncDef:
    names = [f.decl.name for f in functions]
    if function is not None:
        chosen = [f for f in functions if f.decl.name == function]
        if not chosen:
            raise SpecError.at(
                f"the file has no function '{function}'; it defines {', '.join(names)}",
                SourcePosition(scope.filename, 1, 1), scope.text,
            )
        return chosen[0]
    if len(functions) == 1:
        return functions[0]
    called = {c.name.name for f in functions for c in _calls(f.body)
              if c.name.name != f.decl.name}
    roots = [f for f in functions if f.decl.name not in called]
    kernels = [f for f in roots if _returns_void(f) or _takes_arrays(f)]
    if len(kernels) == 1:
        return kernels[0]
    if not kernels and len(roots) == 1:
        return roots[0]  # refused for what it returns, as the only candidate
    candidates = kernels or roots or functions
    which = ("" if len(candidates) == len(functions) else
             f": {', '.join(f.decl.name for f in candidates)} could each be the kernel (no "
             "other function calls them)")
    raise scope.error(
        f"the file defines {len(functions)} functions ({', '.join(names)}); choose one with "
        f"--function NAME (function= in Python){which}",
        candidates[1].decl,
    )


def _returns_void(f: c_ast.FuncDef) -> bool:
    return type_words(f.decl.type.type) == ["void"]


def _takes_arrays(f: c_ast.FuncDef) -> bool:
    params = f.decl.type.args.params if f.decl.type.args is not None else []
    return any(isinstance(p, c_ast.Decl) and isinstance(p.type, (c_ast.ArrayDecl, c_ast.PtrDecl))
               for p in params)


def _conversion(words: list[str], expr: c_ast.Node, coord: object) -> Conversion:
    """`expr` converted to the type `words`, positioned at `coord`; its type name carries no
    position, so the conversion's own stands for it."""
    to_type = c_ast.Typename(None, [], None, c_ast.TypeDecl(None, [], None,
                                                             c_ast.IdentifierType(list(words))))
    return Conversion(to_type, expr, coord)


def _tree_size(node: c_ast.Node, limit: int) -> int:
    """Nodes of `node` read as a tree (a shared subtree counted at each use), up to `limit`."""
    sizes: dict[int, int] = {}
    pending: list[tuple[c_ast.Node, bool]] = [(node, False)]
    while pending:
        current, done = pending.pop()
        if id(current) in sizes:
            continue
        children = [child for _, child in current.children()]
        if done:
            sizes[id(current)] = min(limit + 1, 1 + sum(sizes[id(c)] for c in children))
        else:
            pending.append((current, True))
            pending.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(node)]


@dataclass(frozen=True)
class _Local:
    """A parameter or local variable of a helper while its body is read: its type, its value
    as an expression of the arguments (None before it is assigned), the block it was declared
    in and the variable of that name it hides."""

    words: tuple[str, ...]
    value: c_ast.Node | None
    depth: int
    hidden: _Local | None = None


@dataclass(frozen=True)
class _EndBlock:
    """The end of a block in the statements still to run: its locals go out of scope."""

    depth: int


class _Inliner:
    """Inlines the calls of `helpers` under the kernel; `active` is the chain of functions
    being inlined (the kernel first), so a call back into it is recursion."""

    def __init__(self, helpers: dict[str, c_ast.FuncDef], kernel: str, scope: Scope) -> None:
        self.helpers = helpers
        self.kernel = kernel
        self.scope = scope
        self.active: list[str] = [kernel]
        self.checked: set[str] = set()

    def error(self, message: str, node: c_ast.Node | None) -> SpecError:
        return self.scope.error(message, node)

    # ------------------------------------------------------------------ the kernel

    def expand(self, root: c_ast.Node) -> None:
        """Replace, in place, every call of a helper under `root` by its value."""
        pending = [root]
        while pending:
            node = pending.pop()
            statements = _STATEMENT_SLOTS.get(type(node), ())
            for attr in _fields(node):
                value = getattr(node, attr)
                if isinstance(value, list):
                    for k, item in enumerate(value):
                        if isinstance(item, c_ast.Node):
                            value[k] = self._visit(item, attr in statements, pending)
                elif isinstance(value, c_ast.Node):
                    setattr(node, attr, self._visit(value, attr in statements, pending))

    def _visit(self, node: c_ast.Node, statement: bool, pending: list[c_ast.Node]) -> c_ast.Node:
        name = _callee(node)
        if name is None or (name not in self.helpers and name != self.kernel):
            pending.append(node)
            return node
        assert isinstance(node, c_ast.FuncCall)
        if statement and name in self.helpers:
            self._check(self.helpers[name])
            raise self.error(
                f"the value of helper '{name}' is not used; a helper computes a value: assign "
                f"it (y[i] = {name}(...);)", node)
        args = []
        for arg in _arguments(node):
            holder = c_ast.ExprList([arg])
            self.expand(holder)  # calls in the arguments first
            args.append(holder.exprs[0])
        return self.call(node, args)

    # ------------------------------------------------------------------ one call

    def call(self, node: c_ast.FuncCall, args: list[c_ast.Node]) -> c_ast.Node:
        """The value of the call `node` of a helper (or of a function being inlined: an
        error), its arguments already inlined."""
        name = node.name.name
        if name in self.active:
            cycle = " -> ".join([*self.active[self.active.index(name):], name])
            what = "the kernel" if name == self.kernel else "helper"
            raise self.error(
                f"{what} '{name}' is called recursively ({cycle}): helpers are inlined into "
                "the kernel, so no function may call itself, directly or through others", node)
        helper = self.helpers[name]
        self._check(helper)
        params = _parameters(helper)
        if len(args) != len(params):
            raise self.error(f"helper '{name}' takes {len(params)} argument(s), not {len(args)}",
                             node)
        # C evaluates each argument once; here each use of the parameter repeats the argument's
        # expression. Values in this language have no side effects (no assignments or
        # increments inside expressions; the only calls are math functions and helpers, which
        # are pure), so repeating an argument computes what C computes.
        # parameters share the scope of the body's outermost block, as in C
        env = {p.name: _Local(tuple(type_words(p.type) or ()), _conversion(
            type_words(p.type) or [], arg, arg.coord), 1) for p, arg in zip(params, args, strict=True)}
        self.active.append(name)
        try:
            value = _Body(self, helper).run(env)
        finally:
            self.active.pop()
        result = _conversion(type_words(helper.decl.type.type) or [], value, node.coord)
        size = _tree_size(result, MAX_INLINED_NODES)
        if size > MAX_INLINED_NODES:
            raise self.error(
                f"inlining helper '{name}' here gives an expression of more than "
                f"{MAX_INLINED_NODES} operations (each use of a parameter repeats its "
                "argument); compute the argument into a local variable first, or simplify "
                "the helper", node)
        return result

    def _check(self, helper: c_ast.FuncDef) -> None:
        """Refuse what no inlining of `helper` can accept: writes to arrays first (the most
        likely mistake), then loops, pointers and other statements, then the declaration."""
        name = helper.decl.name
        if name in self.checked:
            return
        _Checker(self, name).body(helper.body)
        decl = helper.decl
        why = refusal(name)
        if why is not None:
            raise self.error(why, decl)
        if set(decl.storage) - {"static"} or set(decl.funcspec) - {"inline"} or decl.quals:
            raise self.error(
                f"helper '{name}' must be declared as 'TYPE {name}(...)' (static and inline "
                "are allowed), without extern or qualifiers", decl)
        if helper.param_decls:
            raise self.error("old-style (K&R) parameter declarations are not allowed", decl)
        ret = decl.type.type
        if isinstance(ret, c_ast.PtrDecl):
            raise self.error(f"helper '{name}' returns a pointer; pointers are not allowed, a "
                             f"helper returns {_TYPES}", decl)
        words = type_words(ret)
        if words == ["void"]:
            raise self.error(
                f"helper '{name}' returns void: a helper returns a value computed from its "
                "arguments (outputs are the kernel's arrays)", decl)
        if not _scalar(words):
            raise self.error(f"helper '{name}' must return {_TYPES}", decl)
        for p in _declared_parameters(helper):
            self._check_parameter(name, p)
        self.checked.add(name)

    def _check_parameter(self, name: str, p: c_ast.Node) -> None:
        if isinstance(p, c_ast.EllipsisParam):
            raise self.error(f"helper '{name}' is variadic; variadic functions are not allowed",
                             p)
        if not isinstance(p, c_ast.Decl) or not p.name:
            raise self.error(f"every parameter of helper '{name}' needs a type and a name", p)
        if isinstance(p.type, c_ast.PtrDecl):
            raise self.error(
                f"parameter '{p.name}' of helper '{name}' is a pointer; pointers are not "
                f"allowed: a helper takes {_TYPES}", p)
        if isinstance(p.type, c_ast.ArrayDecl):
            raise self.error(
                f"parameter '{p.name}' of helper '{name}' is an array: a helper takes scalars "
                f"({_TYPES}); pass it an element, {name}(x[i])", p)
        if p.storage or p.funcspec or set(p.quals) - {"const"}:
            raise self.error(f"parameter '{p.name}' of helper '{name}' may be const, nothing "
                             "more", p)
        if not _scalar(type_words(p.type)):
            raise self.error(f"parameter '{p.name}' of helper '{name}' must be {_TYPES}", p)


def _fields(node: c_ast.Node) -> list[str]:
    """The attributes of a syntax-tree node that may hold nodes (its class's and its bases')."""
    return [a for cls in type(node).__mro__ for a in getattr(cls, "__slots__", ())
            if a not in ("coord", "__weakref__")]


def _callee(node: c_ast.Node) -> str | None:
    if isinstance(node, c_ast.FuncCall) and isinstance(node.name, c_ast.ID):
        return node.name.name
    return None


def _arguments(node: c_ast.FuncCall) -> list[c_ast.Node]:
    return list(node.args.exprs) if node.args is not None else []


def _declared_parameters(f: c_ast.FuncDef) -> list[c_ast.Node]:
    params = f.decl.type.args.params if f.decl.type.args is not None else []
    if len(params) == 1 and isinstance(params[0], c_ast.Typename) and type_words(
            params[0].type) == ["void"]:
        return []
    return list(params)


def _parameters(f: c_ast.FuncDef) -> list[c_ast.Decl]:
    return [p for p in _declared_parameters(f) if isinstance(p, c_ast.Decl)]


def _scalar(words: list[str] | None) -> bool:
    """Whether a helper may take or return the type `words`: those a conversion represents
    (bfloat16 is a storage type only, and C has no arithmetic in it)."""
    dtype = element_dtype(words) if words else None
    return dtype is not None and dtype != "bfloat16"


def _returns(node: c_ast.Node) -> bool:
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, c_ast.Return):
            return True
        pending.extend(child for _, child in current.children())
    return False


class _Checker:
    """Refuses the constructs no helper may hold, each at its position."""

    def __init__(self, inliner: _Inliner, name: str) -> None:
        self.inliner = inliner
        self.name = name

    def error(self, message: str, node: c_ast.Node) -> SpecError:
        return self.inliner.error(f"helper '{self.name}' {message}", node)

    def body(self, body: c_ast.Node) -> None:
        nodes: list[c_ast.Node] = []  # in source order
        pending = [body]
        while pending:
            node = pending.pop()
            nodes.append(node)
            pending.extend(reversed([child for _, child in node.children()]))
        for node in nodes:  # writes to arrays first: the likeliest mistake
            if isinstance(node, c_ast.Assignment):
                self._target(node.lvalue, node)
            elif isinstance(node, c_ast.UnaryOp) and node.op in ("++", "--", "p++", "p--"):
                self._target(node.expr, node)
        for node in nodes:
            self.node(node)

    def node(self, node: c_ast.Node) -> None:
        if isinstance(node, c_ast.UnaryOp) and pointer_refusal(node.op):
            raise self.error(f"uses a pointer: {pointer_refusal(node.op)}", node)
        elif isinstance(node, (c_ast.For, c_ast.While, c_ast.DoWhile)):
            raise self.error(
                "has a loop: a helper is inlined as one expression, so it holds no loops; "
                "write the loop in the kernel", node)
        elif isinstance(node, c_ast.StructRef):
            raise self.error("uses a struct member; structs and pointers are not allowed", node)
        elif isinstance(node, (c_ast.Switch, c_ast.Goto, c_ast.Label, c_ast.Break,
                               c_ast.Continue, c_ast.Case, c_ast.Default)):
            raise self.error(f"has a statement that is not allowed: {_BODY}", node)
        elif isinstance(node, c_ast.Decl):
            self._local(node)

    def _target(self, target: c_ast.Node, node: c_ast.Node) -> None:
        if isinstance(target, c_ast.ArrayRef):
            base = target
            while isinstance(base, c_ast.ArrayRef):
                base = base.name
            array = base.name if isinstance(base, c_ast.ID) else "an array"
            raise self.error(
                f"writes the array '{array}': a helper only returns a value computed from its "
                f"arguments (it is inlined into an expression of the kernel); write '{array}' "
                "in the kernel itself", node)
        if isinstance(target, c_ast.UnaryOp) and target.op == "*":
            raise self.error(f"writes through a pointer: {pointer_refusal('*')}", node)

    def _local(self, decl: c_ast.Decl) -> None:
        if isinstance(decl.type, c_ast.FuncDecl):
            raise self.error("declares a function inside its body; declare helpers at file "
                             "scope", decl)
        if isinstance(decl.type, c_ast.PtrDecl):
            raise self.error(f"declares the pointer '{decl.name}'; pointers are not allowed",
                             decl)
        if isinstance(decl.type, c_ast.ArrayDecl):
            raise self.error(f"declares the array '{decl.name}'; a helper's locals are scalars",
                             decl)
        if decl.storage:
            raise self.error(
                f"declares '{decl.name}' {' '.join(decl.storage)}; a helper's locals are plain "
                "(a static one would keep its value between calls)", decl)
        if not _scalar(type_words(decl.type)):
            raise self.error(f"declares '{decl.name}', which must be {_TYPES}", decl)


class _Body:
    """One inlining of a helper: its statements run on expressions of the arguments. Every
    path ends in a `return`; an `if` whose branches return is a `?:` of the values each path
    returns (the statements after it read on each path), another merges the variables its
    branches assign with `?:`."""

    def __init__(self, inliner: _Inliner, helper: c_ast.FuncDef) -> None:
        self.inliner = inliner
        self.helper = helper
        self.name = helper.decl.name
        self.returns = tuple(type_words(helper.decl.type.type) or ())
        self.steps = 0

    def error(self, message: str, node: c_ast.Node | None) -> SpecError:
        return self.inliner.error(f"helper '{self.name}' {message}", node)

    def run(self, env: dict[str, _Local]) -> c_ast.Node:
        value = self._run((self.helper.body,), env, 0)
        if value is None:
            raise self.error("can reach the end of its body without returning a value; "
                             "every path must end in return", self.helper.decl)
        return value

    def _run(self, pending: tuple[object, ...], env: dict[str, _Local],
             base: int) -> c_ast.Node | None:
        """The value returned by running `pending` (statements and block ends, inside `base`
        blocks) on `env` (changed in place), or None where they end without a return."""
        while pending:
            item, pending = pending[0], pending[1:]
            self.steps += 1
            if self.steps > MAX_HELPER_STEPS:
                raise self.error(
                    f"has too many paths through its ifs to inline (more than "
                    f"{MAX_HELPER_STEPS} statements run); return from fewer places",
                    self.helper.decl)
            if isinstance(item, _EndBlock):
                for name, local in list(env.items()):
                    if local.depth == item.depth:
                        if local.hidden is None:
                            del env[name]
                        else:
                            env[name] = local.hidden
                continue
            assert isinstance(item, c_ast.Node)
            depth = base + sum(isinstance(p, _EndBlock) for p in pending)
            if isinstance(item, c_ast.Compound):
                pending = (*(item.block_items or []), _EndBlock(depth + 1), *pending)
            elif isinstance(item, c_ast.Return):
                if item.expr is None:
                    raise self.error("returns no value; a helper returns a value", item)
                return _conversion(list(self.returns), self.value(item.expr, env), item.coord)
            elif isinstance(item, c_ast.If):
                if _returns(item):
                    yes = self._run((item.iftrue, *pending), dict(env), base)
                    no = self._run(((item.iffalse,) if item.iffalse is not None else ())
                                   + pending, dict(env), base)
                    if yes is None or no is None:
                        return None
                    return self.choice(item.cond, env, yes, no)
                self._merge(item, env, depth)
            else:
                self._statement(item, env, depth)
        return None

    def _merge(self, node: c_ast.If, env: dict[str, _Local], depth: int) -> None:
        """An `if` whose branches do not return: each variable a branch assigns takes the
        value of the branch the condition selects."""
        taken, other = dict(env), dict(env)
        self._run((node.iftrue,), taken, depth)
        if node.iffalse is not None:
            self._run((node.iffalse,), other, depth)
        for name, before in list(env.items()):
            yes, no = taken[name], other[name]
            if yes is no:
                continue
            if yes.value is None or no.value is None:
                env[name] = replace(before, value=None)
            else:
                env[name] = replace(before, value=self.choice(node.cond, env, yes.value,
                                                              no.value))

    def _statement(self, node: c_ast.Node, env: dict[str, _Local], depth: int) -> None:
        if isinstance(node, c_ast.Decl):
            if node.name in env and env[node.name].depth == depth:
                raise self.error(f"declares '{node.name}' twice", node)
            words = tuple(type_words(node.type) or ())
            value = (None if node.init is None else
                     _conversion(list(words), self.value(node.init, env), node.coord))
            env[node.name] = _Local(words, value, depth, env.get(node.name))
        elif isinstance(node, c_ast.Assignment):
            self._assign(node.lvalue, node.op, self.value(node.rvalue, env), node, env)
        elif isinstance(node, c_ast.UnaryOp) and node.op in ("++", "--", "p++", "p--"):
            one = c_ast.Constant("int", "1", node.coord)
            self._assign(node.expr, "+=" if "+" in node.op else "-=", one, node, env)
        elif isinstance(node, c_ast.EmptyStatement):
            return
        elif isinstance(node, c_ast.FuncCall):
            raise self.error("calls a function without using its value; "
                             f"{_BODY}", node)
        else:
            raise self.error(f"has a statement that is not allowed: {_BODY}", node)

    def _assign(self, target: c_ast.Node, op: str, value: c_ast.Node, node: c_ast.Node,
                env: dict[str, _Local]) -> None:
        if not isinstance(target, c_ast.ID):
            raise self.error("may assign only its parameters and local variables", target)
        local = self._variable(target, env)
        if op != "=":
            current = self._read(target, local)
            value = c_ast.BinaryOp(op[:-1], current, value, node.coord)
        env[target.name] = replace(local, value=_conversion(list(local.words), value,
                                                            node.coord))

    def _variable(self, node: c_ast.ID, env: dict[str, _Local]) -> _Local:
        local = env.get(node.name)
        if local is not None:
            return local
        if node.name in self.inliner.helpers or node.name == self.inliner.kernel:
            raise self.error(f"uses the function '{node.name}' as a value; call it", node)
        raise self.error(
            f"uses '{node.name}', which is neither its parameter nor its local variable: a "
            f"helper computes from its arguments only; pass '{node.name}' as an argument",
            node)

    def _read(self, node: c_ast.ID, local: _Local) -> c_ast.Node:
        if local.value is None:
            raise self.error(f"reads '{node.name}' before assigning it on some path", node)
        return local.value

    def value(self, node: c_ast.Node, env: dict[str, _Local]) -> c_ast.Node:
        """The expression `node` of the helper, as an expression of the arguments."""
        if isinstance(node, c_ast.ID):
            return self._read(node, self._variable(node, env))
        if isinstance(node, c_ast.Constant):
            return node
        name = _callee(node)
        if name is not None and (name in self.inliner.helpers or name == self.inliner.kernel):
            assert isinstance(node, c_ast.FuncCall)
            return self.inliner.call(node, [self.value(a, env) for a in _arguments(node)])
        if isinstance(node, c_ast.FuncCall):  # a math function: read as the kernel's calls
            args = [self.value(a, env) for a in _arguments(node)]
            return c_ast.FuncCall(node.name, c_ast.ExprList(args, node.coord), node.coord)
        if isinstance(node, c_ast.Assignment):
            raise self.error("assigns inside an expression; assign in a statement of its own",
                             node)
        if isinstance(node, c_ast.UnaryOp) and node.op in ("++", "--", "p++", "p--"):
            raise self.error("increments inside an expression; write v += 1; as a statement "
                             "of its own", node)
        rebuilt = copy.copy(node)
        for attr in _fields(node):
            child = getattr(node, attr)
            if isinstance(child, c_ast.Node):
                setattr(rebuilt, attr, self.value(child, env) if not isinstance(
                    child, (c_ast.Typename, c_ast.IdentifierType)) else child)
            elif isinstance(child, list) and any(isinstance(c, c_ast.Node) for c in child):
                setattr(rebuilt, attr, [self.value(c, env) for c in child])
        return rebuilt

    def choice(self, cond: c_ast.Node, env: dict[str, _Local], yes: c_ast.Node,
               no: c_ast.Node) -> c_ast.Node:
        """`cond ? yes : no`, with `cond` of the helper read in `env`: comparisons joined by
        `&&`, `||` and `!` become nested `?:` of single comparisons (the form a value's
        condition takes); any other condition is compared with zero, as C tests it."""
        if isinstance(cond, c_ast.UnaryOp) and cond.op == "!":
            return self.choice(cond.expr, env, no, yes)
        if isinstance(cond, c_ast.BinaryOp) and cond.op == "&&":
            return self.choice(cond.left, env, self.choice(cond.right, env, yes, no), no)
        if isinstance(cond, c_ast.BinaryOp) and cond.op == "||":
            return self.choice(cond.left, env, yes, self.choice(cond.right, env, yes, no))
        if isinstance(cond, c_ast.BinaryOp) and cond.op in COMPARISONS:
            test = c_ast.BinaryOp(cond.op, self.value(cond.left, env),
                                  self.value(cond.right, env), cond.coord)
        else:
            test = c_ast.BinaryOp("!=", self.value(cond, env),
                                  c_ast.Constant("int", "0", cond.coord), cond.coord)
        return c_ast.TernaryOp(test, yes, no, cond.coord)


__all__ = ["MAX_INLINED_NODES", "kernel_function"]
