"""Fake C compilers for fault tests: small shell scripts handed to polydl through POLYDL_CC."""

from __future__ import annotations

import shutil
from pathlib import Path

REAL_CC = shutil.which("cc") or "cc"


def fake_compiler(directory: Path, name: str, body: str) -> Path:
    """A script that answers `--version` like a compiler and runs `body` for compilations
    ("$@" are the arguments; `$REAL_CC` is the real compiler)."""
    script = directory / name
    script.write_text(
        "#!/bin/sh\n"
        f"REAL_CC={REAL_CC}\n"
        'if [ "$1" = "--version" ]; then echo "fake-cc 1.0"; exit 0; fi\n'
        + body + "\n"
    )
    script.chmod(0o755)
    return script
