"""Errors raised by polydl: one root class, structured fields, compiler-style messages."""

from __future__ import annotations

from dataclasses import dataclass


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


class SpecError(PolyDLError):
    """A spec that polydl cannot accept, with the position of the offending construct."""

    def __init__(
        self,
        message: str,
        file: str = "<spec>",
        line: int = 0,
        column: int = 0,
        source_line: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.source_line = source_line
        super().__init__(self._render())

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

    def _render(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}: " if self.line else f"{self.file}: "
        text = f"{where}error: {self.message}"
        if self.source_line is not None:
            caret = " " * max(self.column - 1, 0) + "^"
            text += f"\n  {self.source_line}\n  {caret}"
        return text


class ArgumentError(PolyDLError):
    """A builder argument of the wrong type or out of range (no source text to point into)."""

    def __init__(self, argument: str, message: str) -> None:
        self.argument = argument
        self.message = message
        super().__init__(f"argument '{argument}': {message}")


class ShapeError(PolyDLError):
    """A kernel call whose argument does not match what the kernel was compiled for."""

    def __init__(
        self,
        array: str,
        message: str,
        expected: object = None,
        given: object = None,
    ) -> None:
        self.array = array
        self.message = message
        self.expected = expected
        self.given = given
        detail = ""
        if expected is not None or given is not None:
            detail = f" (expected {expected}, got {given})"
        super().__init__(f"argument '{array}': {message}{detail}")


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
