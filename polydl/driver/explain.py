"""`polydl explain`: the compiler's view of a spec, as readable text.

Takes a `Compilation`; returns text with the target, the arrays (a local with where the code
holds it), the iteration domains, access relations, dependences, the chosen schedule and the
decisions recorded while choosing it: who decided, each fusion decision, where the epilogues
run and, where the schedule was ranked, the candidates with their working sets. Nothing is
decided again here: each nest's line in the summary and in the schedule section is the plan's
own `describe_plan` line (a general-scheduler nest's bands as the scheduler described them),
the line the kernel's `Schedule.describe()` prints for the main nest.
"""

from __future__ import annotations

import re

from polydl.codegen.c.thread_scratch import per_thread_arrays
from polydl.driver.compilation import Compilation
from polydl.ir import Array, Indirect, expr_loads, int_vars
from polydl.names import respell, spelling
from polydl.poly.counting import count_points
from polydl.poly.dependences import dependences_of
from polydl.poly.isl_parts import maps_of
from polydl.schedules.contraction import LocalStorage, local_storage
from polydl.schedules.cpu.nests import describe_plan
from polydl.schedules.fusion import level_loop
from polydl.schedules.schedule import GENERAL_SCHEDULER_NOTE
from polydl.target import CpuTarget

# The array the C frontend expands a local scalar `float s` of the spec into: `_pd_s_0`, one
# cell per iteration of the loops around its declaration (`frontends/c_loopnest.py`).
_C_LOCAL = re.compile(r"_pd_(\w+)_\d+")


def explain(c: Compilation, ranking: int = 5) -> str:
    model = c.model
    lines = [f"kernel {model.nest.name}  ({model.nest.filename})"]
    lines += _summary(c)
    lines.append("")
    lines.append("details:")
    lines.append(f"  target: {c.target.describe()}")
    lines.append("  sizes: " + (", ".join(f"{k}={v}" for k, v in model.params.items()) or "none"))
    lines.append("  arrays:")
    per_thread = per_thread_arrays(c.scheduled) if c.scheduled is not None else frozenset()
    storage = local_storage(c.scheduled) if c.scheduled is not None else {}
    # the scheduled model's: with the scratch arrays the schedule added (scaled operands)
    for a in (c.scheduled.model if c.scheduled is not None else model).nest.arrays:
        shape = "x".join(str(e) for e in a.concrete_shape(model.params))
        lines.append(f"    {a.name}: {a.dtype}[{shape}] "
                     f"{_role(a, a.name in per_thread, storage.get(a.name))}")
    lines.append("")
    lines.append("statements:")
    for s in model.statements:
        lines.append(f"  {s.name} (nest {s.group}): {_text(s)}")
        lines.append(f"    domain: {s.domain}  ({count_points(s.domain)} instances)")
        for acc in s.accesses:
            lines.append(f"    {'write' if acc.is_write else 'read '}: {acc.relation}")
    deps = dependences_of(model)
    lines.append("")
    lines.append("dependences (flow, value-based):")
    flow = maps_of(deps.flow)
    lines += [f"  {m}" for m in flow] or ["  none"]
    lines.append("dependences (memory-based, kept in order by every schedule):")
    for kind, rel in (("RAW", deps.raw), ("WAR", deps.war), ("WAW", deps.waw)):
        for m in maps_of(rel):
            lines.append(f"  {kind} {m}")
    lines.append("")
    lines.append(f"schedule: {c.schedule.describe()}")
    lines.append(f"  decided by {c.decision.describe()}")
    if c.scheduled is not None:
        for plan in c.scheduled.groups:
            main = " (main)" if plan.group == c.scheduled.main_group else ""
            lines.append(f"  nest {plan.group}{main}: {describe_plan(plan)}")
    for key, value in getattr(c.schedule, "notes", ()):
        if key != GENERAL_SCHEDULER_NOTE:  # the main nest's line above
            lines.append(f"  {key}: {value}")
    lines += _fusion(c)
    lines += _indirect(c)
    lines.append(f"flops per call: {c.flops}")
    if ranking > 0:
        lines.append("")
        lines += _ranking(c, ranking)
    return respell("\n".join(lines))  # IR names as the spec spells them


def _summary(c: Compilation) -> list[str]:
    """One screen first: per nest its statements, loop order, parallel loops and microkernel,
    and who decided; the details follow."""
    model = c.model
    kinds = {a.name: "input" if a.is_input else "output" for a in model.nest.parameters}
    arrays = ", ".join(f"{n} ({k})" for n, k in kinds.items())
    lines = ["summary:",
             f"  {len(model.statements)} statement(s) in {len({s.group for s in model.statements})} "
             f"nest(s); arrays {arrays or 'none'}; {c.flops} flops per call",
             f"  target {getattr(c.target, 'name', '?')}; schedule decided by "
             f"{c.decision.describe()}"]
    scheduled = c.scheduled
    if scheduled is None:
        lines.append(f"  {c.schedule.describe()}")
        return lines
    if scheduled.model is not model:
        lines.append(f"  GEMM statements isolated: now {len(scheduled.model.statements)} "
                     f"statement(s) in {len(scheduled.groups)} nest(s)"
                     + "".join(f"; {a.name} is a scaled copy" for a in scheduled.model.nest.locals
                               if a.name not in {b.name for b in model.nest.arrays}))
    loopless = [p for p in scheduled.groups
                if p.tree is not None and not p.bands and p.group != scheduled.main_group]
    if loopless:
        lines.append(f"  {len(loopless)} nest(s) without loops (scalar statements): "
                     + ", ".join(st.name for p in loopless for st in p.statements))
    for plan in scheduled.groups:
        if plan in loopless:
            continue
        names = ", ".join(st.name for st in plan.statements)
        main = " (main)" if plan.group == scheduled.main_group else ""
        if plan.tree is not None:  # `describe_plan`'s bands, one per line
            lines.append(f"  nest {plan.group}{main} [{names}]: {plan.how}, "
                         f"{len(plan.bands)} band(s)")
            lines += [f"    {band}" for band in plan.bands or ("no loops",)]
            continue
        lines.append(f"  nest {plan.group}{main} [{names}]: {describe_plan(plan)}")
    return lines


def _role(array: Array, per_thread: bool, storage: LocalStorage | None = None) -> str:
    """input, output, or a local with where the code holds it, as the chosen schedule allows
    (`schedules.contraction`): a register scalar or the cells one iteration touches, with the
    loops it lives one iteration of and why; else one slice of its first index per thread, or
    the whole array (one cell per iteration of the loops it was expanded along)."""
    if not array.local:
        return "input" if array.is_input else "output"
    if per_thread:
        where = "one slice of its first index per thread"
    elif storage is not None:
        where = storage.describe()
    else:
        where = "the whole array"
    scalar = _C_LOCAL.fullmatch(array.name)
    if scalar is None or array.position is None:
        return f"local (scratch), {where}"
    return f"local, the C local '{spelling(scalar.group(1))}' at {array.position}: {where}"


def _fusion(c: Compilation) -> list[str]:
    """What was fused into the main nest, at which level, where it runs, and why each consumer
    nest was or was not fused (as recorded when the schedule was chosen)."""
    if c.scheduled is None or not (c.decision.fusion or c.scheduled.main.epilogues):
        return []
    main = c.scheduled.main
    lines = ["fusion of the nests after the main one:"]
    if main.epilogues:
        names = ", ".join(s.name for s in main.epilogues)
        loop = level_loop(main.order, main.fusion_level) if main.fusion_level is not None else "-"
        lines.append(f"  this kernel: {names} run inside loop {loop} (level {main.fusion_level})")
        lines += [f"  this kernel: {placement.describe()}" for placement in c.code.placements]
    else:
        lines.append("  this kernel: nothing fused")
    lines += [f"  {d.describe()}" for d in c.decision.fusion]
    return lines


def _indirect(c: Compilation) -> list[str]:
    """How the gathers and scatters through index arrays run, and where their values are
    checked."""
    lines = []
    for number, check in enumerate(getattr(c.code, "index_checks", ())):
        where = ("once, over the whole index array, before the loops" if check.before_loops
                 else "where each value is read (the nest writes the index array, or reads it "
                 "in part); the loops finish first")
        lines.append(f"  {check.index_array} selects in dimension {check.dimension} of "
                     f"{check.array} (0..{check.extent - 1}): checked {where}; status {number + 1}")
    scheduled = c.scheduled
    for s in (scheduled.model if scheduled is not None else c.model).statements:
        target = s.statement.target
        if not target.is_indirect:
            continue
        loops = sorted({v for i in target.indices if isinstance(i, Indirect) for v in int_vars(i)}
                       & set(s.iterators))
        plan = next((p for p in scheduled.groups if s in p.statements), None) if scheduled else None
        if plan is not None and plan.private_sum == target.array:
            how = (f"each thread adds into a private copy of {target.array}, added into it at the "
                   "end of the parallel loop (OpenMP's reduction)")
        else:
            how = ("no atomics: its updates run in the written order along "
                   f"{', '.join(loops) or 'every loop'} (the loops its index varies with), which "
                   "no parallel loop splits; the other loops may run in parallel")
        lines.append(f"  {s.name} scatters into {target.array} (a may-write of every cell of the "
                     f"indexed dimension): {how}")
    gathered = [s.name for s in c.model.statements
                if any(a.is_indirect for a in expr_loads(s.statement.value))]
    if gathered:
        lines.append(f"  {', '.join(gathered)} gather(s) through index arrays: may-reads of every "
                     "cell of the indexed dimension; no microkernel takes them")
    return ["index arrays (gathers and scatters):", *lines] if lines else []


def _ranking(c: Compilation, top: int) -> list[str]:
    target = c.target
    ranked = c.decision.ranking
    if not ranked or not isinstance(target, CpuTarget):
        return []
    caches = f"L1 {target.l1_bytes // 1024} KiB, L2 {target.l2_bytes // 1024} KiB, L3 {target.l3_bytes // 1024} KiB"
    lines = [f"ranking by the data-reuse model ({len(ranked)} legal candidates; {caches}; {target.cores} cores):"]
    for i, r in enumerate(ranked[:top]):
        lines.append(f"  #{i + 1} cost {r.cost:.3e}  {r.schedule.describe()}")
        for w in r.working_sets:
            size = w.bytes(target.cache_line_bytes)
            fits = ("L1" if size <= target.l1_bytes else "L2" if size <= target.l2_bytes
                    else "L3" if size <= target.l3_bytes else "memory")
            lines.append(
                f"      level {w.level} {w.loop:>8s}: working set {_size(size):>10s} ({fits}), runs {w.executions}x"
            )
        traffic = ", ".join(f"{k} {_size(v)}" for k, v in r.traffic_bytes.items())
        lines.append(f"      traffic into {traffic}; parallel balance {r.balance:.2f}")
    return lines


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _text(s) -> str:
    src = s.statement.position
    nest = s.statement
    if src is not None:
        return f"{nest.target.array}[...] {nest.op} ...  at {src}"
    return f"{nest.target.array}[...] {nest.op} ..."
