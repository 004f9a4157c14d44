"""The compile cache under stress: concurrent builders share one entry, a damaged entry is
rebuilt, an unwritable cache directory falls back to a temporary one with a `CacheWarning`."""

from __future__ import annotations

import json
import multiprocessing
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl.errors import CacheWarning
from polydl.frontends import load_spec
from polydl.runtime.c.toolchain import build_shared_library
from polydl.runtime.cache import MANIFEST, entry_is_complete, read_lowering, write_lowering
from tests.kernels import run_and_check
from tests.runtime.faults import fake_compiler

SPEC = """
void scale(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++)
    y[i] = 3.0f * x[i];
}
"""


def _code(n: int):  # type: ignore[no-untyped-def]
    from polydl.api import lower

    return lower(*load_spec(SPEC, {"N": n})).code


def _compile_and_run(cache_dir: str, n: int) -> str:
    os.environ["POLYDL_CACHE_DIR"] = cache_dir
    k = polydl.compile(SPEC, {"N": n})
    x = np.arange(n, dtype=np.float32)
    np.testing.assert_allclose(k(x), 3 * x)
    return str(k.library_path)


def test_concurrent_processes_share_one_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "compilations.log"
    counting = fake_compiler(tmp_path, "countcc", f'echo "$*" >> {log}\nexec "$REAL_CC" "$@"')
    monkeypatch.setenv("POLYDL_CC", str(counting))
    cache = tmp_path / "cache"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        paths = pool.starmap(_compile_and_run, [(str(cache), 37)] * 4)
    assert len(set(paths)) == 1
    entries = [p for p in (cache / "kernels").glob("*/*") if p.is_dir()]
    assert len(entries) == 1
    builds = [ln for ln in log.read_text().splitlines() if " -o " in ln]  # not the CPU query
    assert len(builds) == 1  # built once, under the entry lock
    assert not [p for p in entries[0].iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("damage", ["truncate", "flip", "no-manifest", "bad-manifest"])
def test_damaged_entry_is_detected_and_rebuilt(
    damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYDL_CACHE_DIR", str(tmp_path))
    code = _code(41)
    library = build_shared_library(code)
    good = library.read_bytes()
    files = [library, library.with_name("scale.c"), library.with_name("scale.h")]
    if damage == "truncate":
        library.write_bytes(good[: len(good) // 2])
    elif damage == "flip":
        library.write_bytes(good[:100] + bytes([good[100] ^ 0xFF]) + good[101:])
    elif damage == "no-manifest":
        (library.parent / MANIFEST).unlink()
    else:
        (library.parent / MANIFEST).write_text("{not json")
    assert not entry_is_complete(library.parent, files)
    if damage == "no-manifest":  # an older layout, or a crash before the manifest: quietly
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again = build_shared_library(code)
    else:
        with pytest.warns(CacheWarning, match="rebuilding"):
            again = build_shared_library(code)
    assert again == library and entry_is_complete(library.parent, files)
    assert len(again.read_bytes()) == len(good)
    run_and_check(polydl.compile(SPEC, {"N": 41}), lambda x: 3 * x)


def test_damaged_lowering_record_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYDL_CACHE_DIR", str(tmp_path))
    write_lowering("ab" * 32, {"code": {"source": "int f(void) { return 0; }"}, "flops": 1})
    assert read_lowering("ab" * 32) is not None
    (path,) = (tmp_path / "lowered").rglob("*.json")
    data = json.loads(path.read_text())
    data["record"]["code"]["source"] = "int f(void) { return 1; }"  # altered, still valid JSON
    path.write_text(json.dumps(data))
    assert read_lowering("ab" * 32) is None
    path.write_text(path.read_text()[:40])  # truncated
    assert read_lowering("ab" * 32) is None


def test_unwritable_cache_dir_falls_back_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    configured = blocker / "cache"  # its parent is a file: nobody, root included, can create it
    monkeypatch.setenv("POLYDL_CACHE_DIR", str(configured))
    with pytest.warns(CacheWarning, match="cannot be written"):
        k = polydl.compile(SPEC, {"N": 43})
    assert not str(k.library_path).startswith(str(configured))
    run_and_check(k, lambda x: 3 * x)


def test_full_cache_dir_falls_back_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = tmp_path / "full-cache"
    monkeypatch.setenv("POLYDL_CACHE_DIR", str(full))
    script = fake_compiler(tmp_path, "fullcc", (
        f'case "$*" in *"{full}"*) echo "fatal error: error writing to /tmp/cc.s: '
        'No space left on device" >&2; exit 1;; esac\nexec "$REAL_CC" "$@"'
    ))
    monkeypatch.setenv("POLYDL_CC", str(script))
    with pytest.warns(CacheWarning, match="No space left"):
        k = polydl.compile(SPEC, {"N": 44})
    assert not str(k.library_path).startswith(str(full))
    run_and_check(k, lambda x: 3 * x)


def test_read_only_cache_with_complete_entries_is_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries already in a cache that can no longer be written are used, not rebuilt."""
    import errno

    from polydl.runtime import cache

    monkeypatch.setenv("POLYDL_CACHE_DIR", str(tmp_path))
    code = _code(45)
    library = build_shared_library(code)
    monkeypatch.setattr(cache, "_FALLBACK", {})
    with pytest.warns(CacheWarning):
        cache.fall_back(OSError(errno.EROFS, "Read-only file system"))
    assert cache.usable_root() != tmp_path
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build_shared_library(code) == library
