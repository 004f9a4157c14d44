"""The C/OpenMP target: a `ScheduledNest` becomes one C translation unit and its header.

Takes a `ScheduledNest` and the `CpuTarget` it is built for (the microkernels' ISA, the
compiler's -march); returns `GeneratedCode`. The function takes one pointer per array in
declaration order (`const` for inputs); size parameters are compile-time constants.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from polydl.codegen.artifact import EpiloguePlacement, GeneratedCode, KernelArgument, kernel_arguments
from polydl.codegen.c.accumulators import AccumulatorPrinter
from polydl.codegen.c.index_checks import IndexChecks, check_text, plan_index_checks
from polydl.codegen.c.index_checks import helpers as index_helpers
from polydl.codegen.c.line_copies import line_copies
from polydl.codegen.c.loops import LANE_STEP_LINES, LoopPrinter
from polydl.codegen.c.microkernel_call import CallPrinter, kept_flag, pairs_copy_lines
from polydl.codegen.c.register_tiles import RowTilePrinter
from polydl.codegen.c.scratch_clearing import clearing
from polydl.codegen.c.thread_scratch import THREAD_HELPERS, per_thread_arrays
from polydl.codegen.c.vector_math import math_form
from polydl.codegen.c_expr import C_HELPERS, ArrayLayout, StatementPrinter
from polydl.codegen.templating import render
from polydl.poly.model import StatementModel
from polydl.schedules.apply import GroupPlan, ScheduledNest
from polydl.schedules.contraction import local_storage
from polydl.schedules.cpu.amx_pairs import pairs_b
from polydl.schedules.cpu.register_blocking import unit_for
from polydl.schedules.cpu.vector_width import wide_vectors
from polydl.schedules.fusion import reduction_vector_dims, vector_dims
from polydl.schedules.loop_spans import LoopSpans
from polydl.schedules.microkernel import MicrokernelCall
from polydl.schedules.postops import postop_plan, without_epilogues
from polydl.schedules.start import start_statement
from polydl.target.cpu import CpuTarget
from polydl.version import __version__

# the header's spelling of `restrict`: kernel.h.j2 defines it as `restrict` for C and `__restrict`
# for C++, which has no `restrict`
HEADER_RESTRICT = "POLYDL_RESTRICT"

# The kernels never read the floating-point exception flags: the C compiler may then compute
# both arms of a data-dependent select (`t > 0 ? t : slope * t`) and blend them in vectors,
# which it refuses where an arm might raise a flag (`-ftrapping-math`, its default). No value
# changes.
SELECT_FLAGS = ("-fno-trapping-math",)


def comment_text(text: str) -> str:
    """`text` made safe inside a C block comment: one printable line that cannot end it (a
    spec's path is user input and must not become code)."""
    printable = "".join(ch if ch.isprintable() else "?" for ch in text)
    return printable.replace("*/", "*?/")


def c_parameters(arguments: tuple[KernelArgument, ...], renamed: Mapping[str, str] | None = None,
                 restrict: str = "restrict", spelled: bool = False) -> list[str]:
    """Arrays by pointer (`const` for inputs); scalar parameters (no extents) by value.
    `renamed`: parameters the definition spells otherwise (the body reads a local by the
    array's name: `line_copies`). `restrict`: how the qualifier is spelled (the header's
    `POLYDL_RESTRICT`, which C++ callers read as `__restrict`). `spelled`: the names as the
    spec writes them (the header's prototype), not the generated code's."""
    renamed = renamed or {}

    def name(a: KernelArgument) -> str:
        return a.name if spelled else renamed.get(a.identifier, a.identifier)

    return [
        f"const {a.c_type} {name(a)}" if not a.shape
        else f"{'const ' if a.is_input else ''}{a.c_type} *{restrict} {name(a)}"
        for a in arguments
    ]


def place_epilogues(
    scheduled: ScheduledNest, plan: GroupPlan, calls: CallPrinter,
    start: StatementModel | None = None,
) -> tuple[GroupPlan, EpiloguePlacement | None, bool]:
    """The plan to print, where its fused epilogues run and whether `start` (the statement
    before the plan's nest) became its calls' start: as post-ops inside the microkernels where
    `postop_plan` finds that legal and every kernel of the call can apply them (the epilogue
    loop then leaves the plan), else as the loop after the call."""
    if start is not None and plan.calls:
        post = postop_plan(scheduled.model, plan, start)
        if not isinstance(post, str) and calls.use_postops(plan.calls[post.statement], post):
            names = (start.name, *(s.name for s in plan.epilogues))
            return without_epilogues(plan), EpiloguePlacement(names, True, post.describe()), True
    if not plan.epilogues:
        return plan, None, False
    names = tuple(s.name for s in plan.epilogues)
    post = postop_plan(scheduled.model, plan)
    if isinstance(post, str):
        return plan, EpiloguePlacement(names, False, post), False
    call = plan.calls[post.statement]
    if not calls.use_postops(call, post):
        return plan, EpiloguePlacement(names, False, "its microkernel applies no post-ops"), False
    return without_epilogues(plan), EpiloguePlacement(names, True, post.describe()), False


def parallel_pragma(plan: GroupPlan, layouts: dict[str, ArrayLayout]) -> str:
    """OpenMP's parallel loop; where its loops carry a sum, each thread sums into a zeroed
    copy of the output of its own, added into the output at the loop's end."""
    pragma = "#pragma omp parallel for schedule(static)"
    if plan.private_sum is None:
        return pragma
    cells = math.prod(layouts[plan.private_sum].shape)
    return f"{pragma} reduction(+: {plan.private_sum}[0:{cells}])"


def _printers(
    scheduled: ScheduledNest, target: CpuTarget, given: dict[str, str]
) -> tuple[dict[str, ArrayLayout], StatementPrinter, CallPrinter, IndexChecks]:
    model = scheduled.model
    sliced = per_thread_arrays(scheduled)
    storage = local_storage(scheduled)
    layouts = {
        a.name: ArrayLayout(a.name, a.dtype, a.concrete_shape(model.params), a.name in sliced)
        for a in model.nest.arrays
    }
    for name, held in storage.items():
        if not held.whole:  # a register scalar (no subscripts), or the cells one iteration touches
            layouts[name] = ArrayLayout(name, layouts[name].dtype, tuple(e for _, e in held.kept),
                                        kept=tuple(k for k, _ in held.kept))
    checks = plan_index_checks(model, layouts, given)
    printer = StatementPrinter(layouts, math_form(target, model.nest.exact_math), checks.sites)
    constant = frozenset(a.name for a in model.nest.parameters if a.is_input)
    paired = pairs_b(model, target, scheduled.schedule)
    return layouts, printer, CallPrinter(printer, target.isa, constant, target.l1_bytes,
                                         {paired.array: paired} if paired else None), checks


def generate_c(scheduled: ScheduledNest, target: CpuTarget) -> GeneratedCode:
    model = scheduled.model
    arguments = kernel_arguments(scheduled.model.nest, scheduled.model.params)
    # inputs read in vectors that the caller may give off a cache line: copied onto one
    given = {a: f"_pd_given_{a}" for a in line_copies(scheduled, target)}
    layouts, printer, calls, index_checks = _printers(scheduled, target, given)
    math_calls = math_form(target, model.nest.exact_math)

    def instance(s: StatementModel | str, args: list[str],
                 lanes: dict[str, tuple[str, int]]) -> list[str]:
        if isinstance(s, str):  # the copy of a packed operand, named after its call
            if s in a_packs:
                return calls.pack_a_lines(a_packs[s], args)
            return calls.pack_lines(packs[s], args)
        call = plan_calls.get(s.name)
        if call is not None:
            return calls.lines(call, args)
        binds = [f"const long {var} = {arg};" for var, arg in zip(s.iterators, args, strict=True)]
        return ["{", *("  " + b for b in binds), "  " + printer.statement(s.statement, lanes), "}"]

    body: list[str] = []
    plan_calls: dict[str, MicrokernelCall] = {}
    packs = {
        call.pack_statement: call
        for plan in scheduled.groups
        for call in plan.calls.values()
        if call.pack is not None
    }
    placements = []
    sums = AccumulatorPrinter(printer)
    a_packs = {
        call.pack_a_statement: call
        for plan in scheduled.groups
        for call in plan.calls.values()
        if call.pack_a is not None
    }
    groups = list(scheduled.groups)
    placed: list[GroupPlan | None] = []
    for index, plan in enumerate(groups):
        # (calls that overwrite their start would overwrite a thread's private copy)
        start = (start_statement(groups[index - 1])
                 if index and plan.calls and plan.private_sum is None else None)
        if plan.feeds:
            loop = plan.order[plan.feed_level - 1] if plan.feed_level else "the nest"
            held = [s.write.access.array for s in plan.feeds if layouts[s.write.access.array].per_thread]
            placements.append(EpiloguePlacement(
                tuple(s.name for s in plan.feeds), False,
                "each thread copies what its iterations read right before they read it"
                + "".join(f"; {a} is held one slice of its first index per thread" for a in held),
                where=f"in the band before the nest it feeds (inside loop {loop})", what="copy"))
        if plan.prologues:
            loop = plan.order[plan.fusion_level - 1] if plan.fusion_level else "the nest"
            placements.append(EpiloguePlacement(
                tuple(s.name for s in plan.prologues), False,
                "each output tile is set right before the loops that sum into it",
                where=f"in the band before the reduction (inside loop {loop})"))
        plan, placement, started = place_epilogues(scheduled, plan, calls, start)
        placements += [placement] if placement is not None else []
        if started:  # the start's own nest runs nowhere: the calls overwrite C instead
            placed[-1] = None
        placed.append(plan)
    contracted = {name: frozenset(s.name for s in model.statements
                                  if name in {a.access.array for a in s.accesses})
                  for name, held in local_storage(scheduled).items() if not held.whole}
    lifetimes = {name: held.level for name, held in local_storage(scheduled).items()
                 if not held.whole and held.level is not None}
    lane_step = False
    for plan in (p for p in placed if p is not None):
        plan_calls = plan.calls
        # only fused epilogues or a body of several statements is declared SIMD (`LoopPrinter`):
        # a nest of one statement needs no dependence analysis per dimension for it
        several = len(plan.printed_statements) > 1
        simd_dims = vector_dims(model, plan.schedule_map) if several else frozenset()
        reduction_dims = reduction_vector_dims(model, plan.schedule_map) if several else frozenset()
        loops = LoopPrinter(plan, instance, parallel_pragma=parallel_pragma(plan, layouts),
                            simd_dims=simd_dims, reduction_dims=reduction_dims,
                            spans=LoopSpans(plan.schedule_map),
                            accumulators=sums, contracted=contracted, lifetimes=lifetimes,
                            threads=target.cores,
                            row_tiles=RowTilePrinter(printer, plan.tiles,
                                                     unit_for(target.isa).vector_bytes))
        body += loops.lines()
        lane_step = lane_step or loops.printed_lanes
    # contracted locals: C locals of the function, each thread's own where a parallel loop's
    # body writes them (`LoopPrinter`)
    # (an array's cells flat, as the statements index them)
    body = [f"{layouts[a].c_type} {a}" + (f"[{math.prod(layouts[a].shape)}]" if layouts[a].shape else "")
            + ";" for a in sorted(contracted)] + (list(LANE_STEP_LINES) if lane_step else []) + body
    locals_ = []
    for a in (a for a in model.nest.locals if a.name not in contracted):
        zeroed, clear = clearing(model, layouts[a.name], a.filled)
        shape = layouts[a.name].shape
        count = (f"_pd_slices({shape[0]}) * {math.prod(shape[1:])}L" if layouts[a.name].per_thread
                 else math.prod(shape))
        locals_.append({"name": a.name, "c_type": layouts[a.name].c_type, "count": count,
                        "zeroed": zeroed, "zero_lines": clear})
    # packed copies are written in full before they are read: no need to zero them
    locals_ += [
        {"name": call.pack.name, "c_type": layouts[call.b.array].c_type,
         "count": call.pack.elements, "zeroed": False}
        for call in packs.values()
        if call.pack is not None and not call.pack.kept
    ]
    # the copies of inputs the caller keeps between calls: the library keeps them, keyed by
    # the input's address as given (before any copy onto a cache line)
    kept_calls = [call for call in packs.values() if call.pack is not None and call.pack.kept]

    def kept_copy(name: str, array: str, count: int) -> dict[str, object]:
        return {"name": name, "c_type": layouts[array].c_type, "count": count,
                "fill": kept_flag(name), "source": given.get(array, array),
                "slots": f"_pd_kept_slots{name}"}

    kept = [kept_copy(call.pack.name, call.b.array, call.pack.elements)
            for call in kept_calls if call.pack is not None]
    # kept inputs the AMX calls read in k pairs (`amx_pairs.pairs_b`): copied at the first call
    pairs_first: list[str] = []
    for pairs in calls.paired.values():
        kept.append(kept_copy(pairs.name, pairs.array, pairs.elements))
        pairs_first += [f"if ({kept_flag(pairs.name)})",
                        *pairs_copy_lines(pairs, pairs.array, layouts[pairs.array].c_type)]
        placements.append(EpiloguePlacement(
            (pairs.array,), False,
            "the AMX calls load their tiles of it in place instead of each copying its part; "
            "at the first call on the array only (kept)",
            where="before the nest", what="copy in k pairs of"))
    body = pairs_first + body
    locals_ += [
        {"name": call.pack_a.name, "c_type": layouts[call.a.array].c_type,
         "count": call.pack_a.elements, "zeroed": False}
        for call in a_packs.values()
        if call.pack_a is not None
    ]

    on_line = [{"name": a, "given": g, "c_type": layouts[a].c_type, "count": math.prod(layouts[a].shape)}
               for a, g in given.items()]
    name = model.nest.name
    origin = comment_text(model.nest.filename)
    values = dict(name=name, version=__version__, origin=origin, parameters=c_parameters(arguments),
                  target=comment_text(target.describe()))
    source = render(
        "c/kernel.c.j2",
        **{**values, "parameters": c_parameters(arguments, given)},
        schedule="; ".join([scheduled.schedule.describe(), *(p.describe() for p in placements),
                            *(f"{name}: {held.describe()}" for name, held in local_storage(scheduled).items()
                              if not held.whole)]),
        includes=[],  # each microkernel source includes the headers it needs
        helpers=C_HELPERS + (THREAD_HELPERS if any(lay.per_thread for lay in layouts.values()) else "")
        + math_calls.preamble(model.nest, printer.ctype)
        + (index_helpers(name) if index_checks.checks else ""),
        index_checks=index_checks.before_loops,
        index_fault=index_checks.at_access,
        microkernels=[mk.source for mk in calls.microkernels.values()],
        size_params=[{"name": p, "value": v} for p, v in model.params.items()],
        locals=locals_,
        kept=kept,
        line_copies=on_line,
        body=body,
        # microkernels that reuse a packed constant input across calls count the calls
        tile_generation=any(mk.counts_calls for mk in calls.microkernels.values()),
        wide_vectors=wide_vectors(scheduled, target),
    )
    kept_inputs = tuple(dict.fromkeys([*(call.b.array for call in kept_calls),
                                       *calls.paired]))
    header = render("c/kernel.h.j2", **{**values, "parameters": c_parameters(arguments, restrict=HEADER_RESTRICT,
                                                                           spelled=True)},
                    restrict=HEADER_RESTRICT, arguments=arguments, kept=kept_inputs,
                    index_checks=[check_text(n, c) for n, c in enumerate(index_checks.checks)])
    return GeneratedCode(
        function=name,
        arguments=arguments,
        source=source,
        header=header,
        kind="c",
        compile_flags=tuple(
            sorted({*SELECT_FLAGS, *(flag for mk in calls.microkernels.values() for flag in mk.link_flags),
                    *math_calls.compile_flags(model.nest)})
        ),
        target_flags=target.compile_flags(),
        fallback_flags=target.portable_flags(),
        placements=tuple(placements),
        kept=kept_inputs,
        index_checks=index_checks.checks,
    )
