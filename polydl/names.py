"""How a spec's own names that begin with '_' live inside polydl.

Generated code owns the names that begin with '_' (`_pd_...` helpers and locals, `_t...` loop
iterators), so a spec's `_y` is renamed `_pd___y` in the IR and everything generated from it.
No other name begins with `_pd___`: generated names are `_pd_` and a word, or `_pd_` and an IR
name (which begins with a letter or with `_pd_`). The renaming maps back one to one; what a
user sees (a kernel's keyword arguments, messages, `explain`) takes the spec's spelling again.
"""

from __future__ import annotations

import re

USER_NAME_PREFIX = "_pd__"
_INTERNAL = re.compile(r"(?<!\w)" + USER_NAME_PREFIX + r"(_\w*)")


def internal_name(name: str) -> str:
    """The IR name of a spec's identifier."""
    return USER_NAME_PREFIX + name if name.startswith("_") else name


def spelling(name: str) -> str:
    """The spec's spelling of an IR name."""
    if name.startswith(USER_NAME_PREFIX + "_"):
        return name[len(USER_NAME_PREFIX):]
    return name


def respell(text: str) -> str:
    """Text written from IR names (a message, an explanation) in the spec's spelling."""
    return _INTERNAL.sub(r"\1", text)


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base` with the first number appended that makes it none of `taken`."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}{n}"
    return name
