"""Emit a batch-reduce GEMM call in place of the loops a `MicrokernelCall` binds.

Takes a `MicrokernelCall` and the C expressions of the outer loop values at one AST leaf;
returns the C lines of the call and the microkernels it needs (one per tile-size variant:
full tiles, and the remainder tile where an extent is not a multiple of the tile).
"""

from __future__ import annotations

import hashlib
from itertools import product

from polydl.codegen.c_expr import StatementPrinter
from polydl.codegen.microkernels import BatchDim, BrgemmSpec, Microkernel, choose_microkernel
from polydl.errors import ScheduleError
from polydl.schedules.microkernel import MicrokernelCall
from polydl.schedules.schedule import is_tile_loop, loop_var


def microkernel_dtype(printer: StatementPrinter, call: MicrokernelCall) -> str:
    """The brgemm dtype: A, B and C all float32 or all float64, or bf16 A and B into fp32 C."""
    a, b, c = (printer.layouts[acc.array].dtype for acc in (call.a, call.b, call.c))
    if a == b == c and a in ("float32", "float64"):
        return a
    if a == b == "bfloat16" and c == "float32":
        return "bfloat16"
    raise ScheduleError(
        f"no batch-reduce GEMM microkernel multiplies {a} by {b} into {c}; "
        "it takes float32 or float64 throughout, or bfloat16 inputs with a float32 output"
    )


def brgemm_spec(call: MicrokernelCall, m: int, n: int, dtype: str) -> BrgemmSpec:
    b = call.binding
    st = call.strides
    return BrgemmSpec(
        m=m,
        n=n,
        k=call.ranges[b.k].extent,
        a_m=st[("a", b.m)],
        a_k=st[("a", b.k)],
        b_k=st[("b", b.k)],
        b_n=st[("b", b.n)],
        c_m=st[("c", b.m)],
        c_n=st[("c", b.n)],
        batch=tuple(
            BatchDim(call.ranges[v].extent, st[("a", v)], st[("b", v)]) for v in b.batch
        ),
        dtype=dtype,
        beta=1.0,
    )


def microkernel_name(spec: BrgemmSpec, isa: str) -> str:
    digest = hashlib.sha256(repr((spec, isa)).encode()).hexdigest()[:12]
    return f"_pd_brgemm_{digest}"


class CallPrinter:
    def __init__(self, printer: StatementPrinter, isa: str) -> None:
        self.printer = printer
        self.isa = isa
        self.microkernels: dict[str, Microkernel] = {}

    def _kernel(self, spec: BrgemmSpec, backend: str) -> str:
        name = microkernel_name(spec, self.isa + backend)
        if name not in self.microkernels:
            self.microkernels[name] = choose_microkernel(spec, self.isa, name=name, backend=backend)
        return name

    def lines(self, call: MicrokernelCall, args: list[str]) -> list[str]:
        binding = call.binding
        out = ["{"]
        starts: dict[str, str] = {}
        for name, arg in zip(call.outer, args, strict=True):
            var = loop_var(name)
            if is_tile_loop(name):
                if var in call.ranges:
                    starts[var] = arg
                continue
            out.append(f"  const long {var} = {arg};")
        for var in binding.loops:
            out.append(f"  const long {var} = {starts.get(var, str(call.ranges[var].lower))};")
        p = self.printer
        ctype = {acc.array: p.layouts[acc.array].c_type for acc in (call.a, call.b, call.c)}
        out.append(f"  const {ctype[call.a.array]} *_pd_a = &{p.element(call.a)};")
        out.append(f"  const {ctype[call.b.array]} *_pd_b = &{p.element(call.b)};")
        out.append(f"  {ctype[call.c.array]} *_pd_c = &{p.element(call.c)};")
        dtype = microkernel_dtype(p, call)
        m_sizes = call.extent_variants(binding.m)
        n_sizes = call.extent_variants(binding.n)
        for m, n in product(m_sizes, n_sizes):
            name = self._kernel(brgemm_spec(call, m, n, dtype), binding.backend)
            conds = []
            for var, sizes, size in ((binding.m, m_sizes, m), (binding.n, n_sizes, n)):
                if len(sizes) > 1:
                    r = call.ranges[var]
                    end = r.lower + r.extent
                    op = ">=" if size == sizes[0] else "<"
                    conds.append(f"{end} - {var} {op} {sizes[0]}")
            test = " && ".join(conds)
            line = f"{name}(_pd_a, _pd_b, _pd_c);"
            out.append(f"  if ({test}) {line}" if test else f"  {line}")
        out.append("}")
        return out
