"""Features of one candidate schedule, read off the polyhedral model's analysis of it.

The cost model learns from these. Each is a number that means the same across problems and
machines: working sets and traffic per cache level (log2 bytes, and relative to the level's
capacity), trip counts, the microkernel's vector and register-tile efficiency, the parallel
loop's balance over the cores, and the analytic cost relative to the best candidate of the
same problem (the prior the model corrects).
"""

from __future__ import annotations

import math

from polydl.poly.model import PolyModel
from polydl.schedules.apply import array_bytes
from polydl.schedules.cpu.calls import accumulator_lanes, loop_extent, streams_along, trip_count
from polydl.schedules.cpu.cost import RankedSchedule, microkernel_efficiency, moves_along
from polydl.schedules.schedule import is_tile_loop, loop_var
from polydl.target.cpu import ISAS, CpuTarget

CACHES = ("l1", "l2", "l3")


def _log2(value: float) -> float:
    return math.log2(value) if value > 0 else -1.0


def _capacities(target: CpuTarget) -> dict[str, int]:
    return {"l1": target.l1_bytes, "l2": target.l2_bytes,
            "l3": max(target.l3_bytes // max(target.cores, 1), 1)}


def features(model: PolyModel, target: CpuTarget, ranked: RankedSchedule, best_cost: float) -> dict[str, float]:
    """The feature vector of `ranked` (a candidate evaluated by `cost.evaluate`)."""
    s = ranked.schedule
    line = target.cache_line_bytes
    flops = float(model.flops)
    out: dict[str, float] = {
        "flops": flops,
        "log_flops": _log2(flops),
        "log_cost": _log2(ranked.cost),
        "cost_vs_best": ranked.cost / best_cost if best_cost > 0 else 1.0,
        "log_compute_cycles": _log2(ranked.compute_cycles),
        "compute_share": ranked.compute_cycles / max(ranked.cost * max(target.cores, 1), 1.0),
        "balance": ranked.balance,
        "cores": float(target.cores),
        "isa": float(ISAS.index(target.isa)) if target.isa in ISAS else -1.0,
        "lanes": float(target.vector_lanes("float32")),
        "loops": float(len(s.order)),
        "tiled_loops": float(len(s.tiles)),
    }
    capacities = _capacities(target)
    sets = list(ranked.working_sets)
    for cache in CACHES:
        traffic = ranked.traffic_bytes.get(cache, 0)
        out[f"log_traffic_{cache}"] = _log2(traffic)
        out[f"traffic_per_flop_{cache}"] = traffic / flops if flops else 0.0
        fitting = [w for w in sets if w.bytes(line) <= capacities[cache] * 0.75]
        # the outermost loop whose working set fits this cache: how deep, how full
        ws = fitting[0] if fitting else (sets[-1] if sets else None)
        out[f"fit_level_{cache}"] = float(ws.level) if ws else -1.0
        out[f"fill_{cache}"] = ws.bytes(line) / capacities[cache] if ws else 0.0
        out[f"log_executions_{cache}"] = _log2(ws.executions) if ws else -1.0
    trips = [trip_count(model, s, loop) for loop in s.order]
    out["log_outer_trip"] = _log2(trips[0]) if trips else -1.0
    out["log_inner_trip"] = _log2(trips[-1]) if trips else -1.0
    out.update(_parallel_features(model, target, ranked))
    out.update(_microkernel_features(model, target, ranked))
    return out


def _parallel_features(model: PolyModel, target: CpuTarget, ranked: RankedSchedule) -> dict[str, float]:
    s = ranked.schedule
    if not s.parallel:
        return {"parallel_loops": 0.0, "parallel_depth": -1.0, "parallel_units_per_core": 0.0,
                "parallel_is_tile": 0.0, "parallel_balance": float(max(target.cores, 1)),
                "parallel_log_forks": -1.0, "parallel_replicated_share": 1.0,
                "parallel_replicated_per_l2": _replicated_bytes(model, ()) / target.l2_bytes}
    first = s.parallel[0]
    cores = max(target.cores, 1)
    units = math.prod(trip_count(model, s, loop) for loop in s.parallel)
    depth = s.order.index(first) if first in s.order else 0
    # every entry into the parallel loops forks and joins the threads
    forks = math.prod(trip_count(model, s, loop) for loop in s.order[:depth])
    # a static schedule over collapsed loops hands each thread a run of the outer ones: the
    # data is split by the outer loops until they alone have a unit for every core
    split, covered = [], 1
    for loop in s.parallel:
        if covered >= cores:
            break
        split.append(loop_var(loop))
        covered *= trip_count(model, s, loop)
    replicated = _replicated_bytes(model, tuple(split))
    return {
        "parallel_loops": float(len(s.parallel)),
        "parallel_depth": float(depth),
        "parallel_units_per_core": units / cores,
        "parallel_is_tile": float(is_tile_loop(first)),
        # the busiest thread's share of the (collapsed) units against an even share
        "parallel_balance": math.ceil(units / cores) * cores / units if units else float(cores),
        "parallel_log_forks": _log2(forks),
        "parallel_replicated_share": replicated / max(_replicated_bytes(model, ()), 1),
        "parallel_replicated_per_l2": replicated / target.l2_bytes,
    }


def _replicated_bytes(model: PolyModel, split: tuple[str, ...]) -> float:
    """Bytes of the arrays every thread reads whole: no access moves along a loop the threads
    split (`split`; none split: every array the main nest touches)."""
    return float(sum(array_bytes(model, name)
                     for name, along in moves_along(model, split).items()
                     if not any(along)))


def _microkernel_features(model: PolyModel, target: CpuTarget, ranked: RankedSchedule) -> dict[str, float]:
    s = ranked.schedule
    mk = s.microkernel
    if mk is None:
        return {"microkernel": 0.0, "mk_efficiency": microkernel_efficiency(s, model, target),
                "mk_m": -1.0, "mk_n": -1.0, "mk_k": -1.0, "mk_batch": 0.0, "pack_a": 0.0,
                "pack_b": 0.0, "n_lane_use": 0.0, "innermost_streams": float(
                    bool(s.order) and streams_along(model, loop_var(s.order[-1])))}
    sizes = {}
    for name, var in (("m", mk.m), ("n", mk.n), ("k", mk.k)):
        extent = loop_extent(model, var)
        sizes[name] = min(s.tile_sizes.get(var, extent), extent)
    lanes = accumulator_lanes(model, target, mk)
    vectors = max(1, math.ceil(sizes["n"] / lanes))
    batch = math.prod(trip_count(model, s, b) for b in mk.batch)
    blocks = trip_count(model, s, mk.blocks) if mk.blocks else 1
    return {
        "microkernel": 1.0,
        "mk_efficiency": microkernel_efficiency(s, model, target),
        "mk_m": _log2(sizes["m"]),
        "mk_n": _log2(sizes["n"] * blocks),
        "mk_k": _log2(sizes["k"] * batch),
        "mk_batch": _log2(batch),
        "pack_a": float(mk.pack_a),
        "pack_b": float(mk.pack_b),
        "n_lane_use": sizes["n"] / (vectors * lanes),
        "innermost_streams": 1.0,
    }




def vector(values: dict[str, float], names: tuple[str, ...]) -> list[float]:
    """`values` in the order of `names` (a feature the record lacks is NaN: trees handle it)."""
    return [float(values.get(n, math.nan)) for n in names]
