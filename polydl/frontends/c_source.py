"""C spec text -> pycparser AST, with every failure turned into a positioned `SpecError`.

Takes the spec text, its file name and the preprocessor's options; returns a
`pycparser.c_ast.FileAST` and the `SourceMap` that turns the AST's positions into positions in
the user's files. Comments and `#pragma` lines are blanked first. A spec with directives (or
given macros) then goes through the C preprocessor (`c_preprocess`); one without keeps its text,
so every line and column in the AST is the one in the original text.

A syntax error is reported where the mistake is: a bracket never closed at that bracket (with
where the parser needed the closing one), a missing `;` at the end of its statement, anything
else at the token where the parser stopped; each mapped into the user's file.
"""

from __future__ import annotations

import re

from pycparser import c_ast, c_parser

from polydl.errors import SpecError
from polydl.frontends.c_preprocess import Preprocessing, needs_preprocessor, preprocess
from polydl.frontends.c_source_map import SourceMap, tokens
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


# Element types spelled as type names, not keywords: bfloat16 (`bfloat16`, or gcc's `__bf16`)
# and the fixed-width integers of stdint.h. Declared for the parser before the spec; `#line 1`
# keeps every position in the spec's own numbering.
PRELUDE_TYPES = ("bfloat16", "__bf16", "int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t",
                 "int64_t")
PRELUDE = "".join(f"typedef int {t}; " for t in PRELUDE_TYPES) + "\n#line 1\n"


_CLOSING = {"(": ")", "[": "]", "{": "}"}
_OPENING = {close: open_ for open_, close in _CLOSING.items()}


def _open_brackets(parsed: str, end: int) -> list[tuple[str, int]]:
    """The brackets open at `end` (innermost last), each with its offset."""
    stack: list[tuple[str, int]] = []
    for offset, ch in enumerate(parsed[:end]):
        if ch in _CLOSING:
            stack.append((ch, offset))
        elif ch in _OPENING and stack and stack[-1][0] == _OPENING[ch]:
            stack.pop()
    return stack


def _bracket_mistake(parsed: str) -> tuple[str, int, bool] | None:
    """The first bracket that is never closed or closes nothing: (bracket, offset, closes
    nothing). A closing bracket that matches an outer one means that those opened since were
    never closed (`for (...; i++ {` ... `}`): the earliest of them is the mistake, not the
    closing bracket far below."""
    stack: list[tuple[str, int]] = []
    for offset, ch in enumerate(parsed):
        if ch in _CLOSING:
            stack.append((ch, offset))
        elif ch in _OPENING:
            if stack and stack[-1][0] == _OPENING[ch]:
                stack.pop()
                continue
            outer = [k for k, (opening, _) in enumerate(stack) if opening == _OPENING[ch]]
            if outer:
                return (*stack[outer[-1] + 1], False)
            return ch, offset, True
    return (*stack[-1], False) if stack else None


def check_brackets(parsed: str, source_map: SourceMap, failed_at: int | None = None) -> None:
    """Unbalanced brackets, at the first that is never closed or closes nothing, where it
    comes no later than `failed_at` (the offset where the C parser stopped; an earlier
    mistake of another kind is reported as such)."""
    mistake = _bracket_mistake(parsed)
    if mistake is None:
        return
    ch, offset, closes_nothing = mistake
    if failed_at is not None and offset > failed_at:
        return
    here = position_of(parsed, offset, source_map.filename)
    where = source_map.position(here.line, here.column)
    if closes_nothing:
        raise source_map.error(f"syntax error: unmatched '{ch}'", where)
    message = f"syntax error: '{ch}' is never closed"
    if failed_at is not None and failed_at > offset and _open_brackets(parsed, failed_at)[-1:] == [
            (ch, offset)]:
        message += f" ({_expected(parsed, failed_at, _CLOSING[ch], source_map, where.file)})"
    raise source_map.error(message, where)


def _expected(parsed: str, offset: int, what: str, source_map: SourceMap, file: str) -> str:
    """`expected ')' before '{' at 2:30`: what the parser needed where it stopped (the file
    named where it is not `file`)."""
    token = tokens(parsed[offset:].split("\n", 1)[0])
    if not token:
        return f"expected '{what}' at the end of the input"
    stopped = position_of(parsed, offset, source_map.filename)
    where = source_map.position(stopped.line, stopped.column)
    shown = f"{where.line}:{where.column}" if where.file == file else str(where)
    return f"expected '{what}' before '{token[0][1]}' at {shown}"


_PARSE_ERROR = re.compile(r"^(\d+)(?::(\d+))?:\s*(.*)$", re.DOTALL)


def _failure(raw: str, filename: str, parsed: str, parser: c_parser.CParser) -> tuple[int, int, str]:
    """(line, column, what the parser said) of a `ParseError`, in the parsed text."""
    rest = raw[len(filename) + 1 :] if raw.startswith(filename + ":") else raw
    match = _PARSE_ERROR.match(rest)
    if match is not None:
        return int(match.group(1)), int(match.group(2) or 1), match.group(3).strip()
    # some pycparser errors carry no position: take the token the parser stopped at
    return (*_stopped_at(parser, parsed), rest.strip())


def _offset(text: str, line: int, column: int) -> int:
    """The offset of a 1-based line and column in `text` (its end, past the last line)."""
    lines = text.split("\n")
    if line > len(lines):
        return len(text)
    return min(sum(len(ln) + 1 for ln in lines[: line - 1]) + column - 1, len(text))


def _stops_at(parsed: str, filename: str) -> int | None:
    """The offset where the C parser stops in `parsed`; None where it reads it all."""
    parser = c_parser.CParser()
    try:
        parser.parse(PRELUDE + parsed, filename)
    except c_parser.ParseError as exc:
        return _offset(parsed, *_failure(str(exc), filename, parsed, parser)[:2])
    except Exception:  # the parser's assertions, or too deep a nesting: where it was
        return _offset(parsed, *_stopped_at(parser, parsed))
    return None


def _missing_semicolon(parsed: str, filename: str, offset: int) -> int | None:
    """Where a `;` is missing, if one is: the end of the token before `offset`, when a `;`
    put there lets the parser read further (the statement before a `}`, or before the next
    statement, lacks its `;`)."""
    before = len(parsed[:offset].rstrip())
    if before == 0 or parsed[before - 1] == ";":
        return None
    stops = _stops_at(parsed[:before] + ";" + parsed[before:], filename)
    return before if stops is None or stops > offset + 1 else None


def _syntax_error(
    raw: str, filename: str, parsed: str, parser: c_parser.CParser, source_map: SourceMap
) -> SpecError:
    line, column, detail = _failure(raw, filename, parsed, parser)
    if detail.startswith("before:"):
        token = detail[len("before:"):].strip()
        message = f"syntax error before '{token}'"
        offset = _offset(parsed, line, column)
        missing = _missing_semicolon(parsed, filename, offset)
        if missing is not None:
            message = f"syntax error: expected ';' before '{token}'"
            after = position_of(parsed, missing, filename)
            if after.line < line:  # at the end of the statement, as C compilers put it
                line, column = after.line, after.column
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
    parser = c_parser.CParser()
    try:
        ast = parser.parse(PRELUDE + parsed, filename)
        ast.ext = ast.ext[len(PRELUDE_TYPES):]
        return ast, source_map
    except c_parser.ParseError as exc:
        raw = str(exc)
        check_brackets(parsed, source_map, _offset(parsed, *_failure(raw, filename, parsed, parser)[:2]))
        raise _syntax_error(raw, filename, parsed, parser, source_map) from None
    except RecursionError:
        check_brackets(parsed, source_map)
        raise source_map.error_at(
            "the spec is nested too deeply to parse", *_deepest_bracket(parsed)
        ) from None
    except Exception as exc:  # pycparser's own assertions on input it does not expect
        stopped = _stopped_at(parser, parsed)
        check_brackets(parsed, source_map, _offset(parsed, *stopped))
        raise source_map.error_at(
            f"syntax error ({type(exc).__name__} in the C parser)", *stopped
        ) from None
