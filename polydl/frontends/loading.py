"""Load a spec, a `.c`/`.toml` file or the text itself, and bind its size parameters.

Takes the spec and the size values given by the caller; returns `(LoopNest, params)` with
params in declaration order, every size bound to an int >= 1 and every array extent >= 1.
"""

from __future__ import annotations

import numbers
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from polydl.errors import ErrorCollector, SpecError
from polydl.frontends.c_loopnest import CSpec, read_c
from polydl.frontends.c_preprocess import preprocessing
from polydl.frontends.c_source import check_size
from polydl.frontends.toml_spec import parse_toml
from polydl.ir import LoopNest, eval_int
from polydl.names import internal_name, respell

_TOML_SPEC = re.compile(r"""^\s*primitive\s*=\s*["']""", re.MULTILINE)


def read_spec(spec: str | os.PathLike[str]) -> tuple[str, str, str]:
    """The spec's text, file name and kind ("c" or "toml")."""
    if isinstance(spec, str) and ("\n" in spec or "{" in spec or "=" in spec):
        return spec, "<spec>", "toml" if _TOML_SPEC.search(spec) else "c"
    if not isinstance(spec, (str, os.PathLike)):
        raise SpecError(f"a spec is a path or the text of a spec, not {type(spec).__name__}")
    path = Path(spec)
    name = os.fspath(spec)
    if not path.exists():
        raise SpecError(f"no such file: {name}", name)
    if not path.is_file():
        raise SpecError(f"not a file: {name}", name)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read the spec: {exc}", name) from None
    if path.suffix == ".toml":
        kind = "toml"
    elif path.suffix in (".c", ".h"):
        kind = "c"
    else:
        kind = "toml" if _TOML_SPEC.search(text) else "c"
    return text, name, kind


def bind_sizes(spec: CSpec, params: Mapping[str, int] | None) -> dict[str, int]:
    """Check the caller's sizes (named as the spec spells them) against the spec's size
    parameters and its array extents; returns them by their IR names (`polydl.names`)."""
    nest = spec.nest
    given = dict(params or {})
    known = list(spec.size_positions)
    unknown = [k for k in given if k not in spec.size_positions]
    if unknown:
        raise SpecError(
            f"unknown size parameter(s) {', '.join(map(repr, unknown))}; '{nest.name}' has "
            + (", ".join(known) if known else "no size parameters"),
            nest.filename,
        )
    bound: dict[str, int] = {}
    errors = ErrorCollector()
    for name, position in spec.size_positions.items():
        if name not in given:
            errors.add(nest.error_at(
                f"missing value for size parameter '{name}' (give it in params, or -p {name}=...)",
                position
            ))
            continue
        value = given[name]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            errors.add(nest.error_at(
                f"size parameter '{name}' must be an integer, not {value!r}", position
            ))
        elif value < 1:
            errors.add(nest.error_at(
                f"size parameter '{name}' must be >= 1, not {value}", position
            ))
        else:
            bound[internal_name(name)] = int(value)
    errors.raise_if_any()
    for array in nest.arrays:
        for dim, extent in enumerate(array.shape):
            value = eval_int(extent, bound)
            if value < 1:
                raise nest.error_at(
                    respell(f"dimension {dim + 1} of array '{array.name}' has extent "
                            f"{extent.to_c()} = {value}; every extent must be >= 1"),
                    array.position
                )
    return bound


def load_spec(
    spec: str | os.PathLike[str], params: Mapping[str, int] | None = None,
    function: str | None = None,
    defines: Mapping[str, object] | Iterable[str] | None = None,
    include_dirs: Iterable[str | os.PathLike[str]] | None = None,
    target_kind: str | None = None,
) -> tuple[LoopNest, dict[str, int]]:
    """A `.c` or `.toml` spec (a path or the text itself) as a loop nest and its bound sizes;
    `function` picks the kernel of a C file where several functions could be one (by default
    the one no other function calls; the others are helpers, inlined); `defines` and
    `include_dirs` are the C preprocessor's macros and header folders (`-D`, `-I`);
    `target_kind` the kind of target it is built for (a TOML primitive's form may follow it:
    `builders.target_options`)."""
    text, filename, kind = read_spec(spec)
    check_size(text, filename)
    if kind == "toml":
        if function is not None:
            raise SpecError(f"function='{function}' chooses a function of a C spec; "
                            "a TOML spec names a primitive", filename)
        if defines or include_dirs:
            raise SpecError("defines and include_dirs are for the C preprocessor; a TOML spec "
                            "names a primitive", filename)
        return parse_toml(text, filename, params, target_kind)
    base_dir = None if filename == "<spec>" else str(Path(filename).resolve().parent)
    options = preprocessing(defines, include_dirs, base_dir)
    parsed = read_c(text, filename, function, options)
    return parsed.nest, bind_sizes(parsed, params)
