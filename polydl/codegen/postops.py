"""Post-ops in the microkernels: the fused epilogue applied to the accumulators of a register
tile right before they are stored (see `polydl.schedules.postops`).

Takes a spec's `PostOps` and the tile's cells; returns C lines: SIMD intrinsics for the vector
kernels (an operand that is constant along the vector is broadcast, one that is unit-stride is
loaded, masked on a ragged edge), plain C for the portable kernel and the dot-product cells.
A kernel that cannot apply them raises `PostOpsUnsupported`; the caller then keeps the
epilogue as a loop after the call.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from polydl.errors import ScheduleError
from polydl.schedules.postops import Acc, Apply, Literal, Operand, PostExpr, PostOps

# C comparison -> AVX predicate (ordered, quiet; `!=` is true on NaN in C: unordered)
PREDICATES = {"<": "_CMP_LT_OQ", "<=": "_CMP_LE_OQ", ">": "_CMP_GT_OQ", ">=": "_CMP_GE_OQ",
              "==": "_CMP_EQ_OQ", "!=": "_CMP_NEQ_UQ"}


class PostOpsUnsupported(ScheduleError):
    """This microkernel cannot apply the post-ops (the epilogue stays a loop after the call)."""


def parameters(postops: PostOps | None, ctype: str) -> str:
    """The extra parameters of a kernel with post-ops: one pointer per operand."""
    if postops is None:
        return ""
    return "".join(f", const {ctype} *restrict e{i}" for i in range(len(postops.operands)))


def arguments(postops: PostOps | None) -> str:
    if postops is None:
        return ""
    return "".join(f", e{i}" for i in range(len(postops.operands)))


def operand_bases(postops: PostOps, ctype: str, block_n: int = 0) -> list[str]:
    """Each operand's pointer at the tile's origin (m0, n0; with `block_n`, column n0 of
    blocks of that many columns). The empty volatile asm keeps
    the loads here, after the reduction: an operand that does not vary along m would
    otherwise be loaded before the tile's loops and held in registers through the
    reduction, spilling an accumulator from its inner loop."""
    lines = []
    for i, o in enumerate(postops.operands):
        n0 = (f"(n0 / {block_n}) * {o.nb}L + (n0 % {block_n}) * {o.n}L" if block_n
              else f"n0 * {o.n}L")
        lines.append(f"{ctype} const *ep{i} = e{i} + m0 * {o.m}L + {n0};")
        lines.append(f'__asm__ volatile("" : "+r"(ep{i}));')
    return lines


def literal(value: float, ctype: str) -> str:
    if math.isinf(value) or math.isnan(value):
        raise PostOpsUnsupported(f"non-finite literal {value}")
    text = repr(float(value))
    return text + "f" if ctype == "float" else text


def scalar_expr(e: PostExpr, acc: str, operand: Callable[[int], str], ctype: str) -> str:
    """`e` as a C expression of type `ctype`."""
    def go(x: PostExpr) -> str:
        if isinstance(x, Acc):
            return acc
        if isinstance(x, Operand):
            return operand(x.index)
        if isinstance(x, Literal):
            return literal(x.value, ctype)
        args = [go(a) for a in x.args]
        if x.op == "neg":
            return f"(-{args[0]})"
        if x.op == "max":
            return f"({args[0]} > {args[1]} ? {args[0]} : {args[1]})"
        if x.op == "min":
            return f"({args[0]} < {args[1]} ? {args[0]} : {args[1]})"
        if x.op in ("fmax", "fmin"):
            return f"{x.op}{'f' if ctype == 'float' else ''}({args[0]}, {args[1]})"
        if x.op.startswith("select"):
            return f"({args[0]} {x.op[6:]} {args[1]} ? {args[2]} : {args[3]})"
        return f"({args[0]} {x.op} {args[1]})"
    return go(e)


def scalar_lines(postops: PostOps, var: str, operand: Callable[[int], str], ctype: str) -> list[str]:
    """`var = step;` for each step: the post-ops on one scalar cell."""
    return [f"{var} = {scalar_expr(s, var, operand, ctype)};" for s in postops.steps]


class VectorOps:
    """The intrinsics of one vector ISA family ("avx2" or "avx512") and compute dtype."""

    def __init__(self, family: str, dtype: str) -> None:
        self.wide = family == "avx512"
        self.double = dtype == "float64"
        self.w = "512" if self.wide else "256"
        self.sfx = "pd" if self.double else "ps"
        self.ctype = "double" if self.double else "float"

    def set1(self, scalar: str) -> str:
        return f"_mm{self.w}_set1_{self.sfx}({scalar})"

    def load(self, address: str, masked: bool) -> str:
        if not masked:
            return f"_mm{self.w}_loadu_{self.sfx}({address})"
        if self.wide:
            return f"_mm512_maskz_loadu_{self.sfx}(tail, {address})"
        return f"_mm256_maskload_{self.sfx}({address}, tail)"

    def apply(self, op: str, args: list[str], constant: Callable[[float], str]) -> str:
        p = f"_mm{self.w}"
        names = {"+": "add", "-": "sub", "*": "mul", "/": "div", "max": "max", "min": "min"}
        if op in names:
            return f"{p}_{names[op]}_{self.sfx}({args[0]}, {args[1]})"
        if op == "neg":  # flip the sign bit: 0 - x would turn -0 into +0
            return f"{p}_xor_{self.sfx}({args[0]}, {constant(-0.0)})"
        if op in ("fmax", "fmin"):  # as C's: where b is NaN, a (max_ps / min_ps return b)
            a, b = args
            both = f"{p}_{op[1:]}_{self.sfx}({a}, {b})"
            if self.wide:
                return f"_mm512_mask_blend_{self.sfx}(_mm512_cmp_{self.sfx}_mask({b}, {b}, _CMP_UNORD_Q), {both}, {a})"
            return f"_mm256_blendv_{self.sfx}({both}, {a}, _mm256_cmp_{self.sfx}({b}, {b}, _CMP_UNORD_Q))"
        a, b, t, f = args
        pred = PREDICATES[op[6:]]
        if self.wide:
            return f"_mm512_mask_blend_{self.sfx}(_mm512_cmp_{self.sfx}_mask({a}, {b}, {pred}), {f}, {t})"
        return f"_mm256_blendv_{self.sfx}({f}, {t}, _mm256_cmp_{self.sfx}({a}, {b}, {pred}))"

    @property
    def vtype(self) -> str:
        return f"__m{self.w}" + ("d" if self.double else "")

    def expr(self, e: PostExpr, acc: str, operand: Callable[[int], str],
             constant: Callable[[float], str]) -> str:
        if isinstance(e, Acc):
            return acc
        if isinstance(e, Operand):
            return operand(e.index)
        if isinstance(e, Literal):
            return constant(e.value)
        assert isinstance(e, Apply)
        return self.apply(e.op, [self.expr(a, acc, operand, constant) for a in e.args], constant)


def vector_lines(postops: PostOps, ops: VectorOps, cells: list[tuple[str, int, int, bool]],
                 lanes: int, block_n: int = 0) -> list[str]:
    """Post-ops on the vector cells of an outer-product tile. `cells`: (name, row, first
    column, masked); the vector runs along n (in blocks of `block_n` columns where set).
    Each operand vector is loaded once per tile."""
    lines = operand_bases(postops, ops.ctype, block_n)
    values = _literals(postops)
    if values:
        # literals, too, come through a pointer the compiler cannot see through: as
        # constants they would be kept in registers through the reduction
        table = ", ".join(literal(v, ops.ctype) for v in values)
        lines += [f"static const {ops.ctype} pl[{len(values)}] = {{{table}}};",
                  f"{ops.ctype} const *plp = pl;", '__asm__ volatile("" : "+r"(plp));']
    constants: dict[int, str] = {}

    def constant(value: float) -> str:
        key = next(i for i, v in enumerate(values) if _same(v, value))
        if key not in constants:
            constants[key] = f"lv{key}"
            lines.append(f"const {ops.vtype} lv{key} = {ops.set1(f'plp[{key}]')};")
        return constants[key]

    loaded: dict[tuple[int, int, bool], str] = {}
    for o, strides in enumerate(postops.operands):
        if strides.n not in (0, 1):
            raise PostOpsUnsupported(f"operand e{o} has stride {strides.n} along the vector")
    for name, row, col, masked in cells:
        def operand(index: int, row: int = row, col: int = col, masked: bool = masked) -> str:
            strides = postops.operands[index]
            at = row * strides.m + col * strides.n
            if block_n:
                at = row * strides.m + (col // block_n) * strides.nb + (col % block_n) * strides.n
            broadcast = strides.n == 0
            key = (index, at, masked and not broadcast)
            if key not in loaded:
                var = f"ev{index}_{len(loaded)}"
                address = f"ep{index} + {at}" if at else f"ep{index}"
                value = ops.set1(f"*({address})") if broadcast else ops.load(address, key[2])
                lines.append(f"const {ops.vtype} {var} = {value};")
                loaded[key] = var
            return loaded[key]
        for step in postops.steps:
            value = ops.expr(step, name, operand, constant)
            lines.append(f"{name} = {value};")
    return lines


def _literals(postops: PostOps) -> list[float]:
    """The distinct constants of the steps (with -0.0, which a negation flips signs with)."""
    out: list[float] = []

    def visit(e: PostExpr) -> None:
        if isinstance(e, Literal):
            value = e.value
        elif isinstance(e, Apply) and e.op == "neg":
            value = -0.0
        else:
            value = None
        if value is not None and not any(_same(value, v) for v in out):
            out.append(value)
        for a in getattr(e, "args", ()):
            visit(a)

    for step in postops.steps:
        visit(step)
    return out


def _same(a: float, b: float) -> bool:
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
