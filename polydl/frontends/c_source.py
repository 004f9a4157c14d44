"""C spec text -> pycparser AST, with every failure turned into a positioned `SpecError`.

Takes the spec text, its file name and the preprocessor's options; returns a
`pycparser.c_ast.FileAST` and the `SourceMap` that turns the AST's positions into positions in
the user's files. Comments and `#pragma` lines are blanked first. A spec with directives (or
given macros) then goes through the C preprocessor (`c_preprocess`); one without keeps its text,
so every line and column in the AST is the one in the original text.
"""

from __future__ import annotations

import re

from pycparser import c_ast, c_parser

from polydl.errors import SpecError
from polydl.frontends.c_preprocess import Preprocessing, needs_preprocessor, preprocess
from polydl.frontends.c_source_map import SourceMap
from polydl.frontends.c_text import blank_pragmas, position_of, strip_comments


def reject_stray_hash(parsed: str, source_map: SourceMap) -> None:
    # a '#' left after preprocessing is none of its directives: pycparser's lexer would obey
    # `#line` anywhere, so it is refused here
    offset = parsed.find("#")
    if offset >= 0:
        where = position_of(parsed, offset, source_map.filename)
        raise source_map.error_at(
            "stray '#' outside a preprocessor directive (a directive starts its line)",
            where.line, where.column,
        )


def check_brackets(parsed: str, source_map: SourceMap) -> None:
    """Unbalanced brackets, found before pycparser (which asserts on a stray '}')."""
    closing = {")": "(", "]": "[", "}": "{"}
    stack: list[tuple[str, int]] = []
    for offset, ch in enumerate(parsed):
        if ch in "([{":
            stack.append((ch, offset))
        elif ch in closing:
            if not stack or stack[-1][0] != closing[ch]:
                where = position_of(parsed, offset, source_map.filename)
                raise source_map.error_at(f"syntax error: unmatched '{ch}'", where.line,
                                          where.column)
            stack.pop()
    if stack:
        ch, offset = stack[-1]
        where = position_of(parsed, offset, source_map.filename)
        raise source_map.error_at(f"syntax error: '{ch}' is never closed", where.line,
                                  where.column)


_PARSE_ERROR = re.compile(r"^(\d+)(?::(\d+))?:\s*(.*)$", re.DOTALL)


def _syntax_error(
    raw: str, filename: str, parsed: str, parser: c_parser.CParser, source_map: SourceMap
) -> SpecError:
    rest = raw[len(filename) + 1 :] if raw.startswith(filename + ":") else raw
    match = _PARSE_ERROR.match(rest)
    if match is not None:
        line, column = int(match.group(1)), int(match.group(2) or 1)
        detail = match.group(3).strip()
    else:
        # some pycparser errors carry no position: take the token the parser stopped at
        detail = rest.strip()
        line, column = _stopped_at(parser, parsed)
    if detail.startswith("before:"):
        message = f"syntax error before '{detail[len('before:'):].strip()}'"
    else:
        message = f"syntax error: {detail}"
    position = source_map.position(line, column)
    if source_map.expanded(line, column):
        name = re.match(r"[A-Za-z_]\w*", (source_map.source_line(position) or "")[
            position.column - 1:])
        message += f" (in the expansion of macro '{name.group()}')" if name else (
            " (in the expansion of a macro)")
    return source_map.error(message, position)


def _stopped_at(parser: c_parser.CParser, text: str) -> tuple[int, int]:
    try:
        token = parser._peek()
    except Exception:  # pycparser internals changed, or the lexer fails again
        token = None
    if token is not None:
        return token.lineno, token.column or 1
    lines = text.splitlines() or [""]
    return len(lines), len(lines[-1]) + 1


def _deepest_bracket(parsed: str) -> tuple[int, int]:
    depth, best, where = 0, -1, 0
    for offset, ch in enumerate(parsed):
        if ch in "([{":
            depth += 1
            if depth > best:
                best, where = depth, offset
        elif ch in ")]}":
            depth -= 1
    position = position_of(parsed, where, "")
    return position.line, position.column


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


def parse_translation_unit(
    text: str, filename: str = "<spec>", options: Preprocessing | None = None
) -> tuple[c_ast.FileAST, SourceMap]:
    check_size(text, filename)
    options = options or Preprocessing()
    clean = blank_pragmas(strip_comments(text, filename))
    if needs_preprocessor(clean, options):
        parsed, source_map = preprocess(clean, text, filename, options)
        parsed = blank_pragmas(parsed)  # pragmas of headers, and those _Pragma() writes
    else:
        parsed, source_map = clean, SourceMap.identity(filename, text)
    reject_stray_hash(parsed, source_map)
    check_brackets(parsed, source_map)
    parser = c_parser.CParser()
    try:
        ast = parser.parse(PRELUDE + parsed, filename)
        ast.ext = ast.ext[len(PRELUDE_TYPES):]
        return ast, source_map
    except c_parser.ParseError as exc:
        raise _syntax_error(str(exc), filename, parsed, parser, source_map) from None
    except RecursionError:
        raise source_map.error_at(
            "the spec is nested too deeply to parse", *_deepest_bracket(parsed)
        ) from None
    except Exception as exc:  # pycparser's own assertions on input it does not expect
        raise source_map.error_at(
            f"syntax error ({type(exc).__name__} in the C parser)", *_stopped_at(parser, parsed)
        ) from None
