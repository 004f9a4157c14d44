"""`polydl db` through the command line's main: output, files written, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polydl.cli import main
from polydl.tuning.database import PerfDatabase
from polydl.tuning.records import COMPILE_FAILED, NOISY, OK, Problem, Trial
from tests.tuning.test_database import MATMUL, RELU, schedule, trial, write_v1


@pytest.fixture(autouse=True)
def _no_shipped_system_db(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYDL_SYSTEM_DB", "")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "user.sqlite"
    PerfDatabase(path, system=False).add([
        trial(samples=(2e-3, 2e-3), features={"flops": 2.0 * 64 * 64 * 32}),
        trial(samples=(1e-3,), features={"flops": 2.0 * 64 * 64 * 32}, created=2.0,
              sched=schedule("j", "i", "k", tile=16)),
        trial(NOISY, (1e-5,), created=3.0, message="load 0.8"),
        trial(COMPILE_FAILED, (), created=4.0, message="cc: error", sched={"order": 3}),
        trial(samples=(5e-4,), problem=RELU),
    ])
    return path


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("polydl: "), lines
    return lines[0]


def test_list_shows_one_line_per_problem_and_target(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "list", "--db", str(db)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2
    matmul = next(line for line in out if "matmul" in line)
    assert matmul.startswith(MATMUL.key[:12]) and "M=64" in matmul and "float32" in matmul
    assert "avx512 16 cores" in matmul
    assert "2 ok, 1 compile_failed, 1 noisy" in matmul
    assert "best 1.000 ms 0.3 GFLOP/s (user)" in matmul
    relu = next(line for line in out if "relu" in line)
    assert "best 0.500 ms (user)" in relu and "GFLOP/s" not in relu  # no flops known


def test_list_of_an_empty_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "list", "--db", str(tmp_path / "new.sqlite")]) == 0
    assert "no trials" in capsys.readouterr().out


def test_list_reads_the_system_database_given(db: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    system = tmp_path / "system.sqlite"
    other = Problem("c" * 32, "softmax", (("N", 8),), "float32")
    PerfDatabase(system, system=False).add([trial(samples=(1e-4,), problem=other)])
    assert main(["db", "list", "--db", str(db), "--system", str(system)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "softmax" in ln)
    assert "(system)" in line


def test_show_lists_the_trials_of_a_problem_fastest_first(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "show", MATMUL.key[:6], "--db", str(db)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("problem  matmul(") and MATMUL.key in out[0]
    statuses = [line.split()[0] for line in out[1:]]
    assert statuses == [NOISY, OK, OK, COMPILE_FAILED]
    assert "0.010 ms" in out[1] and "load 0.8" in out[1]
    assert "1.000 ms" in out[2] and "order j > i > k" in out[2] and "tiles" in out[2]
    assert "x2" in out[3]
    assert '{"order": 3}' in out[4] and "cc: error" in out[4]  # a schedule that does not parse


def test_show_needs_a_prefix_of_exactly_one_key(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "no problem key starts with 'zz'" in _fails(["db", "show", "zz", "--db", str(db)], capsys)
    line = _fails(["db", "show", "", "--db", str(db)], capsys)
    assert "starts 2 problem keys" in line


def test_export_import_and_merge(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "export", "--db", str(db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and all(json.loads(line)["problem"] for line in lines)
    dump = tmp_path / "dump.jsonl"
    assert main(["db", "export", "--db", str(db), "-o", str(dump)]) == 0
    assert "exported 5 trials" in capsys.readouterr().out
    assert dump.read_text().splitlines() == lines
    fresh = tmp_path / "fresh.sqlite"
    assert main(["db", "import", str(dump), "--db", str(fresh)]) == 0
    assert "added 5 of 5 trials" in capsys.readouterr().out
    assert main(["db", "import", str(dump), "--db", str(fresh)]) == 0
    assert "added 0 of 5 trials" in capsys.readouterr().out
    other = tmp_path / "other.sqlite"
    write_v1(other)
    assert main(["db", "merge", str(other), "--db", str(fresh)]) == 0
    assert "added 1 trials from" in capsys.readouterr().out
    assert len(PerfDatabase(fresh, system=False).trials()) == 6


def test_export_includes_the_system_database_only_when_asked(
        db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    system = tmp_path / "system.sqlite"
    PerfDatabase(system, system=False).add([trial(samples=(1e-4,), created=9.0)])
    base = ["db", "export", "--db", str(db), "--system", str(system)]
    assert main(base) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5
    assert main([*base, "--include-system"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 6


def test_a_bad_import_line_is_one_error_line_naming_it(db: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "bad.jsonl"
    good: Trial = trial()
    dump.write_text(json.dumps(good.to_dict()) + "\n\n{oops\n")
    line = _fails(["db", "import", str(dump), "--db", str(db)], capsys)
    assert line.startswith(f"polydl: {dump}:3: error: not JSON")


def test_a_corrupt_database_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.sqlite"
    path.write_text("not a database")
    line = _fails(["db", "list", "--db", str(path)], capsys)
    assert str(path) in line and "POLYDL_TUNING_DB" in line
    line = _fails(["db", "merge", str(path), "--db", str(tmp_path / "ok.sqlite")], capsys)
    assert str(path) in line


def test_db_needs_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db"]) == 2
    assert "polydl db" in capsys.readouterr().err
