"""The C/OpenMP backend: a schedule from the reuse model (or the caller), C from the isl AST,
a shared library loaded through cffi.

The target is a `CpuTarget`: the ranking sizes tiles against its caches and cores, the
microkernels follow its ISA, the compiler gets its flags. A library built for a CPU this one
cannot run is still built (for ahead-of-time use) but refuses to be called.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from polydl.codegen.artifact import GeneratedCode
from polydl.codegen.c.generate import generate_c
from polydl.driver.backend import Plan
from polydl.driver.compilation import Compilation, ScheduleDecision
from polydl.driver.reference import LazyReference
from polydl.errors import PolyDLError, ScheduleError
from polydl.ir import LoopNest
from polydl.poly.model import PolyModel
from polydl.runtime.c.kernel import Kernel
from polydl.runtime.c.toolchain import build_shared_library
from polydl.schedules.apply import apply_schedule
from polydl.schedules.cpu.auto import auto_schedule, resolve
from polydl.schedules.cpu.distribution import isolate_gemms
from polydl.schedules.cpu.epilogues import choose_fusion
from polydl.schedules.cpu.nests import plan_nests
from polydl.schedules.feeds import fuse_feed
from polydl.schedules.microkernel import multiply_accumulate
from polydl.schedules.schedule import AFFINE, GENERAL_SCHEDULER_NOTE, Schedule
from polydl.schedules.start import fuse_start
from polydl.target.cpu import CpuTarget
from polydl.target.host import cannot_run_here

kind = "c"
stores_lowerings = True


def schedule_from(data: Mapping[str, Any]) -> Schedule:
    """A schedule given as a mapping (e.g. read from JSON), or ScheduleError if malformed."""
    try:
        return Schedule.from_dict(dict(data))
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ScheduleError(f"malformed schedule {dict(data)!r}: {type(exc).__name__}: {exc}") from None


def schedule_from_dict(data: dict[str, Any]) -> Schedule:
    return Schedule.from_dict(data)


def _refuse_bf16_sums(model: PolyModel) -> None:
    """A multiply-accumulate into a bfloat16 array would round the partial sum at every step
    in C loops (GPU kernels keep it in float32 registers and round once)."""
    for s in model.statements:
        mac = multiply_accumulate(s)
        if mac is not None and model.nest.array(mac[0].array).dtype == "bfloat16":
            raise ScheduleError(
                f"{s.name} accumulates products into the bfloat16 array '{mac[0].array}': the C "
                "target would round the sum at every step; give it a float32 output (a GPU "
                "target accumulates in float32 and rounds once)")


def plan(model: PolyModel, target: CpuTarget, schedule: Any) -> Plan:
    """`schedule`: "auto", a `Schedule` or its dict form (the caller's, or the tuner's)."""
    _refuse_bf16_sums(model)
    model = isolate_gemms(model)
    if isinstance(schedule, Mapping):
        schedule = schedule_from(schedule)
    if isinstance(schedule, Schedule):
        # a compiled kernel's schedule, given back, carries its general scheduler's account:
        # made again for this compilation, never copied into the code's comment
        schedule = replace(schedule, notes=tuple(n for n in schedule.notes if n[0] != GENERAL_SCHEDULER_NOTE))
        chosen = resolve(model, schedule)
        # what the automatic fusion would make of this schedule, for `explain`: a given
        # schedule fuses exactly its own epilogues
        _, fusion = choose_fusion(model, replace(chosen, epilogues=()), target)
        decision = ScheduleDecision("given", "the schedule given by the caller; it fuses exactly "
                                    "its epilogues", fusion=tuple(fusion))
    elif schedule == "auto":
        choice = auto_schedule(model, target)
        chosen = choice.schedule
        if chosen.scheduler == AFFINE:
            reason = ("the main nest is no perfect, permutable one-statement nest: the general "
                      f"scheduler fuses, skews, tiles and parallelises it for {target.name}")
        elif choice.ranking:
            reason = (f"best of {len(choice.ranking)} candidates ranked by the data-reuse model "
                      f"for {target.name}")
        else:
            reason = "no tiled candidate is legal: the original loop order"
        decision = ScheduleDecision("auto", reason, choice.ranking, choice.fusion)
    else:
        raise PolyDLError(f"schedule must be 'auto', 'tuned' or a Schedule, not {schedule!r}")
    nest_plans = plan_nests(model, target, with_main=chosen.scheduler == AFFINE)
    return Plan(chosen, decision, fuse_feed(fuse_start(apply_schedule(model, chosen, nest_plans))))


def generate(model: PolyModel, plan: Plan, target: CpuTarget) -> GeneratedCode:
    return generate_c(plan.detail, target)


def load(
    code: GeneratedCode, nest: LoopNest, params: Mapping[str, int], schedule: Schedule,
    flops: int, reference: LazyReference, target: CpuTarget,
) -> Kernel:
    return Kernel(
        code=code, nest=nest, params=params, schedule=schedule, flops=flops,
        reference_impl=reference, library_path=build_shared_library(code),
        cannot_run=cannot_run_here(target),
    )


def checked(compilation: Compilation) -> Compilation:
    """The C schedule is the analytic ranking's or the tuner's: nothing is timed here."""
    return compilation
