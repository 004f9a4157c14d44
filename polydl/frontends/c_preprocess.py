"""The C preprocessor over a spec: macros (`#define`, `-D`), local headers (`#include`, `-I`)
and conditional text (`#if`, `#ifdef`), run by the C compiler polydl builds with (`cc -E`,
`POLYDL_CC`).

Takes the spec's text (comments and `#pragma` lines blanked), its file name and the
`Preprocessing` options; returns the preprocessed text without line markers and the
`SourceMap` of its lines, so that every later error points into the user's own file (the spec
or a header) at the line and column of the construct. The preprocessor predefines only the
standard macros (`-undef`, `-std=c11`) and sees no system headers: polydl's own `<math.h>`,
`<stdint.h>`, ... (`c_include/`) stand in for them, defining only what a spec may use. An error
of the preprocessor is a `SpecError` at its position.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from polydl import settings
from polydl.errors import ArgumentError, SourcePosition, SpecError
from polydl.frontends.c_source_map import LineOrigin, SourceMap, align
from polydl.frontends.c_text import strip_comments

STAND_IN_HEADERS = Path(__file__).with_name("c_include")
STAND_IN_NAMES = tuple(sorted(p.name for p in STAND_IN_HEADERS.glob("*.h")))
# The preprocessed text may be larger than the spec (macros expand), within reason; and the
# preprocessor runs with bounded time, memory and output, as a spec may `#include "/dev/zero"`
# or expand a macro exponentially.
MAX_PREPROCESSED_BYTES = 4 * 1024 * 1024
TIMEOUT_SECONDS = 30
MEMORY_LIMIT_KIB = 2 * 1024 * 1024
_LIMITS = (f"ulimit -v {MEMORY_LIMIT_KIB} 2>/dev/null; "
           f"ulimit -f {2 * MAX_PREPROCESSED_BYTES // 512} 2>/dev/null; exec \"$@\"")
_DIRECTIVE = re.compile(r"^[ \t]*#", re.MULTILINE)
_MARKER = re.compile(r'^# (\d+) "((?:[^"\\]|\\.)*)"(?: \d+)*$')
_DIAGNOSTIC = re.compile(r"^(.+?):(\d+):(\d+): (?:fatal )?error: (.*)$")
_MACRO_NAME = re.compile(r"^[A-Za-z_]\w*$")


@dataclass(frozen=True)
class Preprocessing:
    """What the preprocessor is given besides the spec: macros (`-D NAME=VALUE`, a None value
    for `-D NAME`), folders of headers (`-I DIR`, searched in order) and the spec's own folder
    (searched first for `#include "..."`; None for the text of a spec, which the preprocessor
    reads from its input and so searches the working directory)."""

    defines: tuple[tuple[str, str | None], ...] = ()
    include_dirs: tuple[str, ...] = ()
    base_dir: str | None = None


def preprocessing(
    defines: Mapping[str, object] | Iterable[str] | None = None,
    include_dirs: Iterable[str | os.PathLike[str]] | None = None,
    base_dir: str | None = None,
) -> Preprocessing:
    """Checked options: `defines` maps names to values (an int, a str, or None / True for a
    bare `-D NAME`) or lists `NAME=VALUE` / `NAME` strings, as the command line gives them."""
    pairs: list[tuple[str, str | None]] = []
    if isinstance(defines, Mapping):
        items = list(defines.items())
    else:
        items = [_split(d) for d in defines or ()]
    for name, value in items:
        if not isinstance(name, str) or not _MACRO_NAME.match(name):
            raise ArgumentError("defines", f"{name!r} is not a macro name")
        if value is None or value is True:
            pairs.append((name, None))
            continue
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ArgumentError("defines", f"the value of {name} must be a number or text, "
                                f"not {type(value).__name__}")
        text = str(value)
        if "\n" in text or "\r" in text:
            raise ArgumentError("defines", f"the value of {name} must be one line")
        pairs.append((name, text))
    dirs = []
    for d in include_dirs or ():
        path = Path(d)
        if not path.is_dir():
            raise ArgumentError("include_dirs", f"{os.fspath(d)} is not a folder")
        dirs.append(str(path.resolve()))
    return Preprocessing(tuple(pairs), tuple(dirs), base_dir)


def _split(item: object) -> tuple[object, str | None]:
    if not isinstance(item, str):
        return item, None
    name, sep, value = item.partition("=")
    return name, value if sep else None


def needs_preprocessor(clean: str, options: Preprocessing) -> bool:
    """Whether the spec has a directive (or macros are given): only then does it go through
    the preprocessor, so a spec without any keeps its exact layout."""
    return bool(options.defines) or _DIRECTIVE.search(clean) is not None


def preprocess(
    clean: str, text: str, filename: str, options: Preprocessing
) -> tuple[str, SourceMap]:
    """The preprocessed text (line markers removed) and where each of its lines came from;
    `clean` is what the preprocessor reads, `text` the spec as the user wrote it."""
    compiler = settings.cc()
    command = [*shlex.split(compiler), "-E", "-x", "c", "-std=c11", "-undef", "-nostdinc",
               "-isystem", str(STAND_IN_HEADERS)]
    if options.base_dir is not None:
        command += ["-iquote", options.base_dir]
    for folder in options.include_dirs:
        command += ["-I", folder]
    for name, value in options.defines:
        command.append(f"-D{name}" if value is None else f"-D{name}={value}")
    command.append("-")
    source = f'#line 1 "{_escape(filename)}"\n{clean}'
    shell = shutil.which("sh")
    if shell is not None:
        command = [shell, "-c", _LIMITS, "sh", *command]
    with tempfile.TemporaryDirectory(prefix="polydl-cpp-") as folder:
        out_path, err_path = Path(folder, "out"), Path(folder, "err")
        try:
            with open(out_path, "w") as out, open(err_path, "w") as err:
                done = subprocess.run(command, input=source, stdout=out, stderr=err, text=True,
                                      timeout=TIMEOUT_SECONDS, env=_compiler_environment())
        except FileNotFoundError:
            raise SpecError(
                f"the spec needs the C preprocessor (it has directives or -D macros), but the "
                f"C compiler '{compiler}' (POLYDL_CC) was not found", filename) from None
        except subprocess.TimeoutExpired:
            raise SpecError(f"the C preprocessor took more than {TIMEOUT_SECONDS} s",
                            filename) from None
        size = out_path.stat().st_size
        if size > MAX_PREPROCESSED_BYTES:
            raise SpecError(f"the spec is more than {MAX_PREPROCESSED_BYTES} characters long "
                            "after preprocessing", filename)
        stderr = err_path.read_text(errors="replace")
        if shell is not None and done.returncode == 127 and "not found" in stderr:
            raise SpecError(
                f"the spec needs the C preprocessor (it has directives or -D macros), but the "
                f"C compiler '{compiler}' (POLYDL_CC) was not found", filename)
        texts: dict[str, str | None] = {filename: text}
        if done.returncode != 0:
            raise _failure(stderr, filename, texts)
        output = out_path.read_text(errors="replace")
    return _unmark(output, filename, clean, texts)


def _compiler_environment() -> dict[str, str]:
    """This process's environment without preloaded libraries: a sanitizer runtime preloaded
    into Python (the sanitizer test run) reserves terabytes of address space, which the
    memory limit refuses."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def _escape(name: str) -> str:
    return name.replace("\\", "\\\\").replace('"', '\\"')


def _unescape(name: str) -> str:
    return re.sub(r"\\(.)", r"\1", name)


def _unmark(
    output: str, filename: str, clean: str, texts: dict[str, str | None]
) -> tuple[str, SourceMap]:
    """Drop the line markers, keeping each remaining line's origin and column alignment."""
    stripped: dict[str, list[str] | None] = {filename: clean.split("\n")}
    lines: list[str] = []
    origins: list[LineOrigin] = []
    file, number = filename, 1
    for line in output.split("\n"):
        marker = _MARKER.match(line)
        if marker is not None:
            number, file = int(marker.group(1)), _unescape(marker.group(2))
            continue
        if file not in stripped:
            stripped[file], texts[file] = _read_header(file)
        original = stripped[file]
        columns = None
        if original is not None and 0 < number <= len(original):
            columns = align(original[number - 1], line)
        lines.append(line)
        origins.append(LineOrigin(file, number, columns))
        number += 1
    return "\n".join(lines), SourceMap(filename, texts, tuple(origins))


def _read_header(path: str) -> tuple[list[str] | None, str | None]:
    """A header's lines with comments blanked (to match its tokens) and its text (to show)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        return strip_comments(text, path).split("\n"), text
    except (OSError, UnicodeDecodeError, SpecError):
        return None, None


def _failure(stderr: str, filename: str, texts: dict[str, str | None]) -> SpecError:
    """The preprocessor's errors, each at its position."""
    errors = []
    for line in stderr.splitlines():
        found = _DIAGNOSTIC.match(line)
        if found is None:
            continue
        file, message = found.group(1), found.group(4)
        if file not in texts:
            texts[file] = _read_header(file)[1]
        position = SourcePosition(file, int(found.group(2)), int(found.group(3)))
        source_map = SourceMap(filename, texts)
        if "No such file or directory" in message:
            if (source_map.source_line(position) or "")[position.column - 1:].startswith("<"):
                message += ("; system headers are not read (polydl's own "
                            f"{', '.join(STAND_IN_NAMES)} stand in for them)")
            message += "; give the header's folder with -I DIR (include_dirs= in Python)"
        errors.append(source_map.error(message, position))
    if errors:
        return SpecError.several(errors[:20], left_out=len(errors) > 20)
    first = stderr.strip().splitlines()[:1] or ["no message"]
    return SpecError(f"the C preprocessor failed: {first[0]}", filename)
