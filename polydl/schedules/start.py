"""The statement that sets the main nest's output, fused into the main band before the
reduction: `y = 0` (a convolution with `accumulate=False`) then runs on each output tile right
before the loops that sum into it, while the tile is in cache, instead of as a pass of its own
over the whole output (which the reduction then reads back from memory).

Takes a `ScheduledNest`; returns it with the nest just before the main one moved into the main
plan (`GroupPlan.prologues`) where that is legal, else unchanged. Only for a main nest without
microkernel calls: those overwrite C themselves (`postops.postop_plan`'s start). The start runs
at the level of the fused epilogues (or, without them, the deepest level inside the parallel
loops) and before the producer there:

    start     [t0 .. t(L-1), -1, <its loops>]
    producer  [t0 .. t(L-1),  0, <its inner dims>]

Legal when every start instance belongs to exactly one iteration of the outer loops (no
reduction loop among them) and isl's check finds every dependence of the start still running
source before sink, none carried by a parallel loop (`fusion.fuse_at`).
"""

from __future__ import annotations

from dataclasses import replace

from polydl.poly.model import StatementModel
from polydl.schedules.apply import GroupPlan, ScheduledNest, fusion_max_level
from polydl.schedules.fusion import fuse_at, fusion_levels, insert_level


def fuse_start(scheduled: ScheduledNest) -> ScheduledNest:
    groups = list(scheduled.groups)
    main = scheduled.main
    index = groups.index(main)
    if (index == 0 or main.calls or main.tree is not None or main.instance_map is None
            or main.private_sum is not None):  # a start inside would set a thread's copy
        return scheduled
    start = start_statement(groups[index - 1])
    if start is None:
        return scheduled
    fused = _fused(scheduled, main, start)
    if fused is None:
        return scheduled
    groups[index - 1:index + 1] = [fused]
    return replace(scheduled, groups=tuple(groups))


def start_statement(before: GroupPlan) -> StatementModel | None:
    """The statement of the nest `before` that may start the next nest: its only one, an
    assignment, in a nest without microkernel calls or a start of its own."""
    if before.calls or before.prologues or len(before.printed_statements) != 1:
        return None
    start = before.statements[0]
    return start if start.statement.op == "=" else None


def _fused(scheduled: ScheduledNest, main: GroupPlan, start: StatementModel) -> GroupPlan | None:
    assert main.instance_map is not None
    if main.fusion_level is not None:  # the epilogues' level, whose dimension is inserted
        levels, inserted = [main.fusion_level], True
    else:
        levels, inserted = list(fusion_levels(fusion_max_level(main), main.parallel_dims)), False
    for level in levels:
        if level == 0:
            continue  # before the whole nest: where it already runs
        base = main.schedule_map if inserted else insert_level(main.schedule_map, level)
        found = fuse_at(scheduled.model, main.statements, main.instance_map, [start], level,
                        main.parallel_dims, before=True, others=base, others_are=main.printed_statements)
        if isinstance(found, str):
            continue
        return replace(main, schedule_map=found.producer.union(found.consumers),
                       prologues=(start,), fusion_level=level)
    return None
