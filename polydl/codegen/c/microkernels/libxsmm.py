"""The LIBXSMM backend: a batch-reduce GEMM that calls LIBXSMM's JIT-generated kernel.

Takes a `BrgemmSpec`; returns C source that dispatches `libxsmm_?mmdispatch_reducebatch_strd`
(one batch stride) or `..._offs` (a table of batch offsets) once, or raises ScheduleError
when the strides have no column-major BLAS form. LIBXSMM is column-major: our row-major
C[m][n] += A[m][k] B[k][n] is its C'[n][m] += B'[n][k] A'[k][m] with B as its first operand.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from polydl.codegen.c.microkernels.spec import BrgemmSpec
from polydl.codegen.templating import render
from polydl.errors import ScheduleError

# The static libraries of Debian's libxsmm-dev: libxsmm needs a BLAS only for shapes its JIT
# refuses, which the generated code routes to polydl's own kernel, so the no-BLAS stub is enough.
LINK_FLAGS = ("-lxsmm", "-lxsmmnoblas", "-lm", "-lpthread", "-ldl")
MAX_OFFSETS = 1 << 16
_ELEMENT_BYTES = {"float32": 4, "float64": 8}
_DISPATCH_PREFIX = {"float32": "libxsmm_smmdispatch", "float64": "libxsmm_dmmdispatch"}
_FUNCTION_PREFIX = {"float32": "libxsmm_smmfunction", "float64": "libxsmm_dmmfunction"}


def _search_dirs(variables: tuple[str, ...], defaults: tuple[str, ...]) -> list[Path]:
    dirs = [p for v in variables for p in os.environ.get(v, "").split(os.pathsep) if p]
    return [Path(d) for d in (*dirs, *defaults)]


@cache
def libxsmm_available() -> bool:
    """True if the LIBXSMM header and libraries are where the C compiler looks."""
    includes = _search_dirs(("CPATH", "C_INCLUDE_PATH"), ("/usr/local/include", "/usr/include"))
    libs = _search_dirs(
        ("LIBRARY_PATH",),
        ("/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"),
    )
    header = any((d / "libxsmm.h").is_file() for d in includes)

    def found(lib: str) -> bool:
        return any((d / f"lib{lib}.{ext}").exists() for d in libs for ext in ("so", "a"))

    return header and found("xsmm") and found("xsmmnoblas")


@dataclass(frozen=True)
class LibxsmmPlan:
    """LIBXSMM's column-major view of a spec: C'(m x n, ldc) += A'(m x k, lda) B'(k x n, ldb),
    A' being our `first` operand ("a" or "b")."""

    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    first: str
    count: int
    first_stride: int  # bytes between batch entries (one batch loop)
    second_stride: int
    first_offsets: tuple[int, ...] | None  # bytes per batch entry (several batch loops)
    second_offsets: tuple[int, ...] | None


def _column_major(spec: BrgemmSpec) -> tuple[int, int, int, str] | None:
    """(lda, ldb, ldc, first operand) if the spec is a column-major GEMM with B first:
    unit stride along n in B and C and along k in A, leading dimensions large enough."""
    s = spec
    if not (s.b_n == 1 and s.c_n == 1 and s.a_k == 1):
        return None
    lda = s.b_k if s.k > 1 else s.n
    ldb = s.a_m if s.m > 1 else s.k
    ldc = s.c_m if s.m > 1 else s.n
    if lda < s.n or ldb < s.k or ldc < s.n:
        return None
    return lda, ldb, ldc, "b"


def libxsmm_plan(spec: BrgemmSpec) -> LibxsmmPlan:
    if spec.dtype not in _ELEMENT_BYTES:
        raise ScheduleError(f"the LIBXSMM backend supports float32 and float64, not {spec.dtype}")
    if spec.batch_count == 0:
        raise ScheduleError("the LIBXSMM backend needs a non-empty batch")
    # Merging a batch loop into k saves LIBXSMM a batch entry but may make k exceed the
    # leading dimension (rows that overlap); then keep the batch loop.
    layout = None
    for s in (spec.normalized(), spec.normalized(merge_k=False)):
        view = s
        layout = _column_major(view)
        if layout is None:
            view = s.transposed()
            layout = _column_major(view)
            if layout is not None:
                layout = (*layout[:3], "a")
        if layout is not None:
            break
    if layout is None:
        raise ScheduleError(
            "LIBXSMM needs unit stride along n in B and C and along k in A, with leading "
            "dimensions at least the block (or the transposed form); strides are "
            f"a_m={spec.a_m} a_k={spec.a_k} b_k={spec.b_k} b_n={spec.b_n} "
            f"c_m={spec.c_m} c_n={spec.c_n}"
        )
    lda, ldb, ldc, first = layout
    size = _ELEMENT_BYTES[spec.dtype]
    # In LIBXSMM's view, A' is `view`'s B and B' is `view`'s A.
    first_strides = [d.b_stride * size for d in view.batch]
    second_strides = [d.a_stride * size for d in view.batch]
    if any(st < 0 for st in first_strides + second_strides):
        raise ScheduleError("the LIBXSMM backend needs non-negative batch strides")
    first_offsets = second_offsets = None
    first_stride = first_strides[0] if len(view.batch) == 1 else 0
    second_stride = second_strides[0] if len(view.batch) == 1 else 0
    if len(view.batch) > 1:
        if s.batch_count > MAX_OFFSETS:
            raise ScheduleError(f"a batch of {s.batch_count} is too large for an offset table")
        ranges = [range(d.extent) for d in view.batch]
        first_offsets = tuple(
            sum(i * st for i, st in zip(idx, first_strides, strict=True))
            for idx in itertools.product(*ranges)
        )
        second_offsets = tuple(
            sum(i * st for i, st in zip(idx, second_strides, strict=True))
            for idx in itertools.product(*ranges)
        )
    return LibxsmmPlan(
        m=view.n, n=view.m, k=view.k, lda=lda, ldb=ldb, ldc=ldc, first=first,
        count=s.batch_count, first_stride=first_stride, second_stride=second_stride,
        first_offsets=first_offsets, second_offsets=second_offsets,
    )


def render_libxsmm_kernel(spec: BrgemmSpec, plan: LibxsmmPlan, name: str, fallback: str,
                          fallback_name: str, description: str) -> str:
    kind = "offs" if plan.first_offsets is not None else "strd"
    stride_args = f" {plan.first_stride}, {plan.second_stride}," if kind == "strd" else ""
    second = "a" if plan.first == "b" else "b"
    mapping = (
        f"C'({plan.m} x {plan.n}, ld {plan.ldc}) += {plan.first.upper()}'({plan.m} x {plan.k}, "
        f"ld {plan.lda}) * {second.upper()}'({plan.k} x {plan.n}, ld {plan.ldb})"
    )
    return render(
        "c/microkernels/libxsmm.c.j2",
        name=name,
        description=description,
        fallback=fallback,
        fallback_name=fallback_name,
        t=spec.input_ctype,
        function_type=f"{_FUNCTION_PREFIX[spec.dtype]}_reducebatch_{kind}",
        dispatch=f"{_DISPATCH_PREFIX[spec.dtype]}_reducebatch_{kind}",
        mapping=mapping,
        m=plan.m,
        n=plan.n,
        k=plan.k,
        lda=plan.lda,
        ldb=plan.ldb,
        ldc=plan.ldc,
        beta="1" if spec.beta != 0.0 else "0",
        stride_args=stride_args,
        count=plan.count,
        offsets=plan.first_offsets is not None,
        first_offsets=plan.first_offsets or (),
        second_offsets=plan.second_offsets or (),
        first=plan.first,
        second=second,
    )
