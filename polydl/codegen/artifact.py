"""What code generation hands to the runtime: one translation unit and its calling convention."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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
    launcher: str = ""  # GPU targets: the host function that launches the kernels of `source`


def code_to_dict(code: GeneratedCode) -> dict[str, Any]:
    return asdict(code)


def code_from_dict(data: dict[str, Any]) -> GeneratedCode:
    return GeneratedCode(
        function=data["function"],
        arguments=tuple(
            KernelArgument(a["name"], a["dtype"], tuple(a["shape"]), a["is_input"], a["c_type"])
            for a in data["arguments"]
        ),
        source=data["source"],
        header=data["header"],
        target=data["target"],
        compile_flags=tuple(data["compile_flags"]),
        launcher=data.get("launcher", ""),
    )
