"""Loop code from isl's AST generator.

Takes a `GroupPlan` (statement domains and their schedule map); returns C lines. isl decides
every loop bound and guard; this module only prints its AST, binds each statement's original
iterators to the AST's arguments, and puts an OpenMP `parallel for` on the outermost loop of a
dimension the plan proved dependence-free. Sums into one cell along an innermost loop run in a
register (`accumulators.py`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import islpy as isl

from polydl.codegen.c.accumulators import AccumulatorPrinter, Instance
from polydl.codegen.c.register_tiles import RowTilePrinter
from polydl.codegen.c_expr import AST_FOR, AST_IF, LANE_STEP, ast_expr_to_c
from polydl.poly.ast_order import ITERATOR_PREFIX, tree_ast
from polydl.poly.isl_parts import maps_of, out_width
from polydl.poly.model import StatementModel
from polydl.schedules.apply import GroupPlan
from polydl.schedules.cpu.affine import PARALLEL_REGION_MARK, read_parallel_mark
from polydl.schedules.cpu.lanes import read_lanes_mark
from polydl.schedules.loop_spans import LoopSpans

# `LANE_STEP`, 1 at run time but opaque to the compiler (an empty asm that may change it)
LANE_STEP_LINES = (f"long {LANE_STEP} = 1;", f'__asm__("" : "+r"({LANE_STEP}));')

# Renders one statement instance given C expressions for its iterators, and inside a lane loop
# each iterator that the lane runs (iterator -> (the lane's counter, lanes)); returns lines.
InstancePrinter = Callable[[StatementModel | str, list[str], dict[str, tuple[str, int]]],
                           list[str]]


def build_ast(plan: GroupPlan) -> isl.AstNode:
    if plan.tree is not None:  # the AST the plan checked (`poly.ast_order`)
        return tree_ast(plan.tree)
    ctx = plan.schedule_map.get_ctx()
    width = out_width(plan.schedule_map)
    iterators = isl.IdList.alloc(ctx, width)
    for d in range(width):
        iterators = iterators.add(isl.Id(f"{ITERATOR_PREFIX}{d}", context=ctx))
    build = isl.AstBuild.from_context(isl.Set("{ : }")).set_iterators(iterators)
    # The schedule map is already restricted to the instances it runs (statements or calls).
    return build.node_from_schedule_map(plan.schedule_map)


def _dim_of(iterator: str) -> int:
    return int(iterator[len(ITERATOR_PREFIX):])


class LoopPrinter:
    def __init__(
        self,
        plan: GroupPlan,
        print_instance: InstancePrinter,
        parallel_pragma: str = "#pragma omp parallel for schedule(static)",
        simd_dims: frozenset[int] = frozenset(),
        spans: LoopSpans | None = None,
        reduction_dims: frozenset[int] = frozenset(),
        accumulators: AccumulatorPrinter | None = None,
        row_tiles: RowTilePrinter | None = None,
        contracted: dict[str, frozenset[str]] | None = None,
        lifetimes: dict[str, int] | None = None,
        threads: int = 0,
    ) -> None:
        self.plan = plan
        self.print_instance = print_instance
        self.statements = {s.name: s for s in plan.printed_statements}
        # statements printed as themselves (not microkernel calls)
        self.plain_statements = {k: v for k, v in self.statements.items() if k not in plan.calls}
        self.parallel_dims = set(plan.parallel_dims)
        self.parallel_pragma = parallel_pragma
        self.simd_dims = simd_dims
        self.spans = spans  # loops' iteration counts (`_at_most_two`)
        # loops that carry only sums and extrema on their own cells: SIMD with those in registers
        self.reduction_dims = reduction_dims
        self.band_dims: dict[str, tuple[int, ...]] | None = None  # `_band_dims` of a tree plan
        self.accumulators = accumulators
        self.row_tiles = row_tiles
        self.epilogue_names = {s.name for s in plan.epilogues}
        # set by a `parallel` mark of a scheduled tree: the next loop below it runs parallel
        # (with the one after it, 2, where the mark says collapse)
        self.marked_parallel = 0
        self.marked_dim = -1  # the schedule dimension of the marked loop
        self.lanes_next = 0  # set by a `lanes` mark: the next loop is a loop of that many lanes
        self.printed_lanes = False  # a lane loop was printed (it needs `LANE_STEP_LINES`)
        self.lane: tuple[str, int] | None = None  # (iterator, lanes) of the lane loop printed
        self.collapsed_left = 0  # loops below a `collapse(n)` pragma still to print bare
        # inside a `parallel region` mark: the threads run every loop, parallel ones share out
        # their iterations (`omp for`), and a statement outside them runs on one (`omp single`)
        self.in_region = False
        # locals held as C locals (`schedules.contraction`): the statements touching each, in
        # every nest
        self.contracted = contracted or {}
        # each contracted local's storage lives one iteration of the schedule's dimensions
        # before this one (`LocalStorage.level`)
        self.lifetimes = lifetimes or {}
        self.threads = threads
        self.runs: dict[str, int] = {}  # how often the AST runs each statement (its user nodes)

    def lines(self) -> list[str]:
        if self.plan.schedule_map.is_empty():
            return []
        root = build_ast(self.plan)
        self.runs = _user_nodes(root)
        return self._node(root, 0, False)

    def _node(self, node: isl.AstNode, indent: int, in_parallel: bool) -> list[str]:
        pad = "  " * indent
        kind = node.get_type()
        if kind == isl.ast_node_type.block:
            children = node.block_get_children()
            out: list[str] = []
            for i in range(children.n_ast_node()):
                out += self._node(children.get_at(i), indent, in_parallel)
            return out
        if kind == AST_FOR:
            return self._for(node, indent, in_parallel)
        if kind == AST_IF:
            out = [f"{pad}if ({_strip(ast_expr_to_c(node.if_get_cond()))}) {{"]
            out += self._node(node.if_get_then_node(), indent + 1, in_parallel)
            if node.if_has_else_node():
                out.append(f"{pad}}} else {{")
                out += self._node(node.if_get_else_node(), indent + 1, in_parallel)
            out.append(f"{pad}}}")
            return out
        if kind == isl.ast_node_type.user:
            call = node.user_get_expr()
            name = call.get_op_arg(0).get_id().get_name()
            args = [ast_expr_to_c(call.get_op_arg(i)) for i in range(1, call.get_op_n_arg())]
            # a name that is no statement is a copy the schedule added (a packed operand)
            statement = self.statements.get(name, name)
            body = self.print_instance(statement, args, self._lane_iterators(statement, args))
            if self.in_region and not in_parallel:
                return [pad + "#pragma omp single", pad + "{", *("  " + pad + line for line in body),
                        pad + "}"]
            return [pad + line for line in body]
        if kind == isl.ast_node_type.mark:
            name = node.mark_get_id().get_name()
            if name == PARALLEL_REGION_MARK and not in_parallel and not self.in_region:
                self.in_region = True
                lines = self._node(node.mark_get_node(), indent + 1, in_parallel)
                self.in_region = False
                return [pad + "#pragma omp parallel", pad + "{", *lines, pad + "}"]
            lanes = read_lanes_mark(name)
            if lanes is not None:
                self.lanes_next = lanes
                lines = self._node(node.mark_get_node(), indent, in_parallel)
                self.lanes_next = 0
                return lines
            mark = read_parallel_mark(name)
            if mark is not None and not in_parallel:
                self.marked_parallel, self.marked_dim = mark
            lines = self._node(node.mark_get_node(), indent, in_parallel)
            self.marked_parallel = 0
            return lines
        raise NotImplementedError(f"isl AST node {kind}")

    def _for(self, node: isl.AstNode, indent: int, in_parallel: bool) -> list[str]:
        pad = "  " * indent
        it = node.for_get_iterator().get_id().get_name()
        init = ast_expr_to_c(node.for_get_init())
        marked, self.marked_parallel = self.marked_parallel, 0
        lanes, self.lanes_next = self.lanes_next, 0
        if marked and _dim_of(it) != self.marked_dim:
            marked = 0  # the marked loop has one value in this part: isl left it out
        if node.for_is_degenerate():
            out = [f"{pad}{{", f"{pad}  const long {it} = {init};"]
            out += self._node(node.for_get_body(), indent + 1, in_parallel)
            return out + [f"{pad}}}"]
        cond = ast_expr_to_c(node.for_get_cond())
        out = []
        if self.collapsed_left:  # a loop of a collapsed parallel nest: no pragma may come between
            self.collapsed_left -= 1
            return [pad + _header(node), *self._node(node.for_get_body(), indent + 1, in_parallel), f"{pad}}}"]
        own = self._own_locals(node)
        parallel_here = (not in_parallel and (marked or _dim_of(it) in self.parallel_dims)
                         and own is not None)
        if parallel_here:
            depth = self._collapsible(node, marked)
            pragma = self.parallel_pragma + _private(own or ())
            if self.in_region:  # the threads are there: share out the iterations
                pragma = pragma.replace("parallel for", "for", 1)
            if depth > 1:
                pragma = re.sub(r"\bfor\b", f"for collapse({depth})", pragma, count=1)
                self.collapsed_left = depth - 1
            out.append(pad + pragma)
        # a loop every thread of a region runs prints its statements one by one (each once,
        # `omp single`), which OpenMP allows in no `omp simd` loop
        shared = self.in_region and not (in_parallel or parallel_here)
        if lanes and not parallel_here and not shared:
            return self._lane_loop(node, indent, in_parallel, lanes)
        if (not parallel_here and not shared and self._map_dim(node) in self.simd_dims
                and own is not None and self._simd_body(node.for_get_body())):
            out.append(pad + "#pragma omp simd" + _private(own or ()))
        header = _header(node)
        if not out and not parallel_here and not shared and self.row_tiles is not None:
            tile = self.row_tiles.match(node, self.plain_statements, _header)
            if tile is not None:
                loops = [header, *self._node(node.for_get_body(), 1, in_parallel), "}"]
                return [pad + line for line in self.row_tiles.lines(tile, loops)]
        if not out and not parallel_here and not shared and self.accumulators is not None:
            body = self._instances(node.for_get_body())
            sums = self.accumulators.accumulations(body, it) if body else []
            if sums:
                simd = (self._own_locals(node, frozenset(
                    a.instance.statement.statement.target.array for a in sums))
                    if self._map_dim(node) in self.reduction_dims else None)
                lines = self.accumulators.loop(body, sums, header, it, init, _strip(cond), simd)
                return [pad + line for line in lines]
        if not out and not shared and self._at_most_two(node):
            out.append(pad + "#pragma GCC unroll 2")
        out.append(pad + header)
        out += self._node(node.for_get_body(), indent + 1, bool(in_parallel or parallel_here))
        return out + [f"{pad}}}"]

    def _lane_iterators(self, statement: StatementModel | str,
                        args: list[str]) -> dict[str, tuple[str, int]]:
        """The iterator of `statement` that the lane loop being printed runs (the one its
        iterator appears in: the lane band is that iterator less its strip), with the loop's
        iterator and lanes; {} outside lane loops."""
        if self.lane is None or isinstance(statement, str):
            return {}
        iterator, lanes = self.lane
        return {var: (iterator, lanes) for var, arg in zip(statement.iterators, args, strict=True)
                if re.search(rf"\b{iterator}\b", arg)}

    def _lane_loop(self, node: isl.AstNode, indent: int, in_parallel: bool,
                   lanes: int) -> list[str]:
        """A lane loop (`schedules.cpu.lanes`): SIMD. Its iterator runs the lane, the strip-mined
        iterator less its strip: a local kept a cell per lane is indexed by it, and an access a
        row apart strides by `LANE_STEP` (`StatementPrinter`). Its iterations depend on none of
        each other (the lanes' loop carries nothing), so a local that a lane writes is the
        lane's own, unless something outside the loop touches it: then it keeps a cell per
        lane (`schedules.contraction`)."""
        pad = "  " * indent
        inside = _user_nodes(node.for_get_body())
        own = tuple(sorted(
            name for name, users in self.contracted.items()
            if any(self.statements[u].statement.target.array == name for u in inside
                   if u in self.statements)
            and all(inside.get(u, 0) >= self.runs.get(u, 0) for u in users if u in self.runs)))
        self.printed_lanes = True
        self.lane = (node.for_get_iterator().get_id().get_name(), lanes)
        body = self._node(node.for_get_body(), indent + 1, in_parallel)
        self.lane = None
        return [pad + "#pragma omp simd" + _private(own), pad + _header(node), *body, f"{pad}}}"]

    def _own_locals(self, node: isl.AstNode, held: frozenset[str] = frozenset()) -> tuple[str, ...] | None:
        """The contracted locals that the body of loop `node` writes, which each of its
        iterations may hold as its own (`private`): every statement touching them runs inside
        the loop only. None where one is touched outside the loop too: a value that enters or
        leaves the loop, which then runs as it is written (neither parallel nor SIMD). `held`:
        locals the loop's register accumulators hold instead (read before it, stored after)."""
        inside = _user_nodes(node.for_get_body())
        written = {s.statement.target.array for name in inside
                   if (s := self.statements.get(name)) is not None}
        own = tuple(sorted(name for name in self.contracted if name in written - held))
        for name in own:
            if any(user not in self.statements or inside.get(user, 0) < self.runs.get(user, 0)
                   for user in self.contracted[name]):
                return None
        if not own:
            return own
        # a local whose storage outlives one iteration of this loop (a value written in one
        # iteration is read in a later iteration of a loop outside) is shared, not each
        # iteration's own: its cells tell this loop's iterations apart (`schedules.contraction`)
        dim = self._map_dim(node)
        if dim is None:
            return None
        return tuple(name for name in own if self.lifetimes.get(name, dim + 1) > dim)

    def _map_dim(self, node: isl.AstNode) -> int | None:
        """The output dimension of the plan's schedule map that loop `node` runs (what
        `simd_dims` and `reduction_dims` name). A schedule map's AST names its loops by that
        dimension; a schedule tree's by its depth in bands, while the tree's map has a
        dimension for each sequence too: there the statements under the loop say which (None
        where they disagree)."""
        depth = _dim_of(node.for_get_iterator().get_id().get_name())
        if self.plan.tree is None:
            return depth
        if self.band_dims is None:
            self.band_dims = _band_dims(self.plan.tree)
        dims = {self.band_dims[name][depth] if depth < len(self.band_dims.get(name, ())) else None
                for name in _user_nodes(node.for_get_body())}
        return dims.pop() if len(dims) == 1 else None

    def _collapsible(self, node: isl.AstNode, marked: int = 0) -> int:
        """How many loops from `node` down run as one parallel loop: the schedule's parallel
        dimensions, or the `marked` ones of a scheduled tree's mark (each carries no
        dependence, so any two iterations of the set differ in a dependence-free loop), that
        nest perfectly, the inner bounds free of the outer iterators (OpenMP's collapse). Two
        loops of 4 and 14 iterations feed 16 threads where the outer one alone leaves 12 idle."""
        first = _dim_of(node.for_get_iterator().get_id().get_name())
        wanted = set(range(first, first + marked)) if marked else self.parallel_dims
        depth, outer = 1, [node.for_get_iterator().get_id().get_name()]
        inner = node.for_get_body()
        trips = _trips(node)
        while (inner.get_type() == AST_FOR
               and (not self._loop_free(inner.for_get_body())
                    or (trips is not None and trips < self.threads)) and not inner.for_is_degenerate()
               and _dim_of(inner.for_get_iterator().get_id().get_name()) == first + depth
               and first + depth in wanted):
            bounds = ast_expr_to_c(inner.for_get_init()) + " " + ast_expr_to_c(inner.for_get_cond())
            if any(re.search(rf"\b{name}\b", bounds) for name in outer):
                break
            depth += 1
            outer.append(inner.for_get_iterator().get_id().get_name())
            more = _trips(inner)
            trips = None if more is None or trips is None else trips * more
            inner = inner.for_get_body()
        return depth

    def _instances(self, node: isl.AstNode) -> list[Instance]:
        """The statement instances of a loop body made of statements only (no loop, guard or
        microkernel call); [] otherwise."""
        kind = node.get_type()
        if kind == isl.ast_node_type.block:
            children = node.block_get_children()
            out: list[Instance] = []
            for i in range(children.n_ast_node()):
                part = self._instances(children.get_at(i))
                if not part:
                    return []
                out += part
            return out
        if kind != isl.ast_node_type.user:
            return []
        call = node.user_get_expr()
        name = call.get_op_arg(0).get_id().get_name()
        statement = self.statements.get(name)
        if statement is None or name in self.plan.calls:
            return []
        args = tuple(ast_expr_to_c(call.get_op_arg(i)) for i in range(1, call.get_op_n_arg()))
        return [Instance(statement, args)]

    def _simd_body(self, node: isl.AstNode) -> bool:
        """True for the bodies of a dependence-free innermost loop that the C compiler leaves
        scalar on its own: fused epilogues only (it guards or transposes the per-tile epilogue
        loop, which then costs as much as a separate pass over the output), and several
        statements (gcc gives up on a large body, e.g. a Winograd transform's 36 sums), and
        in a nest with a fused start (its reduction's innermost loop was vectorised behind a
        run-time overlap test of the output and input rows on every iteration)."""
        return self._only_epilogues(node) or len(self._instances(node)) > 1 or (
            bool(self.plan.prologues) and self._loop_free(node))

    def _at_most_two(self, node: isl.AstNode) -> bool:
        """True for an innermost loop (`node`) that runs at most two iterations. It is printed
        `#pragma GCC unroll 2`: unrolled, never vectorised as a loop. gcc 12.2 at -O3 vectorises
        such a loop in vectors of two behind a run-time overlap test and runs a whole vector
        where one iteration is left (differential seed 810758); two iterations gain nothing
        from a loop of vectors anyway."""
        body, dim = node.for_get_body(), self._map_dim(node)
        if self.spans is None or dim is None or not self._loop_free(body):
            return False
        widest = self.spans.widest(frozenset(_user_nodes(body)), dim)
        return widest is not None and widest <= 1

    def _loop_free(self, node: isl.AstNode) -> bool:
        """True if `node` holds statements and no loop (degenerate ones aside)."""
        return self._leaves_all(node, lambda name: True)

    def _only_epilogues(self, node: isl.AstNode) -> bool:
        """True if `node` holds no loop (degenerate ones aside) and runs fused epilogues only."""
        return self._leaves_all(node, lambda name: name in self.epilogue_names)

    def _leaves_all(self, node: isl.AstNode, test: Callable[[str], bool]) -> bool:
        """True if `node` holds no loop (degenerate ones aside) and `test` holds for the name
        of every statement it runs."""
        kind = node.get_type()
        if kind == isl.ast_node_type.block:
            children = node.block_get_children()
            return all(self._leaves_all(children.get_at(i), test) for i in range(children.n_ast_node()))
        if kind == AST_FOR:
            return bool(node.for_is_degenerate()) and self._leaves_all(node.for_get_body(), test)
        if kind == AST_IF:
            return self._leaves_all(node.if_get_then_node(), test) and (
                not node.if_has_else_node() or self._leaves_all(node.if_get_else_node(), test)
            )
        if kind == isl.ast_node_type.user:
            return test(node.user_get_expr().get_op_arg(0).get_id().get_name())
        if kind == isl.ast_node_type.mark:
            return self._leaves_all(node.mark_get_node(), test)
        return False


def _band_dims(tree: isl.Schedule) -> dict[str, tuple[int, ...]]:
    """For each statement of `tree`, the output dimensions of the tree's schedule map that its
    band members make, from the root down: each band member makes one, and each sequence or
    set one more (the position of its child)."""
    out: dict[str, tuple[int, ...]] = {}

    def walk(node: isl.ScheduleNode, dims: tuple[int, ...], next_dim: int) -> None:
        kind = node.get_type()
        if kind == isl.schedule_node_type.leaf:
            for part in maps_of(isl.UnionMap.from_domain(node.get_domain())):
                out[part.get_tuple_name(isl.dim_type.in_)] = dims
            return
        if kind == isl.schedule_node_type.band:
            members = node.band_n_member()
            dims, next_dim = dims + tuple(range(next_dim, next_dim + members)), next_dim + members
        elif kind in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
            next_dim += 1
        for k in range(node.n_children()):
            walk(node.child(k), dims, next_dim)

    walk(tree.get_root(), (), 0)
    return out


def _user_nodes(node: isl.AstNode) -> dict[str, int]:
    """How many places of the AST under `node` run each statement (or call), by name."""
    out: dict[str, int] = {}

    def visit(n: isl.AstNode) -> bool:
        if n.get_type() == isl.ast_node_type.user:
            name = n.user_get_expr().get_op_arg(0).get_id().get_name()
            out[name] = out.get(name, 0) + 1
        return True

    node.foreach_descendant_top_down(visit)
    return out


def _private(names: tuple[str, ...]) -> str:
    return f" private({', '.join(names)})" if names else ""


def _trips(node: isl.AstNode) -> int | None:
    """How many iterations loop `node` runs, where its bounds are numbers."""
    it = node.for_get_iterator().get_id().get_name()
    init, cond = ast_expr_to_c(node.for_get_init()), _strip(ast_expr_to_c(node.for_get_cond()))
    step = ast_expr_to_c(node.for_get_inc())
    bound = re.fullmatch(rf"{re.escape(it)} (<=|<) (-?\d+)", cond)
    if bound is None or not re.fullmatch(r"-?\d+", init) or not step.isdigit():
        return None
    last = int(bound.group(2)) - (bound.group(1) == "<")
    return max(0, (last - int(init)) // int(step) + 1)


def _header(node: isl.AstNode) -> str:
    """The `for (...) {` line of a loop node."""
    it = node.for_get_iterator().get_id().get_name()
    init, cond = ast_expr_to_c(node.for_get_init()), ast_expr_to_c(node.for_get_cond())
    inc = ast_expr_to_c(node.for_get_inc())
    step = f"{it}++" if inc == "1" else f"{it} += {inc}"
    return f"for (long {it} = {init}; {_strip(cond)}; {step}) {{"


def _strip(text: str) -> str:
    if text.startswith("(") and text.endswith(")"):
        depth = 0
        for i, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(text) - 1:
                return text
        return text[1:-1]
    return text
