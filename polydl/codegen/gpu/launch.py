"""What every GPU kernel generator returns and shares: a kernel's text with how the launcher
starts it (`KernelLaunch`), the kernels' array parameters, and template macros called from
Python where a C expression is built inside another (an epilogue's operand)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polydl.codegen.c_expr import ArrayLayout
from polydl.codegen.templating import environment
from polydl.poly.model import PolyModel


@dataclass(frozen=True)
class Pointer:
    """An array parameter: `[const ]c_type *name`."""

    name: str
    c_type: str
    is_input: bool


@dataclass(frozen=True)
class TensorMapSetup:
    """The launcher's encoding of one TMA tensor map `{kernel}_{operand}` of the array at
    `array` (+ `offset` elements where given)."""

    operand: str
    array: str
    offset: int | None
    extents: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    steps: tuple[int, ...]
    float32: bool  # else bf16

    @property
    def rank(self) -> int:
        return len(self.extents)


@dataclass(frozen=True)
class KernelLaunch:
    """A kernel's text and how the launcher starts it."""

    text: str
    grid: tuple[int, ...]
    block: int
    shared_bytes: int
    tensor_maps: tuple[TensorMapSetup, ...] = ()  # encoded before the launch, passed after the arrays
    # a persistent grid: min(multiprocessors x `blocks_per_sm`, tiles) blocks (`grid` unused)
    persistent_tiles: int | None = None
    blocks_per_sm: int = 1
    alignment: int = 1  # bytes the operands' device addresses must be a multiple of
    # the whole L1 as shared memory, for several blocks' worth of it on a multiprocessor
    shared_carveout: bool = False


def kernel_pointers(model: PolyModel) -> list[Pointer]:
    """The kernels' array parameters, every array of the nest."""
    return [Pointer(a.name, ArrayLayout(a.name, a.dtype, ()).c_type, a.is_input) for a in model.nest.arrays]


def macro(template: str, name: str) -> Callable[..., str]:
    """Macro `name` of `template`, to render a piece of C inside text Python builds."""
    module = environment().get_template(template).module
    function: Callable[..., str] = getattr(module, name)
    return lambda *args, **kwargs: str(function(*args, **kwargs))
