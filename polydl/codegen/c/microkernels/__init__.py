"""Batch-reduce GEMM microkernels: C source for one `BrgemmSpec` on one ISA.

Takes a `BrgemmSpec` (sizes, element strides, batch, dtype, beta), an ISA from
`polydl.target.cpu.ISAS`, a function name and a backend; returns a `Microkernel` whose source
defines `static void NAME(const T *a, const T *b, U *c)`.

Backends: "polydl" generates the kernel (SIMD intrinsics where the strides allow a vector
dimension, portable C otherwise); "libxsmm" calls LIBXSMM's JIT (ScheduleError where the
strides have no BLAS form); "auto" is polydl's own unless LIBXSMM is known to be faster.
"""

from __future__ import annotations

from dataclasses import replace

from polydl.codegen import postops
from polydl.codegen.c.microkernels import amx, dpbf16
from polydl.codegen.c.microkernels.blocking import (
    DEFAULT_L1_BYTES,
    VECTOR_UNITS,
    Blocking,
    choose_dot_product,
    choose_outer_product,
    portable_cycles,
)
from polydl.codegen.c.microkernels.libxsmm import (
    LINK_FLAGS,
    libxsmm_available,
    libxsmm_plan,
    render_libxsmm_kernel,
)
from polydl.codegen.c.microkernels.portable import portable_blocking, render_portable_kernel
from polydl.codegen.c.microkernels.spec import BatchDim, BrgemmSpec, Microkernel
from polydl.codegen.c.microkernels.vector import render_vector_kernel
from polydl.codegen.templating import render
from polydl.errors import ScheduleError
from polydl.target.cpu import ISAS

__all__ = [
    "BACKENDS",
    "BatchDim",
    "BrgemmSpec",
    "Microkernel",
    "choose_microkernel",
    "libxsmm_available",
]

BACKENDS = ("auto", "polydl", "libxsmm")


def choose_microkernel(spec: BrgemmSpec, isa: str, name: str, backend: str = "auto",
                       b_constant: bool = False, l1_bytes: int = DEFAULT_L1_BYTES) -> Microkernel:
    """`b_constant`: B is a constant input of the generated function, which then counts its
    calls in `_pd_tile_generation` (kernels that reuse a packed B across calls need it)."""
    if isa not in ISAS:
        raise ValueError(f"unknown ISA '{isa}'; known: {', '.join(ISAS)}")
    if backend not in BACKENDS:
        raise ScheduleError(f"unknown microkernel backend '{backend}'; known: {', '.join(BACKENDS)}")
    if spec.normalized().n_blocks > 1 and not _blocks_native(spec.normalized(), isa, backend):
        return blocks_kernel(spec, isa, name, backend, l1_bytes)
    if spec.a_panel_rows:
        if backend == "libxsmm":
            raise ScheduleError("LIBXSMM takes A as a matrix, not packed in panels: pack_a needs "
                                "backend 'polydl' or 'auto'")
        return panel_kernel(spec, isa, name, l1_bytes)
    if backend == "libxsmm" and spec.b_pairs:
        raise ScheduleError("LIBXSMM takes B as a matrix, not in k pairs")
    if backend == "libxsmm" or (backend == "auto" and _libxsmm_preferred(spec, isa)):
        return libxsmm_kernel(spec, isa, name, l1_bytes)
    return own_kernel(spec, isa, name, b_constant, l1_bytes=l1_bytes)


def _headline(spec: BrgemmSpec, name: str) -> str:
    """The first words of every kernel's description: what it computes."""
    n = f"{spec.n}x{spec.n_blocks} blocks" if spec.n_blocks > 1 else f"{spec.n}"
    return (
        f"{name}: brgemm m={spec.m} n={n} k={spec.k} batch={spec.batch_count} "
        f"{spec.dtype} beta={spec.beta:g}"
    )


def _blocks_native(spec: BrgemmSpec, isa: str, backend: str) -> bool:
    """Whether polydl's own outer-product kernel takes `spec`'s n blocks in one register
    tile: float vectors along a unit-stride n of whole vectors in every block."""
    unit = VECTOR_UNITS.get(isa)
    return (backend != "libxsmm" and unit is not None and spec.dtype in ("float32", "float64")
            and spec.b_n == 1 and spec.c_n == 1 and spec.n % unit.lanes(spec.compute_dtype) == 0
            and _vector_operands(spec))


def blocks_kernel(spec: BrgemmSpec, isa: str, name: str, backend: str,
                  l1_bytes: int) -> Microkernel:
    """A spec of several n blocks as one call of block 0's kernel per block, where no kernel
    takes them in one register tile (AMX, bf16 pairs, LIBXSMM, portable C, ragged vectors)."""
    inner = choose_microkernel(spec.one_block(), isa, f"{name}_block", backend, l1_bytes=l1_bytes)
    description = f"{_headline(spec, name)}; one call per block of {inner.describe()}"
    ops = spec.postops
    source = render(
        "c/microkernels/blocks.c.j2",
        name=name,
        inner_name=inner.name,
        inner=inner.source,
        description=description,
        in_t=spec.input_ctype,
        out_t=spec.output_ctype,
        blocks=spec.n_blocks,
        b_nb=spec.b_nb,
        c_nb=spec.c_nb,
        postop_params=postops.parameters(ops, spec.output_ctype),
        postop_args="".join(f", e{i} + jb * {o.nb}L" for i, o in enumerate(ops.operands)) if ops else "",
    )
    return replace(inner, name=name, source=source, spec=spec,
                   estimated_cycles=inner.estimated_cycles * spec.n_blocks)


def panel_kernel(spec: BrgemmSpec, isa: str, name: str, l1_bytes: int) -> Microkernel:
    """The outer-product SIMD kernel over an A packed in panels of register-tile rows."""
    s = spec.normalized()
    unit = VECTOR_UNITS.get(isa)
    if unit is None or not (s.b_n == 1 and s.c_n == 1) or s.dtype == "bfloat16":
        raise ScheduleError(
            f"A packed in panels needs a SIMD outer-product microkernel (vectors along n) in "
            f"float32 or float64; ISA {isa}, dtype {s.dtype}, B's n stride {s.b_n}, C's {s.c_n}"
        )
    blocking = choose_outer_product(s, unit, l1_bytes)
    description = (
        f"{name}: brgemm m={spec.m} n={spec.n} k={spec.k} {spec.dtype} beta={spec.beta:g}; "
        f"{unit.isa} outer-n over A panels of {spec.a_panel_rows} rows, register tile "
        f"{blocking.rows} x {blocking.vectors} vectors"
    )
    source, unroll = render_vector_kernel(s, unit, blocking, name, description)
    return Microkernel(name=name, source=source, spec=spec, backend="polydl", isa=unit.isa,
                       form="outer-n", mr=blocking.rows, nr=blocking.vectors * blocking.lanes,
                       unroll=unroll, estimated_cycles=blocking.cycles)


def _libxsmm_preferred(spec: BrgemmSpec, isa: str) -> bool:
    """Where LIBXSMM is measured to beat polydl's own kernel. No such shape is known yet:
    the hook stays so that "auto" can learn one from benchmarks."""
    return False


def own_kernel(spec: BrgemmSpec, isa: str, name: str, b_constant: bool = False, *,
               l1_bytes: int) -> Microkernel:
    """polydl's generated kernel: the form and register blocking with the fewest estimated
    cycles among those the strides allow, portable C if none does (or for isa "scalar")."""
    s = spec.normalized()
    if s.b_pairs:  # a copy made for the AMX kernel, which alone reads B so
        if spec.postops is not None:
            raise postops.PostOpsUnsupported("the AMX kernel applies no post-ops")
        if isa != "avx512amx" or not amx.supports(s):
            raise ScheduleError(f"B in k pairs is read by the AMX kernel only, not on {isa} or "
                                f"with A's k stride {s.a_k}, C's n stride {s.c_n}")
        return _amx_kernel(spec, s, False, name, False, l1_bytes)
    if isa == "avx512amx" and s.dtype == "bfloat16":
        for view in (s, s.transposed()):
            if amx.supports(view):
                if spec.postops is not None:
                    raise postops.PostOpsUnsupported("the AMX kernel applies no post-ops")
                return _amx_kernel(spec, view, view is not s, name, b_constant, l1_bytes)
    unit = VECTOR_UNITS.get(isa)
    candidates: list[tuple[float, str, BrgemmSpec, Blocking]] = []
    if unit is not None:
        if s.b_n == 1 and s.c_n == 1:
            b = choose_outer_product(s, unit, l1_bytes)
            candidates.append((b.cycles, "outer-n", s, b))
        t = s.transposed() if s.n_blocks == 1 else None  # n blocks: outer-n only
        if t is not None and t.b_n == 1 and t.c_n == 1:
            b = choose_outer_product(t, unit, l1_bytes)
            candidates.append((b.cycles, "outer-m", t, b))
        if t is not None and s.a_k == 1 and s.b_k == 1:
            b = choose_dot_product(s, unit)
            candidates.append((b.cycles, "dot-k", s, b))
    # post-op operands must be broadcast or unit-stride along the vector of an outer form
    candidates = [c for c in candidates if c[1] == "dot-k" or _vector_operands(c[2])]
    if not candidates:
        return _portable(spec, s, isa, name)
    assert unit is not None
    cycles, form, view, blocking = min(candidates, key=lambda c: c[0])
    swapped = form == "outer-m"
    inner = f"{name}_t" if swapped else name
    description = (
        f"{_headline(spec, name)}; {unit.isa} {form}, register tile "
        f"{blocking.rows} x {blocking.vectors}{' vectors' if blocking.form == 'outer' else ''}"
        f"{' of C^T' if swapped else ''}"
    )
    if spec.postops is not None:
        description += f"; post-ops before the store: {spec.postops.describe()}"
    if isa in ("avx512amx", "avx512bf16") and blocking.form == "outer" and dpbf16.supports(view):
        if spec.postops is not None:
            raise postops.PostOpsUnsupported("the vdpbf16ps kernel applies no post-ops")
        description += "; vdpbf16ps on k pairs"
        source, unroll = dpbf16.render_dpbf16_kernel(view, blocking, inner, description), 1
    else:
        source, unroll = render_vector_kernel(view, unit, blocking, inner, description)
    if swapped:
        source = _swap_wrapper(spec, name, inner, source, description)
    if blocking.form == "outer":
        tile_m, tile_n = blocking.rows, blocking.vectors * blocking.lanes
    else:
        tile_m, tile_n = blocking.rows, blocking.vectors
    if swapped:
        tile_m, tile_n = tile_n, tile_m
    return Microkernel(
        name=name,
        source=source,
        spec=spec,
        backend="polydl",
        isa=unit.isa,
        form=form,
        mr=tile_m,
        nr=tile_n,
        unroll=unroll,
        estimated_cycles=cycles,
    )


def _amx_kernel(spec: BrgemmSpec, view: BrgemmSpec, swapped: bool, name: str,
                b_constant: bool, l1_bytes: int) -> Microkernel:
    """The AMX tile kernel of `view` (`spec` itself or its transpose), with the vdpbf16ps
    kernel of the same view as its fallback where the OS refuses the tile state."""
    inner = f"{name}_t" if swapped else name
    if view.b_pairs:  # only the portable kernel reads B in pairs besides the tiles
        fallback = _portable(view, view, "scalar", f"{inner}_vnni")
    else:
        fallback = own_kernel(view, "avx512bf16", f"{inner}_vnni", l1_bytes=l1_bytes)
    rows, columns = amx.tile_shape(view)
    description = (
        f"{_headline(spec, name)}; AMX tiles, C blocks of {rows} x {columns} tiles, "
        f"k chunks of {amx.k_chunk(view.k)}, B packed in k pairs{' (of C^T)' if swapped else ''}"
    )
    # the packed operand is the view's B: the spec's A where the view is swapped
    b_cached = b_constant and not swapped
    source = amx.render_amx_kernel(view, inner, description, fallback.source, fallback.name,
                                   b_constant=b_cached)
    if swapped:
        source = _swap_wrapper(spec, name, inner, source, description)
    tile_m = min(amx.row_block(view.m, rows * amx.TILE_ROWS), view.m)
    tile_n = min(columns * amx.TILE_COLUMNS, view.n)
    if swapped:
        tile_m, tile_n = tile_n, tile_m
    return Microkernel(
        name=name,
        source=source,
        spec=spec,
        backend="polydl",
        isa="avx512amx",
        form="outer-m" if swapped else "outer-n",
        mr=tile_m,
        nr=tile_n,
        estimated_cycles=amx.estimated_cycles(view),
        counts_calls=amx.counts_calls(view, b_cached),
    )


def _vector_operands(view: BrgemmSpec) -> bool:
    return view.postops is None or all(o.n in (0, 1) for o in view.postops.operands)


def _swap_wrapper(spec: BrgemmSpec, name: str, inner_name: str, inner: str, description: str) -> str:
    return render(
        "c/microkernels/swapped.c.j2",
        name=name,
        inner_name=inner_name,
        inner=inner,
        description=description + " (A and B swapped: C^T = B^T A^T)",
        in_t=spec.input_ctype,
        out_t=spec.output_ctype,
        postop_params=postops.parameters(spec.postops, spec.output_ctype),
        postop_args=postops.arguments(spec.postops),
    )


def _portable(spec: BrgemmSpec, s: BrgemmSpec, isa: str, name: str) -> Microkernel:
    t = s if s.b_pairs else s.transposed()
    swapped = not (s.b_n == 1 and s.c_n == 1) and t.b_n == 1 and t.c_n == 1
    view = t if swapped else s
    inner = f"{name}_t" if swapped else name
    rows, cols = portable_blocking(view)
    description = (
        f"{_headline(spec, name)}; portable C, register tile {rows} x {cols}"
        f"{' of C^T' if swapped else ''}"
    )
    if spec.postops is not None:
        description += f"; post-ops before the store: {spec.postops.describe()}"
    source = render_portable_kernel(view, inner, description)
    if swapped:
        source = _swap_wrapper(spec, name, inner, source, description)
        rows, cols = cols, rows
    return Microkernel(
        name=name,
        source=source,
        spec=spec,
        backend="polydl",
        isa="scalar",
        form="portable",
        mr=rows,
        nr=cols,
        estimated_cycles=portable_cycles(spec),
    )


def libxsmm_kernel(spec: BrgemmSpec, isa: str, name: str, l1_bytes: int) -> Microkernel:
    """LIBXSMM's JIT kernel, with polydl's own as the fallback where the JIT refuses."""
    if spec.postops is not None:
        raise postops.PostOpsUnsupported("the LIBXSMM kernel applies no post-ops")
    if not libxsmm_available():
        raise ScheduleError("the LIBXSMM backend needs libxsmm (Debian: apt-get install libxsmm-dev)")
    plan = libxsmm_plan(spec)
    fallback = own_kernel(spec, isa, f"{name}_own", l1_bytes=l1_bytes)
    description = (
        f"{_headline(spec, name)}; LIBXSMM {'offset' if plan.first_offsets else 'stride'}"
        f"-based batch reduce"
    )
    source = render_libxsmm_kernel(spec, plan, name, fallback.source, fallback.name, description)
    return Microkernel(
        name=name,
        source=source,
        spec=spec,
        backend="libxsmm",
        isa=isa,
        form="libxsmm",
        mr=spec.m,
        nr=spec.n,
        link_flags=LINK_FLAGS,
        estimated_cycles=fallback.estimated_cycles,
    )
