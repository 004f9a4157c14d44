"""The GPU schedule: which loops become the grid and the block, and how a GEMM is tiled.

Takes a `PolyModel` and a `GpuTarget`; returns a `GpuSchedule` with one `GpuKernelPlan` per
statement, launched in source order (one stream, so each launch sees the previous one's
writes). Distributing the statements of one loop nest into separate launches is legal only if no
dependence runs from a later statement back to an earlier one; otherwise `ScheduleError`.

Inside one statement, the threads run the loops of a set P that no dependence crosses: every
dependence between two instances has equal values on all loops of P (checked with isl on the
memory-based dependences). The other loops stay sequential in each thread, in their original
order, so reductions are sequential per thread. A statement `C += A * B` that has a GEMM
binding (`schedules.microkernel`) instead becomes a block-tiled implicit GEMM: the loops that
index C and A are M, C and B are N, the reduction loops are K, the loops that index all three
are the batch. Its block tile (shared memory) and thread/warp tile (registers) are chosen from
the footprint of one tile step, counted with isl (`card()` of the accessed cells), against the
target's shared-memory and register capacities (`schedules.gpu.tiling`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.errors import ScheduleError
from polydl.ir import (
    Access,
    Guard,
    Loop,
    Statement,
    access_vars,
    eval_int,
    expr_loads,
    int_vars,
    walk_statements,
)
from polydl.names import respell
from polydl.poly.dependences import dependences_of
from polydl.poly.isl_parts import maps_of
from polydl.poly.model import PolyModel, StatementModel, build_model
from polydl.schedules.gpu.epilogues import with_epilogues
from polydl.schedules.gpu.plans import GemmDim, GemmPlan, GpuKernelPlan, GpuSchedule, ThreadLoop
from polydl.schedules.gpu.staging import stage_channels_last
from polydl.schedules.gpu.tiling import MAX_GRID_Z, choose_tiling, ranked_tilings
from polydl.schedules.gpu.variants import FmaTiling
from polydl.schedules.gpu.windows import read_through_copies
from polydl.schedules.gpu.winograd import winograd_convolutions
from polydl.schedules.microkernel import (
    candidate_bindings,
    multiply_accumulate,
    only_accumulation,
)
from polydl.schedules.strides import element_stride
from polydl.target.gpu import GpuTarget

THREADS_PER_BLOCK = 256


# ----------------------------------------------------------------------------- legality


def _between(deps: isl.UnionMap, source: str, sink: str) -> list[isl.Map]:
    return [
        m for m in maps_of(deps)
        if m.get_tuple_name(isl.dim_type.in_) == source
        and m.get_tuple_name(isl.dim_type.out) == sink
    ]


def check_distribution(model: PolyModel) -> None:
    """Each statement becomes its own launch, in source order: no dependence may go backwards."""
    deps = dependences_of(model).all
    names = [s.name for s in model.statements]
    for i, early in enumerate(names):
        for late in names[i + 1:]:
            if any(not m.is_empty() for m in _between(deps, late, early)):
                raise ScheduleError(
                    f"the GPU target runs each statement as its own kernel, but {early} depends "
                    f"on a later instance of {late}: the loop nest cannot be distributed"
                )


def _agree(deps: list[isl.Map], pairs: list[tuple[int, int]]) -> bool:
    """True if every dependence joins instances equal on each (source dim, sink dim) pair:
    those on one thread when the pairs are the thread loops' positions."""
    for dep in deps:
        eq = isl.Map.universe(dep.get_space())
        for a, b in pairs:
            eq = eq.equate(isl.dim_type.in_, a, isl.dim_type.out, b)
        if not dep.is_subset(eq):
            return False
    return True


def thread_loops(
    model: PolyModel, s: StatementModel, enclosing: tuple[Loop | Guard, ...]
) -> tuple[ThreadLoop, ...]:
    """The largest outermost-first greedy set of loops with constant bounds that no dependence
    of `s` on itself crosses."""
    deps = _between(dependences_of(model).all, s.name, s.name)
    params = set(model.params)
    chosen: list[int] = []
    out: list[ThreadLoop] = []
    for d, loop in enumerate(s.loops):
        if not (int_vars(loop.lower) | int_vars(loop.upper)) <= params:
            continue  # bounds that move with another loop cannot be hoisted to the grid
        if not _agree(deps, [(c, c) for c in (*chosen, d)]):
            continue
        lo, hi = eval_int(loop.lower, model.params), eval_int(loop.upper, model.params)
        extent = max(0, -(-(hi - lo) // loop.step))
        chosen.append(d)
        out.append(ThreadLoop(loop.var, lo, extent, loop.step))
    return tuple(out)


def _last_var(acc: Access) -> str | None:
    """The one loop variable of an access's last subscript (`iw`, `iw + 1`), if it has one."""
    if not acc.indices:
        return None
    names = int_vars(acc.indices[-1])
    return next(iter(names)) if len(names) == 1 else None


def transpose_loops(
    model: PolyModel, stmt: Statement, enclosing: tuple[Loop | Guard, ...], threads: tuple[ThreadLoop, ...]
) -> tuple[str, str] | None:
    """(u, v) where `stmt` is an assignment of float32/bf16 values (computed in float) whose
    every loop runs on threads, its first load running along loop u in memory and its target
    along another loop v (a copy into another layout: NCHW into channels-last). One thread a
    cell reads coalesced and writes a cell per C elements, or the reverse; tiles of u x v
    through shared memory do both in runs."""
    if stmt.op != "=" or any(isinstance(x, Guard) for x in enclosing):
        return None
    if any(a.dtype not in ("float32", "bfloat16") and not DTYPES[a.dtype].is_integer for a in model.nest.arrays):
        return None  # a double compute type: tiles of float would round
    loads = expr_loads(stmt.value)
    if not loads or any(model.nest.array(a.array).dtype not in ("float32", "bfloat16")
                        for a in (stmt.target, *loads)):
        return None
    mapped = {t.var for t in threads}
    if any(isinstance(x, Loop) and x.var not in mapped for x in enclosing):
        return None
    u, v = _last_var(loads[0]), _last_var(stmt.target)
    if u is None or v is None or u == v or not {u, v} <= mapped:
        return None
    # tiles even for runs much shorter than 32 (a 7 x 7 image's rows, 3 x 3 taps)
    # (see decisions: GPU transposes through shared memory)
    return u, v


def _register_accumulator(
    s: StatementModel, enclosing: tuple[Loop | Guard, ...], threads: tuple[ThreadLoop, ...]
) -> bool:
    """A `+=`/`-=` whose target moves with no sequential loop, read nowhere else, unguarded."""
    stmt = s.statement
    if stmt.op not in ("+=", "-=") or any(isinstance(x, Guard) for x in enclosing):
        return False
    mapped = {t.var for t in threads}
    sequential = {x.var for x in enclosing if isinstance(x, Loop)} - mapped
    if not sequential:
        return False
    if access_vars(stmt.target) & sequential:
        return False
    return all(acc.array != stmt.target.array for acc in stmt.reads[1:])


# ----------------------------------------------------------------------------- GEMM


def _flat_offset(model: PolyModel, access: Access, env: dict[str, int]) -> int:
    shape = model.nest.array(access.array).concrete_shape(model.params)
    offset = 0
    for extent, index in zip(shape, access.indices, strict=True):
        offset = offset * extent + eval_int(index, env)
    return offset


def _gemm_dims(
    model: PolyModel, s: StatementModel, target: GpuTarget, rank: int = 0
) -> GemmPlan | None:
    if not candidate_bindings(model, s, s.iterators):
        return None
    if not only_accumulation(s, s.iterators):
        return None
    mac = multiply_accumulate(s)
    assert mac is not None
    c, x, y = mac
    dtypes = {acc.array: model.nest.array(acc.array).dtype for acc in (c, x, y)}
    if dtypes[x.array] != dtypes[y.array] or dtypes[x.array] not in ("float32", "bfloat16"):
        return None
    if dtypes[c.array] not in ("float32", "bfloat16"):
        return None
    lows = {v: s.domain.dim_min_val(d).to_python() for d, v in enumerate(s.iterators)}
    highs = {v: s.domain.dim_max_val(d).to_python() for d, v in enumerate(s.iterators)}
    strides: dict[str, tuple[int, int, int]] = {}
    for v in s.iterators:
        sx, sy, sc = (element_stride(model, acc, v) for acc in (x, y, c))
        if sx is None or sy is None or sc is None:
            return None
        strides[v] = (sx, sy, sc)
    # A is the load that moves with some C loop the other load ignores.
    a, b = x, y
    if not any(sc and sx and not sy for sx, sy, sc in strides.values()):
        a, b = y, x
    # The tensor-core kernels hold C's rows in pairs along N: where C runs along a loop of A
    # only (an NCHW output's positions), the operands trade places (C^T = B^T A^T), unless A
    # is a window there (a K loop moving along the same dimension: the TMA window kernel
    # reads A's windows, not B's)
    tensor_cores = target.tensor_cores and dtypes[x.array] == "bfloat16"
    moving = [v for v in s.iterators if highs[v] > lows[v]]
    along = [v for v in moving if strides[v][2] == 1]
    if tensor_cores and along:
        i = 0 if a is x else 1
        unit = strides[along[0]]
        taps = {v for v in moving if strides[v][2] == 0}
        window = any(along[0] in int_vars(e) and int_vars(e) & taps for e in a.indices)
        if unit[i] and not unit[1 - i] and not window:
            a, b = b, a
    groups: dict[str, list[GemmDim]] = {"m": [], "n": [], "k": [], "batch": []}
    for v in s.iterators:
        sx, sy, sc = strides[v]
        sa, sb = (sx, sy) if a is x else (sy, sx)
        extent = highs[v] - lows[v] + 1
        if extent == 1:
            continue
        dim = GemmDim(v, lows[v], extent, sa, sb, sc)
        if sc == 0:
            groups["k"].append(dim)
        elif sa and not sb:
            groups["m"].append(dim)
        elif sb and not sa:
            groups["n"].append(dim)
        else:
            groups["batch"].append(dim)
    if tensor_cores and len(groups["n"]) > 1:
        # the outermost N loop where it does not continue the others in B (the images of
        # NCHW positions): a batch loop that A ignores, so B's N runs as one strided matrix
        outer, inner = groups["n"][0], groups["n"][1:]
        if outer.stride_b != inner[0].stride_b * math.prod(d.extent for d in inner):
            groups["n"], groups["batch"] = inner, [*groups["batch"], outer]
    if not groups["m"] or not groups["n"] or not groups["k"]:
        return None
    batch = math.prod(d.extent for d in groups["batch"])
    if batch > MAX_GRID_Z:
        return None
    dtype_ab = dtypes[x.array]
    plan = GemmPlan(
        c=c, a=a, b=b,
        m=tuple(groups["m"]), n=tuple(groups["n"]), k=tuple(groups["k"]),
        batch=tuple(groups["batch"]),
        base_a=_flat_offset(model, a, {**model.params, **lows}),
        base_b=_flat_offset(model, b, {**model.params, **lows}),
        base_c=_flat_offset(model, c, {**model.params, **lows}),
        dtype_ab=dtype_ab, dtype_c=dtypes[c.array],
        tiling=FmaTiling(0, 0, 0), footprint_bytes=0,  # until `choose_tiling`
    )
    return choose_tiling(model, s, plan, target, rank)


# ----------------------------------------------------------------------------- the schedule


def gpu_schedule(model: PolyModel, target: GpuTarget, ranks: Mapping[str, int] | None = None) -> GpuSchedule:
    """Kernels for `model` on `target`: GEMMs tiled for its tensor cores or FMA units, the
    other statements one thread a point of their parallel loops. Convolution windows that
    the tensor cores cannot read in runs are planned on a staged nest (`schedules.gpu.staging`).
    `ranks` takes a GEMM statement's tile that many places down its ranking (by the name of
    the statement in the planned nest; absent: the best)."""
    for s in model.statements:
        if s.statement.is_indirect:
            raise model.nest.error_at(respell(
                f"{s.name} reads or writes through an index array (a gather or scatter); "
                f"target '{target.kind}' does not run those yet: build it for the C target"),
                s.statement.position)
    winograd = winograd_convolutions(model.nest, model.params, target)
    staged = stage_channels_last(winograd, model.params, target)
    if staged is not model.nest:
        staged_model = build_model(staged, model.params)
        writes = _writes(staged_model)
        how = []
        if winograd is not model.nest:
            how.append("3 x 3 convolutions by Winograd's F(m x m, 3 x 3) (schedules/gpu/winograd.py)")
        if staged is not winograd:
            how.append("bf16 operands copied channels-last (schedules/gpu/staging.py)")
        note = f"{'; '.join(how)}; the kernels' statements are the rewritten nest's: {writes}"
        return replace(_planned(staged_model, target, ranks or {}), model=staged_model, notes=(("staged", note),))
    return _planned(model, target, ranks or {})


def replanned(model: PolyModel, schedule: GpuSchedule, ranks: Mapping[str, int]) -> GpuSchedule:
    """`schedule` planned again with the GEMM tiles `ranks` names (as `gpu_schedule` takes it)."""
    planned = _planned(schedule.model or model, schedule.target, ranks)
    return replace(planned, model=schedule.model, notes=schedule.notes)


def tile_counts(model: PolyModel, schedule: GpuSchedule) -> dict[str, int]:
    """How many tiles each GEMM statement of `schedule` has in its ranking."""
    planned = schedule.model or model
    return {k.name: len(ranked_tilings(planned, k.statement, k.gemm, schedule.target))
            for k in schedule.kernels if k.gemm is not None}


def _writes(model: PolyModel) -> str:
    """"S0 writes xp, S1-S36 write u, ...": the statements in runs writing one array."""
    runs: list[list[str]] = []  # [first, last, array]
    for s in model.statements:
        array = s.statement.target.array
        if runs and runs[-1][2] == array:
            runs[-1][1] = s.name
        else:
            runs.append([s.name, s.name, array])
    return ", ".join(f"{first} writes {array}" if first == last else f"{first}-{last} write {array}"
                     for first, last, array in runs)


def _planned(model: PolyModel, target: GpuTarget, ranks: Mapping[str, int]) -> GpuSchedule:
    check_distribution(model)
    chains = {stmt.name: enclosing for stmt, enclosing in walk_statements(model.nest.body)}
    kernels = []
    for s in model.statements:
        enclosing = chains[s.name]
        gemm = None
        if not any(isinstance(x, Guard) for x in enclosing):
            gemm = _gemm_dims(model, s, target, ranks.get(s.name, 0))
        threads = thread_loops(model, s, enclosing)
        kernels.append(
            GpuKernelPlan(
                statement=s,
                enclosing=enclosing,
                threads=threads,
                block=THREADS_PER_BLOCK,
                register_accumulator=_register_accumulator(s, enclosing, threads),
                gemm=gemm,
                transpose=transpose_loops(model, s.statement, enclosing, threads) if gemm is None else None,
            )
        )
    planned = read_through_copies(model, with_epilogues(model, kernels))
    return GpuSchedule(target, tuple(sibling_groups(model, planned)))


def _plain(plan: GpuKernelPlan) -> bool:
    """A kernel of one statement whose every loop runs on threads (a point a thread)."""
    return (plan.gemm is None and plan.transpose is None and not plan.register_accumulator
            and not plan.sequential)


def _loops_of(plan: GpuKernelPlan) -> tuple[int, ...]:
    return tuple(id(x) for x in plan.enclosing if isinstance(x, Loop))


def sibling_groups(model: PolyModel, kernels: list[GpuKernelPlan]) -> list[GpuKernelPlan]:
    """Consecutive plain kernels of statements in the same loops, on the same thread loops,
    as one kernel whose threads run each statement of their point in source order: legal
    where every dependence between two of them stays on one thread (the same values of the
    thread loops). A Winograd transform's (m+2)^2 statements read the same tile: one launch
    reads it once, and the compiler shares the sums its statements have in common."""
    deps = dependences_of(model).all
    out: list[GpuKernelPlan] = []
    for plan in kernels:
        head = out[-1] if out else None
        if (head is not None and _plain(head) and _plain(plan) and _loops_of(head) == _loops_of(plan)
                and head.threads == plan.threads
                and all(_same_thread(deps, early, plan.statement, plan.threads)
                        for early in head.statements)):
            out[-1] = replace(head, siblings=(*head.siblings, (plan.statement, plan.enclosing)))
        else:
            out.append(plan)
    return out


def _same_thread(deps: isl.UnionMap, early: StatementModel, late: StatementModel,
                 threads: tuple[ThreadLoop, ...]) -> bool:
    """Whether every dependence from `early` to `late` joins instances of one thread."""
    position = [{lp.var: d for d, lp in enumerate(s.loops)} for s in (early, late)]
    return _agree(_between(deps, early.name, late.name),
                  [(position[0][t.var], position[1][t.var]) for t in threads])
