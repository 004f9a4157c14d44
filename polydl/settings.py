"""Every `POLYDL_*` setting, read from the environment at call time in this one module."""

from __future__ import annotations

import os


def cc() -> str:
    return os.environ.get("POLYDL_CC", "cc")


def forced_isa() -> str | None:
    return os.environ.get("POLYDL_ISA") or None
