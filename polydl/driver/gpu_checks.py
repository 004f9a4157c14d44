"""The GPU tile model checked by a few timed candidates.

The tile score (`schedules.gpu.tiling.scored_tilings`) orders a GEMM's tiles by intensity, waste
and occupancy, which does not see everything that decides a tile's speed (see decisions: GPU
tiles timed on the device). Where a CUDA device is present, a kernel being built has the
best-ranked tiles of each GEMM statement (six; `POLYDL_GPU_TILES`) compiled in parallel, run
interleaved on the same random inputs (`runtime.gpu.timing`) and the fastest kept; the stored
lowering holds that choice, so it is timed once per problem and target. Without a device, or for
source only (`lower`, `polydl compile`), the ranking's best stays. The decision's reason lists
the times.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from polydl import settings
from polydl.codegen.artifact import GeneratedCode
from polydl.codegen.gpu.generate import generate_gpu
from polydl.driver.compilation import Compilation
from polydl.errors import PolyDLError
from polydl.runtime.gpu.kernel import GpuKernel, loaded_libraries, unload
from polydl.runtime.gpu.timing import device_seconds
from polydl.schedules.gpu.planning import replanned, tile_counts
from polydl.schedules.gpu.plans import GpuSchedule

MARGIN = 1.03  # another tile is kept where it runs at least this much faster


def timed(compilation: Compilation, build: Callable[[GeneratedCode, GpuSchedule], GpuKernel]) -> Compilation:
    """`compilation` with each GEMM's tile the fastest of its best-ranked on this
    machine's device, or unchanged where there is no device or no choice."""
    schedule = compilation.schedule
    timed_tiles = settings.gpu_timed_tiles()
    counts = {name: min(timed_tiles, n) for name, n in tile_counts(compilation.model, schedule).items()}
    counts = {name: n for name, n in counts.items() if n > 1}
    if not counts:
        return compilation
    before = loaded_libraries()  # kernels built elsewhere in the process keep theirs
    current = build(compilation.code, schedule)
    if not current.has_device():
        return compilation
    loaded, kept = {current.library_path}, current.library_path
    ranks: dict[str, int] = {}
    code, notes = compilation.code, []
    for name, count in counts.items():
        variants = [replanned(compilation.model, schedule, {**ranks, name: r}) for r in range(count)]
        codes = [generate_gpu(compilation.model, v) for v in variants]
        with ThreadPoolExecutor(max_workers=min(count, os.cpu_count() or 1)) as pool:
            kernels = list(pool.map(lambda pair: _built(build, *pair), zip(codes, variants, strict=True)))
        ready = {r: k for r, k in enumerate(kernels) if k is not None}
        loaded |= {k.library_path for k in ready.values()}
        try:
            times = device_seconds(list(ready.values()))
        except PolyDLError:  # no room on the device for the operands: the model's choice
            times = [float("inf")] * len(ready)
        seconds = dict(zip(ready, times, strict=True))
        best = min(seconds, key=lambda r: seconds[r])
        if 0 in seconds and seconds[best] > seconds[0] / MARGIN:
            best = 0  # within the timing's noise of the model's pick: the model's
        ranks[name] = best
        kept = ready[best].library_path
        schedule, code = variants[best], codes[best]
        tiles = [_tile(variants[r], name) for r in range(count)]
        timings = ", ".join(f"{tiles[r]} {seconds[r] * 1e3:.4f} ms" if r in seconds else f"{tiles[r]} failed"
                            for r in range(count))
        notes.append(f"{name} timed {count} tiles ({timings}): {tiles[best]}")
    for path in loaded - {kept} - before:  # the losers' kernels stay registered otherwise
        unload(path)
    reason = f"{compilation.decision.reason}; {'; '.join(notes)}"
    return replace(compilation, schedule=schedule, code=code,
                   decision=replace(compilation.decision, reason=reason))


def _built(build: Callable[[GeneratedCode, GpuSchedule], GpuKernel], code: GeneratedCode,
           schedule: GpuSchedule) -> GpuKernel | None:
    try:
        return build(code, schedule)
    except PolyDLError:  # a tile the compiler refuses is no candidate
        return None


def _tile(schedule: GpuSchedule, name: str) -> str:
    t = next(k for k in schedule.kernels if k.name == name).gemm.tiling  # type: ignore[union-attr]
    return f"{t.block_m}x{t.block_n}x{t.block_k}/{t.threads}"
