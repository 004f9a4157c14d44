"""One driver for every backend: a loop nest, its sizes, a target and a schedule request in; a
`Compilation` or a callable kernel out.

Takes a resolved target value (see `polydl.target.resolve_target`); nothing here asks the
running machine. Each backend (`BACKENDS`, by target kind) plans, generates and loads; a
`schedule="tuned"` request is answered by the tuner first, so backends only see "auto" or a
`Schedule`. Lowerings whose schedule round-trips through JSON are stored in the compile cache,
keyed by everything the generated code depends on, the target included.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from polydl.codegen.artifact import GeneratedCode, code_from_dict, code_to_dict
from polydl.driver import c_backend, gpu_backend
from polydl.driver.backend import Backend, Plan
from polydl.driver.compilation import Compilation
from polydl.driver.reference import LazyReference
from polydl.errors import PolyDLError
from polydl.ir import LoopNest, fingerprint
from polydl.poly.model import PolyModel, build_model
from polydl.runtime.cache import compiler_revision, content_key, read_lowering, write_lowering
from polydl.runtime.kernel import CompiledKernel
from polydl.schedules.schedule import Schedule
from polydl.target import Target
from polydl.tuning.lookup import tuned_schedule
from polydl.version import __version__

BACKENDS: dict[str, Backend] = {
    "c": c_backend,  # a module with the backend's functions
    "cuda": gpu_backend.CUDA,
    "hip": gpu_backend.HIP,
}


def backend_for(target: Target) -> Backend:
    return BACKENDS[target.kind]


def _plan(model: PolyModel, target: Target, schedule: Any) -> Plan:
    backend = backend_for(target)
    if isinstance(schedule, str) and schedule == "tuned":
        if target.kind != "c":
            raise PolyDLError(f"target '{target.kind}' takes schedule='auto' only, not 'tuned'")
        choice = tuned_schedule(model, target)  # type: ignore[arg-type]
        plan = backend.plan(model, target, choice.schedule)
        reason = f"the {choice.decided_by} decided: {choice.reason}"
        return replace(plan, decision=replace(plan.decision, source="tuned", reason=reason))
    return backend.plan(model, target, schedule)


def lower(nest: LoopNest, params: Mapping[str, int], target: Target, schedule: Any = "auto") -> Compilation:
    """Run the compiler up to generated source (no native compile)."""
    backend = backend_for(target)
    model = build_model(nest, dict(params))
    plan = _plan(model, target, schedule)
    code = backend.generate(model, plan, target)
    return Compilation(model, target, plan.schedule, code, plan.decision, plan.detail)


def kernel_from(compilation: Compilation) -> CompiledKernel:
    model = compilation.model
    return backend_for(compilation.target).load(
        compilation.code, model.nest, model.params, compilation.schedule, compilation.flops,
        LazyReference(model.nest, model.params, model), compilation.target,
    )


def lowering_key(
    nest: LoopNest, params: Mapping[str, int], target: Target, schedule: Any
) -> str | None:
    """Everything the generated code depends on; None where it depends on mutable state or
    the backend cannot store its lowerings."""
    if not backend_for(target).stores_lowerings:
        return None
    if isinstance(schedule, Schedule):
        chosen = schedule.to_json()
    elif isinstance(schedule, Mapping):
        chosen = c_backend.schedule_from(schedule).to_json()
    elif schedule == "auto":
        chosen = "auto"
    else:  # "tuned" reads the tuning database, which changes under us
        return None
    return content_key(
        [__version__, compiler_revision(), fingerprint(nest),
         json.dumps(dict(params), sort_keys=True), target.kind, chosen, target.key()]
    )


def stored_lowering(
    nest: LoopNest, params: Mapping[str, int], target: Target, schedule: Any = "auto"
) -> tuple[GeneratedCode, Any, int] | None:
    """(code, schedule, flops) of the stored lowering of a nest, if the cache holds one."""
    key = lowering_key(nest, params, target, schedule)
    record = read_lowering(key) if key else None
    if record is None:
        return None
    try:
        return (code_from_dict(record["code"]),
                backend_for(target).schedule_from_dict(record["schedule"]), int(record["flops"]))
    except (KeyError, TypeError, ValueError, PolyDLError):
        return None  # an entry from an older layout: lower again and overwrite it


def lower_and_store(
    nest: LoopNest, params: Mapping[str, int], target: Target, schedule: Any = "auto",
    timed: bool = False,
) -> Compilation:
    """`lower` (with the choices this machine can time made by timing, where `timed`), then
    store the lowering where the schedule allows."""
    compilation = lower(nest, params, target, schedule)
    if timed:
        compilation = backend_for(target).checked(compilation)
    key = lowering_key(nest, params, target, schedule)
    if key:
        write_lowering(key, {
            "code": code_to_dict(compilation.code),
            "schedule": compilation.schedule.to_dict(),
            "flops": compilation.flops,
        })
    return compilation


def generated_code(
    nest: LoopNest, params: Mapping[str, int], target: Target, schedule: Any = "auto"
) -> GeneratedCode:
    """The generated code of a nest, from the stored lowering or lowered now (and stored)."""
    stored = stored_lowering(nest, params, target, schedule)
    if stored is not None:
        return stored[0]
    return lower_and_store(nest, params, target, schedule).code


def build_kernel(
    nest: LoopNest, params: Mapping[str, int], target: Target, schedule: Any = "auto"
) -> CompiledKernel:
    """Lower (or reuse the stored lowering of) a nest and return its compiled kernel."""
    stored = stored_lowering(nest, params, target, schedule)
    if stored is not None:
        code, chosen, flops = stored
        return backend_for(target).load(code, nest, params, chosen, flops,
                                        LazyReference(nest, params), target)
    return kernel_from(lower_and_store(nest, params, target, schedule, timed=True))
