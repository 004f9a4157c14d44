"""Emit a batch-reduce GEMM call in place of the loops a `MicrokernelCall` binds.

Takes a `MicrokernelCall` and the C expressions of the outer loop values at one AST leaf;
returns the C lines of the call and the microkernels it needs (one per tile-size variant:
full tiles, and the remainder tile where an extent is not a multiple of the tile).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import replace
from itertools import product

from polydl.codegen.c.microkernels import BatchDim, BrgemmSpec, Microkernel, choose_microkernel
from polydl.codegen.c_expr import StatementPrinter
from polydl.codegen.postops import PostOpsUnsupported
from polydl.errors import ScheduleError
from polydl.schedules.cpu.amx_pairs import PairedB
from polydl.schedules.microkernel import MicrokernelCall
from polydl.schedules.postops import Condition, PostOpPlan, PostOps, condition_c, offset_c
from polydl.schedules.schedule import is_tile_loop, loop_var, tile_loop


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


def brgemm_spec(call: MicrokernelCall, m: int, n: int, dtype: str, k: int | None = None,
                blocks: int = 1) -> BrgemmSpec:
    """The call's spec for one tile size: m x n cells (in `blocks` blocks of the binding's
    blocks loop), k steps."""
    b = call.binding
    st = call.strides
    pack = call.pack
    b_batch = pack.batch_strides if pack else tuple(st[("b", v)] for v in b.batch)
    panels = call.pack_a
    return BrgemmSpec(
        m=m,
        n=n,
        k=call.ranges[b.k].extent if k is None else k,
        a_m=1 if panels else st[("a", b.m)],
        a_k=panels.rows if panels else st[("a", b.k)],
        a_panel_rows=panels.rows if panels else 0,
        a_panel_m=panels.k_extent if panels else 0,
        b_k=pack.k_stride if pack else st[("b", b.k)],
        b_n=1 if pack else st[("b", b.n)],
        c_m=st[("c", b.m)],
        c_n=st[("c", b.n)],
        batch=tuple(
            BatchDim(call.extent_variants(v)[0], st[("a", v)], b_stride)
            for v, b_stride in zip(b.batch, b_batch, strict=True)
        ),
        dtype=dtype,
        beta=1.0,
        n_blocks=blocks,
        b_nb=st[("b", b.blocks)] if b.blocks and blocks > 1 else 0,
        c_nb=st[("c", b.blocks)] if b.blocks and blocks > 1 else 0,
    )


def tile_variants(call: MicrokernelCall) -> list[tuple[int, int, int, int]]:
    """(m, n, k, blocks) of every tile size a call takes: full tiles and remainders."""
    b = call.binding
    blocks = call.extent_variants(b.blocks) if b.blocks else (1,)
    return list(product(call.extent_variants(b.m), call.extent_variants(b.n),
                        call.extent_variants(b.k), blocks))


def _spec_variant(spec: BrgemmSpec, overwrite: bool, ops: PostOps) -> BrgemmSpec:
    """`spec` overwriting C (beta 0) where `overwrite`, with `ops` as its post-ops if any."""
    return replace(spec, beta=0.0 if overwrite else spec.beta,
                   postops=ops if ops.steps else spec.postops)


def kept_flag(pack: str) -> str:
    """The C variable that says whether this call fills the kept copy `pack`."""
    return f"_pd_fill{pack}"


def microkernel_name(spec: BrgemmSpec, isa: str) -> str:
    digest = hashlib.sha256(repr((spec, isa)).encode()).hexdigest()[:12]
    return f"_pd_brgemm_{digest}"


class CallPrinter:
    def __init__(self, printer: StatementPrinter, isa: str, constant: frozenset[str],
                 l1_bytes: int, paired: Mapping[str, PairedB] | None = None) -> None:
        self.printer = printer
        self.isa = isa
        self.l1_bytes = l1_bytes  # register tiles keep A's rows within its sets
        self.constant = constant  # arrays no statement writes (the function's const inputs)
        # inputs the calls read from a copy in k pairs made before the nest (`amx_pairs.py`)
        self.paired = dict(paired or {})
        self.microkernels: dict[str, Microkernel] = {}
        # the fused epilogue of a call's statement, applied inside its microkernels
        self.postops: dict[str, PostOpPlan] = {}

    def _spec(self, call: MicrokernelCall, m: int, n: int, dtype: str, k: int,
              blocks: int) -> BrgemmSpec:
        spec = brgemm_spec(call, m, n, dtype, k, blocks)
        return replace(spec, b_pairs=True) if call.b.array in self.paired else spec

    def _b_constant(self, call: MicrokernelCall) -> bool:
        return call.pack is None and call.b.array in self.constant

    def _name_isa(self, backend: str, b_constant: bool) -> str:
        return self.isa + backend + ("+const-b" if b_constant else "")

    def _kernel(self, spec: BrgemmSpec, backend: str, b_constant: bool = False) -> str:
        name = microkernel_name(spec, self._name_isa(backend, b_constant))
        if name not in self.microkernels:
            self.microkernels[name] = choose_microkernel(spec, self.isa, name=name, backend=backend,
                                                         b_constant=b_constant, l1_bytes=self.l1_bytes)
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
        if call.pack_a is not None:
            # panel of row m, step k: m * K + k * rows (m is a multiple of the panel rows)
            panels = call.pack_a
            out.append(f"  const {ctype[call.a.array]} *_pd_a = {panels.name} + "
                       f"{binding.m} * {panels.k_extent}L + {binding.k} * {panels.rows}L;")
        else:
            out.append(f"  const {ctype[call.a.array]} *_pd_a = &{p.element(call.a)};")
        if call.pack is not None:
            pack = call.pack
            out.append(
                f"  const {ctype[call.b.array]} *_pd_b = {pack.name} + "
                f"{self._slot_offset(call, binding.n)} + {binding.k} * {pack.k_stride}L;"
            )
        elif call.b.array in self.paired:
            # the same element in the copy: rows paired, so its column counts twice
            row = self.paired[call.b.array].row
            out.append(f"  const long _pd_o = &{p.element(call.b)} - {call.b.array};")
            out.append(f"  const {ctype[call.b.array]} *_pd_b = "
                       f"{self.paired[call.b.array].name} + _pd_o + _pd_o % {row}L;")
        else:
            out.append(f"  const {ctype[call.b.array]} *_pd_b = &{p.element(call.b)};")
        out.append(f"  {ctype[call.c.array]} *_pd_c = &{p.element(call.c)};")
        post = self.postops.get(call.statement.name)
        extra = ""
        if post is not None:
            scalars = frozenset(n for n, layout in p.layouts.items() if not layout.shape)
            out += postop_pointers(post, call, ctype[call.c.array], scalars)
            extra = "".join(f", _pd_e{i}" for i in range(len(post.operands)))
        dtype = microkernel_dtype(p, call)
        for m, n, k, blocks in tile_variants(call):
            b_constant = self._b_constant(call)
            spec = self._spec(call, m, n, dtype, k, blocks)
            conds = []
            variants = [(var, call.extent_variants(var), size) for var, size in
                        ((binding.m, m), (binding.n, n), (binding.k, k), (binding.blocks, blocks))
                        if var is not None]
            for var, sizes, size in variants:
                if len(sizes) > 1:
                    r = call.ranges[var]
                    end = r.lower + r.extent
                    op = ">=" if size == sizes[0] else "<"
                    conds.append(f"{end} - {var} {op} {sizes[0]}")
            test = " && ".join(conds)
            line = self._variants(spec, binding.backend, b_constant, post, args, extra)
            out.append(f"  if ({test}) {line}" if test else f"  {line}")
        out.append("}")
        return out

    def _variants(self, spec: BrgemmSpec, backend: str, b_constant: bool,
                  post: PostOpPlan | None, args: list[str], extra: str) -> str:
        """The call of one tile size: where the reduction of a tile is split over calls, the
        calls that begin it overwrite C (a fused start) and those that finish it apply the
        epilogue's post-ops, each chosen by a test on the outer loops."""

        def call_text(first: bool, last: bool) -> str:
            if post is None:
                return f"{self._kernel(spec, backend, b_constant)}(_pd_a, _pd_b, _pd_c);"
            overwrite, ops = post.variant(first, last)
            name = self._kernel(_spec_variant(spec, overwrite, ops), backend, b_constant)
            return f"{name}(_pd_a, _pd_b, _pd_c{extra if ops.operands else ''});"

        def split(condition: Condition | None, case: Callable[[bool], str]) -> str:
            if condition is None:
                return case(True)
            return f"{{ if ({condition_c(condition, args)}) {case(True)} else {case(False)} }}"

        if post is None:
            return call_text(False, False)

        def by_last(first: bool) -> str:
            if not post.ops.steps:
                return call_text(first, False)
            return split(post.last_call, lambda last: call_text(first, last))

        return by_last(False) if post.start is None else split(post.first_call, by_last)

    def use_postops(self, call: MicrokernelCall, post: PostOpPlan) -> bool:
        """Apply `post` inside every microkernel of `call` if they all can (then the caller
        drops the epilogue loop); False leaves the calls plain."""
        dtype = microkernel_dtype(self.printer, call)
        binding = call.binding
        made: dict[str, Microkernel] = {}
        cases = [(first, last) for first in (True, False) for last in (True, False)
                 if (first or post.first_call is not None or post.start is None)
                 and (last or post.last_call is not None or not post.ops.steps)]
        for m, n, k, blocks in tile_variants(call):
            for first, last in cases:
                overwrite, ops = post.variant(first, last)
                spec = _spec_variant(self._spec(call, m, n, dtype, k, blocks), overwrite, ops)
                b_constant = self._b_constant(call)
                name = microkernel_name(spec, self._name_isa(binding.backend, b_constant))
                try:
                    made[name] = choose_microkernel(spec, self.isa, name=name,
                                                    backend=binding.backend, b_constant=b_constant,
                                                    l1_bytes=self.l1_bytes)
                except PostOpsUnsupported:
                    return False
        self.microkernels.update(made)
        self.postops[call.statement.name] = post
        return True

    def pack_lines(self, call: MicrokernelCall, args: list[str]) -> list[str]:
        """Copy the slot(s) of B that the following calls read: one slot for each value of
        the outer loops B depends on and each n block; those loops among the first `level`
        outer loops are fixed by `args`, the others are looped here."""
        pack = call.pack
        assert pack is not None
        binding = call.binding
        fixed = dict(zip(call.outer[: pack.level], args, strict=True))
        loops: list[tuple[str, str, str, str]] = []  # (C variable, start, stop, step)
        for r in pack.outer:
            if r.var not in fixed:
                loops.append((r.var, str(r.lower), str(r.lower + r.extent), "1"))
        n_tile = tile_loop(binding.n)
        if n_tile in fixed:
            n_start = fixed[n_tile]
        else:
            n_start = "_pd_nb"
            loops.append(("_pd_nb", "0", str(pack.blocks * pack.block), str(pack.block)))
        out = ["{"]
        for r in pack.outer:
            if r.var in fixed:
                out.append(f"  const long {r.var} = {fixed[r.var]};")
        depth = 1
        for d, (var, start, stop, step) in enumerate(loops):
            pad = "  " * depth
            if d == 0 and (pack.level == 0 or pack.parallel_copy):
                # a copy outside the parallel loops: its slots are independent
                out.append(f"{pad}#pragma omp parallel for schedule(static)")
            inc = f"{var}++" if step == "1" else f"{var} += {step}"
            out.append(f"{pad}for (long {var} = {start}; {var} < {stop}; {inc}) {{")
            depth += 1
        k_start = fixed.get(tile_loop(binding.k)) if pack.k_blocked else None
        out += ["  " * depth + line for line in self._pack_slot(call, n_start, k_start)]
        for d in reversed(range(1, depth)):
            out.append("  " * d + "}")
        if pack.kept:  # the library's kept copy: filled by the first call on this B only
            return [f"if ({kept_flag(pack.name)})", *out, "}"]
        return out + ["}"]

    def pack_a_lines(self, call: MicrokernelCall, args: list[str]) -> list[str]:
        """Copy the block of A the following calls read (their m tile x k tile, or all of
        A) into panels of `rows` rows: `panels[m / rows][k][m % rows]`."""
        panels = call.pack_a
        assert panels is not None
        binding = call.binding
        fixed = dict(zip(call.outer[: panels.level], args, strict=True))
        m_range, k_range = call.ranges[binding.m], call.ranges[binding.k]
        bounds = []
        for var, tile, extent in ((binding.m, panels.m_tile, m_range.extent),
                                  (binding.k, panels.k_tile, k_range.extent)):
            start = fixed.get(tile_loop(var), "0") if tile is not None else "0"
            stop = f"_pd_min({start} + {tile}, {extent})" if tile is not None else str(extent)
            bounds.append((start, stop))
        (m0, m1), (k0, k1) = bounds
        p = self.printer
        ctype = p.layouts[call.a.array].c_type
        a_m, a_k = call.strides[("a", binding.m)], call.strides[("a", binding.k)]
        rows = panels.rows
        out = ["{"]
        # A's element at the call loops' lower bounds (0 for m and k)
        out += [f"  const long {var} = {call.ranges[var].lower};" for var in binding.loops]
        out.append(f"  const {ctype} *restrict _pd_src = &{p.element(call.a)};")
        out.append(f"  const long _pd_m1 = {m1}, _pd_k0 = {k0}, _pd_k1 = {k1};")
        if panels.parallel_copy:
            out.append("  #pragma omp parallel for schedule(static)")
        out.append(f"  for (long _pd_p = {m0}; _pd_p < _pd_m1; _pd_p += {rows}) {{")
        out.append(f"    {ctype} *restrict _pd_dst = {panels.name} + _pd_p * {panels.k_extent}L;")
        out.append(f"    const long _pd_rows = _pd_m1 - _pd_p < {rows} ? _pd_m1 - _pd_p : {rows};")
        out.append("    for (long _pd_k = _pd_k0; _pd_k < _pd_k1; ++_pd_k)")
        out.append("      for (long _pd_r = 0; _pd_r < _pd_rows; ++_pd_r)")
        out.append(f"        _pd_dst[_pd_k * {rows}L + _pd_r] = "
                   f"_pd_src[(_pd_p + _pd_r) * {a_m}L + _pd_k * {a_k}L];")
        out.append("  }")
        return out + ["}"]

    def _slot_offset(self, call: MicrokernelCall, n_start: str) -> str:
        pack = call.pack
        assert pack is not None
        terms = [f"({r.var} - {r.lower}) * {stride}L"
                 for r, stride in zip(pack.outer, pack.slot_strides, strict=True)]
        terms.append(f"({n_start} / {pack.block}) * {pack.block_elements}L")
        return " + ".join(terms)

    def _pack_slot(self, call: MicrokernelCall, n_start: str, k_start: str | None = None) -> list[str]:
        """The copy of one slot; with `k_start`, only the rows of the k tile starting there."""
        pack = call.pack
        assert pack is not None
        binding = call.binding
        p = self.printer
        out = ["{", f"  const long _pd_n0 = {n_start};"]
        # B's element at the call loops' lower bounds (and the outer loops' values)
        for var in binding.loops:
            out.append(f"  const long {var} = {call.ranges[var].lower};")
        ctype = p.layouts[call.b.array].c_type
        out.append(f"  const {ctype} *restrict _pd_src = &{p.element(call.b)} + _pd_n0 * "
                   f"{call.strides[('b', binding.n)]}L;")
        out.append(f"  {ctype} *restrict _pd_dst = {pack.name} + {self._slot_offset(call, '_pd_n0')};")
        n_extent = call.ranges[binding.n].extent
        out.append(f"  const long _pd_width = {n_extent} - _pd_n0 < {pack.block} ? "
                   f"{n_extent} - _pd_n0 : {pack.block};")
        k_range = call.ranges[binding.k]
        first, stop = "0", str(k_range.extent)
        if k_start is not None and k_range.tile is not None:
            out.append(f"  const long _pd_k0 = {k_start} - {k_range.lower};")
            first = "_pd_k0"
            stop = (f"(_pd_k0 + {k_range.tile} < {k_range.extent} ? _pd_k0 + {k_range.tile} : "
                    f"{k_range.extent})")
        b_n = call.strides[("b", binding.n)]

        def copy(full: bool) -> list[str]:
            src, dst, depth, lines = [], [], 1, []
            for var, stride in zip(binding.batch, pack.batch_strides, strict=True):
                d = depth - 1
                lines.append("  " * (depth + 1) + f"for (long _pd_b{d} = 0; "
                             f"_pd_b{d} < {call.ranges[var].extent}; ++_pd_b{d})")
                src.append(f"_pd_b{d} * {call.strides[('b', var)]}L")
                dst.append(f"_pd_b{d} * {stride}L")
                depth += 1
            pad = "  " * (depth + 1)
            lines.append(f"{pad}for (long _pd_k = {first}; _pd_k < {stop}; ++_pd_k) {{")
            src.append(f"_pd_k * {call.strides[('b', binding.k)]}L")
            dst.append(f"_pd_k * {pack.k_stride}L")
            lines.append(f"{pad}  const {ctype} *restrict _pd_s = _pd_src + {' + '.join(src)};")
            lines.append(f"{pad}  {ctype} *restrict _pd_d = _pd_dst + {' + '.join(dst)};")
            width = str(pack.block) if full else "_pd_width"
            lines.append(f"{pad}  for (long _pd_j = 0; _pd_j < {width}; ++_pd_j) "
                         f"_pd_d[_pd_j] = _pd_s[_pd_j * {b_n}L];")
            if not full:
                lines.append(f"{pad}  for (long _pd_j = _pd_width; _pd_j < {pack.block}; ++_pd_j) "
                             f"_pd_d[_pd_j] = 0;")
            lines.append(f"{pad}}}")
            return lines

        # a full block copies rows of a constant width, which gcc turns into whole vectors
        out.append(f"  if (_pd_width == {pack.block}) {{")
        out += copy(full=True)
        out.append("  } else {")
        out += copy(full=False)
        out.append("  }")
        out.append("}")
        return out


def postop_pointers(
    post: PostOpPlan, call: MicrokernelCall, ctype: str, scalars: frozenset[str] = frozenset()
) -> list[str]:
    """Each post-op operand's address at the call's first C cell (the call's loops are bound
    to their starts), as `_pd_e<i>`; a scalar parameter (passed by value) by its address."""
    names = call.statement.iterators
    return [
        f"  const {ctype} *_pd_e{i} = &{o.array};" if o.array in scalars
        else f"  const {ctype} *_pd_e{i} = {o.array} + ({offset_c(o.offset, names)});"
        for i, o in enumerate(post.operands)
    ]


def pairs_copy_lines(pairs: PairedB, source: str, c_type: str) -> list[str]:
    """C lines that copy input `source` into `pairs.name` in k pairs: rows 2q and 2q + 1 of
    `pairs.row` elements become one row of pairs (`amx_pairs.py`), on the threads."""
    row = pairs.row
    return [
        "{",
        f"  /* {source} in k pairs for the AMX calls */",
        "  #pragma omp parallel for schedule(static)",
        f"  for (long _pd_q = 0; _pd_q < {pairs.elements // (2 * row)}; ++_pd_q) {{",
        f"    const {c_type} *restrict _pd_s = {source} + _pd_q * {2 * row}L;",
        f"    {c_type} *restrict _pd_d = {pairs.name} + _pd_q * {2 * row}L;",
        f"    for (long _pd_j = 0; _pd_j < {row}; ++_pd_j) {{",
        "      _pd_d[2 * _pd_j] = _pd_s[_pd_j];",
        f"      _pd_d[2 * _pd_j + 1] = _pd_s[{row} + _pd_j];",
        "    }",
        "  }",
        "}",
    ]
