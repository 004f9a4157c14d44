"""How a GEMM kernel stores C: which store forms apply, and each cell's final value.

Takes a `GemmPlan`; returns `CStores`, what `templates/gpu/stores.j2` writes the stores from:
a cell at a time, an aligned pair, four cells of a row or of a column, or runs staged through
shared memory (the TMA kernel). A cell's value is its accumulator with the fused epilogue
applied (`schedules.gpu.epilogues`); K slices of one tile meet in C through atomics (no
epilogue there).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from polydl.codegen.gpu.launch import macro
from polydl.codegen.postops import scalar_expr
from polydl.schedules.gpu.operands import contiguous_runs
from polydl.schedules.gpu.plans import GemmDim, GemmPlan, TensorMap
from polydl.schedules.gpu.variants import TmaTiling


@dataclass(frozen=True)
class CellValue:
    """The final value `var` of one C cell from its accumulator: with a fused epilogue, its
    start (None: C's stored value) and steps as C expressions; without, C's stored value plus
    the accumulator."""

    var: str
    fused: bool
    initial: str | None
    steps: tuple[str, ...]


@dataclass(frozen=True)
class CStores:
    atomic: bool  # K slices of one tile add into C
    bf16: bool  # C holds bf16 (stored rounded, read widened)
    reads_c: bool  # the cells' start is C's stored value, read with the store
    adds_run: bool  # plain `C += A B`: a staged run is read and added
    cell: CellValue  # pd_v at column n
    pair: tuple[CellValue, CellValue]  # pd_v0, pd_v1 at columns n, n + 1
    four: tuple[CellValue, ...]  # pd_v0..pd_v3 at columns n..n + 3
    column: CellValue  # pd_v at column n, for each of four rows
    staged_eight: bool  # a thread stores staged runs of 8 cells (else 4)


def _cell_value(g: GemmPlan, kernel: str, var: str, n: str) -> CellValue:
    e = g.epilogue
    if e is None:
        return CellValue(var, False, None, ())
    operand_text = macro("gpu/stores.j2", "epilogue_operand")

    def operand(i: int) -> str:
        o = e.operands[i]
        return operand_text(g.dtype_c == "bfloat16", kernel, i, o.array, o.base, n)

    initial = None if e.initial is None else scalar_expr(e.initial, "", operand, "float")
    return CellValue(var, True, initial, tuple(scalar_expr(step, var, operand, "float") for step in e.steps))


def c_stores(g: GemmPlan, kernel: str) -> CStores:
    def cell(var: str, n: str) -> CellValue:
        return _cell_value(g, kernel, var, n)

    return CStores(
        atomic=g.tiling.splits > 1,
        bf16=g.dtype_c == "bfloat16",
        reads_c=g.epilogue is None or g.epilogue.initial is None,
        adds_run=g.epilogue is None,
        cell=cell("pd_v", "n"),
        pair=(cell("pd_v0", "n"), cell("pd_v1", "n + 1")),
        four=tuple(cell(f"pd_v{i}", f"n + {i}" if i else "n") for i in range(4)),
        column=cell("pd_v", "n"),
        staged_eight=staged_width(g) == 8,
    )


def epilogue_dims(g: GemmPlan) -> list[tuple[str, tuple[GemmDim, ...]]]:
    """(index function name, the GEMM loops with the operand's strides as C's) of each
    epilogue operand's m, n and z offsets; none where K is split (no epilogue there)."""
    if g.epilogue is None or g.tiling.splits > 1:
        return []
    return [(f"e{i}{label}", tuple(replace(d, stride_c=o.stride(d.var)) for d in dims))
            for i, o in enumerate(g.epilogue.operands)
            for label, dims in (("m", g.m), ("n", g.n), ("z", g.batch))]


def pair_stores(g: GemmPlan) -> bool:
    """Whether columns n and n + 1 (n even) of C are adjacent cells of one aligned pair: the
    kernels then store (and read) C two cells at a time."""
    return g.tiling.splits == 1 and contiguous_runs(g, "c", "n", 2)


def staged_stores(g: GemmPlan) -> bool:
    """Whether the TMA kernel stores C through shared memory in runs of 4 cells: a bf16 C of
    a GEMM over strided matrices, its rows contiguous along n in aligned runs, its start value
    not read from C unless C is plain `C += A B` (added in the run). An fp32 C and the
    convolution windows store faster in pairs straight from registers
    (see decisions: GPU TMA stores staged through shared memory)."""
    if not isinstance(g.tiling, TmaTiling) or g.tiling.splits > 1 or g.dtype_c != "bfloat16":
        return False
    if g.tma is None or not isinstance(g.tma.a, TensorMap):
        return False
    if g.epilogue is not None and g.epilogue.initial is None:
        return False
    return contiguous_runs(g, "c", "n", 4)


def staged_width(g: GemmPlan) -> int:
    """Cells of C one thread stores at a time from the staged tile: 8 bf16 (16 bytes) where C
    runs in aligned eights along n, else 4."""
    return 8 if g.dtype_c == "bfloat16" and contiguous_runs(g, "c", "n", 8) else 4
