"""A GEMM operand read as a sliding window: a channels-last convolution's input through TMA.

In `y[n][p][q][k] += x[n][p + r][q + s][c] * w[k][r][s][c]` the A operand (M = n, p, q;
K = r, s, c) is no strided matrix, but each dimension of x is indexed by at most one M loop
plus one K loop. For one tap (r, s) and BK channels, the rows of a block tile that covers BP
rows by BQ columns of output positions are one TMA box of x at (c0, q0 + s, p0 + r, n): the
tensor-memory accelerator then gathers the im2col tile, with the 128-byte swizzle the wgmma
kernel reads. The M tile is two-dimensional (positions past the output's edge are loaded
and never stored); the K steps walk the taps, BK channels at a time.
"""

from __future__ import annotations

import math
from dataclasses import replace

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.ir import Load
from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.gpu.plans import GemmPlan, GpuKernelPlan, WindowAxis, WindowMap

WINDOW_MAX_RANK = 5
MAX_STEP = 8  # TMA's largest element stride


def window_box(plan: GemmPlan, block_m: int) -> tuple[tuple[str, int], ...]:
    """The block tile over the M loops: the innermost two take BQ x BP = block_m positions
    (the split that wastes least on the edges), the others one each."""
    inner_p, inner_q = plan.m[-2], plan.m[-1]

    def waste(bq: int) -> float:
        bp = block_m // bq
        return (math.ceil(inner_q.extent / bq) * bq / inner_q.extent
                * math.ceil(inner_p.extent / bp) * bp / inner_p.extent)

    bq = min((1 << i for i in range(block_m.bit_length()) if block_m % (1 << i) == 0 and 1 << i <= 256
              and block_m >> i <= 256), key=lambda b: (waste(b), -b))
    return (*((d.var, 1) for d in plan.m[:-2]), (inner_p.var, block_m // bq), (inner_q.var, bq))


def window_map(plan: GemmPlan, shape_a: tuple[int, ...], block_m: int, block_k: int,
               elem: int = 2) -> WindowMap | None:
    """A as a window over its array, or None where it is not one: every K loop indexes exactly
    one array dimension with a unit coefficient, every M loop one with a coefficient of at most
    8 (a stride: the box then takes every step-th element), at most one M and one K loop per
    dimension, the innermost dimension one K loop of whole BK steps (channels), 16-byte
    strides, no batch loops, at most five dimensions."""
    if plan.batch or len(plan.m) < 2 or plan.base_a or len(shape_a) > WINDOW_MAX_RANK:
        return None
    strides = [math.prod(shape_a[i + 1:]) for i in range(len(shape_a))]
    if len(set(strides)) != len(strides):  # an extent-1 dimension: loops would be ambiguous
        return None
    where = {s: i for i, s in enumerate(strides)}
    m_of: dict[int, str] = {}
    k_of: dict[int, str] = {}
    steps: dict[int, int] = {}
    for d in plan.k:  # K loops: unit coefficients
        axis = where.get(d.stride_a)
        if axis is None or axis in k_of:
            return None
        k_of[axis] = d.var
    for d in plan.m:  # M loops: a coefficient of up to 8 (TMA's element strides)
        fits = [i for i, s in enumerate(strides) if d.stride_a % s == 0 and d.stride_a // s <= MAX_STEP]
        if not fits or fits[0] in m_of:
            return None
        m_of[fits[0]] = d.var
        steps[fits[0]] = d.stride_a // strides[fits[0]]
    last = len(shape_a) - 1
    k_inner = next(d for d in plan.k if d.var == k_of.get(last)) if last in k_of else None
    if last in m_of or k_inner is None or k_inner.extent % block_k or plan.k[-1].var != k_inner.var:
        return None
    if any(s * elem % 16 for s in strides[:-1]):
        return None
    tile = window_box(plan, block_m)
    boxes = dict(tile)
    axes = tuple(WindowAxis(shape_a[i], m_of.get(i), k_of.get(i), steps.get(i, 1))
                 for i in reversed(range(len(shape_a))))
    box = tuple(block_k if i == 0 else boxes.get(a.m, 1) * a.step if a.m else 1 for i, a in enumerate(axes))
    if any(b > 256 for b in box):
        return None
    # the K loops other than the channels are taps: each must be the only K loop of its axis
    # and come before the channels in the K order, as the flat K index walks them
    order = [d.var for d in plan.k]
    taps = [k_of[i] for i in sorted(k_of) if i != last]
    if order[:-1] != taps:
        return None
    return WindowMap(axes, tuple(s * elem for s in reversed(strides[:-1])), box, tile)


def _translation(model: PolyModel, copy: StatementModel, target: str) -> tuple[str, tuple[int, ...]] | None:
    """(X, offsets) where `copy` is `target[i + o] = X[i]` over every cell of X; else None."""
    if copy.statement.op != "=" or not isinstance(copy.statement.value, Load):
        return None
    source = copy.statement.value.access.array
    if source == target or model.nest.array(source).dtype != model.nest.array(target).dtype:
        return None
    write = next(a.relation for a in copy.accesses if a.is_write)
    read = next(a.relation for a in copy.accesses if not a.is_write and a.access.array == source)
    shape = model.nest.array(source).concrete_shape(model.params)
    if len(shape) != len(model.nest.array(target).concrete_shape(model.params)):
        return None
    names = [f"i{d}" for d in range(len(shape))]
    whole = isl.Set(f"{{ {source}[{', '.join(names)}] : "
                    + " and ".join(f"0 <= {v} < {n}" for v, n in zip(names, shape, strict=True)) + " }")
    if not (read.is_injective() and write.is_injective() and read.range().is_equal(whole)):
        return None
    moved = read.reverse().apply_range(write)  # X cell -> A cell
    point = moved.wrap().sample_point()
    values = [int(point.get_coordinate_val(isl.dim_type.set, d).to_python()) for d in range(2 * len(shape))]
    offsets = tuple(values[len(shape) + d] - values[d] for d in range(len(shape)))
    rule = isl.Map(f"{{ {source}[{', '.join(names)}] -> {target}["
                   + ", ".join(f"{v} + {o}" for v, o in zip(names, offsets, strict=True)) + "] }")
    if not moved.is_subset(rule):
        return None
    return source, offsets


def read_through_copies(model: PolyModel, kernels: list[GpuKernelPlan]) -> list[GpuKernelPlan]:
    """`kernels` with each TMA window over a zero-padded copy of an array reading the array
    itself (the copies' boxes fill the padding with zeros), and the copy's launch gone: a
    channels-last convolution then reads x, not a padded scratch copy of it.

    The copy must be the only statement writing the (scratch, zero-initialised) array, its
    only reader the GEMM, and `A[i + o] = X[i]` for every cell of X."""
    locals_ = {a.name for a in model.nest.locals}
    writers: dict[str, list[str]] = {}
    readers: dict[str, set[str]] = {}
    for st in model.statements:
        for acc in st.accesses:
            if acc.is_write:
                writers.setdefault(acc.access.array, []).append(st.name)
            else:
                readers.setdefault(acc.access.array, set()).add(st.name)
    by_name = {k.name: k for k in kernels}
    dropped: set[str] = set()
    out = []
    for plan in kernels:
        g = plan.gemm
        if g is None or g.tma is None or not isinstance(g.tma.a, WindowMap) or g.tma.a.source is not None:
            out.append(plan)
            continue
        window = g.tma.a
        target = g.a.array
        copies = writers.get(target, [])
        if target not in locals_ or len(copies) != 1 or readers.get(target) != {plan.name}:
            out.append(plan)
            continue
        found = _translation(model, by_name[copies[0]].statement, target) if copies[0] in by_name else None
        if found is None:
            out.append(plan)
            continue
        source, offsets = found
        shape = model.nest.array(source).concrete_shape(model.params)
        elem = DTYPES[model.nest.array(source).dtype].bytes
        strides = [math.prod(shape[i + 1:]) * elem for i in range(len(shape))]
        moved = replace(
            window,
            axes=tuple(replace(a, extent=n) for a, n in zip(window.axes, reversed(shape), strict=True)),
            strides=tuple(reversed(strides[:-1])),
            source=source,
            offsets=tuple(-o for o in reversed(offsets)),
            copy=copies[0],
        )
        out.append(replace(plan, gemm=replace(g, tma=replace(g.tma, a=moved))))
        dropped.add(copies[0])
    return [k for k in out if k.name not in dropped]
