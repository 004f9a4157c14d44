"""The arena of a network's activations: buffers live at the same time never overlap, and they
start at different offsets within a 4 KiB page (ResNet's sizes are multiples of large powers
of two: packed end to end, a layer's input and output began at the same offset in their pages,
and each load of the one waited on a store to the other with the same low 12 bits)."""

from __future__ import annotations

from polydl.network import PAGE, SKEW, SKEWS, Buffer, CopyStep, NetworkPlan, assign_offsets


def _plan(count: int, nbytes: int) -> NetworkPlan:
    """A chain of copies a -> b -> c ...: each buffer live with its neighbours."""
    names = [f"t{i}" for i in range(count)]
    buffers = {n: Buffer(n, (nbytes // 4,), "activation") for n in names}
    steps = [CopyStep(f"copy {a} -> {b}", a, b) for a, b in zip(names, names[1:], strict=False)]
    return NetworkPlan("net", buffers, list(steps), [], [])


def test_live_buffers_are_apart_and_start_at_different_offsets_in_a_page() -> None:
    plan = assign_offsets(_plan(6, 1 << 20))
    spans = sorted((b.offset, b.offset + b.nbytes) for b in plan.buffers.values())
    ordered = list(plan.buffers.values())
    neighbours = list(zip(ordered, ordered[1:], strict=False))
    for a, b in neighbours:  # live together: disjoint
        assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset
        assert abs(a.offset % PAGE - b.offset % PAGE) >= 256
    assert all(o % 64 == 0 for o, _ in spans)  # cache lines and vectors stay aligned
    assert plan.arena_bytes <= 6 * ((1 << 20) + SKEW * (SKEWS - 1))
