"""Specs whose expected error position is marked with `$` in their text."""

from __future__ import annotations

import pytest

from polydl.errors import SpecError
from polydl.frontends.c_loopnest import parse_c


def located(marked: str) -> tuple[str, int, int]:
    """Text with `$` removed, and the line and column where `$` stood."""
    offset = marked.index("$")
    line = marked.count("\n", 0, offset) + 1
    column = offset - (marked.rfind("\n", 0, offset) + 1) + 1
    return marked.replace("$", "", 1), line, column


def refused_at_mark(marked: str, *words: str, filename: str = "spec.c") -> SpecError:
    """The C spec with `$` removed is refused at the `$`, with each of `words` in the message."""
    text, line, column = located(marked)
    with pytest.raises(SpecError) as info:
        parse_c(text, filename)
    err = info.value
    assert (err.file, err.line, err.column) == (filename, line, column), err.message
    for word in words:
        assert word in err.message, err.message
    return err
