"""A copy that feeds the main nest, fused into the main band: the zero-padded (or strided) copy
of a convolution's input then runs image by image inside the parallel loop, each thread copying
the image it is about to read while the copy is in its cache, instead of as a pass of its own
over the whole input that the convolution then reads back from memory (ResNet-50's first 3 x 3
layer at N=32: 25.7 MB read, 27.5 MB written, 27.5 MB read again).

Takes a `ScheduledNest`; returns it with one nest before the main one moved into the main plan
(`GroupPlan.feeds`) where that is legal, else unchanged. The feed is the nearest nest before the
main one that is one assignment into a scratch (`local`) array the main nest reads:

    feed      [t0 .. t(L-1), -1, <its loops>]
    main      [t0 .. t(L-1),  0, <its inner dims>]

at the deepest level L inside the parallel loops where every cell it writes is read in one
iteration of the main nest's outer L loops (a padded image: the image loop, not the output
channels that read all of it). Legal where no nest between the two depends on it, no fused
epilogue touches its arrays, and isl's check finds every dependence of the feed still running
source before sink, none carried by a parallel loop (`fusion.fuse_at`).
"""

from __future__ import annotations

from dataclasses import replace

from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.apply import GroupPlan, ScheduledNest, fusion_max_level
from polydl.schedules.fusion import (
    dependences_between,
    fuse_at,
    fusion_levels,
    insert_level,
    widened,
)


def fuse_feed(scheduled: ScheduledNest) -> ScheduledNest:
    groups = list(scheduled.groups)
    main = scheduled.main
    index = groups.index(main)
    if (index == 0 or main.tree is not None or main.instance_map is None or main.prologues
            or main.feeds or main.private_sum is not None):
        return scheduled
    model = scheduled.model
    for k in range(index - 1, -1, -1):
        feed = feed_statement(model, groups[k], main)
        if feed is None:
            continue
        between = [s for g in groups[k + 1:index] for s in g.printed_statements]
        if not dependences_between(model, [feed], between).is_empty():
            return scheduled
        fused = _fused(model, main, feed)
        if fused is None:
            return scheduled
        groups[index] = fused
        del groups[k]
        return replace(scheduled, groups=tuple(groups))
    return scheduled


def feed_statement(model: PolyModel, before: GroupPlan, main: GroupPlan) -> StatementModel | None:
    """The statement of the nest `before` that may feed `main`: its only one, an assignment
    into a scratch array that `main` reads, in a nest without calls or fused statements."""
    if before.calls or before.prologues or before.epilogues or len(before.statements) != 1:
        return None
    feed = before.statements[0]
    array = feed.write.access.array
    if feed.statement.op != "=" or not model.nest.array(array).local:
        return None
    read = any(not a.is_write and a.access.array == array for s in main.statements for a in s.accesses)
    return feed if read else None


def _fused(model: PolyModel, main: GroupPlan, feed: StatementModel) -> GroupPlan | None:
    assert main.instance_map is not None
    touched = {a.access.array for a in feed.accesses}
    if any(a.access.array in touched for s in main.epilogues for a in s.accesses):
        return None  # the check below sees the main statements only
    for level in fusion_levels(fusion_max_level(main), main.parallel_dims):
        if level == 0 or (main.fusion_level is not None and level > main.fusion_level):
            continue  # before the whole nest: where it already runs; or below the dimension
            # the fused epilogues inserted, which the statement-level map lacks
        found = fuse_at(model, main.statements, main.instance_map, [feed], level,
                        main.parallel_dims, before=True, feeding=True)
        if isinstance(found, str):
            continue
        # the printed map (microkernel calls, fused epilogues) with the same dimension inserted
        printed = widened(insert_level(main.schedule_map, level), found.consumers)
        return replace(main, schedule_map=printed, feeds=(feed,), feed_level=level)
    return None
