"""The GPU schedule's plan types: what `schedules.gpu.planning` decides, as values.

A `GpuSchedule` is one `GpuKernelPlan` per launch, in order. A kernel plan names the loops
its threads run (`ThreadLoop`) or, for a GEMM statement, a `GemmPlan`: the GEMM's loops
(`GemmDim`), its tile (a variant of `schedules.gpu.variants`), the TMA views of its operands
(`TensorMap`, or a `WindowMap` over a convolution's input) and the statements fused into its
store (`GemmEpilogue`). `StoredGpuSchedule` is what the lowering cache keeps of a schedule.
The algorithms that make and rewrite these live beside this module; none is imported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from polydl.ir import Access, Guard, Loop
from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.gpu.variants import GemmTiling
from polydl.schedules.postops import PostExpr, expr_text
from polydl.target.gpu import GpuTarget


@dataclass(frozen=True)
class ThreadLoop:
    """A loop whose iterations run on separate threads: `var = lower + step * index`."""

    var: str
    lower: int
    extent: int
    step: int


@dataclass(frozen=True)
class GemmDim:
    """One loop of an implicit GEMM, relative to its lower bound; strides in elements."""

    var: str
    lower: int
    extent: int
    stride_a: int
    stride_b: int
    stride_c: int

    def stride(self, operand: str) -> int:
        """The element stride in operand "a", "b" or "c"."""
        return {"a": self.stride_a, "b": self.stride_b, "c": self.stride_c}[operand]


@dataclass(frozen=True)
class TensorMap:
    """A TMA view of one operand: extents and byte strides innermost first (the first dimension
    is contiguous), the box one copy moves, and where the GEMM's indices enter: the tile
    coordinate of each dimension is "k", "m", "n" or a batch loop's name."""

    extents: tuple[int, ...]
    strides: tuple[int, ...]  # bytes, of dimensions 1.. (dimension 0 is contiguous)
    box: tuple[int, ...]
    roles: tuple[str, ...]

    @property
    def rank(self) -> int:
        return len(self.extents)

    @property
    def element_strides(self) -> tuple[int, ...]:
        return (1,) * len(self.extents)


@dataclass(frozen=True)
class WindowAxis:
    """One dimension of A's array: its extent, and the M loop and K loop (either may be
    absent) whose sum indexes it."""

    extent: int
    m: str | None
    k: str | None
    step: int = 1  # elements between consecutive M positions (a strided convolution's stride)


@dataclass(frozen=True)
class WindowMap:
    """A operand as a sliding window over its array, read by TMA boxes
    (`schedules.gpu.windows`)."""

    axes: tuple[WindowAxis, ...]  # innermost (the contiguous K loop) first
    strides: tuple[int, ...]  # bytes, of axes 1..
    box: tuple[int, ...]  # elements one copy moves along each axis
    tile_m: tuple[tuple[str, int], ...]  # (M loop, positions a block tile covers), outer first
    # the array the copies read when not A's own: the source of a zero-padded copy A of it,
    # read at A's coordinates plus `offsets` (per axis); cells outside it read as zero
    source: str | None = None
    offsets: tuple[int, ...] = ()
    copy: str | None = None  # the statement making A, whose launch reading X replaces

    @property
    def extents(self) -> tuple[int, ...]:
        return tuple(a.extent for a in self.axes)

    @property
    def rank(self) -> int:
        return len(self.axes)

    @property
    def element_strides(self) -> tuple[int, ...]:
        return tuple(a.step for a in self.axes)

    def tile_counts(self, plan: GemmPlan) -> dict[str, int]:
        """Block tiles along each M loop, outer first."""
        return {d.var: math.ceil(d.extent / t) for d, (_, t) in zip(plan.m, self.tile_m, strict=True)}

    def useful(self, plan: GemmPlan) -> float:
        """The share of a block tile's rows that are output positions."""
        counts = self.tile_counts(plan)
        return math.prod(d.extent / (counts[d.var] * t) for d, (_, t) in zip(plan.m, self.tile_m, strict=True))


@dataclass(frozen=True)
class EpilogueOperand:
    """An array the epilogue reads at the C cell's position: element offset `base` plus
    `strides` times each GEMM loop's index (relative to its lower bound)."""

    array: str
    base: int
    strides: tuple[tuple[str, int], ...]  # (loop, element stride)

    def stride(self, var: str) -> int:
        return dict(self.strides).get(var, 0)


@dataclass(frozen=True)
class GemmEpilogue:
    """Statements fused into a GEMM's store (`schedules.gpu.epilogues`)."""

    initial: PostExpr | None  # the cell's value before the reduction; None: C's stored value
    steps: tuple[PostExpr, ...]  # then `acc = step(acc)`, in order
    operands: tuple[EpilogueOperand, ...]
    initializer: str | None  # the fused statement that set `initial`
    statements: tuple[str, ...]  # the fused epilogue statements

    def describe(self) -> str:
        parts = []
        if self.initializer is not None:
            assert self.initial is not None
            parts.append(f"C starts at {expr_text(self.initial)} ({self.initializer} fused)")
        if self.steps:
            ops = "; ".join(f"acc = {expr_text(s)}" for s in self.steps)
            parts.append(f"epilogue {', '.join(self.statements)} in the kernel: {ops}")
        arrays = ", ".join(f"e{i} = {o.array}" for i, o in enumerate(self.operands))
        return "; ".join(parts) + (f" ({arrays})" if arrays else "")


@dataclass(frozen=True)
class TmaOperands:
    a: TensorMap | WindowMap  # K-major: (k, m, batch...), or a window over A's array
    b: TensorMap  # N-major (n, k, batch...) or K-major (k, n, batch...)
    b_major: str  # "n" | "k"


@dataclass(frozen=True, eq=False)
class GemmPlan:
    c: Access
    a: Access
    b: Access
    m: tuple[GemmDim, ...]
    n: tuple[GemmDim, ...]
    k: tuple[GemmDim, ...]
    batch: tuple[GemmDim, ...]
    base_a: int
    base_b: int
    base_c: int
    dtype_ab: str
    dtype_c: str
    tiling: GemmTiling
    footprint_bytes: int  # A and B cells one block's K step reads (isl count)
    tma: TmaOperands | None = None  # set for a `TmaTiling`
    epilogue: GemmEpilogue | None = None  # neighbouring statements applied in the kernel

    @property
    def copy_source(self) -> WindowMap | None:
        """The window when A is read from the source of a padded copy of it, not from A."""
        window = self.tma.a if self.tma is not None else None
        return window if isinstance(window, WindowMap) and window.source else None

    @staticmethod
    def size(dims: tuple[GemmDim, ...]) -> int:
        return math.prod(d.extent for d in dims)


@dataclass(frozen=True, eq=False)
class GpuKernelPlan:
    statement: StatementModel
    enclosing: tuple[Loop | Guard, ...]  # loops and guards around the statement, outermost first
    threads: tuple[ThreadLoop, ...]  # loops mapped to threads, outermost first
    block: int  # threads per block (generic kernels)
    register_accumulator: bool  # reduction into one target kept in a register
    gemm: GemmPlan | None = None
    # (u, v): a copy whose source runs along thread loop u and whose target runs along v,
    # moved through 32 x 32 shared-memory tiles (`transpose_loops`)
    transpose: tuple[str, str] | None = None
    # statements after `statement` that the same threads run, each under its own guards
    # (`sibling_groups`: the same loops, every one on threads, no dependence between threads)
    siblings: tuple[tuple[StatementModel, tuple[Loop | Guard, ...]], ...] = ()

    @property
    def name(self) -> str:
        return self.statement.name

    @property
    def sequential(self) -> tuple[str, ...]:
        mapped = {t.var for t in self.threads}
        return tuple(x.var for x in self.enclosing if isinstance(x, Loop) and x.var not in mapped)

    def describe(self) -> str:
        if self.gemm is not None:
            g, t = self.gemm, self.gemm.tiling
            dims = "; ".join(
                f"{label}=({', '.join(d.var for d in ds)})"
                for label, ds in (("batch", g.batch), ("m", g.m), ("n", g.n), ("k", g.k)) if ds
            )
            return (
                f"{self.name}: gemm[{t.label}] {dims}; {t.describe()}"
                + (f"; {g.epilogue.describe()}" if g.epilogue is not None else "")
                + (f"; reads {w.source} through TMA boxes zero-filled at its edges "
                   f"({w.copy}, its padded copy, dropped)" if (w := g.copy_source) else "")
            )
        par = ", ".join(t.var for t in self.threads) or "none"
        seq = ", ".join(self.sequential) or "none"
        acc = " (register accumulator)" if self.register_accumulator else ""
        tiles = (f"; tiles of {self.transpose[0]} x {self.transpose[1]} through shared memory"
                 if self.transpose else "")
        name = self.name if not self.siblings else f"{self.name}-{self.siblings[-1][0].name}"
        return f"{name}: threads over ({par}); sequential ({seq}){acc}{tiles}"

    @property
    def statements(self) -> tuple[StatementModel, ...]:
        return (self.statement, *(s for s, _ in self.siblings))


@dataclass(frozen=True, eq=False)
class GpuSchedule:
    target: GpuTarget
    kernels: tuple[GpuKernelPlan, ...]
    notes: tuple[tuple[str, Any], ...] = field(default=())
    # the model the kernels were planned on where it is not the user's nest
    # (`schedules.gpu.staging`: windows read channels-last copies)
    model: PolyModel | None = None

    def describe(self) -> str:
        return f"gpu {self.target.name}: " + " | ".join(k.describe() for k in self.kernels)

    def to_dict(self) -> dict[str, Any]:
        # "device": the stored lowerings' key for the target
        return {"device": self.target.to_dict(), "kernels": [k.describe() for k in self.kernels]}


@dataclass(frozen=True)
class StoredGpuSchedule:
    """A GPU schedule read back from the lowering cache: the plans themselves hold isl objects
    and stay behind; what a loaded kernel reports (its target and each launch's description)
    comes back."""

    target: GpuTarget
    kernels: tuple[str, ...]  # each launch's `describe()`

    def describe(self) -> str:
        return f"gpu {self.target.name}: " + " | ".join(self.kernels)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.target.to_dict(), "kernels": list(self.kernels)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> StoredGpuSchedule:
        kernels = data["kernels"]
        if not isinstance(kernels, list) or not all(isinstance(k, str) for k in kernels):
            raise ValueError("kernels must be a list of descriptions")
        return StoredGpuSchedule(GpuTarget.from_dict(data["device"]), tuple(kernels))
