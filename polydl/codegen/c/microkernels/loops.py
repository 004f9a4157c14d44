"""Loop structure shared by the generated microkernels: blocks of C and the batch loops.

Takes sizes, block sizes and a spec's batch; returns the loop data the templates print.
"""

from __future__ import annotations

from dataclasses import dataclass

from polydl.codegen import postops
from polydl.codegen.c.microkernels.spec import BrgemmSpec


@dataclass(frozen=True)
class BlockLoop:
    """`for (v = start; v < stop; v += step)`: equal blocks of `step` along m or n."""

    start: int
    stop: int
    step: int


def block_loops(extent: int, block: int) -> list[tuple[BlockLoop, int]]:
    """The full blocks of `block` and the remainder block, each with its size."""
    full = extent - extent % block
    out = []
    if full:
        out.append((BlockLoop(0, full, block), block))
    if extent % block:
        out.append((BlockLoop(full, extent, extent - full), extent - full))
    return out


@dataclass(frozen=True)
class BatchLoop:
    var: str
    extent: int


def batch_loops(spec: BrgemmSpec) -> tuple[list[BatchLoop], str, str]:
    """The batch loops (outermost first) and the C text added to the A and B base pointers."""
    loops = [BatchLoop(f"_b{d}", dim.extent) for d, dim in enumerate(spec.batch)]
    a_terms = "".join(
        f" + {loop.var} * {dim.a_stride}L" for loop, dim in zip(loops, spec.batch, strict=True)
        if dim.a_stride
    )
    b_terms = "".join(
        f" + {loop.var} * {dim.b_stride}L" for loop, dim in zip(loops, spec.batch, strict=True)
        if dim.b_stride
    )
    return loops, a_terms, b_terms


def spec_values(spec: BrgemmSpec) -> dict[str, object]:
    """What every microkernel template reads of a spec: element types, strides, beta and the
    batch loops with their pointer offsets."""
    batch, a_batch, b_batch = batch_loops(spec)
    return dict(
        dtype=spec.dtype, in_t=spec.input_ctype, out_t=spec.output_ctype,
        beta=spec.beta != 0.0,
        a_m=spec.a_m, a_k=spec.a_k, b_k=spec.b_k, b_n=spec.b_n, c_m=spec.c_m, c_n=spec.c_n,
        a_tile_m=spec.a_panel_m if spec.a_panel_rows else spec.a_m,
        batch=batch, a_batch=a_batch, b_batch=b_batch,
        postop_params=postops.parameters(spec.postops, spec.output_ctype),
        postop_args=postops.arguments(spec.postops),
    )


def offset(base: str, value: int) -> str:
    """`base + value` as C text."""
    if value == 0:
        return base
    return f"{base} + {value}" if value > 0 else f"{base} - {-value}"


@dataclass(frozen=True)
class Cell:
    """One accumulator of a register tile: its variable and the address of its C vector."""

    name: str
    address: str
    masked: bool


def column(spec: BrgemmSpec, col: int, block_stride: int, unit: int = 1) -> int:
    """Element offset of column `col` of a tile (unit stride along n): in spec's n blocks,
    block col // n at `block_stride`. A tile lies within one block or starts at one's first
    column (see `blocking.choose_outer_product`)."""
    if spec.n_blocks == 1:
        return col * unit
    return (col // spec.n) * block_stride + (col % spec.n) * unit


def tile_start(spec: BrgemmSpec, var: str, stride: int, block_stride: int) -> str:
    """C text of the offset of the tile whose first column is `var`."""
    if spec.n_blocks == 1:
        return f"{var} * {stride}"
    return f"({var} / {spec.n}) * {block_stride} + ({var} % {spec.n}) * {stride}"


def outer_cells(spec: BrgemmSpec, rows: int, vectors: int, lanes: int, masked: bool) -> tuple[Cell, ...]:
    """The accumulators of an outer-product tile, `c{row}_{vector}`; with `masked` the last
    vector of each row is the ragged n edge."""
    return tuple(
        Cell(f"c{i}_{j}", offset("cp", i * spec.c_m + column(spec, j * lanes, spec.c_nb)),
             masked and j == vectors - 1)
        for i in range(rows) for j in range(vectors)
    )

