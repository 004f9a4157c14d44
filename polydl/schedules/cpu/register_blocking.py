"""The register-blocking model: how many cycles a k step of a register tile of C takes on one
SIMD unit, and which tiles fit its registers.

One model for two readers: the ranking estimates a microkernel call's efficiency with it, and
code generation (`codegen/c/microkernels/blocking.py`) chooses the register tile a call's kernel
uses with it. Per k step of a tile of `rows` x `vectors`, each accumulator takes one FMA (issued
on `fma_ports`), A and B take `rows + vectors` loads (on `load_ports`), and each accumulator's
chain waits for its previous FMA (`fma_latency`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from polydl.dtypes import DTYPES


@dataclass(frozen=True)
class VectorUnit:
    """Facts of one SIMD ISA that decide register blocking."""

    isa: str
    registers: int
    vector_bytes: int
    fma_ports: int = 2  # Skylake-SP/Ice Lake and Zen 3/4 all issue two vector FMAs a cycle
    load_ports: int = 2
    fma_latency: int = 4
    # Cycles beyond the latency that each accumulator's chain needs when a k step also loads
    # A and B, in the register tile code generation chooses (see `step_cycles`).
    chain_slack: int = 0

    target_attribute: str = ""  # gcc target attribute that enables the intrinsics used

    def lanes(self, compute_dtype: str) -> int:
        return max(self.vector_bytes // DTYPES[compute_dtype].bytes, 1)


VECTOR_UNITS: dict[str, VectorUnit] = {
    # Tiles of exactly ports x latency accumulators (4 x 2 on AVX2) fall behind larger ones: a
    # register-only loop of 8 chains reaches the peak, so it is the six loads of a step that
    # leave such a tile no slack (see decisions: One cycle of slack in AVX2 FMA chains).
    "avx2": VectorUnit("avx2", registers=16, vector_bytes=32, chain_slack=1, target_attribute="avx2,fma"),
    "avx512": VectorUnit("avx512", registers=32, vector_bytes=64,
                         target_attribute="avx512f,avx512bw,avx512vl,avx512dq,fma"),
}
VECTOR_UNITS["avx512bf16"] = VECTOR_UNITS["avx512amx"] = VECTOR_UNITS["avx512"]
# No SIMD: what the ranking assumes of portable C (one lane, the registers of x86-64).
SCALAR_UNIT = VectorUnit("scalar", registers=16, vector_bytes=4)

# The register tile BLIS-like blockings are built around: 6 rows of C times 2 vectors on 16
# registers (AVX2: 12 accumulators), 4 vectors on 32 (AVX-512: 24).
PANEL_ROWS = 6


def unit_for(isa: str) -> VectorUnit:
    return VECTOR_UNITS.get(isa, SCALAR_UNIT)


def panel_vectors(unit: VectorUnit) -> int:
    return 4 if unit.registers >= 32 else 2


# An L1 data cache picks a line's set from the address bits inside a 4 KiB page (64 sets of
# 64-byte lines on every x86 core with AVX2 or AVX-512: 32 KiB of 8 ways, 48 KiB of 12), so
# lines a multiple of 4 KiB apart compete for the ways of one set.
L1_WAY_BYTES = 4096
L1_LINE_BYTES = 64
DEFAULT_L1_BYTES = 32 * 1024
# Ways of a set left to the lines of B that pass through it beside A's rows.
_OTHER_WAYS = 1


def l1_ways(l1_bytes: int) -> int:
    return max(l1_bytes // L1_WAY_BYTES, 1)


def lines_per_set(row_bytes: int, rows: int) -> int:
    """The most lines of `rows` rows `row_bytes` apart (a line each) that share an L1 set."""
    return offsets_per_set(i * row_bytes for i in range(rows))


def offsets_per_set(offsets_bytes: Iterable[int]) -> int:
    """The most of the lines at `offsets_bytes` (one a row, or one a batch step) that share an
    L1 set."""
    sets = L1_WAY_BYTES // L1_LINE_BYTES
    lines = {offset // L1_LINE_BYTES for offset in offsets_bytes}
    return max(Counter(line % sets for line in lines).values(), default=0)


# The most ways of an L1 on which `candidates.batch_tiled_call` tiles a call's batch so that
# A's rows over it fit the sets; on more ways the batch stays whole (see there).
BATCH_TILE_MAX_WAYS = 8
# Cycles a register tile waits, beyond its FMAs, for each line of A that L1 no longer holds
# when the tile reaches it, and for each line of its strip of B, where A's rows thrash L1's
# sets (`blocking.a_lines_missed`). Fitted to register tiles of 1 x 1 layers from 256 channels
# at 56 x 56 on a 12-way L1, which read 16 input-channel blocks 49 pages apart: each row's 16
# lines share one set and every vector strip of B reads them from L2 again, with no prefetch
# across pages, while B's strips stream in order (see decisions: A's rows beyond the L1's ways).
A_LINE_MISS_CYCLES = 11.0
B_LINE_CYCLES = 0.5


def alias_free_rows(row_bytes: int, most: int, l1_bytes: int) -> int:
    """Rows (at most `most`) of a register tile whose A lines stay in L1 from one k step to
    the next. A row's line serves the next k steps only while it stays cached: rows 4 KiB
    apart (a K of 1024 floats) all fall in one set, and more of them than the set has ways
    evict each other every step. One way is left to B, which may walk the same set.
    see decisions: Register tile rows within the L1's ways"""
    ways = max(l1_ways(l1_bytes) - _OTHER_WAYS, 1)
    rows = most
    while rows > 1 and lines_per_set(row_bytes, rows) > ways:
        rows -= 1
    return rows


def max_rows(unit: VectorUnit, vectors: int) -> int:
    """Rows of C a tile of `vectors` vectors may have: its accumulators, the B vectors of one
    k step, one register for the broadcast A element and one spare fit the register file."""
    return (unit.registers - vectors - 2) // vectors


def step_cycles(unit: VectorUnit, fmas: int, loads: int, *, slack: bool = False) -> float:
    """One k step: every accumulator takes one FMA, so the step lasts at least one latency;
    `slack`: and the unit's `chain_slack` more, as code generation prices a tile. (The ranking
    prices without it: its choices of tiles and loops were measured so, and priced with it,
    GEMMs moved to slower blocks.) see decisions: One cycle of slack in AVX2 FMA chains"""
    latency = unit.fma_latency + (unit.chain_slack if slack else 0)
    return max(fmas / unit.fma_ports, loads / unit.load_ports, float(latency))


def rows_step_cycles(unit: VectorUnit, rows: int, vectors: int) -> float:
    """Cycles per k step of `rows` rows of C times `vectors` vectors, split into the register
    tiles that fit (full ones and a remainder) as the code generator would split them."""
    best = math.inf
    for r in range(1, min(rows, max(max_rows(unit, vectors), 1)) + 1):
        full, rest = divmod(rows, r)
        cycles = full * step_cycles(unit, r * vectors, r + vectors)
        if rest:
            cycles += step_cycles(unit, rest * vectors, rest + vectors)
        best = min(best, cycles)
    return best
