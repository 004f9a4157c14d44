"""Ahead-of-time use: the library `polydl compile -o DIR` writes links into a plain C program with
the line the README shows, and computes what numpy computes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from polydl.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
@pytest.mark.parametrize("machine", ["native", "generic"])
def test_the_readme_link_line_builds_a_program_that_runs(tmp_path: Path, machine: str) -> None:
    out = tmp_path / "out"
    assert main(["compile", str(ROOT / "examples" / "matmul.c"), "-p", "M=4", "-p", "N=3",
                 "-p", "K=5", "--machine", machine, "-o", str(out)]) == 0
    # the README's line, with the example's path
    line = (f'cc {ROOT}/examples/aot/main.c -Iout -Lout -lmatmul -Wl,-rpath,"$PWD/out" '
            f"-o matmul_demo && ./matmul_demo")
    done = subprocess.run(["sh", "-c", line], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    printed = np.array([[float(v) for v in row.split()] for row in done.stdout.splitlines()])
    i, k, j = np.arange(4)[:, None], np.arange(5), np.arange(3)
    a = (i + k).astype(np.float64)
    b = (np.arange(5)[:, None] - j).astype(np.float64)
    np.testing.assert_allclose(printed, a @ b)
