"""Candidate schedules and their ranking by the PolyDL data-reuse cost model.

Takes a `PolyModel` and a `Machine`; returns candidate schedules ranked best first. For every
cache level, the outermost band level whose working set fits decides that cache's traffic:
each execution of that level brings its working set in once. The cost adds the cycles of that
traffic at each level's bandwidth to the compute cycles (at the microkernel's register-blocking
efficiency), scaled by how evenly the parallel loop splits over the cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from polydl.errors import ScheduleError
from polydl.machine import Machine
from polydl.poly.model import PolyModel
from polydl.poly.reuse import LevelWorkingSet, working_sets
from polydl.schedules.apply import (
    GroupPlan,
    apply_schedule,
    band_of,
    group_statements,
    loop_is_parallel,
    main_group,
)
from polydl.schedules.microkernel import candidate_bindings
from polydl.schedules.schedule import MicrokernelBinding, Schedule, tile_loop

# Bytes per cycle into each cache level from the one below (per core, typical x86 server core).
BANDWIDTH = {"l1": 64.0, "l2": 32.0, "l3": 8.0}
MAX_CANDIDATES = 48


@dataclass(frozen=True)
class RankedSchedule:
    schedule: Schedule
    cost: float
    working_sets: tuple[LevelWorkingSet, ...]
    traffic_bytes: dict[str, int]
    compute_cycles: float
    balance: float


def _extent(model: PolyModel, var: str) -> int:
    for s in model.statements:
        if var in s.iterators:
            d = s.iterators.index(var)
            return int(s.domain.dim_max_val(d).to_python() - s.domain.dim_min_val(d).to_python() + 1)
    return 1


def _m_tiles(extent: int) -> list[int]:
    """Rows per call: whole extent when small, else sizes that fill the 32 vector registers."""
    options = {t for t in (4, 6, 7, 8, 12, 14, 16, 28, 32) if t < extent}
    options.add(extent if extent <= 64 else 64)
    return sorted(options, reverse=True)[:4]


def _n_tiles(extent: int, lanes: int) -> list[int]:
    if extent <= 4 * lanes:
        return [extent]
    return [t for t in (4 * lanes, 2 * lanes, lanes * 8) if t < extent][:2] + [extent] * (extent <= 256)


def microkernel_candidates(
    model: PolyModel, machine: Machine, band_vars: tuple[str, ...], binding: MicrokernelBinding
) -> list[Schedule]:
    lanes = machine.vector_lanes("float32")
    m_ext, n_ext = _extent(model, binding.m), _extent(model, binding.n)
    outer_vars = [v for v in band_vars if v not in binding.loops]
    out: list[Schedule] = []
    for mt in _m_tiles(m_ext):
        for nt in _n_tiles(n_ext, lanes):
            tiles = {}
            if mt < m_ext:
                tiles[binding.m] = mt
            if nt < n_ext:
                tiles[binding.n] = nt
            outer = outer_vars + [tile_loop(v) for v in (binding.m, binding.n) if v in tiles]
            inner = list(binding.batch) + [binding.m, binding.n, binding.k]
            # The first outer loop is the parallel one; keep the others in a few sensible orders.
            orders = _outer_orders(outer)
            for order in orders:
                out.append(
                    Schedule(
                        order=tuple(order) + tuple(inner),
                        tiles=tuple(sorted(tiles.items())),
                        microkernel=binding,
                    )
                )
    return out


def _outer_orders(outer: list[str]) -> list[list[str]]:
    """The written order, and each loop moved outermost or innermost: the moves that change
    which operand stays in cache, without the factorial of all permutations."""
    orders = [outer]
    for v in outer:
        rest = [x for x in outer if x != v]
        for order in ([v] + rest, rest + [v]):
            if order not in orders:
                orders.append(order)
    return orders


def loop_candidates(model: PolyModel, machine: Machine, band_vars: tuple[str, ...]) -> list[Schedule]:
    """Tiled schedules without a microkernel: square-ish tiles, the original point order."""
    out = [Schedule()]
    big = [v for v in band_vars if _extent(model, v) > 64]
    for size in (32, 64, 128):
        tiles = {v: size for v in big if _extent(model, v) > size}
        if not tiles:
            continue
        tile_order = [tile_loop(v) for v in band_vars if v in tiles]
        out.append(Schedule(order=tuple(tile_order) + band_vars, tiles=tuple(sorted(tiles.items()))))
    return out


def candidates(model: PolyModel, machine: Machine) -> list[Schedule]:
    statements = group_statements(model)[main_group(model)]
    band = band_of(statements)
    band_vars = tuple(loop.var for loop in band)
    out: list[Schedule] = []
    if len(statements) == 1:
        for binding in candidate_bindings(model, statements[0], band_vars)[:1]:
            out += microkernel_candidates(model, machine, band_vars, binding)
    return out + loop_candidates(model, machine, band_vars)


def _with_parallel(model: PolyModel, schedule: Schedule, machine: Machine) -> tuple[Schedule, GroupPlan] | None:
    """Parallelise the outermost dependence-free loop, collapsing a second one when the first
    alone has too few iterations for the cores."""
    try:
        plan = apply_schedule(model, replace(schedule, parallel=(), microkernel=None)).main
    except ScheduleError:
        return None
    inside_call = set(schedule.microkernel.loops) if schedule.microkernel else set()
    free = [
        name
        for d, name in enumerate(plan.order)
        if name not in inside_call and loop_is_parallel(model, plan, d)
    ]
    if not free:
        return replace(schedule, parallel=()), plan
    first = plan.order.index(free[0])
    chosen = [free[0]]
    nxt = plan.order[first + 1] if first + 1 < len(plan.order) else None
    if _trip(model, schedule, free[0]) < 4 * machine.cores and nxt in free:
        chosen.append(nxt)
    final = replace(schedule, parallel=tuple(chosen))
    try:
        apply_schedule(model, final)  # binds the microkernel: may still refuse it
    except ScheduleError:
        return None
    return final, plan  # the parallel loops do not change the time map the reuse model reads


def _trip(model: PolyModel, schedule: Schedule, loop: str) -> int:
    var = loop[:-2] if loop.endswith(".t") else loop
    extent = _extent(model, var)
    tile = schedule.tile_sizes.get(var)
    if loop.endswith(".t"):
        return math.ceil(extent / tile) if tile else 1
    return min(tile, extent) if tile else extent


def _mk_efficiency(schedule: Schedule, model: PolyModel, machine: Machine) -> float:
    """Fraction of peak FMA throughput the inner code reaches: the microkernel's register
    block needs (rows + vectors) loads per rows*vectors FMAs; plain loops reach far less."""
    mk = schedule.microkernel
    lanes = machine.vector_lanes("float32")
    if mk is None:
        return 0.15
    m = schedule.tile_sizes.get(mk.m, _extent(model, mk.m))
    n = schedule.tile_sizes.get(mk.n, _extent(model, mk.n))
    vectors = max(1, math.ceil(n / lanes))
    lane_use = n / (vectors * lanes)
    rows = max(1, min(m, 28 // min(vectors, 4)))
    block_loads = rows + min(vectors, 4)
    ratio = rows * min(vectors, 4) / block_loads  # FMAs per load
    return lane_use * min(1.0, ratio / 3.0) * (0.95 if m % rows == 0 else 0.85)


def evaluate(model: PolyModel, machine: Machine, schedule: Schedule) -> RankedSchedule | None:
    found = _with_parallel(model, schedule, machine)
    if found is None:
        return None
    final, plan = found
    loops = plan.order
    if final.microkernel is not None:
        # Inside the call the microkernel blocks for registers and streams its panels; the
        # model stops at the call itself.
        loops = loops[: len(loops) - len(final.microkernel.loops) + 1]
    ws = working_sets(model, plan.statements, plan.schedule_map, loops, machine.cache_line_bytes)
    caches = {"l1": machine.l1_bytes, "l2": machine.l2_bytes, "l3": machine.l3_bytes // max(machine.cores, 1)}
    traffic: dict[str, int] = {}
    total_lines_once = ws[0].lines if ws else 0
    for name, capacity in caches.items():
        fitting = [w for w in ws if w.bytes(machine.cache_line_bytes) <= capacity * 0.75]
        if fitting:
            w = fitting[0]
            traffic[name] = w.bytes(machine.cache_line_bytes) * w.executions
        else:
            inner = ws[-1] if ws else None
            traffic[name] = inner.bytes(machine.cache_line_bytes) * inner.executions if inner else 0
        traffic[name] = max(traffic[name], total_lines_once * machine.cache_line_bytes)
    flops = sum(s.flops for s in plan.statements)
    peak_per_cycle = 2 * 2 * machine.vector_lanes("float32")  # 2 FMA pipes x lanes x 2 flops
    compute = flops / (peak_per_cycle * _mk_efficiency(final, model, machine))
    units = 1
    for p in final.parallel:
        units *= _trip(model, final, p)
    cores = max(machine.cores, 1)
    balance = (math.ceil(units / cores) * cores / units) if final.parallel else float(cores)
    memory = sum(traffic[c] / BANDWIDTH[c] for c in traffic)
    cost = (compute + memory) * balance / cores
    return RankedSchedule(final, cost, tuple(ws), traffic, compute, balance)


def rank(model: PolyModel, machine: Machine, limit: int = MAX_CANDIDATES) -> list[RankedSchedule]:
    ranked = []
    for schedule in candidates(model, machine)[:limit]:
        result = evaluate(model, machine, schedule)
        if result is not None:
            ranked.append(result)
    ranked.sort(key=lambda r: r.cost)
    return ranked
