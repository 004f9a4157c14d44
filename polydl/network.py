"""What a compiled network does, as data: its buffers and the steps that fill them.

A `NetworkPlan` is what the lowering of an ONNX graph produces and what code generation reads:
every tensor is a `Buffer` (a graph input or output, a constant in the weights blob, or an
activation in the arena), and every step is a kernel call over buffers or a copy. The arena
offsets come from the buffers' live ranges (`assign_offsets`): a buffer's memory is reused once
its last reader has run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from polydl.ir import LoopNest

ALIGNMENT = 64  # bytes: a cache line and an AVX-512 vector
# An activation starts SKEW x k bytes past its place (k < SKEWS), k chosen so that buffers
# live at the same time start at different offsets within a 4 KiB page. ResNet's sizes are
# multiples of large powers of two, so buffers packed end to end began at the same offset in
# their pages, and a layer streaming from one into another had each load wait on a store to
# an address equal in its low 12 bits (4K aliasing). See decisions: Activations skewed within
# their pages.
SKEW, SKEWS, PAGE = 4096 + 256, 16, 4096
# A network run in passes ends with steps over small activations (a classifier after the global
# pool) whose weights are large: run in the same loop as the layers, each pass read them again
# from memory. Such a tail runs after all the passes, pass by pass, its weights read from the
# cache after the first (`tail_start`; see decisions: The classifier after the passes).
TAIL_ACTIVATION_BYTES = 64 << 10  # a pass's activation at most, in every tail step
TAIL_WEIGHT_BYTES = 256 << 10  # the tail's weights at least


@dataclass(frozen=True)
class Buffer:
    """A float32 tensor in memory. `kind`: "input" | "output" (the caller's arrays, by
    position `index`), "constant" (in the weights blob at `offset`), "activation" (in the
    arena at `offset`). `alias` names the buffer whose memory this one is (a reshape)."""

    name: str
    shape: tuple[int, ...]
    kind: str
    index: int = 0
    offset: int = 0
    alias: str = ""

    @property
    def nbytes(self) -> int:
        return 4 * math.prod(self.shape)


@dataclass(frozen=True)
class KernelStep:
    """A call of a polydl kernel: `arguments` maps each kernel argument (by the spec's name)
    to a buffer; `zero` names the outputs cleared before the call (kernels that accumulate)."""

    label: str
    nest: LoopNest
    arguments: Mapping[str, str]
    zero: tuple[str, ...] = ()
    params: Mapping[str, int] = field(default_factory=dict)  # the nest's size parameters
    # The kernel is for one image: the step calls it `repeat` times, buffer pointers advanced by
    # `strides[buffer]` float elements per call (absent: the same, e.g. the weights), so its
    # scratch arrays are one image's, reused while in cache, not the whole batch's.
    repeat: int = 1
    strides: Mapping[str, int] = field(default_factory=dict)
    function: str = ""  # the generated function, once compiled


@dataclass(frozen=True)
class CopyStep:
    """`destination = source`, byte for byte (a graph output taken from an activation)."""

    label: str
    source: str
    destination: str


Step = KernelStep | CopyStep


@dataclass
class NetworkPlan:
    name: str
    buffers: dict[str, Buffer]
    steps: list[Step]
    inputs: list[str]  # buffer names, in the graph's input order
    outputs: list[str]
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # constant buffer -> data
    notes: list[str] = field(default_factory=list)  # what the graph optimisation did
    # The steps are for one pass over batch / passes images; the network runs them `passes`
    # times, the inputs' and outputs' pointers advanced by a pass's images each time. Steps from
    # `tail` on (None: none) run in a second loop of passes after the first: the activations
    # the two loops share (`carried`) have a pass's room each, at the end of the arena.
    passes: int = 1
    tail: int | None = None
    carried: tuple[str, ...] = ()
    arena_bytes: int = 0
    weights_bytes: int = 0

    def whole_shape(self, name: str) -> tuple[int, ...]:
        """The shape of a graph input's or output's buffer as the caller passes it: all the
        passes' images (`passes`) at axis 0."""
        shape = self.buffers[name].shape
        return (shape[0] * self.passes, *shape[1:]) if shape else shape

    def root(self, name: str) -> Buffer:
        buffer = self.buffers[name]
        while buffer.alias:
            buffer = self.buffers[buffer.alias]
        return buffer


def _slot(address: int) -> int:
    """Which 256 bytes of a 4 KiB page an address falls in."""
    return address % PAGE // (PAGE // SKEWS)


def aligned(nbytes: int) -> int:
    """`nbytes` rounded up to `ALIGNMENT`: the room a buffer takes."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def _reads_writes(step: Step) -> tuple[str, ...]:
    if isinstance(step, KernelStep):
        return tuple(step.arguments.values())
    return (step.source, step.destination)


def tail_start(plan: NetworkPlan) -> int | None:
    """Where a network run in passes may start its tail (`TAIL_ACTIVATION_BYTES`): the first
    of the last steps that touch only small activations, where those steps read at least
    `TAIL_WEIGHT_BYTES` of weights; None where there is no such tail or no passes."""
    if plan.passes < 2:
        return None
    start = len(plan.steps)
    while start > 0:
        roots = [plan.root(n) for n in _reads_writes(plan.steps[start - 1])]
        if any(r.kind != "constant" and r.nbytes > TAIL_ACTIVATION_BYTES for r in roots):
            break
        start -= 1
    if start in (0, len(plan.steps)):
        return None
    weights = {r.name: r.nbytes for step in plan.steps[start:] for n in _reads_writes(step)
               if (r := plan.root(n)).kind == "constant"}
    return start if sum(weights.values()) >= TAIL_WEIGHT_BYTES else None


def _carried(plan: NetworkPlan, tail: int) -> tuple[str, ...]:
    """The arena activations written before `tail` and read from it on."""
    early = {plan.root(n).name for step in plan.steps[:tail] for n in _reads_writes(step)}
    late = {plan.root(n).name for step in plan.steps[tail:] for n in _reads_writes(step)}
    return tuple(sorted(n for n in early & late if plan.buffers[n].kind == "activation"))


def assign_offsets(plan: NetworkPlan) -> NetworkPlan:
    """Arena offsets for the activations (first fit by live range, largest first, each
    skewed within its page away from the buffers live with it) and blob offsets for the
    constants; returns the plan with both filled in. With a tail (`NetworkPlan.tail`), the
    activations carried into it follow, a pass's room each."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for index, step in enumerate(plan.steps):
        for name in _reads_writes(step):
            root = plan.root(name).name
            first.setdefault(root, index)
            last[root] = index
    # (offset, end, first step, last step, start) of each placed buffer: its room and where it
    # starts in it
    placed: list[tuple[int, int, int, int, int]] = []
    buffers = dict(plan.buffers)
    plan.carried = _carried(plan, plan.tail) if plan.tail is not None else ()
    activations = [b for b in plan.buffers.values() if b.kind == "activation" and not b.alias
                   and b.name in first and b.name not in plan.carried]
    for buffer in sorted(activations, key=lambda b: (-b.nbytes, first[b.name])):
        lo, hi = first[buffer.name], last[buffer.name]
        size = aligned(buffer.nbytes) + SKEW * (SKEWS - 1)  # room for any skew
        live = [p for p in placed if not (p[3] < lo or p[2] > hi)]
        offset = 0
        for o, e in sorted((p[0], p[1]) for p in live):
            if offset + size <= o:
                break
            offset = max(offset, e)
        taken = [_slot(p[4]) for p in live]
        skew = SKEW * min(range(SKEWS), key=lambda k: (taken.count(_slot(offset + SKEW * k)), k))
        placed.append((offset, offset + size, lo, hi, offset + skew))
        buffers[buffer.name] = replace(buffer, offset=offset + skew)
    plan.arena_bytes = max((p[1] for p in placed), default=0)
    for name in plan.carried:
        buffers[name] = replace(buffers[name], offset=plan.arena_bytes)
        plan.arena_bytes += plan.passes * aligned(buffers[name].nbytes)
    offset = 0
    for name in sorted(plan.weights):
        buffers[name] = replace(buffers[name], offset=offset)
        offset += aligned(buffers[name].nbytes)
    plan.weights_bytes = offset
    plan.buffers = buffers
    return plan


def weights_blob(plan: NetworkPlan) -> bytes:
    """The constants, each at its offset, as one little-endian float32 blob."""
    blob = bytearray(plan.weights_bytes)
    for name, data in plan.weights.items():
        start = plan.buffers[name].offset
        raw = np.ascontiguousarray(data, dtype="<f4").tobytes()
        blob[start : start + len(raw)] = raw
    return bytes(blob)
