"""The on-disk compile cache: one content key, one atomic write.

An entry is a folder named by the hash of everything that changes the binary (source, flags,
compiler identity, polydl version); it holds the source, the compiler command and the library,
so the cache stays readable. Files are written to a temporary name and renamed into place, so a
concurrent process sees either no file or the whole file. An entry is complete only when its
manifest (checksums of its files, written last) matches; anything else is rebuilt. A cache
directory that cannot be written (read-only, full) is replaced, for the rest of the process, by
a temporary one, with a `CacheWarning`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import tempfile
import threading
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from polydl.errors import CacheWarning
from polydl.settings import cache_dir as cache_root

# errno values that mean "this directory cannot hold the cache", not "polydl has a bug"
# (EEXIST/ENOTDIR: a file stands where a directory of the path should be).
UNWRITABLE = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.EEXIST}
)
MANIFEST = "manifest.json"
_FALLBACK: dict[Path, Path] = {}
_USABLE: set[Path] = set()
_ROOT_LOCK = threading.Lock()


# Paths in the package (a folder covers what is under it) whose code does not decide generated
# kernels: the benchmark harness, the command line, `explain`'s printing, and the runtime that
# compiles, caches and calls a kernel (the library cache keys on the source and the compiler
# flags itself). Everything else, including modules added later, is part of the revision.
NOT_CODEGEN = ("bench", "cli.py", "driver/explain.py", "runtime", "tuner")
REVISION_SUFFIXES = (".py", ".j2", ".json")


def revision_files() -> tuple[Path, ...]:
    """The files `compiler_revision` hashes, in hashing order: the package's modules, templates
    and data, less the `NOT_CODEGEN` entries, so editing those keeps stored lowerings valid."""
    package = Path(__file__).resolve().parents[1]
    return tuple(
        path for path in sorted(package.rglob("*"))
        if path.suffix in REVISION_SUFFIXES
        and "__pycache__" not in path.parts
        and not _excluded(path.relative_to(package).as_posix())
    )


def _excluded(relative: str) -> bool:
    return any(relative == entry or relative.startswith(entry + "/") for entry in NOT_CODEGEN)


@functools.cache
def compiler_revision() -> str:
    """A hash of the code that generates kernels (`revision_files`): a stored lowering made by
    other code may schedule the same nest differently, so it is keyed by this, not the version.
    Left out, as code that does not change generated kernels (`NOT_CODEGEN`, an exclusion list,
    so new compiler modules count by default): `polydl/bench/`, `polydl/cli.py`,
    `polydl/explain.py` and `polydl/runtime/`; editing them keeps stored lowerings valid."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in revision_files():
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def content_key(parts: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def usable_root() -> Path:
    """The configured cache root if it can be written, else this process's temporary one."""
    root = cache_root()
    with _ROOT_LOCK:
        if root in _FALLBACK:
            return _FALLBACK[root]
        if root in _USABLE:
            return root
    try:
        probe_dir = root / "kernels"
        probe_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=probe_dir, prefix=".probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return fall_back(exc)
    with _ROOT_LOCK:
        _USABLE.add(root)
    return root


def fall_back(reason: OSError) -> Path:
    """Use a temporary cache root for the rest of the process, saying why once."""
    root = cache_root()
    with _ROOT_LOCK:
        _USABLE.discard(root)
        if root not in _FALLBACK:
            _FALLBACK[root] = Path(tempfile.mkdtemp(prefix="polydl-cache-"))
            warnings.warn(
                CacheWarning(
                    f"compile cache {root} cannot be written ({reason.strerror or reason}); "
                    f"using {_FALLBACK[root]} for this process"
                ),
                stacklevel=3,
            )
        return _FALLBACK[root]


def is_unwritable(exc: OSError) -> bool:
    return exc.errno in UNWRITABLE


def entry_dir(key: str, root: Path | None = None) -> Path:
    """Where the entry for `key` is built: under `root`, else the usable root."""
    return (root or usable_root()) / "kernels" / key[:2] / key


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(entry: Path, files: Iterable[Path]) -> None:
    """Record the entry's files and their checksums; written last, it marks the entry complete."""
    record = {p.name: file_digest(p) for p in files}
    write_atomic(entry / MANIFEST, json.dumps(record, sort_keys=True).encode())


def entry_is_complete(entry: Path, files: Iterable[Path]) -> bool:
    """True if the manifest lists exactly `files` and each matches its checksum."""
    files = list(files)
    try:
        record = json.loads((entry / MANIFEST).read_text())
        return isinstance(record, dict) and all(
            record.get(p.name) == file_digest(p) for p in files
        ) and len(record) == len(files)
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def entry_lock(entry: Path) -> Iterator[None]:
    """Hold the entry's lock file, so concurrent processes build an entry once."""
    try:
        import fcntl
    except ImportError:  # no flock: atomic renames still keep every file whole
        yield
        return
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry / ".lock", "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temporary name beside `path` and rename it into place. The file gets
    the mode open() gives (0666 less the umask, 0644 usually), not mkstemp's 0600: the
    generated sources, headers and libraries are for other users and tools to read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    while True:
        tmp = path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _lowering_path(key: str, root: Path | None = None) -> Path:
    return (root or usable_root()) / "lowered" / key[:2] / f"{key}.json"


def _checksum(record: Any) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def read_lowering(key: str) -> dict[str, Any] | None:
    """A stored lowering (generated code, schedule, flops), or None if absent, unreadable or
    not matching its checksum (a truncated or altered file is lowered again)."""
    # the configured root first: it may be read-only and still hold the record
    record = _read_record(_lowering_path(key, cache_root()))
    if record is None and _lowering_path(key) != _lowering_path(key, cache_root()):
        record = _read_record(_lowering_path(key))
    return record


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("record"), dict):
        return None
    if data.get("checksum") != _checksum(data["record"]):
        return None
    return data["record"]


def write_lowering(key: str, record: dict[str, Any]) -> None:
    data = json.dumps({"checksum": _checksum(record), "record": record}, sort_keys=True).encode()
    try:
        write_atomic(_lowering_path(key), data)
    except OSError as exc:
        if not is_unwritable(exc):
            raise
        fall_back(exc)
        with contextlib.suppress(OSError):  # only a shortcut: a kernel does not need it
            write_atomic(_lowering_path(key), data)
