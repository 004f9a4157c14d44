"""The ranking of a nest's candidate schedules on a CPU target, best first.

Takes a `PolyModel` and a `CpuTarget`; returns `RankedSchedule`s sorted by the cost model's
cycles. The candidates (`candidates.py`) are priced (`cost.py`); the winner is refined by its
variants (outer tilings, calls over blocks, k tiles, window calls), uneven winners by sums
split among the threads, and every call's batch is tiled where it overflows the caches below
the model's view.
"""

from __future__ import annotations

from polydl.poly.model import PolyModel
from polydl.schedules.cpu.calls import Memo
from polydl.schedules.cpu.candidates import (
    batch_tiled_call,
    block_variants,
    candidates,
    k_tilings,
    outer_tilings,
    private_sum_splits,
    window_calls,
)
from polydl.schedules.cpu.cost import RankedSchedule, evaluate
from polydl.target.cpu import CpuTarget

MAX_CANDIDATES = 48


def rank(model: PolyModel, target: CpuTarget, limit: int = MAX_CANDIDATES) -> list[RankedSchedule]:
    """The first `limit` candidates and the variants of the best, priced on `target`."""
    ranked = []
    memo: Memo = {}
    for schedule in candidates(model, target)[:limit]:
        result = evaluate(model, target, schedule, memo)
        if result is not None:
            ranked.append(result)
    ranked.sort(key=lambda r: r.cost)
    # refine the winner: its outer-tiled variants (a few more evaluations, not a product)
    if ranked:
        best = ranked[0].schedule
        tiled = outer_tilings(model, best)
        variants = tiled + [v for x in (best, *tiled) for v in block_variants(model, x, target)]
        variants += [v for x in ranked[:3] for v in k_tilings(model, target, x.schedule)]
        windows = [v for x in ranked[:3] for v in window_calls(model, x.schedule, target)]
        variants += windows + [v for x in windows for v in block_variants(model, x, target)]
        for schedule in variants:
            result = evaluate(model, target, schedule, memo)
            if result is not None:
                ranked.append(result)
        ranked.sort(key=lambda r: r.cost)
        # and, where the best ones' parallel loops leave threads idle or waiting, a reduction
        # split among the threads
        uneven = [x.schedule for x in ranked[:3] if x.balance > 1.05]
        if uneven and target.cores > 1:
            for schedule in (v for x in uneven for v in private_sum_splits(model, target, x)):
                result = evaluate(model, target, schedule, memo)
                if result is not None:
                    ranked.append(result)
            ranked.sort(key=lambda r: r.cost)
    # below the model's view: every call's batch tiled where it overflows L1's sets or L2, in
    # the order of the whole calls' costs (the tiled ones' costs add the partial sums' traffic
    # and not what the tiles save; see decisions: Batch tiles after the ranking)
    return [_with_tiled_batch(model, target, result, memo) for result in ranked]


def _with_tiled_batch(model: PolyModel, target: CpuTarget, result: RankedSchedule,
                      memo: Memo) -> RankedSchedule:
    tiled = batch_tiled_call(model, target, result.schedule)
    if tiled is result.schedule:
        return result
    return evaluate(model, target, tiled, memo) or result
