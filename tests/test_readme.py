"""The README's own kernel compiles and computes what its comment says, and its test command is
the one .ci/run runs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import polydl

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_kernel_compiles_and_matches_numpy(tmp_path: Path) -> None:
    source = re.search(r"```c\n(// rownorm\.c.*?)```", README, re.S)
    assert source, "the README's rownorm.c example is gone"
    spec = tmp_path / "rownorm.c"
    spec.write_text(source.group(1))
    k = polydl.compile(str(spec), params={"N": 6, "D": 40})
    x = np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32)
    y = k(x, 1e-6)
    top = np.abs(x).max(axis=1, keepdims=True)
    expected = x / (top * np.sqrt(((x / top) ** 2).sum(axis=1, keepdims=True)) + 1e-6)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-7)


def test_ci_runs_the_readme_test_command() -> None:
    commands = re.search(r"```bash\n(.*?)```", README, re.S)
    assert commands
    lines = commands.group(1).splitlines()
    test_command = [line for line in lines if line.startswith("python3") and "pytest" in line][0]
    assert test_command in (ROOT / ".ci" / "run").read_text()
