"""The performance database: storage, the system database beside the user's, schema versions,
export and import."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pytest

from polydl import settings
from polydl.errors import PolyDLError
from polydl.schedules.schedule import Schedule
from polydl.tuning import records
from polydl.tuning.database import (
    SCHEMA_VERSION,
    DatabaseFileError,
    PerfDatabase,
    TrialLineError,
)
from polydl.tuning.records import COMPILE_FAILED, NOISY, OK, TIMED_OUT, Problem, Trial

TARGET = json.dumps({"cores": 16, "isa": "avx512", "l1_bytes": 49152}, sort_keys=True)
OTHER_TARGET = json.dumps({"cores": 2, "isa": "avx2", "l1_bytes": 32768}, sort_keys=True)
MATMUL = Problem("a" * 32, "matmul", (("K", 64), ("M", 64), ("N", 32)), "float32", "f" * 24)
RELU = Problem("b" * 32, "relu", (("N", 1000),), "float32", "e" * 24)


def schedule(*order: str, tile: int = 0) -> dict:
    tiles = tuple((v, tile) for v in order) if tile else ()
    # as JSON gives it back: lists where to_dict() has tuples
    return json.loads(Schedule(order=order or ("i", "j", "k"), tiles=tiles).to_json())


def trial(status: str = OK, samples: tuple[float, ...] = (1e-3,), problem: Problem = MATMUL,
          target: str = TARGET, created: float = 1.0, **kw) -> Trial:
    return Trial(problem, target, kw.pop("sched", schedule()), status, samples,
                 created=created, **kw)


def user_db(path: Path, system: Path | bool = False) -> PerfDatabase:
    return PerfDatabase(path, system=system)


def test_every_trial_is_kept_and_read_back(tmp_path: Path) -> None:
    db = user_db(tmp_path / "u.sqlite")
    first = trial(samples=(2e-3, 1e-3, 3e-3), features={"flops": 2.0 * 64 * 64 * 32},
                  other_load=0.05, host="h1", message="m")
    again = trial(samples=(1.5e-3,), created=2.0)  # the same schedule, measured later
    assert db.add([first, again, trial(COMPILE_FAILED, (), problem=RELU)]) == 3
    got = db.trials(problem_key=MATMUL.key)
    assert [t.to_dict() for t in got] == [first.to_dict(), again.to_dict()]
    assert got[0].seconds == 2e-3 and got[0].origin == "user" and got[0].problem == MATMUL
    assert [t.problem for t in db.trials(statuses=[COMPILE_FAILED])] == [RELU]
    assert db.trials(target_key=OTHER_TARGET) == []


def test_export_then_import_into_a_fresh_database_gives_the_same_trials(tmp_path: Path) -> None:
    db = user_db(tmp_path / "u.sqlite")
    db.add([trial(samples=(1e-3, 2e-3), features={"flops": 1e6}),
            trial(NOISY, (5e-4,), other_load=0.7, sched=schedule("j", "i", "k", tile=8)),
            trial(TIMED_OUT, (), problem=RELU, target=OTHER_TARGET, message="after 10 s")])
    stream = io.StringIO()
    assert db.export(stream) == 3
    lines = stream.getvalue().splitlines()
    fresh = user_db(tmp_path / "fresh.sqlite")
    assert fresh.import_lines(lines, "dump.jsonl") == 3
    assert [t.to_dict() for t in fresh.trials()] == [t.to_dict() for t in db.trials()]
    assert fresh.import_lines(lines, "dump.jsonl") == 0  # exact duplicates are skipped
    assert len(fresh.trials()) == 3


def write_v1(path: Path) -> None:
    """A file as the tuning database before schema 2 wrote it: only winners, table `tuned`."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE tuned (key TEXT NOT NULL, machine TEXT NOT NULL, primitive TEXT "
                   "NOT NULL, params TEXT NOT NULL, dtype TEXT NOT NULL, schedule TEXT NOT NULL, "
                   "seconds REAL NOT NULL, gflops REAL NOT NULL, trials INTEGER NOT NULL, "
                   "created REAL NOT NULL, PRIMARY KEY (key, machine))")
        db.execute("INSERT INTO tuned VALUES (?,?,?,?,?,?,?,?,?,?)",
                   (MATMUL.key, TARGET, "matmul", json.dumps({"M": 64, "N": 32, "K": 64}),
                    "float32", json.dumps(schedule()), 0.004, 66.0, 8, 123.0))
    db.close()


def _version(path: Path) -> int:
    with sqlite3.connect(path) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    db.close()
    assert "tuned" not in tables or version == 0
    return int(version)


def test_a_file_of_the_old_schema_is_migrated_in_place_once(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    write_v1(path)
    [t] = user_db(path).trials()
    assert _version(path) == SCHEMA_VERSION == 3
    assert t.problem == Problem(MATMUL.key, "matmul", MATMUL.params, "float32", "")
    assert (t.status, t.samples, t.target_key, t.features, t.created) == (OK, (0.004,), TARGET,
                                                                         {}, 123.0)
    assert Schedule.from_dict(dict(t.schedule)) == Schedule(order=("i", "j", "k"))
    assert user_db(path).best(MATMUL.key, TARGET) == t  # opened again: not migrated twice
    assert len(user_db(path).trials()) == 1
    # a fingerprint given later fills the one the old schema did not have
    user_db(path).add([trial(samples=(0.005,), created=200.0)])
    assert {t.problem.fingerprint for t in user_db(path).trials()} == {MATMUL.fingerprint}


def write_v2(path: Path) -> None:
    """A file of schema 2: every trial, timed without a reference beside it."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE problems (key TEXT PRIMARY KEY, primitive TEXT NOT NULL, params "
                   "TEXT NOT NULL, dtype TEXT NOT NULL, fingerprint TEXT NOT NULL, created REAL "
                   "NOT NULL)")
        db.execute("CREATE TABLE trials (id INTEGER PRIMARY KEY, problem TEXT NOT NULL, "
                   "target_key TEXT NOT NULL, schedule TEXT NOT NULL, schedule_key TEXT NOT NULL, "
                   "status TEXT NOT NULL, samples TEXT NOT NULL, seconds REAL, features TEXT NOT "
                   "NULL, message TEXT NOT NULL, other_load REAL, host TEXT NOT NULL, created "
                   "REAL NOT NULL)")
        db.execute("INSERT INTO problems VALUES (?,?,?,?,?,?)",
                   (MATMUL.key, "matmul", json.dumps(dict(MATMUL.params), sort_keys=True),
                    "float32", MATMUL.fingerprint, 1.0))
        old = trial(samples=(0.004,))
        db.execute("INSERT INTO trials (problem, target_key, schedule, schedule_key, status, "
                   "samples, seconds, features, message, other_load, host, created) VALUES "
                   "(?,?,?,?,?,?,?,?,?,?,?,?)",
                   (MATMUL.key, TARGET, json.dumps(old.schedule, sort_keys=True),
                    old.schedule_key, OK, "[0.004]", 0.004, "{}", "", None, "h", 5.0))
        db.execute("PRAGMA user_version = 2")
    db.close()


def test_a_file_of_schema_2_gains_the_reference_samples_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite"
    write_v2(path)
    [t] = user_db(path).trials()
    assert _version(path) == 3
    assert (t.samples, t.reference_samples, t.relative, t.host) == ((0.004,), (), None, "h")
    user_db(path).add([trial(samples=(0.003,), reference_samples=(0.006,), created=6.0)])
    assert [x.relative for x in user_db(path).trials()] == [None, 0.5]


def test_a_trial_timed_in_every_round_beside_the_reference_compares_round_by_round() -> None:
    # the third round ran slow for the reference alone: its median moves, the rounds' does not
    paired = trial(samples=(1e-3, 1.1e-3, 1e-3), reference_samples=(2e-3, 2.2e-3, 9e-3))
    assert paired.relative == pytest.approx(0.5)
    assert paired.seconds / 2.2e-3 != pytest.approx(0.5)
    # a candidate timed once has one sample: the ratio of the medians
    once = trial(samples=(3e-3,), reference_samples=(2e-3, 2.2e-3, 9e-3))
    assert once.relative == pytest.approx(3e-3 / 2.2e-3)


def test_measurements_of_one_schedule_pool_their_rounds() -> None:
    # the first request met a fast spell of the candidate's, the second a slow one: pooled,
    # every round's ratio counts, not the luckier request's
    fast = trial(samples=(0.9e-3, 0.9e-3, 0.9e-3), reference_samples=(1e-3, 1e-3, 1e-3))
    slow = trial(samples=(1.1e-3, 1.1e-3, 1.1e-3), reference_samples=(1e-3, 1e-3, 1e-3))
    both = records.pooled([fast, slow])
    assert both.round_ratios == pytest.approx((0.9, 0.9, 0.9, 1.1, 1.1, 1.1))
    assert both.relative == pytest.approx(1.0)
    assert records.pooled([slow]) is slow
    # a measurement timed once pairs no rounds: the measurement of median time stands
    once = trial(samples=(1.3e-3,), reference_samples=(1e-3, 1e-3, 1e-3))
    assert records.pooled([once, fast, slow]) is slow
    assert records.pooled([once, fast]) is fast


def test_the_best_compares_ratios_to_the_reference_timed_beside_each(tmp_path: Path) -> None:
    db = user_db(tmp_path / "u.sqlite")
    # measured while the machine ran slow: more seconds, yet half the reference's time
    slow_minute = trial(samples=(3e-3,), reference_samples=(6e-3,), sched=schedule("j", "i", "k"))
    fast_minute = trial(samples=(2e-3,), reference_samples=(2.5e-3,), sched=schedule("k", "i", "j"))
    db.add([fast_minute, slow_minute])
    assert db.best(MATMUL.key, TARGET) == slow_minute
    [entry] = db.summary()
    assert entry.best == slow_minute
    # a trial without a reference makes the problem's trials comparable by seconds only
    unreferenced = trial(samples=(2.5e-3,), sched=schedule("i", "k", "j"))
    db.add([unreferenced])
    assert db.best(MATMUL.key, TARGET) == fast_minute


def test_a_file_of_a_newer_schema_asks_for_a_newer_polydl(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 7")
    db.close()
    with pytest.raises(DatabaseFileError, match="version 7") as info:
        user_db(path)
    assert "upgrade polydl" in str(info.value) and info.value.path == path


@pytest.mark.parametrize("content", [b"not a database", b"SQLite format 3\x00" + b"\xff" * 200])
def test_a_file_that_is_not_a_database_names_its_path_and_the_way_out(
        tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "tuning.sqlite"
    path.write_bytes(content)
    with pytest.raises(PolyDLError) as info:
        user_db(path)
    assert str(path) in str(info.value) and "POLYDL_TUNING_DB" in str(info.value)


def test_a_database_of_someone_else_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE invoices (id INTEGER)")
    db.close()
    with pytest.raises(DatabaseFileError, match="invoices"):
        user_db(path)
    assert _version(path) == 0


def _system(tmp_path: Path, trials: list[Trial]) -> Path:
    path = tmp_path / "system.sqlite"
    user_db(path).add(trials)
    path.chmod(0o444)
    return path


def test_the_system_database_is_read_and_never_written(tmp_path: Path) -> None:
    system = _system(tmp_path, [trial(samples=(1e-4,))])
    before = system.read_bytes()
    db = user_db(tmp_path / "u.sqlite", system)
    db.add([trial(samples=(2e-3,), created=5.0)])
    assert [t.origin for t in db.trials()] == ["system", "user"]
    assert system.read_bytes() == before
    assert len(PerfDatabase(tmp_path / "u.sqlite", system=False).trials()) == 1
    assert db.measured(MATMUL.key, TARGET) == {trial().schedule_key}  # the user's only
    assert [t.origin for t in db.trials()] == ["system", "user"]


def test_the_user_s_ok_trial_wins_over_a_faster_system_one(tmp_path: Path) -> None:
    system = _system(tmp_path, [trial(samples=(1e-4,), sched=schedule("k", "i", "j"))])
    db = user_db(tmp_path / "u.sqlite", system)
    db.add([trial(NOISY, (1e-5,), created=3.0)])  # only noisy: the system's stands
    best = db.best(MATMUL.key, TARGET)
    assert best is not None and best.origin == "system" and best.seconds == 1e-4
    db.add([trial(samples=(3e-3,), created=4.0),
            trial(samples=(2e-3,), created=5.0, sched=schedule("j", "i", "k"))])
    best = db.best(MATMUL.key, TARGET)
    assert best is not None and (best.origin, best.seconds) == ("user", 2e-3)
    [entry] = db.summary()
    assert entry.best == best and dict(entry.counts) == {OK: 3, NOISY: 1} and entry.total == 4
    assert db.best(MATMUL.key, OTHER_TARGET) is None


def test_a_schedule_timed_again_counts_by_its_slower_measurement(tmp_path: Path) -> None:
    """Once some schedules were measured twice (`polydl tune`'s finalists, beside the analytic
    choice), the best is the one that won both times: a single lucky measurement is not."""
    analytic, lucky, finalist = schedule(), schedule("k", "i", "j"), schedule("j", "i", "k")

    def timed(sched: dict, ratio: float, created: float) -> Trial:
        return trial(samples=(ratio * 1e-3,), reference_samples=(1e-3,), sched=sched, created=created)

    db = user_db(tmp_path / "u.sqlite")
    db.add([timed(analytic, 1.0, 1.0), timed(lucky, 0.5, 2.0), timed(finalist, 0.9, 3.0)])
    best = db.best(MATMUL.key, TARGET)
    assert best is not None and best.schedule == lucky  # nothing timed twice: the fastest
    db.add([timed(analytic, 1.0, 4.0), timed(finalist, 0.95, 5.0)])
    best = db.best(MATMUL.key, TARGET)
    assert best is not None and best.schedule == finalist and best.relative == 0.95
    db.add([timed(finalist, 1.1, 6.0)])  # lost the third time: the analytic choice stands
    best = db.best(MATMUL.key, TARGET)
    assert best is not None and best.schedule == analytic
    [entry] = db.summary()
    assert entry.best == best


def test_the_system_database_follows_the_setting(tmp_path: Path) -> None:
    system = _system(tmp_path, [trial()])
    with settings.override(system_db=str(system)):
        assert PerfDatabase(tmp_path / "u.sqlite").system == system
    with settings.override(system_db=""):
        assert PerfDatabase(tmp_path / "u.sqlite").system is None
    with settings.override(system_db=str(tmp_path / "missing.sqlite")), \
            pytest.raises(DatabaseFileError, match="POLYDL_SYSTEM_DB"):
        PerfDatabase(tmp_path / "u.sqlite")


def test_a_system_database_of_the_old_schema_is_read_through_a_copy(tmp_path: Path) -> None:
    path = tmp_path / "system.sqlite"
    write_v1(path)
    path.chmod(0o444)
    [t] = user_db(tmp_path / "u.sqlite", path).trials()
    assert (t.origin, t.seconds) == ("system", 0.004) and _version(path) == 0


def test_noisy_trials_are_never_the_best_nor_measured(tmp_path: Path) -> None:
    db = user_db(tmp_path / "u.sqlite")
    db.add([trial(NOISY, (1e-6,)), trial(samples=(1e-3,), sched=schedule("j", "i", "k")),
            trial(COMPILE_FAILED, (), sched=schedule("k", "j", "i"))])
    best = db.best(MATMUL.key, TARGET)
    assert best is not None and best.status == OK
    assert db.measured(MATMUL.key, TARGET) == {
        trial(sched=schedule("j", "i", "k")).schedule_key,
        trial(sched=schedule("k", "j", "i")).schedule_key,
    }
    only_noisy = user_db(tmp_path / "n.sqlite")
    only_noisy.add([trial(NOISY, (1e-6,))])
    assert only_noisy.best(MATMUL.key, TARGET) is None
    assert only_noisy.measured(MATMUL.key, TARGET) == set()


GOOD = json.dumps(trial().to_dict())


@pytest.mark.parametrize(
    "line, words",
    [
        ("{not json", ["not JSON"]),
        ("[1, 2]", ["JSON object"]),
        (json.dumps({k: v for k, v in trial().to_dict().items() if k != "target"}), ["target"]),
        (GOOD.replace('"ok"', '"great"'), ["unknown status 'great'"]),
        (GOOD.replace('"samples": [0.001]', '"samples": ["fast"]'), ["samples", "numbers"]),
        (GOOD.replace('"reference_samples": []', '"reference_samples": 0.002'),
         ["reference_samples", "a list of numbers"]),
        (GOOD.replace('"M": 64', '"M": "64"'), ["params"]),
        (GOOD.replace('"primitive": "matmul"', '"primitive": 3'), ["primitive", "string"]),
    ],
)
def test_an_import_error_names_the_file_and_line(tmp_path: Path, line: str, words: list[str]) -> None:
    db = user_db(tmp_path / "u.sqlite")
    with pytest.raises(TrialLineError) as info:
        db.import_lines([GOOD, "", line], "dump.jsonl")
    assert (info.value.source, info.value.line) == ("dump.jsonl", 3)
    assert str(info.value).startswith("dump.jsonl:3: error: ")
    assert all(w in info.value.reason for w in words), info.value.reason
    assert db.trials() == []  # all or nothing


def test_merge_adds_what_the_other_file_lacks(tmp_path: Path) -> None:
    ours, theirs = user_db(tmp_path / "ours.sqlite"), user_db(tmp_path / "theirs.sqlite")
    shared = trial(samples=(1e-3,))
    ours.add([shared])
    theirs.add([shared, trial(samples=(2e-3,), problem=RELU), trial(NOISY, (1e-4,), created=9.0)])
    assert ours.merge(tmp_path / "theirs.sqlite") == 2
    assert ours.merge(tmp_path / "theirs.sqlite") == 0
    assert len(ours.trials()) == 3 and len(theirs.trials()) == 3
    old = tmp_path / "old.sqlite"
    write_v1(old)
    assert ours.merge(old) == 1 and _version(old) == 0  # the other file is only read
    with pytest.raises(DatabaseFileError, match="missing.sqlite"):
        ours.merge(tmp_path / "missing.sqlite")


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    db = user_db(tmp_path / "u.sqlite")

    def trials():
        yield trial()
        raise RuntimeError("measuring stopped")

    with pytest.raises(RuntimeError):
        db.add(trials())
    assert db.trials() == []


@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_a_path_that_cannot_hold_a_database_is_named(tmp_path: Path, where: str) -> None:
    if where == "a directory":
        path = tmp_path / "db.sqlite"
        path.mkdir()
    else:
        (tmp_path / "plain").write_text("")
        path = tmp_path / "plain" / "db.sqlite"
    with pytest.raises(DatabaseFileError) as info:
        user_db(path)
    assert info.value.path == path and "POLYDL_TUNING_DB" in str(info.value)


def test_processes_opening_a_new_file_at_once_all_find_the_schema(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "shared.sqlite"

    def open_and_add(i: int) -> int:
        return user_db(path).add([trial(created=float(i))])

    with ThreadPoolExecutor(4) as pool:
        assert sum(pool.map(open_and_add, range(8))) == 8
    assert len(user_db(path).trials()) == 8 and _version(path) == SCHEMA_VERSION
