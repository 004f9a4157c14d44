"""What code generation hands to the runtime: one translation unit and its calling convention."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelArgument:
    name: str
    dtype: str
    shape: tuple[int, ...]
    is_input: bool
    c_type: str


@dataclass(frozen=True)
class GeneratedCode:
    function: str
    arguments: tuple[KernelArgument, ...]
    source: str
    header: str
    target: str = "c"
    compile_flags: tuple[str, ...] = ()
