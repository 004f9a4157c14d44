"""How a schedule's parallel loops share the work and the data among the threads.

Codegen runs the parallel loops' iterations on the threads, two adjacent ones collapsed into
one loop of their product (2 images by 56 rows are 112 units, not 2), and OpenMP's static
schedule hands thread t one run of units / threads of them (libgomp: the first units % threads
threads one more). Two things of that split reach the ranking: the busiest thread's work
against an even share, and the data several threads read, each into its own L2 (a row of
images split over the output-channel blocks of 8 threads is read by all 8).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

# Units beyond which a thread's share is taken as even up to the rounding and a read as
# shared by the threads that split its loops: that many, the edges hardly count.
MAX_UNITS = 1 << 16


def thread_runs(units: int, threads: int) -> list[tuple[int, int]]:
    """(first unit, count) of each thread's run under OpenMP's static schedule."""
    share, extra = divmod(units, threads)
    runs, start = [], 0
    for t in range(min(threads, units)):
        count = share + (t < extra)
        runs.append((start, count))
        start += count
    return runs


def balance(sizes: Sequence[Sequence[float]], cores: int) -> float:
    """The busiest thread's work over an even share: `sizes` lists, per parallel loop (outer
    first), the work of each of its iterations (a ragged last tile does less)."""
    units = math.prod(len(s) for s in sizes)
    if units > MAX_UNITS:
        return math.ceil(units / cores) * cores / units
    weights: list[float] = [1.0]
    for loop in sizes:
        weights = [w * size for w in weights for size in loop]
    busiest = max(sum(weights[start:start + count]) for start, count in thread_runs(units, cores))
    return busiest * cores / sum(weights)


@cache
def readers(trips: tuple[int, ...], moves: tuple[bool, ...], cores: int) -> float:
    """How many threads read each part of an array, on average: `trips` are the parallel
    loops' iteration counts (outer first), `moves` whether the array's cells change along each.
    An array that moves along every parallel loop is read by one thread per part; one that
    moves along none by every thread."""
    units = math.prod(trips)
    threads = min(cores, units)
    if all(moves):
        return 1.0
    if not any(moves):
        return float(threads)
    if units > MAX_UNITS:
        return float(min(threads, math.prod(t for t, m in zip(trips, moves, strict=True) if not m)))
    per_thread = thread_parts(trips, moves, cores)
    return sum(map(len, per_thread)) / len(frozenset().union(*per_thread))


@cache
def thread_parts(trips: tuple[int, ...], moves: tuple[bool, ...],
                 cores: int) -> tuple[frozenset[tuple[int, ...]], ...]:
    """The parts of an array each thread reads under OpenMP's static split of the parallel
    loops' units (`trips`, outer first): a part is a unit's indices along the loops the array
    moves along (`moves`), () where it moves along none."""
    out = []
    for start, count in thread_runs(math.prod(trips), cores):
        parts = set()
        for unit in range(start, start + count):
            index, rest = [], unit
            for trip in reversed(trips):
                rest, i = divmod(rest, trip)
                index.append(i)
            parts.add(tuple(i for i, m in zip(reversed(index), moves, strict=True) if m))
        out.append(frozenset(parts))
    return tuple(out)
