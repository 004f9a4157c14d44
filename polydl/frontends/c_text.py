"""Spec text before parsing: comments blanked and `#pragma` lines blanked, every other
character (newlines included) kept in place, so that positions in the result are positions in
the text the user wrote."""

from __future__ import annotations

import re

from polydl.errors import SourcePosition, SpecError


def strip_comments(text: str, filename: str = "<spec>") -> str:
    """Replace `//` and `/* */` comments by spaces, keeping newlines so positions stay exact."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
        elif ch == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise SpecError.at("unterminated /* comment", position_of(text, i, filename), text)
            out.append("".join(c if c == "\n" else " " for c in text[i : end + 2]))
            i = end + 2
        elif ch in "\"'":
            # skip a literal so that '//' inside it is kept; the parser rejects literals anyway
            j = i + 1
            while j < n and text[j] not in (ch, "\n"):
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(text[i:j])
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def position_of(text: str, offset: int, filename: str) -> SourcePosition:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return SourcePosition(filename, line, column)


_PRAGMA = re.compile(r"^[ \t]*#[ \t]*pragma\b.*$", re.MULTILINE)


def blank_pragmas(clean: str) -> str:
    """`#pragma` lines (`#pragma scop`, `#pragma omp ...`) blanked: polydl chooses the schedule
    and its parallel loops itself, so a pragma says nothing it needs. A pragma continued onto
    the next line (a trailing backslash) is blanked with its continuation lines."""
    lines = clean.split("\n")
    blanking = False
    for i, line in enumerate(lines):
        if blanking or _PRAGMA.fullmatch(line):
            blanking = line.rstrip().endswith("\\")
            lines[i] = " " * len(line)
    return "\n".join(lines)
