"""What code generation hands to the runtime: one translation unit and its calling convention."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from polydl.dtypes import DTYPES
from polydl.errors import IndexRangeError
from polydl.ir import LoopNest
from polydl.names import spelling


@dataclass(frozen=True)
class KernelArgument:
    """One parameter of a kernel. `name` is what the caller sees (the keyword, messages, the
    header); `c_name` the generated code's name for it where that differs (a spec's `_y` is
    `_pd___y` inside: polydl.names)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    is_input: bool
    c_type: str
    c_name: str = ""

    @property
    def identifier(self) -> str:
        """The name in the generated code (and the IR)."""
        return self.c_name or self.name

    @property
    def spelling(self) -> str:
        """The name as the spec spells it."""
        return self.name if self.c_name else spelling(self.name)


@dataclass(frozen=True)
class EpiloguePlacement:
    """Where the epilogues fused into one nest run: as post-ops on the microkernel's
    accumulators, or as a loop after the call; and why."""

    epilogues: tuple[str, ...]  # statement names
    as_postops: bool
    reason: str
    where: str = ""  # a start (or a feeding copy) fused before the reduction: where it runs
    what: str = "start"

    def describe(self) -> str:
        if self.where:
            return f"{self.what} {', '.join(self.epilogues)} {self.where}: {self.reason}"
        where = "as post-ops in the microkernel" if self.as_postops else "after the call"
        return f"epilogue {', '.join(self.epilogues)} {where}: {self.reason}"


@dataclass(frozen=True)
class IndexCheck:
    """One check a kernel makes of the subscripts it reads from an index array: the values of
    `index_array` (plus `offset`) must select a cell of `array`'s dimension `dimension`. A
    kernel whose check number n fails returns n + 1 (`<function>_index_fault` gives the index
    array's flat position and value). Names are the generated code's (`polydl.names`)."""

    index_array: str
    index_shape: tuple[int, ...]
    array: str
    dimension: int
    extent: int
    offset: int
    # checked over the whole index array before the loops (nothing is written then); else
    # where each value is read (the kernel finishes its loops first)
    before_loops: bool

    def error(self, position: int, value: int) -> IndexRangeError:
        """The error for the flat `position` of the index array holding `value`."""
        where = tuple(int(p) for p in _unravel(position, self.index_shape))
        return IndexRangeError(self.index_array, where, value, self.array, self.dimension,
                               self.extent, self.offset)


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for extent in reversed(shape):
        out.append(flat % extent if extent else 0)
        flat //= extent if extent else 1
    return list(reversed(out))


@dataclass(frozen=True)
class GeneratedCode:
    function: str
    arguments: tuple[KernelArgument, ...]
    source: str
    header: str
    kind: str = "c"  # the backend: "c" | "cuda" | "hip"
    compile_flags: tuple[str, ...] = ()  # what the code itself needs (libraries, GPU archs)
    launcher: str = ""  # GPU targets: the host function that launches the kernels of `source`
    target_flags: tuple[str, ...] = ()  # C: what makes the compiler build for the target
    fallback_flags: tuple[str, ...] = ()  # C: the same ISA for a compiler that lacks its -march
    placements: tuple[EpiloguePlacement, ...] = ()  # where the fused epilogues run
    pointer_alignment: int = 1  # GPU: bytes every array's device address must be a multiple of
    # C: inputs whose packed copies the library keeps between calls; it then exports
    # `<function>_constants_changed()`
    kept: tuple[str, ...] = ()
    # C: the checks of subscripts read from index arrays, by number (`IndexCheck`); the
    # library then exports `<function>_index_fault`
    index_checks: tuple[IndexCheck, ...] = ()


def code_to_dict(code: GeneratedCode) -> dict[str, Any]:
    return asdict(code)


def code_from_dict(data: dict[str, Any]) -> GeneratedCode:
    return GeneratedCode(
        function=data["function"],
        arguments=tuple(
            KernelArgument(a["name"], a["dtype"], tuple(a["shape"]), a["is_input"], a["c_type"],
                           a.get("c_name", ""))
            for a in data["arguments"]
        ),
        source=data["source"],
        header=data["header"],
        kind=data["kind"],
        compile_flags=tuple(data["compile_flags"]),
        launcher=data.get("launcher", ""),
        target_flags=tuple(data.get("target_flags", ())),
        fallback_flags=tuple(data.get("fallback_flags", ())),
        placements=tuple(
            EpiloguePlacement(tuple(p["epilogues"]), p["as_postops"], p["reason"], p.get("where", ""))
            for p in data.get("placements", ())
        ),
        pointer_alignment=int(data.get("pointer_alignment", 1)),
        kept=tuple(data.get("kept", ())),
        index_checks=tuple(
            IndexCheck(c["index_array"], tuple(c["index_shape"]), c["array"], c["dimension"],
                       c["extent"], c["offset"], c["before_loops"])
            for c in data.get("index_checks", ())
        ),
    )


def kernel_arguments(nest: LoopNest, params: dict[str, int]) -> tuple[KernelArgument, ...]:
    """The kernel's parameters as callers see them: the spec's names, with the generated code's
    own where polydl respelled one (`polydl.names`)."""
    return tuple(
        KernelArgument(
            name=spelling(a.name),
            dtype=a.dtype,
            shape=a.concrete_shape(params),
            is_input=a.is_input,
            c_type=DTYPES[a.dtype].c_type,
            c_name=a.name if spelling(a.name) != a.name else "",
        )
        for a in nest.parameters
    )


def in_code(arguments: tuple[KernelArgument, ...]) -> tuple[KernelArgument, ...]:
    """The arguments under the names the generated code gives them."""
    return tuple(replace(a, name=a.identifier, c_name="") for a in arguments)

