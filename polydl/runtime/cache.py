"""The on-disk compile cache: one content key, one atomic write.

An entry is a folder named by the hash of everything that changes the binary (source, flags,
compiler identity, polydl version); it holds the source, the compiler command and the library,
so the cache stays readable. Files are written to a temporary name and renamed into place, so a
concurrent process sees either no file or the whole file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from polydl.paths import cache_root


def content_key(parts: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def entry_dir(key: str) -> Path:
    return cache_root() / "kernels" / key[:2] / key


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _lowering_path(key: str) -> Path:
    return cache_root() / "lowered" / key[:2] / f"{key}.json"


def read_lowering(key: str) -> dict[str, Any] | None:
    """A stored lowering (generated code, schedule, flops), or None if absent or unreadable."""
    try:
        data = json.loads(_lowering_path(key).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_lowering(key: str, record: dict[str, Any]) -> None:
    write_atomic(_lowering_path(key), json.dumps(record, sort_keys=True).encode())
