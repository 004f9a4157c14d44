"""Every `POLYDL_*` setting, read in this one module.

Each accessor reads the environment when it is called (so a test's `monkeypatch.setenv` works)
unless a scoped `override` is in force, and checks what it reads: a bad value is a
`PolyDLError` naming the variable. Nothing else in the package reads `POLYDL_*` variables
(`tests/test_settings.py` checks that).

| variable | accessor | meaning |
|---|---|---|
| `POLYDL_CACHE_DIR` | `cache_dir()` | compile cache root (default: the user cache dir) |
| `POLYDL_TUNING_DB` | `tuning_db()` | tuning database (default: `tuning.sqlite` in the cache) |
| `POLYDL_SYSTEM_DB` | `system_db()` | read-only tuning database shipped beside the user's (default: see below) |
| `POLYDL_COST_MODEL` | `cost_model()` | learned model for `schedule="tuned"` (default: `costmodel.txt` in the cache) |
| `POLYDL_CC` | `cc()` | C compiler (default `cc`) |
| `POLYDL_CFLAGS` | `cflags()` | its optimisation flags, None for the default |
| `POLYDL_ISA` | `forced_isa()` | lower the native target's ISA |
| `POLYDL_SANITIZE` | `sanitizers()` | ASan/UBSan for generated kernels |
| `POLYDL_NVCC`, `POLYDL_HIPCC` | `gpu_compiler(kind)` | GPU compilers |
| `POLYDL_GPU_TILES` | `gpu_timed_tiles()` | how many of each GEMM's best-ranked tiles a CUDA build times (see below) |

`POLYDL_SYSTEM_DB` defaults to `tuning/system.sqlite` in the package if there is one (empty: none).
A CUDA build times `POLYDL_GPU_TILES` tiles where a device is present (default 6; 1: the tile
score's pick, nothing timed).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import platformdirs

from polydl.errors import PolyDLError

VARIABLES = {
    "cache_dir": "POLYDL_CACHE_DIR",
    "tuning_db": "POLYDL_TUNING_DB",
    "system_db": "POLYDL_SYSTEM_DB",
    "cost_model": "POLYDL_COST_MODEL",
    "cc": "POLYDL_CC",
    "cflags": "POLYDL_CFLAGS",
    "isa": "POLYDL_ISA",
    "sanitize": "POLYDL_SANITIZE",
    "nvcc": "POLYDL_NVCC",
    "hipcc": "POLYDL_HIPCC",
    "gpu_tiles": "POLYDL_GPU_TILES",
}
# The ISA names a target may have (polydl.target.cpu.ISAS, which imports this module's users).
ISA_NAMES = ("avx512amx", "avx512bf16", "avx512", "avx2", "scalar")
SANITIZERS = ("address", "undefined")

_overrides: list[dict[str, str | None]] = []
_lock = threading.Lock()


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Settings for the duration of a `with` block, as if the variables held `values` (None:
    as if unset), whatever the environment says; for tests and tools."""
    unknown = sorted(set(values) - set(VARIABLES))
    if unknown:
        raise TypeError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(VARIABLES)}")
    layer = {name: None if value is None else str(value) for name, value in values.items()}
    with _lock:
        _overrides.append(layer)
    try:
        yield
    finally:
        with _lock:
            _overrides.remove(layer)


def _raw(name: str) -> str | None:
    with _lock:
        for layer in reversed(_overrides):
            if name in layer:
                return layer[name]
    return os.environ.get(VARIABLES[name])


def cache_dir() -> Path:
    value = _raw("cache_dir")
    return Path(value) if value else Path(platformdirs.user_cache_dir("polydl"))


def tuning_db() -> Path:
    value = _raw("tuning_db")
    return Path(value) if value else cache_dir() / "tuning.sqlite"


def system_db() -> Path | None:
    """The read-only database of measurements shipped with polydl, None where there is none."""
    value = _raw("system_db")
    if value is not None:
        return Path(value) if value else None
    shipped = Path(__file__).resolve().parent / "tuning" / "system.sqlite"
    return shipped if shipped.is_file() else None


def cost_model() -> Path:
    """The learned cost model `schedule="tuned"` asks where the database has no answer."""
    value = _raw("cost_model")
    return Path(value) if value else cache_dir() / "costmodel.txt"


def cc() -> str:
    return _raw("cc") or "cc"


def cflags() -> tuple[str, ...] | None:
    """The C compiler's optimisation flags; None where unset (the toolchain's default)."""
    value = _raw("cflags")
    if value is None:
        return None
    try:
        return tuple(shlex.split(value))
    except ValueError as exc:
        raise PolyDLError(f"POLYDL_CFLAGS: cannot split {value!r}: {exc}") from None


def forced_isa() -> str | None:
    value = _raw("isa")
    if not value:
        return None
    if value not in ISA_NAMES:
        raise PolyDLError(f"POLYDL_ISA='{value}' is not one of {', '.join(ISA_NAMES)}")
    return value


def sanitizers() -> tuple[str, ...]:
    value = _raw("sanitize") or ""
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in SANITIZERS]
    if unknown:
        raise PolyDLError(
            f"POLYDL_SANITIZE: unknown sanitizer(s) {', '.join(unknown)}; use "
            f"{' and/or '.join(SANITIZERS)}, comma-separated"
        )
    return names


def gpu_timed_tiles() -> int:
    value = _raw("gpu_tiles")
    if not value:
        return 6
    if not value.isdigit() or int(value) < 1:
        raise PolyDLError(f"POLYDL_GPU_TILES='{value}' is not a whole number of tiles (1 or more)")
    return int(value)


def gpu_compiler(kind: str) -> str:
    """The compiler of a GPU backend: `POLYDL_NVCC` (cuda) or `POLYDL_HIPCC` (hip)."""
    name = {"cuda": "nvcc", "hip": "hipcc"}[kind]
    return _raw(name) or name
