"""Writing the C text of a built-in primitive: validated arguments, declarations, loop nests,
fused epilogues, and the parse of the finished text (`Built` = `(LoopNest, params)`).

The builders (`builders`, `conv_backward`, `layers`) write a primitive's spec as C and parse
it with `read_c`, so a builder and the same hand-written spec give the same IR.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Sequence
from dataclasses import replace

from polydl.errors import ArgumentError
from polydl.frontends.c_loopnest import read_c
from polydl.ir import LoopNest

Built = tuple[LoopNest, dict[str, int]]
Loops = Sequence[tuple[str, int | str, int | str]]

EPILOGUES = ("bias", "relu", "residual", "scale_shift", "clip(LO,HI)")
# "clip(LO,HI)": ONNX Clip, ReLU6 as clip(0,6); LO and HI are finite decimal numbers
_CLIP = re.compile(r"\s*clip\s*\((.*)\)\s*", re.DOTALL)
_NUMBER = re.compile(r"\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*")
# Beyond this, 64-bit index arithmetic overflows (poly/index_range.py).
MAX_SIZE = 2**62


def integer_arg(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentError(name, f"must be an integer, not {type(value).__name__} {value!r}")
    if value < minimum:
        raise ArgumentError(name, f"must be >= {minimum}, not {value}")
    if int(value) > MAX_SIZE:
        raise ArgumentError(name, f"must be <= {MAX_SIZE} (2**62), not {value}")
    return int(value)


def choice_arg(name: str, value: object, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ArgumentError(name, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def clip_bounds(name: str) -> tuple[float, float] | None:
    """(LO, HI) of a "clip(LO,HI)" epilogue, None for a name of another kind; `ArgumentError`
    (of `fuse`) where the bounds are not two finite numbers with LO <= HI."""
    match = _CLIP.fullmatch(name)
    if match is None:
        return None
    parts = match.group(1).split(",")
    if len(parts) != 2 or not all(_NUMBER.fullmatch(p) for p in parts):
        raise ArgumentError(
            "fuse", f"{name!r}: clip takes two numbers, as in 'clip(0,6)' (clip(LO,HI))"
        )
    lo, hi = (float(p) for p in parts)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ArgumentError("fuse", f"{name!r}: the clip bounds must be finite")
    if lo > hi:
        raise ArgumentError("fuse", f"{name!r}: the lower bound {lo!r} exceeds the upper {hi!r}")
    return lo, hi


def _epilogue_kind(item: object) -> str:
    if isinstance(item, str) and clip_bounds(item) is not None:
        return "clip"
    return choice_arg("fuse", item, EPILOGUES)


def epilogue_names(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise ArgumentError(
            "fuse", f"must be a list of epilogue names ({', '.join(EPILOGUES)}); got {value!r}"
        )
    out: list[str] = []
    kinds: list[str] = []
    for item in value:
        kind = _epilogue_kind(item)
        if kind in kinds:
            raise ArgumentError("fuse", f"'{kind}' is given twice")
        kinds.append(kind)
        out.append(item)
    return tuple(out)


def float_literal(value: float, ctype: str) -> str:
    """A C literal of `value` in `ctype` ("float" or "double")."""
    text = repr(float(value))
    return text + "f" if ctype == "float" else text


def nest(loops: Loops, body: str) -> str:
    """A perfect nest of `for (int v = lo; v < hi; v++)` around one statement."""
    lines = [
        "  " * (depth + 1) + f"for (int {var} = {lo}; {var} < {hi}; {var}++)"
        for depth, (var, lo, hi) in enumerate(loops)
    ]
    lines.append("  " * (len(loops) + 1) + body)
    return "\n".join(lines)


def zero_based(*loops: tuple[str, int | str]) -> list[tuple[str, int | str, int | str]]:
    return [(var, 0, extent) for var, extent in loops]


def zero_based_nest(loops: Sequence[tuple[str, int | str]], body: str) -> str:
    """A perfect nest of `for (int v = 0; v < extent; v++)` around one statement."""
    return nest(zero_based(*loops), body)


def declaration(ctype: str, name: str, shape: Sequence[str], is_input: bool) -> str:
    return ("const " if is_input else "") + f"{ctype} {name}" + "".join(f"[{e}]" for e in shape)


def function_text(
    name: str, sizes: Sequence[str], arrays: Sequence[str], nests: Sequence[str]
) -> str:
    params = ",\n    ".join([", ".join(f"int {s}" for s in sizes), *arrays])
    return f"void {name}({params}) {{\n" + "\n".join(nests) + "\n}\n"


def parse_built(name: str, text: str, sizes: dict[str, int], local: Sequence[str] = (),
                filled: Sequence[str] = ()) -> Built:
    """Parse a builder's text; `local` names its scratch arrays (no caller sees them), `filled`
    those of them its nests write in full before reading (not cleared on each call)."""
    parsed = read_c(text, f"<{name}>").nest
    arrays = tuple(replace(a, local=True, filled=a.name in filled) if a.name in local else a
                   for a in parsed.arrays)
    return replace(parsed, arrays=arrays), sizes


def padded_copy(loops: Sequence[tuple[str, int | str]], target: str, source: str,
                shifts: Sequence[tuple[str, int, int | str]], zero: str) -> str:
    """A nest that writes every cell of a zero-padded copy: `loops` run over the padded array,
    `target`/`source` are its and the input's subscripted names with "{v}" standing for each
    padded variable v of `shifts` (v, the padding before it, the input's extent along it)
    shifted into the input. Cells inside take the input, the border `zero`: one pass over the
    copy, no clearing of it before."""
    inside = " && ".join(
        part for v, before, extent in shifts
        for part in ((f"{v} >= {before}", f"{v} < {extent} + {before}") if before
                     else (f"{v} < {extent}",)))
    moved = {v: (f"{v} - {before}" if before else v) for v, before, _ in shifts}
    copy = f"{target} = {source.format(**moved)};"
    if not inside:
        return zero_based_nest(loops, copy)
    return zero_based_nest(loops, f"if ({inside}) {copy} else {target} = {zero};")


def epilogue_nests(
    epilogues: Sequence[str],
    ctype: str,
    out_loops: Sequence[tuple[str, int | str]],
    out: tuple[str, Sequence[str]],
    channel: tuple[str, Sequence[str]],
) -> tuple[list[str], list[str]]:
    """(declarations, nests) of the epilogue chain applied to an output, element by element.

    `out` is (subscript, shape) of the output `y`; `channel` is (subscript, shape) of the
    per-channel operands (bias, scale, shift). Each nest is separate: the scheduler decides
    whether it runs inside the producer's loops (schedules/fusion.py)."""
    (at, shape), (ch, ch_shape) = out, channel
    zero = float_literal(0.0, ctype)
    arrays: list[str] = []
    nests: list[str] = []
    for epilogue in epilogues:
        bounds = clip_bounds(epilogue)
        if bounds is not None:
            # selects, as relu: NaN stays NaN (as ONNX Clip and torch.clamp give it)
            lo, hi = (float_literal(v, ctype) for v in bounds)
            body = f"y{at} = y{at} < {lo} ? {lo} : (y{at} > {hi} ? {hi} : y{at});"
        elif epilogue == "bias":
            arrays.append(declaration(ctype, "b", ch_shape, True))
            body = f"y{at} += b{ch};"
        elif epilogue == "relu":
            # a select, not fmaxf: the C compiler vectorises it to a max without -ffast-math
            body = f"y{at} = y{at} > {zero} ? y{at} : {zero};"
        elif epilogue == "scale_shift":
            # batch-norm in inference, folded per channel: y = y * scale + shift
            arrays.append(declaration(ctype, "scale", ch_shape, True))
            arrays.append(declaration(ctype, "shift", ch_shape, True))
            body = f"y{at} = y{at} * scale{ch} + shift{ch};"
        elif epilogue == "residual":
            arrays.append(declaration(ctype, "res", shape, True))
            body = f"y{at} += res{at};"
        else:
            raise ArgumentError("fuse", f"unknown epilogue {epilogue!r}")
        nests.append(zero_based_nest(out_loops, body))
    return arrays, nests
