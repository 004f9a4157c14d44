"""The TOML frontend: a primitive spec (`primitive = "conv2d"`, sizes, options) -> `LoopNest`.

Takes the TOML text, its file name and optional size overrides (`-p N=4`); returns the
`(LoopNest, params)` of the named builder in `primitives.PRIMITIVES`. Every error, TOML syntax
included, is a `SpecError` at the key or value it concerns.
"""

from __future__ import annotations

import inspect
import numbers
import re
from collections.abc import Callable, Mapping

from polydl.errors import ArgumentError, SourcePosition, SpecError
from polydl.frontends.builders import Built, target_options
from polydl.frontends.primitives import PRIMITIVES
from polydl.ir import LoopNest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

_TOML_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_TOML_AT_END = re.compile(r"\s*\(at end of document\)\s*$")
_KEY = re.compile(r"""^(\s*)(?:"([^"]*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*(?:\.[^=]*)?=\s*""")
_TABLE = re.compile(r"""^(\s*)\[\[?\s*(?:"([^"]*)"|'([^']*)'|([A-Za-z0-9_-]+))""")

# what a builder argument's default says about the TOML value it takes
_KINDS = {int: "an integer", str: "a string", tuple: "a list of strings", float: "a number"}


class _Locator:
    """Positions of the top-level keys and tables of a TOML text."""

    def __init__(self, text: str, filename: str) -> None:
        self.text = text
        self.filename = filename
        self.keys: dict[str, tuple[SourcePosition, SourcePosition]] = {}
        in_table = False
        for number, line in enumerate(text.splitlines(), start=1):
            table = _TABLE.match(line)
            if table is not None:
                in_table = True
                name = next(g for g in table.groups()[1:] if g is not None)
                where = SourcePosition(filename, number, len(table.group(1)) + 1)
                self.keys.setdefault(name, (where, where))
                continue
            key = _KEY.match(line)
            if key is not None and not in_table:
                name = next(g for g in key.groups()[1:] if g is not None)
                at_key = SourcePosition(filename, number, len(key.group(1)) + 1)
                at_value = SourcePosition(filename, number, key.end() + 1)
                self.keys.setdefault(name, (at_key, at_value))

    def key(self, name: str) -> SourcePosition | None:
        return self.keys[name][0] if name in self.keys else None

    def value(self, name: str) -> SourcePosition | None:
        return self.keys[name][1] if name in self.keys else None

    def error(self, message: str, position: SourcePosition | None) -> SpecError:
        if position is None:
            return SpecError(message, self.filename)
        return SpecError.at(message, position, self.text)


def _syntax_error(exc: tomllib.TOMLDecodeError, text: str, filename: str) -> SpecError:
    message = str(exc)
    match = _TOML_AT.search(message)
    if match is not None:
        line, column = int(match.group(1)), int(match.group(2))
        message = message[: match.start()]
    else:
        lines = text.splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
        message = _TOML_AT_END.sub("", message) + " (at end of file)"
    where = SourcePosition(filename, line, column)
    return SpecError.at(f"TOML syntax error: {message}", where, text)


def argument_kinds(builder: Callable[..., Built]) -> dict[str, tuple[type, bool]]:
    """Each argument of a builder: the Python type of its value and whether it is required."""
    out: dict[str, tuple[type, bool]] = {}
    for name, p in inspect.signature(builder).parameters.items():
        if p.default is inspect.Parameter.empty:
            out[name] = (int, True)
        else:
            out[name] = (tuple if isinstance(p.default, (tuple, list)) else type(p.default), False)
    return out


def _has_kind(value: object, kind: type) -> bool:
    if kind is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is tuple:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    return isinstance(value, kind)


def _describe(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
             list: "a list", dict: "a table"}
    return names.get(type(value), type(value).__name__)


def parse_toml(
    text: str, filename: str = "<spec>", overrides: Mapping[str, int] | None = None,
    target_kind: str | None = None,
) -> tuple[LoopNest, dict[str, int]]:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _syntax_error(exc, text, filename) from None
    where = _Locator(text, filename)

    primitive = document.get("primitive")
    if primitive is None:
        raise where.error(
            f"missing key 'primitive' (one of {', '.join(PRIMITIVES)})",
            SourcePosition(filename, 1, 1),
        )
    if not isinstance(primitive, str) or primitive not in PRIMITIVES:
        raise where.error(
            f"unknown primitive {primitive!r}; known primitives: {', '.join(PRIMITIVES)}",
            where.value("primitive"),
        )
    builder = PRIMITIVES[primitive]
    kinds = argument_kinds(builder)
    known = ", ".join(kinds)

    arguments: dict[str, object] = {}
    for key, value in document.items():
        if key == "primitive":
            continue
        if key not in kinds:
            raise where.error(
                f"unknown key '{key}' for primitive '{primitive}'; known keys: {known}",
                where.key(key),
            )
        kind = kinds[key][0]
        if not _has_kind(value, kind):
            raise where.error(
                f"'{key}' must be {_KINDS.get(kind, kind.__name__)}, not {_describe(value)}",
                where.value(key),
            )
        arguments[key] = tuple(value) if kind is tuple else value

    overridden = set()
    for key, value in (overrides or {}).items():
        if key not in kinds or kinds[key][0] is not int:
            sizes = ", ".join(k for k, (kind, _) in kinds.items() if kind is int)
            raise where.error(
                f"unknown size parameter {key!r} for primitive '{primitive}'; known: {sizes}",
                None,
            )
        if not _has_kind(value, int):
            raise where.error(f"size parameter '{key}' must be an integer, not {value!r}", None)
        arguments[key] = int(value)
        overridden.add(key)

    missing = [k for k, (_, required) in kinds.items() if required and k not in arguments]
    if missing:
        raise where.error(
            f"primitive '{primitive}' needs the size(s) {', '.join(missing)}; missing",
            where.key("primitive"),
        )
    for key, value in target_options(primitive, target_kind).items():
        arguments.setdefault(key, value)
    try:
        return builder(**arguments)
    except ArgumentError as exc:
        name = exc.argument
        position = None if name in overridden else where.value(name)
        raise where.error(
            f"{name} = {arguments.get(name)!r}: {exc.message}", position
        ) from None
    except SpecError as exc:  # sizes that make the built nest invalid (e.g. too large)
        raise where.error(
            f"these sizes make no valid '{primitive}': {exc.message}", where.key("primitive")
        ) from None
