"""Every CLI failure exits non-zero with one line on stderr (a spec error adds its source line
and a caret); --debug shows the traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from polydl.cli import main
from polydl.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
MATMUL = str(ROOT / "examples" / "matmul.c")
SIZES = ["-p", "M=4", "-p", "N=4", "-p", "K=4"]


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 1) -> str:
    """The error's line; a spec error's source line and caret may follow it, nothing else."""
    assert main(argv) == status
    captured = capsys.readouterr()
    lines = captured.err.rstrip().splitlines()
    assert lines[0].startswith("polydl: "), captured.err
    assert len(lines) == 1 or (len(lines) == 3 and lines[2].strip() == "^"), captured.err
    return lines[0]


@pytest.mark.parametrize(
    "argv, status, words",
    [
        (["compile", "no/such.c"], 1, ["no such file", "no/such.c"]),
        (["compile", MATMUL, "-p", "M"], 2, ["NAME=VALUE"]),
        (["compile", MATMUL, "-p", "M=x", "-p", "N=4", "-p", "K=4"], 2, ["not an integer"]),
        (["compile", MATMUL, "-p", "M=0", "-p", "N=4", "-p", "K=4"], 1, [">= 1"]),
        (["compile", MATMUL, "-p", "M=4", "-p", "N=4"], 1, ["'K'"]),
        (["compile", MATMUL, *SIZES, "-p", "Z=1"], 1, ["unknown size"]),
        (["compile", MATMUL, *SIZES, "--target", "fpga"], 2, ["fpga"]),
        (["frobnicate"], 2, ["frobnicate"]),
        (["run"], 2, ["spec"]),
        (["run", MATMUL, *SIZES, "--repeat", "many"], 2, ["many"]),
        (["cache", "shred"], 2, ["shred"]),
        (["compile", str(ROOT / "examples")], 1, ["not a file"]),
    ],
)
def test_usage_and_spec_failures(
    argv: list[str], status: int, words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    line = _fails(argv, capsys, status)
    for word in words:
        assert word in line


def test_bad_spec_names_file_line_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.c"
    bad.write_bytes(b"void f(int N, float A[N]) {\n  A[0] = \xff;\n}\n")
    line = _fails(["compile", str(bad), "-p", "N=2"], capsys)
    assert str(bad) in line


def test_out_of_bounds_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "oob.c"
    bad.write_text("void f(int N, float A[N]) {\n  for (int i = 0; i <= N; i++)\n    A[i] = 1.0f;\n}\n")
    line = _fails(["run", str(bad), "-p", "N=3"], capsys)
    assert f"{bad}:3:5" in line and "outside" in line


def test_compile_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("POLYDL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("POLYDL_CFLAGS", "-fno-such-option-polydl")
    line = _fails(["run", MATMUL, *SIZES], capsys)
    assert "failed" in line and "fno-such-option-polydl" in line


def test_output_directory_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "taken"
    target.write_text("")
    _fails(["compile", MATMUL, *SIZES, "-o", str(target)], capsys)


def test_debug_shows_the_traceback_in_process() -> None:
    with pytest.raises(SpecError):
        main(["--debug", "compile", MATMUL, "-p", "M=0", "-p", "N=4", "-p", "K=4"])


@pytest.mark.slow
def test_debug_shows_the_traceback_from_the_console(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "polydl.cli", "compile", str(tmp_path / "none.c")]
    quiet = subprocess.run(argv, capture_output=True, text=True, env=env)
    loud = subprocess.run([*argv[:3], "--debug", *argv[3:]], capture_output=True, text=True, env=env)
    assert quiet.returncode == 1 and len(quiet.stderr.strip().splitlines()) == 1
    assert loud.returncode == 1 and "Traceback" in loud.stderr and "SpecError" in loud.stderr


def test_cache_info_and_clear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("POLYDL_CACHE_DIR", str(root))
    assert main(["compile", MATMUL, *SIZES, "-o", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(root) in out and " 0 files" not in out
    assert main(["cache", "clear"]) == 0
    assert not root.exists()
    assert main(["cache", "info"]) == 0
    assert "0 files" in capsys.readouterr().out
    assert main(["compile", MATMUL, *SIZES, "-o", str(tmp_path / "again")]) == 0  # rebuilds
    assert (tmp_path / "again" / "libmatmul.so").stat().st_size > 0


def test_spec_paths_with_odd_characters_are_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "scale=2 {v2}.c"
    spec.write_text("void f(int N, float v[N]) {\n  for (int i = 0; i < N; i++)\n    v[i] = 2.0f;\n}\n")
    assert main(["run", str(spec), "-p", "N=7", "--repeat", "1"]) == 0
    assert "verify   ok" in capsys.readouterr().out
    line = _fails(["run", str(tmp_path / "missing=1.c")], capsys)
    assert "no such file" in line


def test_corrupted_tuning_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "tuning.sqlite"
    db.write_text("not a database")
    line = _fails(["tune", MATMUL, *SIZES, "--trials", "1", "--db", str(db)], capsys)
    assert str(db) in line and "POLYDL_TUNING_DB" in line
