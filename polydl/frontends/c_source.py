"""C spec text -> pycparser AST, with every failure turned into a positioned `SpecError`.

Takes the spec text and its file name; returns a `pycparser.c_ast.FileAST` of the text with
comments blanked out (pycparser has no preprocessor), so every line and column in the AST is
the one in the original text.
"""

from __future__ import annotations

import re

from pycparser import c_ast, c_parser

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


def reject_preprocessor(clean: str, filename: str, text: str) -> None:
    # any '#', not only at the start of a line: pycparser's lexer obeys `#line` anywhere
    offset = clean.find("#")
    if offset >= 0:
        raise SpecError.at(
            "preprocessor directives are not allowed: the spec is one self-contained "
            "function (math functions need no #include, sizes are int parameters)",
            position_of(clean, offset, filename),
            text,
        )


def check_brackets(clean: str, filename: str, text: str) -> None:
    """Unbalanced brackets, found before pycparser (which asserts on a stray '}')."""
    closing = {")": "(", "]": "[", "}": "{"}
    stack: list[tuple[str, int]] = []
    for offset, ch in enumerate(clean):
        if ch in "([{":
            stack.append((ch, offset))
        elif ch in closing:
            if not stack or stack[-1][0] != closing[ch]:
                raise SpecError.at(
                    f"syntax error: unmatched '{ch}'", position_of(clean, offset, filename), text
                )
            stack.pop()
    if stack:
        ch, offset = stack[-1]
        raise SpecError.at(
            f"syntax error: '{ch}' is never closed", position_of(clean, offset, filename), text
        )


def _line(text: str, number: int) -> str | None:
    lines = text.splitlines()
    return lines[number - 1] if 0 < number <= len(lines) else None


_PARSE_ERROR = re.compile(r"^(\d+)(?::(\d+))?:\s*(.*)$", re.DOTALL)


def _syntax_error(
    raw: str, filename: str, text: str, parser: c_parser.CParser
) -> SpecError:
    rest = raw[len(filename) + 1 :] if raw.startswith(filename + ":") else raw
    match = _PARSE_ERROR.match(rest)
    if match is not None:
        line, column = int(match.group(1)), int(match.group(2) or 1)
        detail = match.group(3).strip()
    else:
        # some pycparser errors carry no position: take the token the parser stopped at
        detail = rest.strip()
        line, column = _stopped_at(parser, text)
    if detail.startswith("before:"):
        message = f"syntax error before '{detail[len('before:'):].strip()}'"
    else:
        message = f"syntax error: {detail}"
    return SpecError(message, filename, line, column, _line(text, line))


def _stopped_at(parser: c_parser.CParser, text: str) -> tuple[int, int]:
    try:
        token = parser._peek()
    except Exception:  # pycparser internals changed, or the lexer fails again
        token = None
    if token is not None:
        return token.lineno, token.column or 1
    lines = text.splitlines() or [""]
    return len(lines), len(lines[-1]) + 1


def _deepest_bracket(clean: str, filename: str) -> SourcePosition:
    depth, best, where = 0, -1, 0
    for offset, ch in enumerate(clean):
        if ch in "([{":
            depth += 1
            if depth > best:
                best, where = depth, offset
        elif ch in ")]}":
            depth -= 1
    return position_of(clean, where, filename)


# Element types spelled as type names, not keywords: bfloat16 (`bfloat16`, or gcc's `__bf16`)
# and the fixed-width integers of stdint.h. Declared for the parser before the spec; `#line 1`
# keeps every position in the spec's own numbering.
PRELUDE_TYPES = ("bfloat16", "__bf16", "int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t",
                 "int64_t")
PRELUDE = "".join(f"typedef int {t}; " for t in PRELUDE_TYPES) + "\n#line 1\n"


# Longest spec accepted: real specs are a few KiB; the C parser's time grows with the text.
MAX_SPEC_BYTES = 256 * 1024


def check_size(text: str, filename: str) -> None:
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError.at(
            f"the spec is {len(text)} characters long, more than the {MAX_SPEC_BYTES} accepted",
            position_of(text, MAX_SPEC_BYTES, filename),
            text,
        )


def parse_translation_unit(text: str, filename: str = "<spec>") -> c_ast.FileAST:
    check_size(text, filename)
    clean = blank_pragmas(strip_comments(text, filename))
    reject_preprocessor(clean, filename, text)
    check_brackets(clean, filename, text)
    parser = c_parser.CParser()
    try:
        ast = parser.parse(PRELUDE + clean, filename)
        ast.ext = ast.ext[len(PRELUDE_TYPES):]
        return ast
    except c_parser.ParseError as exc:
        raise _syntax_error(str(exc), filename, text, parser) from None
    except RecursionError:
        raise SpecError.at(
            "the spec is nested too deeply to parse", _deepest_bracket(clean, filename), text
        ) from None
    except Exception as exc:  # pycparser's own assertions on input it does not expect
        line, column = _stopped_at(parser, text)
        raise SpecError(
            f"syntax error ({type(exc).__name__} in the C parser)",
            filename,
            line,
            column,
            _line(text, line),
        ) from None
