"""Sums into one array cell along an innermost loop, accumulated in a register.

Takes the statement instances of an innermost loop (their `StatementModel`s and the C
expressions of their iterators); returns the C of the loop with each such sum held in a local
variable: loaded before the loop, stored after it, and only where the loop runs at least once
(a loop of no iterations writes nothing). gcc cannot keep `tmp[i]` in a register itself inside
an OpenMP region (the outlined function loses `restrict`), so every iteration stores it and the
loop is neither vectorised nor free of a store-to-load chain.

A statement qualifies where it is `c += e`, `c -= e`, `c = c + e` or `c = e + c` (a sum), or
`c = e > c ? e : c`, `c = fmaxf(c, e)` and their minima (an extremum, `poly.sums.extremum_of`),
on a float cell whose subscripts do not move with the loop, no instance reads that cell in e,
and no other statement in the loop touches that array. Where the loop writes nothing but
those reductions it carries no other dependence, so it also gets `#pragma omp simd
reduction(+: ...)` (and `reduction(max: ...)`, `reduction(min: ...)`): each lane then reduces
its share and the lanes are combined at the end; for a sum a reassociation, as the
microkernels' split reductions already are, for an extremum the same value (NaNs aside). So
does a loop whose other statements carry nothing along it (softmax's `e = expf(x - m); y = e;
s += e`: `schedules.fusion.reduction_vector_dims`), its contracted locals private to each lane.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from polydl.codegen.c_expr import StatementPrinter
from polydl.dtypes import DTYPES
from polydl.ir import Expr, Statement, access_vars, expr_loads
from polydl.poly.model import StatementModel
from polydl.poly.sums import addend_of, extremum_of, reads_own_cell

ACCUMULATOR_PREFIX = "_pd_acc"


@dataclass(frozen=True)
class Instance:
    statement: StatementModel
    args: tuple[str, ...]  # C expressions of the statement's iterators


@dataclass(frozen=True)
class Accumulation:
    """One sum held in a register: `variable` stands for the target cell of `instance`."""

    instance: Instance
    variable: str
    addend: Expr  # what each iteration adds (or subtracts, `sign` "-"), or compares
    sign: str  # "+" or "-" for a sum; "max" or "min" for an extremum

    @property
    def reduction(self) -> str:
        """The OpenMP reduction operator."""
        return self.sign if self.sign in ("max", "min") else "+"


def _target_vars(s: StatementModel) -> set[str]:
    """The iterators the statement's target cell is subscripted by."""
    return set(access_vars(s.statement.target))


def _mentions(text: str, iterator: str) -> bool:
    return re.search(rf"\b{re.escape(iterator)}\b", text) is not None


class AccumulatorPrinter:
    def __init__(self, printer: StatementPrinter) -> None:
        self.printer = printer
        self.count = 0

    def accumulations(self, body: list[Instance], iterator: str) -> list[Accumulation]:
        """The sums of `body` (the instances of one innermost loop over `iterator`) that can
        run in a register."""
        touched: dict[str, int] = {}
        for inst in body:
            s = inst.statement.statement
            for array in {s.target.array, *(a.array for a in expr_loads(s.value))}:
                touched[array] = touched.get(array, 0) + 1  # statements, not accesses
        out: list[Accumulation] = []
        for inst in body:
            s = inst.statement.statement
            layout = self.printer.layouts[s.target.array]
            dtype = DTYPES[layout.dtype]
            if dtype.is_integer or dtype.name == "bfloat16":
                continue
            if touched[s.target.array] != 1:
                continue
            form = addend_of(s) or _extremum(s)
            # a scatter's cell is read from an index array, which the loop may change
            if form is None or s.target.is_indirect or reads_own_cell(inst.statement, form[0]):
                continue
            binds = dict(zip(inst.statement.iterators, inst.args, strict=True))
            if any(_mentions(binds[v], iterator) for v in _target_vars(inst.statement)
                   if v in binds):
                continue  # the cell moves with the loop
            out.append(Accumulation(inst, f"{ACCUMULATOR_PREFIX}{self.count}", *form))
            self.count += 1
        return out

    def _binds(self, inst: Instance, only_target: bool = False) -> list[str]:
        used = _target_vars(inst.statement) if only_target else set(inst.statement.iterators)
        return [f"const long {v} = {a};"
                for v, a in zip(inst.statement.iterators, inst.args, strict=True) if v in used]

    def loop(self, body: list[Instance], sums: list[Accumulation], header: str,
             iterator: str, init: str, cond: str,
             simd: tuple[str, ...] | None = None) -> list[str]:
        """The loop (`header` is its `for (...) {` line) with `sums` in registers. `simd`: where
        the loop carries no dependence but its reductions', the contracted locals its body
        writes (each lane's own); then the loop is SIMD beside its other statements too, if
        every reduction of the body is one of `sums`."""
        by_name = {a.instance.statement.name: a for a in sums}
        only_sums = len(sums) == len(body)
        beside = simd is not None and all(
            inst.statement.name in by_name for inst in body
            if addend_of(inst.statement.statement) or _extremum(inst.statement.statement))
        out = ["{", f"  long {iterator} = {init};", f"  if ({cond}) {{"]
        for acc in sums:
            layout = self.printer.layouts[acc.instance.statement.statement.target.array]
            cell = self.printer.element(acc.instance.statement.statement.target)
            out.append(f"    {layout.c_type} {acc.variable};")
            out.append(f"    {{ {' '.join(self._binds(acc.instance, True))} {acc.variable} = {cell}; }}")
        if only_sums or beside:
            clauses = " ".join(
                f"reduction({op}: {', '.join(a.variable for a in sums if a.reduction == op)})"
                for op in dict.fromkeys(a.reduction for a in sums))
            private = f" private({', '.join(simd)})" if simd else ""
            out.append(f"    #pragma omp simd {clauses}{private}")
        out.append(f"    {header}")
        for inst in body:
            held = by_name.get(inst.statement.name)
            if held is None:
                text = self.printer.statement(inst.statement.statement)
            elif held.reduction != "+":
                value, cmp = self.printer.expr(held.addend), ">" if held.sign == "max" else "<"
                text = f"{held.variable} = ({value} {cmp} {held.variable}) ? {value} : {held.variable};"
            else:
                text = f"{held.variable} {held.sign}= {self.printer.expr(held.addend)};"
            out += ["      {", *(f"        {b}" for b in self._binds(inst)), f"        {text}",
                    "      }"]
        out.append("    }")
        for acc in sums:
            cell = self.printer.element(acc.instance.statement.statement.target)
            out.append(f"    {{ {' '.join(self._binds(acc.instance, True))} {cell} = {acc.variable}; }}")
        return out + ["  }", "}"]


def _extremum(s: Statement) -> tuple[Expr, str] | None:
    """A float extremum (`extremum_of`) as an accumulation's (what it compares, max or min)."""
    form = extremum_of(s)
    return None if form is None else (form[0], form[1])
