"""A row of vector sums held in registers across the loops that sum into it.

Takes an isl AST loop whose body is a perfect chain `sums.. > row > lanes > statement` (the
form `schedules/cpu/register_tiles.py` schedules: a tiled output loop `row` outside sums over
taps); returns the C of that loop with each of the tile's outputs in one vector variable
(GCC's vector extension, `vector_size` of the lane row): loaded once before the sums, one
multiply-add per tap, stored once after. isl leaves the row's bounds to each tap (a tap at
the image's edge skips the outputs it has no input for): the code finds the rows the taps
touch first, runs a tap over the whole tile without tests where its bounds are the tile's,
and tests each output of the tile otherwise. A tile wider than `size` (never, for a loop
tiled by `size`) runs the loops as isl printed them.

The statement must be `c += e` or `c -= e` (`poly.sums.addend_of`), or `c = fmaxf(c, e)` or
fminf (`poly.sums.extremum_of`: a max pooling's window, compared lane by lane and the larger
kept, as fmaxf keeps a number over a NaN `e`), on float32 arrays, its
cell moving with the row and the lanes only, every access along the lanes by its last
subscript alone or not at all (a broadcast), and `e` made of loads, constants, `+ - * /` and
negation, which GCC's vector extension computes lane by lane.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import islpy as isl

from polydl.codegen.c_expr import AST_FOR, StatementPrinter, ast_expr_to_c
from polydl.ir import Binary, Const, Expr, Load, Unary, access_vars, int_vars
from polydl.poly.model import StatementModel
from polydl.poly.sums import addend_of, extremum_of, reads_own_cell
from polydl.schedules.cpu.register_tiles import ROW_BYTES, along_lanes

PREFIX = "_pd_row"
_OPS = ("+", "-", "*", "/")


@dataclass(frozen=True)
class RowTile:
    """A matched chain: the C headers of the sum loops, the row loop's bounds, and the
    statement with its iterators' C expressions."""

    sum_headers: tuple[str, ...]
    row_low: str  # the row loop's first value, over the sum loops' iterators
    row_high: str  # its last value
    statement: StatementModel
    args: tuple[str, ...]
    row_var: str  # the statement's iterator along the row
    lane_var: str
    lanes: int
    size: int  # outputs per tile
    addend: Expr  # the value each tap combines into the cell
    combine: str  # "+", "-" (sums), "max" or "min"


def _vector_expr(e: Expr, printer: StatementPrinter, lane: str, vector: str, offset: int = 0) -> str | None:
    """`e` over vectors of `lane` (loads along it as vectors, `offset` lanes on, the rest
    broadcast); None where `e` has an operation the vector extension does not compute lane by
    lane."""
    if isinstance(e, Const):
        return printer.literal(e.value)
    if isinstance(e, Load):
        element = printer.element(e.access)
        if any(lane in int_vars(i) for i in e.access.indices):
            return f"(*(const {vector} *)(&{element}{_plus(offset)}))"
        return element
    if isinstance(e, Unary):
        inner = _vector_expr(e.operand, printer, lane, vector, offset)
        return None if inner is None else f"(-{inner})"
    if isinstance(e, Binary) and e.op in _OPS:
        left = _vector_expr(e.left, printer, lane, vector, offset)
        right = _vector_expr(e.right, printer, lane, vector, offset)
        return None if left is None or right is None else f"({left} {e.op} {right})"
    return None


def _plus(offset: int) -> str:
    return f" + {offset}" if offset else ""


class RowTilePrinter:
    def __init__(self, printer: StatementPrinter, tiles: dict[str, int], vector_bytes: int) -> None:
        """`vector_bytes`: the target's widest vector register. A lane row wider than it is
        held as that many parts, each its own variable: GCC keeps a 64-byte vector of its
        extension on an AVX2 core in memory, not in two registers, and moved every sum of
        the row through the stack on each tap."""
        self.printer = printer
        self.tiles = tiles  # the plan's tile sizes, by loop variable
        self.vector_bytes = vector_bytes
        self.count = 0

    def match(self, node: isl.AstNode, statements: dict[str, StatementModel],
              header: Callable[[isl.AstNode], str]) -> RowTile | None:
        chain = []
        while node.get_type() == AST_FOR and not node.for_is_degenerate():
            chain.append(node)
            node = node.for_get_body()
        if len(chain) < 3 or node.get_type() != isl.ast_node_type.user:
            return None
        call = node.user_get_expr()
        statement = statements.get(call.get_op_arg(0).get_id().get_name())
        if statement is None:
            return None
        args = tuple(ast_expr_to_c(call.get_op_arg(i)) for i in range(1, call.get_op_n_arg()))
        binds = dict(zip(statement.iterators, args, strict=True))
        names = [c.for_get_iterator().get_id().get_name() for c in chain]
        by_name = {a: v for v, a in binds.items()}
        lane, row = by_name.get(names[-1]), by_name.get(names[-2])
        if lane is None or row is None or row not in self.tiles:
            return None
        s = statement.statement
        form = addend_of(s) or extremum_of(s)
        if form is None or reads_own_cell(statement, form[0]):
            return None
        if any(self.printer.layouts[a.access.array].dtype != "float32" for a in statement.accesses):
            return None
        if not along_lanes(statement, lane):
            return None
        moving = access_vars(s.target)
        sums = names[:-2]
        if row not in moving or any(binds.get(v) in sums for v in moving):
            return None
        lanes = _lane_count(chain[-1])
        if lanes * 4 not in ROW_BYTES:
            return None
        if _vector_expr(form[0], self.printer, lane, "v") is None:
            return None
        row_loop = chain[-2]
        cond = row_loop.for_get_cond()
        if (cond.get_type() != isl.ast_expr_type.op
                or ast_expr_to_c(row_loop.for_get_inc()) != "1"
                or cond.get_op_type() not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt)):
            return None
        high = ast_expr_to_c(cond.get_op_arg(1))
        if cond.get_op_type() == isl.ast_expr_op_type.lt:
            high = f"({high} - 1)"
        return RowTile(tuple(header(c) for c in chain[:-2]), ast_expr_to_c(row_loop.for_get_init()),
                       high, statement, args, row, lane, lanes, self.tiles[row], *form)

    def lines(self, tile: RowTile, fallback: list[str]) -> list[str]:
        """The tile's C (`fallback`: the loops as isl printed them, for a wider tile)."""
        n = self.count
        self.count += 1
        vector, lo, hi = f"{PREFIX}{n}_v", f"{PREFIX}{n}_lo", f"{PREFIX}{n}_hi"
        mask, tap, take = f"{PREFIX}{n}_m", f"{PREFIX}{n}_tap", f"{PREFIX}{n}_take"
        first, last, any_ = f"{PREFIX}{n}_first", f"{PREFIX}{n}_last", f"{PREFIX}{n}_any"
        width = min(tile.lanes * 4, max(self.vector_bytes, min(ROW_BYTES))) // 4  # lanes a part
        offsets = range(0, tile.lanes, width)
        accs = [[f"{PREFIX}{n}_{i}" + (f"_{o // width}" if len(offsets) > 1 else "") for o in offsets]
                for i in range(tile.size)]
        s = tile.statement
        target = self.printer.element(s.statement.target)
        values = [_vector_expr(tile.addend, self.printer, tile.lane_var, vector, o) for o in offsets]
        moving = access_vars(s.statement.target)

        def binds(i: int, only_target: bool) -> str:
            out = []
            for v, a in zip(s.iterators, tile.args, strict=True):
                if only_target and v not in moving:
                    continue
                a = f"{first} + {i}" if v == tile.row_var else "0" if v == tile.lane_var else a
                out.append(f"const long {v} = {a};")
            return " ".join(out)

        def sums(body: list[str]) -> list[str]:
            out, pad = [], ""
            for h in tile.sum_headers:
                out.append(pad + h)
                pad += "  "
            out += [pad + line for line in body]
            for _ in tile.sum_headers:
                pad = pad[:-2]
                out.append(pad + "}")
            return out

        def cell(o: int) -> str:
            return f"*({vector} *)(&{target}{_plus(o)})"

        def add(i: int) -> str:
            if tile.combine in ("+", "-"):
                return " ".join(f"{acc} {tile.combine}= {value};"
                                for acc, value in zip(accs[i], values, strict=True))
            # the lanes where the tap's value passes the cell's take it (a comparison of the
            # vector extension gives each lane all ones or zeros); a NaN value never passes
            better = "<" if tile.combine == "max" else ">"
            return " ".join(
                f"{{ const {vector} {tap} = {value}; const {mask} {take} = {acc} {better} {tap}; "
                f"{acc} = ({vector})((({mask}){tap} & {take}) | (({mask}){acc} & ~{take})); }}"
                for acc, value in zip(accs[i], values, strict=True))

        out = ["{", f"  typedef float {vector} __attribute__((vector_size({width * 4}), "
                    "aligned(4), may_alias));",
               *([f"  typedef int {mask} __attribute__((vector_size({width * 4})));"]
                 if tile.combine in ("max", "min") else []),
               f"  long {first} = 0, {last} = -1;", f"  int {any_} = 0;"]
        # the rows the taps touch
        out += ["  " + line for line in sums([
            f"const long {lo} = {tile.row_low}, {hi} = {tile.row_high};",
            f"if ({lo} <= {hi}) {{",
            f"  if (!{any_} || {lo} < {first}) {first} = {lo};",
            f"  if (!{any_} || {hi} > {last}) {last} = {hi};",
            f"  {any_} = 1;",
            "}"])]
        out.append(f"  if ({last} - {first} < {tile.size}) {{")
        for i, parts in enumerate(accs):
            out.append(f"    {vector} {', '.join(f'{acc} = {{0}}' for acc in parts)};")
            loads = " ".join(f"{acc} = {cell(o)};" for acc, o in zip(parts, offsets, strict=True))
            out.append(f"    if ({first} + {i} <= {last}) {{ {binds(i, True)} {loads} }}")
        full = [f"{{ {binds(i, False)} {add(i)} }}" for i in range(tile.size)]
        part = [f"if ({first} + {i} >= {lo} && {first} + {i} <= {hi}) "
                f"{{ {binds(i, False)} {add(i)} }}" for i in range(tile.size)]
        body = [f"const long {lo} = {tile.row_low}, {hi} = {tile.row_high};",
                f"if ({lo} == {first} && {hi} == {first} + {tile.size - 1}) {{",
                *("  " + line for line in full), "} else {", *("  " + line for line in part), "}"]
        out += ["    " + line for line in sums(body)]
        for i, parts in enumerate(accs):
            stores = " ".join(f"{cell(o)} = {acc};" for acc, o in zip(parts, offsets, strict=True))
            out.append(f"    if ({first} + {i} <= {last}) {{ {binds(i, True)} {stores} }}")
        out.append("  } else {")
        out += ["    " + line for line in fallback]
        out += ["  }", "}"]
        return out


def _lane_count(loop: isl.AstNode) -> int:
    """The trip count of a loop `for (i = 0; i <= C; i++)`; 0 for any other form."""
    init, cond = loop.for_get_init(), loop.for_get_cond()
    if (init.get_type() != isl.ast_expr_type.int or init.get_val().to_python() != 0
            or ast_expr_to_c(loop.for_get_inc()) != "1" or cond.get_type() != isl.ast_expr_type.op):
        return 0
    bound = cond.get_op_arg(1)
    if bound.get_type() != isl.ast_expr_type.int:
        return 0
    value = int(bound.get_val().to_python())
    return value + 1 if cond.get_op_type() == isl.ast_expr_op_type.le else (
        value if cond.get_op_type() == isl.ast_expr_op_type.lt else 0)
