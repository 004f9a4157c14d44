"""Where polydl keeps files: one root for the compile cache and the tuning database."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_root() -> Path:
    """`POLYDL_CACHE_DIR`, else the user's cache directory for polydl."""
    env = os.environ.get("POLYDL_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("polydl"))
