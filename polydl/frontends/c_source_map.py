"""Where each line and column of the text the C parser reads came from.

Takes, for the preprocessed text, the origin (file, line) of each of its lines and the original
texts; returns positions in the user's own files. The preprocessor keeps lines (its line
markers say where each came from) but not columns: it collapses white space, drops comments and
expands macros. Columns are recovered by matching the tokens of a parsed line with those of its
original line: a token outside every expansion keeps its exact column, and one that a macro
produced takes the column of the macro's name. Without preprocessing the map is the identity.
"""

from __future__ import annotations

import difflib
import re
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field

from polydl.errors import SourcePosition, SpecError

# C tokens as far as positions need them: names, pp-numbers, literals, punctuators.
_TOKEN = re.compile(
    r"""[A-Za-z_]\w*
      | \.?\d(?:[eEpP][+-]|[\w.])*
      | "(?:[^"\\\n]|\\.)*"? | '(?:[^'\\\n]|\\.)*'?
      | \.\.\.|<<=|>>=|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^]=|\#\#
      | \S""",
    re.VERBOSE,
)


def tokens(line: str) -> list[tuple[int, str]]:
    """(1-based column, text) of each token of one line."""
    return [(m.start() + 1, m.group()) for m in _TOKEN.finditer(line)]


@dataclass(frozen=True)
class LineOrigin:
    """Where one parsed line came from. `columns`: (parsed column, original column, exact) at
    each token start, sorted; None where the columns are the original ones."""

    file: str
    line: int
    columns: tuple[tuple[int, int, bool], ...] | None = None


def align(original: str, parsed: str) -> tuple[tuple[int, int, bool], ...] | None:
    """The column correspondence of a parsed line and the original line it came from."""
    if original == parsed:
        return None
    before, after = tokens(original), tokens(parsed)
    matcher = difflib.SequenceMatcher(None, [t for _, t in before], [t for _, t in after],
                                      autojunk=False)
    out: list[tuple[int, int, bool]] = []
    for tag, i1, _, j1, j2 in matcher.get_opcodes():
        for k in range(j1, j2):
            if tag == "equal":
                out.append((after[k][0], before[i1 + k - j1][0], True))
            else:  # what an expansion produced points at the name expanded
                anchor = before[i1][0] if i1 < len(before) else (before[-1][0] if before else 1)
                out.append((after[k][0], anchor, False))
    return tuple(out)


@dataclass(frozen=True)
class SourceMap:
    """Positions in the parsed text -> positions in the user's files."""

    filename: str  # the spec's file
    texts: Mapping[str, str | None] = field(compare=False)  # each file's original text
    lines: tuple[LineOrigin, ...] | None = None  # per parsed line; None: the identity

    @classmethod
    def identity(cls, filename: str, text: str) -> SourceMap:
        return cls(filename, {filename: text})

    def position(self, line: int, column: int) -> SourcePosition:
        if self.lines is None:
            return SourcePosition(self.filename, line, column)
        if not self.lines:
            return SourcePosition(self.filename, 1, 1)
        origin = self.lines[min(max(line, 1), len(self.lines)) - 1]
        return SourcePosition(origin.file, origin.line, _column(origin, column))

    def expanded(self, line: int, column: int) -> bool:
        """Whether a macro's expansion wrote what stands at a line and column of the parsed
        text (its position is then the macro name's)."""
        if self.lines is None or not 0 < line <= len(self.lines):
            return False
        columns = self.lines[line - 1].columns
        if not columns:
            return False
        k = bisect_right([c[0] for c in columns], column) - 1
        return k >= 0 and not columns[k][2]

    def source_line(self, position: SourcePosition) -> str | None:
        text = self.texts.get(position.file)
        if text is None or position.line < 1:
            return None
        lines = text.splitlines()
        return lines[position.line - 1] if position.line <= len(lines) else None

    def error(self, message: str, position: SourcePosition) -> SpecError:
        return SpecError(message, position.file, position.line, position.column,
                         self.source_line(position))

    def error_at(self, message: str, line: int, column: int) -> SpecError:
        """An error at a line and column of the parsed text."""
        return self.error(message, self.position(line, column))


def _column(origin: LineOrigin, column: int) -> int:
    if origin.columns is None:
        return column
    starts = [c[0] for c in origin.columns]
    k = bisect_right(starts, column) - 1
    if k < 0:
        return origin.columns[0][1] if origin.columns else column
    parsed, original, exact = origin.columns[k]
    return original + (column - parsed) if exact else original
