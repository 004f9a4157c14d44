"""Test-wide setup: a private compile cache and tuning database per test session (and xdist worker)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("polydl-cache")
    os.environ["POLYDL_CACHE_DIR"] = str(root)
    os.environ["POLYDL_TUNING_DB"] = str(root / "tuning.sqlite")


# Hypothesis budgets: "ci" (chosen when CI is set) is derandomized and fixed, so the suite's
# time stays bounded; "deep" is for long local fuzzing runs (HYPOTHESIS_PROFILE=deep).
settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True, database=None,
                          print_blob=True)
settings.register_profile("deep", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))
