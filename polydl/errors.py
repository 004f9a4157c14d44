"""Errors raised by polydl: one root class, structured fields, compiler-style messages."""

from __future__ import annotations

from dataclasses import dataclass

from polydl.names import respell


class PolyDLError(Exception):
    """Root of every error polydl raises on purpose."""


@dataclass(frozen=True)
class SourcePosition:
    """A place in a spec: 1-based line and column."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


# The most errors one spec reports, as C compilers stop after a number of them: past this the
# rest are mostly consequences of the first.
MAX_SPEC_ERRORS = 20


class SpecError(PolyDLError):
    """A spec that polydl cannot accept, with the position of the offending construct.

    One error may stand for several found in the same spec: `errors` holds each (the first
    gives this error's own fields), and `left_out` says whether reading stopped with more to
    find. A single error is its own only entry."""

    def __init__(
        self,
        message: str,
        file: str = "<spec>",
        line: int = 0,
        column: int = 0,
        source_line: str | None = None,
        *,
        errors: tuple[SpecError, ...] = (),
        left_out: bool = False,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.source_line = source_line
        self.errors: tuple[SpecError, ...] = errors or (self,)
        self.left_out = left_out
        super().__init__(self.render())

    @classmethod
    def at(cls, message: str, position: SourcePosition | None, source: str | None = None) -> SpecError:
        if position is None:
            return cls(message)
        source_line = None
        if source is not None and position.line > 0:
            lines = source.splitlines()
            if position.line <= len(lines):
                source_line = lines[position.line - 1]
        return cls(message, position.file, position.line, position.column, source_line)

    @classmethod
    def several(cls, errors: list[SpecError] | tuple[SpecError, ...], left_out: bool = False) -> SpecError:
        """One error for all of `errors` (each a single error), in the order found."""
        if len(errors) == 1 and not left_out:
            return errors[0]
        first = errors[0]
        return cls(first.message, first.file, first.line, first.column, first.source_line,
                   errors=tuple(errors), left_out=left_out)

    def render(self, prefix: str = "") -> str:
        """Each error as a C compiler shows it: `file:line:col: error: message`, then its source
        line and a caret under the column; `prefix` goes before each error's first line (the
        command line's `polydl: `). The message of this exception is `render()`."""
        lines = [line for e in self.errors for line in e._lines(prefix)]
        if self.left_out:
            lines.append(f"{prefix}{self.file}: note: stopped after {len(self.errors)} errors; "
                         "the rest were left out")
        return "\n".join(lines)

    def _lines(self, prefix: str) -> list[str]:
        where = f"{self.file}:{self.line}:{self.column}: " if self.line else f"{self.file}: "
        lines = [f"{prefix}{where}error: {self.message}"]
        if self.source_line is not None:
            lines += [f"  {self.source_line}", "  " + " " * max(self.column - 1, 0) + "^"]
        return lines


class ErrorCollector:
    """The errors of one spec so far: reading goes on after each, and stops (raising them all)
    at the `MAX_SPEC_ERRORS + 1`-th."""

    def __init__(self, limit: int = MAX_SPEC_ERRORS) -> None:
        self.limit = limit
        self.found: list[SpecError] = []

    def add(self, error: SpecError) -> None:
        for single in error.errors:
            if len(self.found) == self.limit:
                raise SpecError.several(self.found, left_out=True)
            self.found.append(single)
        if error.left_out:
            raise SpecError.several(self.found, left_out=True)

    def raise_if_any(self) -> None:
        if self.found:
            raise SpecError.several(self.found)


class UsageError(PolyDLError):
    """A malformed command line that argparse cannot see (`-p M` without `=VALUE`); the command
    line exits with status 2 for it, as for argparse's own errors. An option that does not
    apply to the spec given is a polydl error (status 1), as an unknown size is."""


class ArgumentError(PolyDLError):
    """A builder argument of the wrong type or out of range (no source text to point into)."""

    def __init__(self, argument: str, message: str) -> None:
        self.argument = argument
        self.message = message
        super().__init__(f"argument '{argument}': {message}")


class ShapeError(PolyDLError):
    """A kernel call whose argument does not match what the kernel was compiled for. Names
    are the spec's spelling (`polydl.names`), whatever the generated code calls them."""

    def __init__(
        self,
        array: str,
        message: str,
        expected: object = None,
        given: object = None,
    ) -> None:
        array, message = respell(array), respell(message)
        if isinstance(expected, str):
            expected = respell(expected)
        if isinstance(given, str):
            given = respell(given)
        self.array = array
        self.message = message
        self.expected = expected
        self.given = given
        detail = ""
        if expected is not None or given is not None:
            detail = f" (expected {expected}, got {given})"
        super().__init__(f"argument '{array}': {message}{detail}")


_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


class IndexRangeError(PolyDLError, IndexError):
    """A subscript read from an index array (`emb[tok[i]][j]`) that falls outside the
    dimension it selects: the kernel (or the reference) stopped instead of reading or writing
    outside the array. Names are the spec's spelling.

    `index_array` and `position` (a tuple, one entry per dimension) say which element held
    `value`; `array`, `dimension` (0-based) and `extent` which dimension it selects in, after
    adding `offset` (the constant of `x[idx[k] + 1]`)."""

    def __init__(self, index_array: str, position: tuple[int, ...], value: int, array: str,
                 dimension: int, extent: int, offset: int = 0) -> None:
        self.index_array, self.array = respell(index_array), respell(array)
        self.position, self.value, self.offset = tuple(position), value, offset
        self.dimension, self.extent = dimension, extent
        cell = f"{self.index_array}[{']['.join(map(str, self.position))}]"
        shifted = f" (+ {offset} = {value + offset})" if offset > 0 else (
            f" (- {-offset} = {value + offset})" if offset < 0 else "")
        which = (f"{_ORDINALS[dimension]} dimension" if dimension < len(_ORDINALS)
                 else f"dimension {dimension}")
        super().__init__(f"{cell} = {value}{shifted} is outside {self.array}'s {which} "
                         f"(0..{extent - 1})")


class CompileError(PolyDLError):
    """The native compiler failed or is missing."""

    def __init__(self, compiler: str, command: list[str] | str, output: str) -> None:
        self.compiler = compiler
        self.command = command if isinstance(command, str) else " ".join(command)
        self.output = output
        first = output.strip().splitlines()[:20]
        super().__init__(
            f"{compiler} failed\n  command: {self.command}\n" + "\n".join("  " + ln for ln in first)
        )


class ScheduleError(PolyDLError):
    """A schedule that is illegal for the loop nest (it would violate a dependence) or malformed."""


class PolyDLWarning(UserWarning):
    """Root of the warnings polydl gives when it falls back to a documented alternative."""


class CacheWarning(PolyDLWarning):
    """The compile cache could not be used as configured (read-only, full, corrupted entry)."""


class ToolchainWarning(PolyDLWarning):
    """The C compiler lacks something polydl asked for (e.g. OpenMP); kernels still build."""


class TargetError(PolyDLError):
    """A target description polydl cannot use: an unknown preset, a malformed or unsafe
    `polydl machine --json` file, or a kernel built for a CPU this one cannot run."""

    def __init__(self, message: str, source: str = "") -> None:
        self.message = message
        self.source = source  # the preset name or file the description came from
        super().__init__(f"{source}: {message}" if source else message)


class UnsupportedOperator(PolyDLError):
    """A network node polydl cannot compile: an operator it does not know, or an attribute
    value it does not handle. Names the node, its operator and what is supported."""

    def __init__(self, node: str, op: str, reason: str = "", supported: tuple[str, ...] = ()) -> None:
        self.node = node
        self.op = op
        self.reason = reason
        self.supported = supported
        text = f"node '{node}' ({op}): " + (reason or f"polydl does not support the operator {op}")
        if supported:
            text += f"; supported operators: {', '.join(supported)}"
        super().__init__(text)
