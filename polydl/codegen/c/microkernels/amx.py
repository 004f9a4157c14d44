"""The AMX bf16 microkernel: C held in tile registers, `tdpbf16ps` on whole tiles.

Takes a normalised bfloat16 `BrgemmSpec` with A unit-stride along k, B and C unit-stride along
n and an even k, plus the source and name of a fallback kernel (used where the OS refuses the
tile state); returns C source. A tile multiplies up to 16 rows of A (k pairs adjacent, read in
place at stride a_m) by a tile of B in pair-interleaved (VNNI) order: row p of it holds
(B[2p][n], B[2p+1][n]) for 16 columns n. Each block of n columns of B is copied once per call
into that order, for every batch element and k, into a per-thread buffer; every block of m
rows then reads it (and, where B is a constant input, the thread's next calls on the same B
within one call of the generated function). Where the generated function copied all of B
into that order before its calls (`BrgemmSpec.b_pairs`), the tiles load from B itself. A
block of C is up to 3 x 1 or 2 x 2 tiles of 16 x 16 fp32 (the 8 tile registers also hold
one A tile per tile row and one B tile per tile column); ragged edges are tiles with fewer rows or
columns, under their own tile configuration, and rows are split into blocks of one height where
that costs no tile (`row_block`). A call in one tile configuration leaves it loaded for the
thread's next call within the same call of the generated function; one in several releases the
tiles at its end (see decisions: AMX tile configuration kept between calls).
"""

from __future__ import annotations

from dataclasses import dataclass

from polydl.codegen.c.microkernels.loops import BlockLoop, block_loops, spec_values
from polydl.codegen.c.microkernels.spec import BrgemmSpec
from polydl.codegen.templating import render

TARGET_ATTRIBUTE = "amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"
TILE_ROWS = 16  # rows of a tile
TILE_COLUMNS = 16  # fp32 columns of a C tile, bf16 pairs in a row of a B tile
MAX_K_CHUNK = 32  # bf16 elements in a row of an A tile (64 bytes)
TILE_REGISTERS = 8
DOT_CYCLES = 16  # one tdpbf16ps issues every 16 cycles


@dataclass(frozen=True)
class RowGroup:
    """Blocks of m with the same tile heights, under one tile configuration."""

    m: BlockLoop
    rows: tuple[int, ...]
    config: tuple[int, ...]  # the 64 bytes of the configuration
    c_tiles: tuple[tuple[int, ...], ...]  # tile register of C[i][j]
    a_tiles: tuple[int, ...]
    b_tiles: tuple[int, ...]


@dataclass(frozen=True)
class ColumnGroup:
    """Blocks of n with the same tile widths; B is packed once per block."""

    n: BlockLoop
    columns: tuple[int, ...]
    rows: tuple[RowGroup, ...]


def supports(spec: BrgemmSpec) -> bool:
    return (spec.dtype == "bfloat16" and spec.a_k == 1 and spec.b_n == 1 and spec.c_n == 1
            and spec.k % 2 == 0)


def k_chunk(k: int) -> int:
    """k per tile product: the largest even divisor of k that fits a tile row."""
    return max(c for c in range(2, min(k, MAX_K_CHUNK) + 1, 2) if k % c == 0)


def tile_shape(spec: BrgemmSpec) -> tuple[int, int]:
    """(tile rows, tile columns) of one block of C: 2 x 2 where n spans two tiles, else 3 x 1
    (3 C + 3 A + 1 B of the 8 tile registers)."""
    return (3, 1) if spec.n <= TILE_COLUMNS else (2, 2)


def _heights(size: int, tile: int) -> tuple[int, ...]:
    return (tile,) * (size // tile) + ((size % tile,) if size % tile else ())


def _config(rows: tuple[int, ...], columns: tuple[int, ...], kc: int) -> RowGroup:
    c_tiles = tuple(tuple(i * len(columns) + j for j in range(len(columns))) for i in range(len(rows)))
    first_a = len(rows) * len(columns)
    a_tiles = tuple(first_a + i for i in range(len(rows)))
    b_tiles = tuple(first_a + len(rows) + j for j in range(len(columns)))
    assert b_tiles[-1] < TILE_REGISTERS
    colsb = [0] * 16
    tile_rows = [0] * 16
    for i, r in enumerate(rows):
        for j, w in enumerate(columns):
            colsb[c_tiles[i][j]], tile_rows[c_tiles[i][j]] = 4 * w, r
        colsb[a_tiles[i]], tile_rows[a_tiles[i]] = 2 * kc, r
    for j, w in enumerate(columns):
        colsb[b_tiles[j]], tile_rows[b_tiles[j]] = 4 * w, kc // 2
    config = [1, 0] + [0] * 14  # palette 1, start row 0, reserved
    for value in colsb:
        config += [value & 0xFF, value >> 8]
    config += tile_rows
    return RowGroup(BlockLoop(0, 0, 1), rows, tuple(config), c_tiles, a_tiles, b_tiles)


def row_block(m: int, rows: int) -> int:
    """Rows of C per block, at most `rows`: as many blocks and tiles as blocks of `rows` and a
    remainder take, but of one height where that allows (56 rows: 2 x 28, in tiles of 16 and
    12, not 48 and 8), so that a call has one tile configuration, kept loaded between calls
    (see the template). See decisions: AMX rows in blocks of one height."""
    blocks = -(-m // rows)
    even = m // blocks
    if m % blocks == 0 and blocks * -(-even // TILE_ROWS) == -(-m // TILE_ROWS):
        return even
    return rows


def column_groups(spec: BrgemmSpec) -> list[ColumnGroup]:
    rc, cc = tile_shape(spec)
    kc = k_chunk(spec.k)
    out = []
    for n_loop, width in block_loops(spec.n, cc * TILE_COLUMNS):
        columns = _heights(width, TILE_COLUMNS)
        groups = []
        for m_loop, height in block_loops(spec.m, row_block(spec.m, rc * TILE_ROWS)):
            g = _config(_heights(height, TILE_ROWS), columns, kc)
            groups.append(RowGroup(m_loop, g.rows, g.config, g.c_tiles, g.a_tiles, g.b_tiles))
        out.append(ColumnGroup(n_loop, columns, tuple(groups)))
    return out


def estimated_cycles(spec: BrgemmSpec) -> float:
    """Tile products at one per 16 cycles, plus one permute per packed 16 pairs of B."""
    steps = spec.batch_count * (spec.k // k_chunk(spec.k))
    products = 0
    packing = 0
    for col in column_groups(spec):
        blocks_n = (col.n.stop - col.n.start) // col.n.step
        if not spec.b_pairs:  # B given in pairs needs no copy
            packing += blocks_n * spec.batch_count * (spec.k // 2) * len(col.columns)
        for row in col.rows:
            blocks_m = (row.m.stop - row.m.start) // row.m.step
            products += blocks_n * blocks_m * len(row.rows) * len(col.columns) * steps
    return float(products * DOT_CYCLES + packing)


def render_amx_kernel(spec: BrgemmSpec, name: str, description: str, fallback_source: str,
                      fallback_name: str, b_constant: bool = False) -> str:
    """`b_constant`: B is a constant input of the generated function, which bumps
    `_pd_tile_generation` on entry; a call then reuses the packed B of the thread's previous
    call on the same B (where one block of n holds all of it). A spec of B in k pairs
    (`BrgemmSpec.b_pairs`) loads its tiles from B itself, copying nothing."""
    assert supports(spec)
    groups = column_groups(spec)
    pitch = max(len(g.columns) for g in groups) * 2 * TILE_COLUMNS  # bf16 per packed row
    return render(
        "c/microkernels/amx.c.j2",
        **spec_values(spec),
        name=name,
        description=description,
        target_attribute=TARGET_ATTRIBUTE,
        k=spec.k,
        kc=k_chunk(spec.k),
        pitch=pitch,
        pack_elements=max(spec.batch_count * (spec.k // 2) * pitch, pitch),
        groups=groups,
        tile_columns=TILE_COLUMNS,
        tile_rows=TILE_ROWS,
        fallback_source=fallback_source,
        fallback_name=fallback_name,
        cache_b=_caches_b(spec, b_constant),
        b_pairs=spec.b_pairs,
        keep_config=_keeps_config(spec),
    )


def _caches_b(spec: BrgemmSpec, b_constant: bool) -> bool:
    """A constant B that one block of n holds whole is packed once per thread and reused."""
    groups = column_groups(spec)
    single_block = len(groups) == 1 and groups[0].n.stop - groups[0].n.start == groups[0].n.step
    return b_constant and single_block and not spec.b_pairs


def _keeps_config(spec: BrgemmSpec) -> bool:
    """One tile configuration for every call: it stays loaded between them."""
    return len({row.config for col in column_groups(spec) for row in col.rows}) == 1


def counts_calls(spec: BrgemmSpec, b_constant: bool = False) -> bool:
    """Whether the kernel reads `_pd_tile_generation`, the generated function's count of its
    calls (which the function then bumps on entry)."""
    return _keeps_config(spec) or _caches_b(spec, b_constant)
