"""Batch-reduce GEMM microkernels: C source for one `BrgemmSpec` on one ISA.

Takes a `BrgemmSpec` (sizes, element strides, batch, dtype, beta), an ISA from
`polydl.machine.ISAS`, a function name and a backend; returns a `Microkernel` whose source
defines `static void NAME(const T *a, const T *b, U *c)`.

Backends: "polydl" generates the kernel (SIMD intrinsics where the strides allow a vector
dimension, portable C otherwise); "libxsmm" calls LIBXSMM's JIT (ScheduleError where the
strides have no BLAS form); "auto" is polydl's own unless LIBXSMM is known to be faster.
"""

from __future__ import annotations

from polydl.codegen.microkernels import dpbf16
from polydl.codegen.microkernels.blocking import (
    VECTOR_UNITS,
    Blocking,
    choose_dot_product,
    choose_outer_product,
    portable_cycles,
)
from polydl.codegen.microkernels.libxsmm import (
    LINK_FLAGS,
    libxsmm_available,
    libxsmm_plan,
    render_libxsmm_kernel,
)
from polydl.codegen.microkernels.portable import portable_blocking, render_portable_kernel
from polydl.codegen.microkernels.spec import BatchDim, BrgemmSpec, Microkernel
from polydl.codegen.microkernels.vector import render_vector_kernel
from polydl.codegen.templating import render
from polydl.errors import ScheduleError
from polydl.machine import ISAS

__all__ = [
    "BACKENDS",
    "BatchDim",
    "BrgemmSpec",
    "Microkernel",
    "choose_microkernel",
    "libxsmm_available",
]

BACKENDS = ("auto", "polydl", "libxsmm")


def choose_microkernel(spec: BrgemmSpec, isa: str, name: str, backend: str = "auto") -> Microkernel:
    if isa not in ISAS:
        raise ValueError(f"unknown ISA '{isa}'; known: {', '.join(ISAS)}")
    if backend not in BACKENDS:
        raise ScheduleError(f"unknown microkernel backend '{backend}'; known: {', '.join(BACKENDS)}")
    if spec.a_panel_rows:
        if backend == "libxsmm":
            raise ScheduleError("LIBXSMM takes A as a matrix, not packed in panels: pack_a needs "
                                "backend 'polydl' or 'auto'")
        return panel_kernel(spec, isa, name)
    if backend == "libxsmm" or (backend == "auto" and _libxsmm_preferred(spec, isa)):
        return libxsmm_kernel(spec, isa, name)
    return own_kernel(spec, isa, name)


def panel_kernel(spec: BrgemmSpec, isa: str, name: str) -> Microkernel:
    """The outer-product SIMD kernel over an A packed in panels of register-tile rows."""
    s = spec.normalized()
    unit = VECTOR_UNITS.get(isa)
    if unit is None or not (s.b_n == 1 and s.c_n == 1) or s.dtype == "bfloat16":
        raise ScheduleError(
            f"A packed in panels needs a SIMD outer-product microkernel (vectors along n) in "
            f"float32 or float64; ISA {isa}, dtype {s.dtype}, B's n stride {s.b_n}, C's {s.c_n}"
        )
    blocking = choose_outer_product(s, unit)
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


def own_kernel(spec: BrgemmSpec, isa: str, name: str) -> Microkernel:
    """polydl's generated kernel: the form and register blocking with the fewest estimated
    cycles among those the strides allow, portable C if none does (or for isa "scalar")."""
    s = spec.normalized()
    unit = VECTOR_UNITS.get(isa)
    candidates: list[tuple[float, str, BrgemmSpec, Blocking]] = []
    if unit is not None:
        t = s.transposed()
        if s.b_n == 1 and s.c_n == 1:
            b = choose_outer_product(s, unit)
            candidates.append((b.cycles, "outer-n", s, b))
        if t.b_n == 1 and t.c_n == 1:
            b = choose_outer_product(t, unit)
            candidates.append((b.cycles, "outer-m", t, b))
        if s.a_k == 1 and s.b_k == 1:
            b = choose_dot_product(s, unit)
            candidates.append((b.cycles, "dot-k", s, b))
    if not candidates:
        return _portable(spec, s, isa, name)
    assert unit is not None
    cycles, form, view, blocking = min(candidates, key=lambda c: c[0])
    swapped = form == "outer-m"
    inner = f"{name}_t" if swapped else name
    description = (
        f"{name}: brgemm m={spec.m} n={spec.n} k={spec.k} batch={spec.batch_count} "
        f"{spec.dtype} beta={spec.beta:g}; {unit.isa} {form}, register tile "
        f"{blocking.rows} x {blocking.vectors}{' vectors' if blocking.form == 'outer' else ''}"
        f"{' of C^T' if swapped else ''}"
    )
    if isa == "avx512bf16" and blocking.form == "outer" and dpbf16.supports(view):
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


def _swap_wrapper(spec: BrgemmSpec, name: str, inner_name: str, inner: str, description: str) -> str:
    return render(
        "c/microkernels/swapped.c.j2",
        name=name,
        inner_name=inner_name,
        inner=inner,
        description=description + " (A and B swapped: C^T = B^T A^T)",
        in_t=spec.input_ctype,
        out_t=spec.output_ctype,
    )


def _portable(spec: BrgemmSpec, s: BrgemmSpec, isa: str, name: str) -> Microkernel:
    t = s.transposed()
    swapped = not (s.b_n == 1 and s.c_n == 1) and t.b_n == 1 and t.c_n == 1
    view = t if swapped else s
    inner = f"{name}_t" if swapped else name
    rows, cols = portable_blocking(view)
    description = (
        f"{name}: brgemm m={spec.m} n={spec.n} k={spec.k} batch={spec.batch_count} "
        f"{spec.dtype} beta={spec.beta:g}; portable C, register tile {rows} x {cols}"
        f"{' of C^T' if swapped else ''}"
    )
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


def libxsmm_kernel(spec: BrgemmSpec, isa: str, name: str) -> Microkernel:
    """LIBXSMM's JIT kernel, with polydl's own as the fallback where the JIT refuses."""
    if not libxsmm_available():
        raise ScheduleError("the LIBXSMM backend needs libxsmm (Debian: apt-get install libxsmm-dev)")
    plan = libxsmm_plan(spec)
    fallback = own_kernel(spec, isa, f"{name}_own")
    description = (
        f"{name}: brgemm m={spec.m} n={spec.n} k={spec.k} batch={spec.batch_count} "
        f"{spec.dtype} beta={spec.beta:g}; LIBXSMM {'offset' if plan.first_offsets else 'stride'}"
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
