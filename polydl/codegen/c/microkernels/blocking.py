"""Register blocking: which tile of C a microkernel keeps in vector registers.

Takes a normalised `BrgemmSpec` and a `VectorUnit` (the register file and issue widths of one
ISA); returns the `Blocking` with the fewest estimated cycles, by the register-blocking model of
`schedules/cpu/register_blocking.py` that the ranking uses too. The model counts, per k step of
one register tile, FMAs (issued on `fma_ports`), loads (on `load_ports`) and the FMA latency
that each accumulator's chain must wait; remainder tiles in m and n are counted as what they
are, so a blocking that divides the shape wins over a larger one that leaves a ragged edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from polydl.codegen.c.microkernels.spec import BrgemmSpec
from polydl.dtypes import DTYPES
from polydl.errors import ScheduleError
from polydl.schedules.cpu.register_blocking import (  # noqa: F401 - the model's names, here too
    A_LINE_MISS_CYCLES,
    B_LINE_CYCLES,
    BATCH_TILE_MAX_WAYS,
    DEFAULT_L1_BYTES,
    L1_LINE_BYTES,
    VECTOR_UNITS,
    VectorUnit,
    alias_free_rows,
    l1_ways,
    max_rows,
    offsets_per_set,
    step_cycles,
)

# Cycles to load and store one accumulator and to enter a tile (pointer set-up, loop exits).
_ACCUMULATOR_CYCLES = 1.0
_TILE_CYCLES = 8.0
# One vector wide on 32 registers, gcc keeps every row's broadcast A element of the unrolled k
# steps in a register of its own beside the accumulators: rows past this many spill, a store
# and a load a k step each. Priced so only where the call's B stays in L1 across the extra
# tiles. See decisions: One-vector-wide register tiles priced with gcc's spills.
_SINGLE_VECTOR_ROWS = 8
_SINGLE_VECTOR_B_BYTES = 16 << 10


@dataclass(frozen=True)
class Blocking:
    """A register tile: `rows` rows of the tiled dimension times `vectors` vectors of the
    vector dimension (outer products), or `rows` x `columns` dot products (dot form)."""

    form: str  # "outer" | "dot"
    rows: int
    vectors: int
    lanes: int
    cycles: float

    @property
    def accumulators(self) -> int:
        return self.rows * self.vectors


def _split(extent: int, block: int) -> list[tuple[int, int]]:
    """(count, size) of the full blocks and the remainder block."""
    out = [(extent // block, block)] if extent >= block else []
    if extent % block:
        out.append((1, extent % block))
    return out


def outer_product_cycles(unit: VectorUnit, rows: int, vectors: int, lanes: int,
                         m: int, n: int, steps: int, b_in_l1: bool = False,
                         a_missed_lines: int = 0) -> float:
    """Estimated cycles of an outer-product kernel: C tiles of `rows` x `vectors*lanes`,
    `steps` = k times the batch count; `b_in_l1`: the call's B stays in L1 from tile to tile
    (one-vector tiles are then priced with gcc's spills, `_SINGLE_VECTOR_ROWS`);
    `a_missed_lines`: lines of each row of A that every tile reads from beyond L1
    (`a_lines_missed`), at `A_LINE_MISS_CYCLES` each, its strip of B then read from beyond
    L1 by every tile too, at `B_LINE_CYCLES` a line."""
    total = 0.0
    for m_count, r in _split(m, rows):
        for n_count, width in _split(n, vectors * lanes):
            v = math.ceil(width / lanes)
            # loads: one broadcast of A per row, one vector of B per column vector
            spills = b_in_l1 and v == 1 and unit.registers >= 32
            spilled = max(0, r - _SINGLE_VECTOR_ROWS) if spills else 0
            step = step_cycles(unit, r * v, r + v + 2 * spilled, slack=True)
            tile = steps * step + r * v * _ACCUMULATOR_CYCLES + _TILE_CYCLES
            if a_missed_lines:
                b_lines = steps * v * unit.vector_bytes / L1_LINE_BYTES
                tile += r * a_missed_lines * A_LINE_MISS_CYCLES + b_lines * B_LINE_CYCLES
            total += m_count * n_count * tile
    return total


def a_lines_missed(spec: BrgemmSpec, l1_bytes: int) -> int:
    """Lines of one row of A that each register tile reads from beyond L1: all of the row's
    lines over the call (k and the batch) where they share an L1 set beyond its ways (a 1 x 1
    layer's input-channel blocks a multiple of 4 KiB apart), so that a set holds none of them
    from one vector strip to the next; else none. Not where rows share lines across the batch
    (a 3 x 3 window's taps: a line serves several rows and taps, unmeasured), and only on L1s
    of more than `BATCH_TILE_MAX_WAYS` ways: on fewer the CPU ranking (`schedules/cpu/`) tiles
    such a batch to fit the sets. See decisions: A's rows beyond the L1's ways."""
    ways = l1_ways(l1_bytes)
    a_bytes = DTYPES[spec.dtype].bytes
    if (ways <= BATCH_TILE_MAX_WAYS or not spec.batch or spec.a_k * a_bytes >= L1_LINE_BYTES
            or spec.k * spec.a_k * a_bytes > L1_LINE_BYTES):
        return 0  # (a row of A over several lines a batch step: not measured)
    offsets = [0]
    for d in spec.batch:
        offsets = [o + i * d.a_stride * a_bytes for o in offsets for i in range(d.extent)]
    if offsets_per_set(offsets) <= ways:
        return 0
    row_bytes = spec.a_m * a_bytes
    lines = {(o + i * row_bytes) // L1_LINE_BYTES for o in offsets for i in range(spec.m)}
    if len(lines) < spec.m * len(offsets):
        return 0  # lines shared between rows or taps
    return len(offsets)


def choose_outer_product(spec: BrgemmSpec, unit: VectorUnit,
                         l1_bytes: int = DEFAULT_L1_BYTES) -> Blocking:
    """Rows of C times vectors along n. Accumulators + the B vectors of one k step + one
    register for the broadcast A element + one spare must fit the register file: on AVX2
    (16 ymm) 6x2 (12 + 2 + 1 + 1) or 3x3 -- 4x3 (12 + 3 + 1) leaves none (see decisions: A
    spare vector register in AVX2 register tiles); on AVX-512 (32 zmm) 6x4 (24 + 4 + 1), 9x3
    or 14x2.
    (LIBXSMM's 7x4 needs the A element as an embedded {1to16} memory operand; gcc keeps a
    broadcast used by several FMAs in a register and spills with 28 accumulators.)
    Where a line of A's rows serves several k steps, no more rows than an L1 of `l1_bytes`
    keeps in its sets (`alias_free_rows`)."""
    lanes = unit.lanes(spec.compute_dtype)
    a_bytes = DTYPES[spec.dtype].bytes
    a_lines_reused = spec.a_k * a_bytes < L1_LINE_BYTES
    steps = spec.k * spec.batch_count
    best: Blocking | None = None
    n = spec.n * spec.n_blocks
    b_in_l1 = steps * n * DTYPES[spec.dtype].bytes <= _SINGLE_VECTOR_B_BYTES
    max_vectors = math.ceil(n / lanes)
    missed = a_lines_missed(spec, l1_bytes)
    for vectors in range(1, max_vectors + 1):
        width = vectors * lanes
        if spec.n_blocks > 1 and spec.n % width and width % spec.n:
            continue  # a tile within one block, or of whole blocks
        most = max_rows(unit, vectors)
        if a_lines_reused:
            most = alias_free_rows(spec.a_m * a_bytes, most, l1_bytes)
        row_options = range(1, min(most, spec.m) + 1)
        if spec.a_panel_rows:  # a packed A fixes the rows of a register tile
            if spec.a_panel_rows > most:
                continue
            row_options = range(min(spec.a_panel_rows, spec.m), min(spec.a_panel_rows, spec.m) + 1)
        for rows in row_options:
            cycles = outer_product_cycles(unit, rows, vectors, lanes, spec.m, n, steps, b_in_l1,
                                          missed)
            cand = Blocking("outer", rows, vectors, lanes, cycles)
            if best is None or _better(cand, best, spec):
                best = cand
    if best is None:
        raise ScheduleError(f"no register tile of {spec.a_panel_rows} rows fits {unit.isa}'s registers")
    return best


def _better(cand: Blocking, best: Blocking, spec: BrgemmSpec) -> bool:
    """Fewer cycles; among equals, more accumulators. Over n blocks, equals prefer tiles of
    all rows (see decisions: Register tiles over n blocks take all rows)."""
    ragged = (spec.n_blocks > 1 and spec.m % cand.rows != 0, spec.n_blocks > 1 and spec.m % best.rows != 0)
    return (cand.cycles, ragged[0], -cand.accumulators) < (best.cycles, ragged[1], -best.accumulators)


def dot_product_cycles(unit: VectorUnit, rows: int, cols: int, lanes: int,
                       m: int, n: int, k: int, batch: int) -> float:
    chunks = math.ceil(k / lanes) * batch
    total = 0.0
    for m_count, r in _split(m, rows):
        for n_count, s in _split(n, cols):
            step = step_cycles(unit, r * s, r + s)
            # the horizontal sum of each accumulator at the end: a few shuffles and adds
            tile = chunks * step + r * s * (3 + math.log2(lanes)) + _TILE_CYCLES
            total += m_count * n_count * tile
    return total


def choose_dot_product(spec: BrgemmSpec, unit: VectorUnit) -> Blocking:
    """Rows of A times columns of B, each accumulator a vector along k: accumulators plus
    one A vector per row and one B vector per column must fit (AVX2: 3x3 = 9 + 6)."""
    lanes = unit.lanes(spec.compute_dtype)
    best: Blocking | None = None
    for rows in range(1, spec.m + 1):
        for cols in range(1, spec.n + 1):
            if rows * cols + rows + cols > unit.registers:
                break
            cycles = dot_product_cycles(unit, rows, cols, lanes, spec.m, spec.n, spec.k,
                                        spec.batch_count)
            cand = Blocking("dot", rows, cols, lanes, cycles)
            if best is None or (cycles, -cand.accumulators) < (best.cycles, -best.accumulators):
                best = cand
        if rows * 1 + rows + 1 > unit.registers:
            break
    assert best is not None
    return best


def portable_cycles(spec: BrgemmSpec) -> float:
    """One multiply-add a cycle: what scalar code does when the compiler cannot vectorise."""
    return float(spec.m * spec.n * spec.k * spec.batch_count)
