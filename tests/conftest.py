"""Test-wide setup: a private compile cache and tuning database per test session (and xdist worker)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("polydl-cache")
    os.environ["POLYDL_CACHE_DIR"] = str(root)
    os.environ["POLYDL_TUNING_DB"] = str(root / "tuning.sqlite")
