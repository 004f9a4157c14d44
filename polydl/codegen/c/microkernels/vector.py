"""SIMD microkernels in intrinsics: register tiles of C held in vector registers.

Takes a normalised `BrgemmSpec`, a `VectorUnit` and a `Blocking`; returns C source.

- outer form (b_n == c_n == 1): each k step loads the B row segment of the tile as vectors,
  broadcasts one A element per row and issues rows x vectors FMAs (the LIBXSMM/BLIS
  microkernel); the C tile is loaded once, accumulated over all batch x k steps, stored once.
  A ragged n edge uses masked loads and stores, a ragged m edge a tile with fewer rows.
- dot form (a_k == b_k == 1): each accumulator is a vector of partial sums along k for one
  (m, n) cell, summed horizontally at the end; a ragged k edge uses masked loads.
The m-vectorised case is the outer form of the transposed spec (see `spec.transposed`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from polydl.codegen import postops
from polydl.codegen.c.microkernels.blocking import Blocking, VectorUnit
from polydl.codegen.c.microkernels.loops import (
    BlockLoop,
    Cell,
    block_loops,
    column,
    offset,
    outer_cells,
    spec_values,
    tile_start,
)
from polydl.codegen.c.microkernels.spec import BrgemmSpec
from polydl.codegen.templating import render

OPS_TEMPLATES = {"avx2": "c/microkernels/ops_avx2.j2", "avx512": "c/microkernels/ops_avx512.j2"}


@dataclass(frozen=True)
class Op:
    """One line of a k step: kind "load" | "masked" | "broadcast" (define `name` from
    `address`) or "fma" (`acc` += `x` * `y`)."""

    kind: str
    name: str = ""
    address: str = ""
    acc: str = ""
    x: str = ""
    y: str = ""


@dataclass(frozen=True)
class KLoop:
    """`count` iterations of `steps` (each a list of ops), advancing ak and bk."""

    count: int
    a_step: int
    b_step: int
    steps: tuple[tuple[Op, ...], ...]


@dataclass(frozen=True)
class Tile:
    comment: str
    n: BlockLoop
    m: BlockLoop
    cells: tuple[Cell, ...]
    k_loops: tuple[KLoop, ...]
    post: tuple[str, ...] = ()  # lines between the reduction and the stores (post-ops)
    post_stores: bool = False  # whether `post` also stores the cells
    prefetch: tuple[str, ...] = ()  # one address in each cache line of the C tile


def unroll_factor(k_steps: int) -> int:
    # Two k steps per iteration halve the loop overhead; more only grows the code, as the
    # out-of-order core already overlaps consecutive steps.
    return 2 if k_steps >= 2 else 1


def _outer_step(spec: BrgemmSpec, rows: int, vectors: int, lanes: int, masked_last: bool,
                u: int) -> tuple[Op, ...]:
    ops = []
    for j in range(vectors):
        kind = "masked" if masked_last and j == vectors - 1 else "load"
        ops.append(Op(kind, name=f"b{j}",
                      address=offset("bk", u * spec.b_k + column(spec, j * lanes, spec.b_nb))))
    for i in range(rows):
        ops.append(Op("broadcast", name=f"a{i}", address=offset("ak", u * spec.a_k + i * spec.a_m)))
        ops += [Op("fma", acc=f"c{i}_{j}", x=f"a{i}", y=f"b{j}") for j in range(vectors)]
    return tuple(ops)


CACHE_LINE_BYTES = 64


def c_tile_lines(spec: BrgemmSpec, rows: int, width: int) -> tuple[str, ...]:
    """An address in every cache line of a rows x width tile of C (n unit stride)."""
    per_line = CACHE_LINE_BYTES // (8 if spec.output_ctype == "double" else 4)
    out: list[str] = []
    for i in range(rows):
        for j in sorted({*range(0, width, per_line), width - 1}):
            out.append(offset("cp", i * spec.c_m + column(spec, j, spec.c_nb)))
    return tuple(dict.fromkeys(out))


def outer_tiles(spec: BrgemmSpec, blocking: Blocking) -> tuple[list[Tile], int, int]:
    """Tiles of an outer-product kernel, the lanes of its masked vector (0: none), unroll."""
    lanes = blocking.lanes
    unroll = unroll_factor(spec.k)
    tiles = []
    tail = spec.n % lanes
    for n_loop, width in block_loops(spec.n * spec.n_blocks, blocking.vectors * lanes):
        vectors = -(-width // lanes)
        masked = width % lanes != 0
        for m_loop, rows in block_loops(spec.m, blocking.rows):
            cells = outer_cells(spec, rows, vectors, lanes, masked)
            k_loops = []
            if spec.k // unroll:
                steps = tuple(_outer_step(spec, rows, vectors, lanes, masked, u) for u in range(unroll))
                k_loops.append(KLoop(spec.k // unroll, unroll * spec.a_k, unroll * spec.b_k, steps))
            if spec.k % unroll:
                steps = (_outer_step(spec, rows, vectors, lanes, masked, 0),)
                k_loops.append(KLoop(spec.k % unroll, spec.a_k, spec.b_k, steps))
            comment = f"{rows} x {width} block of C: {rows} rows x {vectors} vectors"
            # With beta 1 the accumulators start at zero and C is added at the end: the C
            # tile's lines, prefetched here, arrive during the k loop instead of stalling
            # its first FMAs (a tile is ~1500 cycles; a C line from L3 or memory 50-300).
            prefetch = c_tile_lines(spec, rows, width) if spec.beta else ()
            tiles.append(Tile(comment, n_loop, m_loop, cells, tuple(k_loops), prefetch=prefetch))
    return tiles, tail, unroll


def _dot_step(spec: BrgemmSpec, rows: int, cols: int, masked: bool, at: int) -> tuple[Op, ...]:
    kind = "masked" if masked else "load"
    ops = [Op(kind, name=f"a{i}", address=offset("ak", at + i * spec.a_m)) for i in range(rows)]
    for j in range(cols):
        ops.append(Op(kind, name=f"b{j}", address=offset("bk", at + j * spec.b_n)))
        ops += [Op("fma", acc=f"c{i}_{j}", x=f"a{i}", y=f"b{j}") for i in range(rows)]
    return tuple(ops)


def dot_tiles(spec: BrgemmSpec, blocking: Blocking) -> tuple[list[Tile], int, int]:
    """Tiles of a dot-product kernel, the lanes of the masked k chunk (0: none), unroll."""
    lanes = blocking.lanes
    chunks, tail = divmod(spec.k, lanes)
    unroll = unroll_factor(chunks)
    tiles = []
    for n_loop, cols in block_loops(spec.n, blocking.vectors):
        for m_loop, rows in block_loops(spec.m, blocking.rows):
            cells = tuple(
                Cell(f"c{i}_{j}", offset("cp", i * spec.c_m + j * spec.c_n), False)
                for i in range(rows) for j in range(cols)
            )
            k_loops = []
            if chunks // unroll:
                steps = tuple(_dot_step(spec, rows, cols, False, u * lanes) for u in range(unroll))
                k_loops.append(KLoop(chunks // unroll, unroll * lanes, unroll * lanes, steps))
            if chunks % unroll:
                steps = (_dot_step(spec, rows, cols, False, 0),)
                k_loops.append(KLoop(chunks % unroll, lanes, lanes, steps))
            if tail:
                k_loops.append(KLoop(1, 0, 0, (_dot_step(spec, rows, cols, True, 0),)))
            comment = f"{rows} x {cols} block of C: dot products along k"
            tiles.append(Tile(comment, n_loop, m_loop, cells, tuple(k_loops)))
    return tiles, tail, unroll


def render_vector_kernel(spec: BrgemmSpec, unit: VectorUnit, blocking: Blocking, name: str,
                         description: str) -> tuple[str, int]:
    """C source of the kernel and its k unroll factor."""
    if blocking.form == "outer":
        tiles, tail, unroll = outer_tiles(spec, blocking)
    else:
        tiles, tail, unroll = dot_tiles(spec, blocking)
    if spec.postops is not None:
        family = "avx512" if unit.isa.startswith("avx512") else unit.isa
        tiles = [_with_postops(spec, t, blocking, family, name) for t in tiles]
    source = render(
        "c/microkernels/vector.c.j2",
        **spec_values(spec),
        ops=OPS_TEMPLATES["avx512" if unit.isa.startswith("avx512") else unit.isa],
        name=name,
        description=description,
        form=blocking.form,
        target_attribute=unit.target_attribute,
        tail=tail,
        tail_bits=hex((1 << tail) - 1),
        tiles=tiles,
        b_n0=tile_start(spec, "n0", spec.b_n, spec.b_nb),
        c_n0=tile_start(spec, "n0", spec.c_n, spec.c_nb),
    )
    return source, unroll


def _with_postops(spec: BrgemmSpec, tile: Tile, blocking: Blocking, family: str, name: str) -> Tile:
    """The tile with its post-ops: on the vectors before the stores (outer form), or on each
    summed cell, which they then store (dot form)."""
    assert spec.postops is not None
    ops = postops.VectorOps(family, spec.dtype)
    cells = []
    for cell in tile.cells:  # named c{row}_{column block}
        row, block = (int(x) for x in cell.name[1:].split("_"))
        cells.append((cell, row, block))
    if blocking.form == "outer":
        lines = postops.vector_lines(
            spec.postops, ops, [(c.name, r, j * blocking.lanes, c.masked) for c, r, j in cells],
            blocking.lanes, spec.n if spec.n_blocks > 1 else 0)
        return replace(tile, post=tuple(lines))
    lines = postops.operand_bases(spec.postops, ops.ctype)
    at = spec.postops.operands
    for cell, row, col in cells:
        total = (f"_mm512_reduce_add_{ops.sfx}({cell.name})" if family == "avx512"
                 else f"{name}_hsum({cell.name})")
        if spec.beta:
            total = f"*({cell.address}) + {total}"
        def operand(o: int, r: int = row, j: int = col) -> str:
            return f"ep{o}[{r * at[o].m + j * at[o].n}]"

        body = postops.scalar_lines(spec.postops, "v", operand, ops.ctype)
        lines.append(f"{{ {ops.ctype} v = {total}; {' '.join(body)} *({cell.address}) = v; }}")
    return replace(tile, post=tuple(lines), post_stores=True)
