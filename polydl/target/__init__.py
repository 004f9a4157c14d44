"""Targets: what code is generated for, as values passed down the whole pipeline.

A target is a `CpuTarget` (the C backend) or a `GpuTarget` (CUDA, HIP). `resolve_target` turns
what a user names (`machine="native"`, a preset, a `polydl machine --json` file, a value) into
one, at the API boundary; nothing below it asks the running machine.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from polydl.errors import TargetError
from polydl.target.cpu import ISAS, CpuTarget
from polydl.target.gpu import DEFAULT_GPUS, GPU_KINDS, GpuTarget
from polydl.target.host import host_target
from polydl.target.presets import CPU_PRESETS, GPU_PRESETS, NATIVE, PRESET_NAMES

Target = CpuTarget | GpuTarget
MachineArg = str | os.PathLike[str] | CpuTarget | GpuTarget | None
KINDS = ("c", *GPU_KINDS)

__all__ = [
    "CPU_PRESETS",
    "GPU_PRESETS",
    "ISAS",
    "KINDS",
    "PRESET_NAMES",
    "CpuTarget",
    "GpuTarget",
    "MachineArg",
    "Target",
    "host_target",
    "load_target",
    "resolve_target",
    "target_from_dict",
]


def target_from_dict(data: Any, source: str = "") -> Target:
    """A target from its JSON form (`to_dict()`): `"kind"` says which."""
    if not isinstance(data, dict):
        raise TargetError("a target description is a JSON object", source)
    kind = data.get("kind", "c")
    if kind == "c":
        return CpuTarget.from_dict(data, source)
    if kind in GPU_KINDS:
        return GpuTarget.from_dict(data, source)
    raise TargetError(f"unknown target kind {kind!r}; known: {', '.join(KINDS)}", source)


def load_target(path: str | os.PathLike[str]) -> Target:
    """A target from a JSON file (as `polydl machine --json` writes)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise TargetError(f"cannot read the target description: {exc.strerror or exc}",
                          str(path)) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise TargetError(f"not JSON: {exc}", str(path)) from None
    target = target_from_dict(data, str(path))
    if target.name == NATIVE:  # saved by `polydl machine --json`: named after its file here
        target = replace(target, name=Path(path).stem)
    return target


def resolve_target(kind: str = "c", machine: MachineArg = None) -> Target:
    """The target for backend `kind` ("c", "cuda", "hip") described by `machine`: None or
    "native" (this machine; a GPU kind's default description), a preset name, a path to a JSON
    description, or a target value."""
    if kind not in KINDS:
        raise TargetError(f"unknown target '{kind}'; available: {', '.join(KINDS)}")
    target = _described(kind, machine)
    if target.kind != kind:
        raise TargetError(f"machine '{getattr(target, 'name', machine)}' describes a "
                          f"{target.kind} target, not {kind}")
    return target


def _described(kind: str, machine: MachineArg) -> Target:
    if isinstance(machine, CpuTarget | GpuTarget):
        return machine
    if machine is None or machine == NATIVE:
        return host_target() if kind == "c" else DEFAULT_GPUS[kind]
    if isinstance(machine, str) and machine in CPU_PRESETS:
        return CPU_PRESETS[machine]
    if isinstance(machine, str) and machine in GPU_PRESETS:
        return GPU_PRESETS[machine]
    if isinstance(machine, str | os.PathLike):
        path = Path(machine)
        if path.suffix == ".json" or path.exists():
            return load_target(path)
        raise TargetError(f"unknown machine {str(machine)!r}: a preset "
                          f"({', '.join(PRESET_NAMES)}) or a JSON file from `polydl machine --json`")
    raise TargetError(f"machine must be a preset name, a JSON path or a target, not {machine!r}")
