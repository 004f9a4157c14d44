"""The performance database: every trial of every problem, in one SQLite file.

The user's file (`POLYDL_TUNING_DB`) is read and written; a system file shipped beside it
(`POLYDL_SYSTEM_DB`, as MIOpen ships a system performance database) is only read. Reads
return both, each trial marked with its origin, and the user's measurements win: the best
trial of a problem on a target is the user's fastest `ok` trial when there is one, the
system's otherwise.

The schema's version is the file's `PRAGMA user_version`. Opening the user's file brings an
older one up to `SCHEMA_VERSION` in place, inside one transaction (a concurrent opener waits
and then finds it done); a read-only file of an older version is upgraded in a copy in memory.
Every write is one transaction, so another process sees all of it or none.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

from polydl import settings
from polydl.errors import PolyDLError
from polydl.tuning.records import (
    FINAL_STATUSES,
    OK,
    STATUSES,
    Problem,
    Trial,
    checked_trial,
    comparable_times,
    schedule_key,
)

SCHEMA_VERSION = 3
USER, SYSTEM = "user", "system"
_VARIABLE = {USER: "POLYDL_TUNING_DB", SYSTEM: "POLYDL_SYSTEM_DB"}

_SCHEMA = (
    """CREATE TABLE problems (
        key TEXT PRIMARY KEY,
        primitive TEXT NOT NULL,
        params TEXT NOT NULL,  -- JSON object: size name -> value
        dtype TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        created REAL NOT NULL
    )""",
    """CREATE TABLE trials (
        id INTEGER PRIMARY KEY,
        problem TEXT NOT NULL REFERENCES problems(key),
        target_key TEXT NOT NULL,
        schedule TEXT NOT NULL,  -- JSON: Schedule.to_dict()
        schedule_key TEXT NOT NULL,
        status TEXT NOT NULL,
        samples TEXT NOT NULL,  -- JSON list of seconds per call
        seconds REAL,  -- their median; NULL without samples
        features TEXT NOT NULL,  -- JSON object
        message TEXT NOT NULL,
        other_load REAL,
        host TEXT NOT NULL,
        created REAL NOT NULL,
        reference_samples TEXT NOT NULL DEFAULT '[]'  -- JSON: the reference's seconds per call
    )""",
    "CREATE INDEX trials_of_problem ON trials (problem, target_key)",
)
# Every version before 2 kept only the winner of each (problem, machine) in this table.
_V1_TABLE = "tuned"
# Version 3 timed each trial beside a reference schedule.
_V3_COLUMN = "reference_samples TEXT NOT NULL DEFAULT '[]'"

_COLUMNS = ("p.key, p.primitive, p.params, p.dtype, p.fingerprint, t.target_key, t.schedule, "
            "t.status, t.samples, t.features, t.message, t.other_load, t.host, t.created, "
            "t.reference_samples")
_FROM = "FROM trials t JOIN problems p ON p.key = t.problem"

T = TypeVar("T")


class DatabaseFileError(PolyDLError):
    """A database file polydl cannot use: not SQLite, unreadable, or written by a newer polydl."""

    def __init__(self, path: Path, reason: str, variable: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.variable = variable  # the setting that names the file, if one does
        hint = f" or set {variable} to another file" if variable else ""
        super().__init__(f"tuning database {path} cannot be used ({reason}); move it away{hint}")


class TrialLineError(PolyDLError):
    """A line of an imported file that is not a trial."""

    def __init__(self, source: str, line: int, reason: str) -> None:
        self.source = source
        self.line = line
        self.reason = reason
        super().__init__(f"{source}:{line}: error: {reason}")


@dataclass(frozen=True)
class Summary:
    """What the database knows of one problem on one target."""

    problem: Problem
    target_key: str
    counts: tuple[tuple[str, int], ...]  # trials by status (both databases), in STATUSES order
    best: Trial | None

    @property
    def total(self) -> int:
        return sum(n for _, n in self.counts)


class PerfDatabase:
    def __init__(self, path: Path | str | None = None, system: Path | str | bool = True) -> None:
        """`system`: True for `settings.system_db()`, False for none, or a file."""
        self.path = Path(path) if path is not None else settings.tuning_db()
        self.system: Path | None = (settings.system_db() if system is True
                                    else None if system is False else Path(system))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseFileError(self.path, exc.strerror or str(exc), _VARIABLE[USER]) from None
        self._read(lambda db, origin: [])  # create, upgrade or reject the files now

    def add(self, trials: Iterable[Trial]) -> int:
        """Store `trials` (with their problems) in one transaction; how many were stored."""
        with _opened(self.path, _VARIABLE[USER]) as db:
            return _insert(db, trials, skip_duplicates=False)

    def trials(self, problem_key: str | None = None, target_key: str | None = None,
               statuses: Iterable[str] | None = None) -> list[Trial]:
        """Trials of both databases (the system's first), in the order they were stored."""
        where, args = [], []
        if problem_key is not None:
            where.append("t.problem = ?")
            args.append(problem_key)
        if target_key is not None:
            where.append("t.target_key = ?")
            args.append(target_key)
        if statuses is not None:
            wanted = sorted(set(statuses))
            where.append(f"t.status IN ({', '.join('?' * len(wanted))})")
            args += wanted
        query = f"SELECT {_COLUMNS} {_FROM} {_where(where)} ORDER BY t.id"
        return self._read(lambda db, origin: _trials(db.execute(query, args), origin))

    def best(self, problem_key: str, target_key: str) -> Trial | None:
        """The fastest `ok` trial (by `records.comparable_times`), the user's if the user has
        any (noisy ones never count)."""
        return _fastest(self.trials(problem_key, target_key, statuses=[OK]))

    def measured(self, problem_key: str, target_key: str) -> set[str]:
        """Schedule keys the user's database holds a final result for (what a resumed tuning
        run need not measure again)."""
        final = sorted(FINAL_STATUSES)
        query = ("SELECT DISTINCT schedule_key FROM trials WHERE problem = ? AND target_key = ? "
                 f"AND status IN ({', '.join('?' * len(final))})")
        rows = self._read(lambda db, _: db.execute(query, (problem_key, target_key, *final))
                          .fetchall(), origins=(USER,))
        return {row[0] for row in rows}

    def summary(self) -> list[Summary]:
        """One entry per (problem, target) with trials in either database, by primitive and sizes."""
        problems = dict(self._read(lambda db, _: [
            (row[0], _problem(row))
            for row in db.execute("SELECT key, primitive, params, dtype, fingerprint FROM problems")
        ]))
        counts: dict[tuple[str, str], dict[str, int]] = {}
        for key, target, status, n in self._read(lambda db, _: db.execute(
                "SELECT problem, target_key, status, COUNT(*) FROM trials GROUP BY 1, 2, 3").fetchall()):
            by_status = counts.setdefault((key, target), {})
            by_status[status] = by_status.get(status, 0) + n
        measured: dict[tuple[str, str], list[Trial]] = {}
        for t in self.trials(statuses=[OK]):
            measured.setdefault((t.problem.key, t.target_key), []).append(t)
        entries = [
            Summary(problems[key], target,
                    tuple((s, by_status[s]) for s in STATUSES if s in by_status),
                    _fastest(measured.get((key, target), [])))
            for (key, target), by_status in counts.items()
        ]
        return sorted(entries, key=lambda e: (e.problem.primitive, e.problem.params,
                                              e.problem.dtype, e.target_key))

    def export(self, stream: IO[str], include_system: bool = False) -> int:
        """Write one JSON object per trial and line (`Trial.to_dict()`); how many were written."""
        trials = self._read(
            lambda db, origin: _trials(db.execute(f"SELECT {_COLUMNS} {_FROM} ORDER BY t.id"), origin),
            origins=(SYSTEM, USER) if include_system else (USER,))
        for trial in trials:
            stream.write(json.dumps(trial.to_dict(), sort_keys=True) + "\n")
        return len(trials)

    def import_lines(self, lines: Iterable[str], source: str) -> int:
        """Add the trials of exported lines (blank lines skipped), all or none; trials already
        stored are skipped. How many were added."""
        trials = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrialLineError(source, number, f"not JSON ({exc})") from None
            try:
                trials.append(checked_trial(data))
            except ValueError as exc:
                raise TrialLineError(source, number, str(exc)) from None
        with _opened(self.path, _VARIABLE[USER]) as db:
            return _insert(db, trials, skip_duplicates=True)

    def merge(self, other: Path | str) -> int:
        """Add the trials of another database file (only read, whatever its version) that this
        one lacks; how many were added."""
        with _opened(Path(other), None, readonly=True) as source:
            trials = _trials(source.execute(f"SELECT {_COLUMNS} {_FROM} ORDER BY t.id"), USER)
        with _opened(self.path, _VARIABLE[USER]) as db:
            return _insert(db, trials, skip_duplicates=True)

    def _read(self, query: Callable[[sqlite3.Connection, str], list[T]],
              origins: tuple[str, ...] = (SYSTEM, USER)) -> list[T]:
        """`query(connection, origin)` on each database of `origins` there is, concatenated."""
        found: list[T] = []
        for origin in origins:
            path = self.path if origin == USER else self.system
            if path is not None:
                with _opened(path, _VARIABLE[origin], readonly=origin == SYSTEM) as db:
                    found += query(db, origin)
        return found


@contextlib.contextmanager
def _opened(path: Path, variable: str | None, readonly: bool = False) -> Iterator[sqlite3.Connection]:
    """A connection to `path` at `SCHEMA_VERSION` (a read-only file of an older version: to an
    upgraded copy in memory); any SQLite failure becomes a `DatabaseFileError`."""
    db: sqlite3.Connection | None = None
    try:
        if readonly:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30,
                                 isolation_level=None)
            if _version(db, path, variable) != SCHEMA_VERSION:
                source, db = db, sqlite3.connect(":memory:", isolation_level=None)
                try:
                    source.backup(db)
                finally:
                    source.close()
        else:
            db = sqlite3.connect(path, timeout=30, isolation_level=None)
        if _version(db, path, variable) != SCHEMA_VERSION:
            _upgrade(db, path, variable)
        yield db
    except sqlite3.Error as exc:
        raise DatabaseFileError(path, str(exc), variable) from None
    finally:
        if db is not None:
            db.close()


def _version(db: sqlite3.Connection, path: Path, variable: str | None) -> int:
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise DatabaseFileError(
            path, f"its schema version {version} is newer than the {SCHEMA_VERSION} this polydl "
            "reads; upgrade polydl to use it", variable)
    return version


def _upgrade(db: sqlite3.Connection, path: Path, variable: str | None) -> None:
    with _transaction(db):
        version = _version(db, path, variable)
        if version == SCHEMA_VERSION:  # another process did it meanwhile
            return
        tables = {row[0] for row in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
        if version == 2 and {"problems", "trials"} <= tables:
            db.execute(f"ALTER TABLE trials ADD COLUMN {_V3_COLUMN}")
        elif tables - {_V1_TABLE}:
            raise DatabaseFileError(path, "not a polydl tuning database: it has the tables "
                                    f"{', '.join(sorted(tables))}", variable)
        else:  # new, or the winners-only table of version 1
            for statement in _SCHEMA:
                db.execute(statement)
            if _V1_TABLE in tables:
                _migrate_v1(db)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _migrate_v1(db: sqlite3.Connection) -> None:
    """Each winner of the old table becomes a problem and one `ok` trial of its time."""
    rows = db.execute("SELECT key, machine, primitive, params, dtype, schedule, seconds, trials, "
                      f"created FROM {_V1_TABLE}").fetchall()
    for key, machine, primitive, params, dtype, schedule, seconds, count, created in rows:
        db.execute("INSERT OR IGNORE INTO problems VALUES (?, ?, ?, ?, '', ?)",
                   (key, primitive, _canonical(json.loads(params)), dtype, created))
        db.execute(
            "INSERT INTO trials (problem, target_key, schedule, schedule_key, status, samples, "
            "seconds, features, message, other_load, host, created) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, '{}', ?, NULL, '', ?)",
            (key, machine, _canonical(json.loads(schedule)), schedule_key(json.loads(schedule)), OK,
             json.dumps([seconds]), seconds, f"the best of {count} trials before schema 2",
             created))
    db.execute(f"DROP TABLE {_V1_TABLE}")


def _insert(db: sqlite3.Connection, trials: Iterable[Trial], skip_duplicates: bool) -> int:
    added = 0
    with _transaction(db):
        for t in trials:
            p = t.problem
            # a problem first stored without its fingerprint (migrated) takes one given later
            db.execute(
                "INSERT INTO problems VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                "fingerprint = excluded.fingerprint WHERE problems.fingerprint = ''",
                (p.key, p.primitive, _canonical(dict(p.params)), p.dtype, p.fingerprint,
                 time.time()))
            samples = json.dumps(list(t.samples))
            if skip_duplicates and db.execute(
                    "SELECT 1 FROM trials WHERE problem = ? AND target_key = ? AND "
                    "schedule_key = ? AND created = ? AND samples = ? LIMIT 1",
                    (p.key, t.target_key, t.schedule_key, t.created, samples)).fetchone():
                continue
            db.execute(
                "INSERT INTO trials (problem, target_key, schedule, schedule_key, status, "
                "samples, seconds, features, message, other_load, host, created, "
                "reference_samples) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (p.key, t.target_key, _canonical(dict(t.schedule)), t.schedule_key, t.status,
                 samples, t.seconds, _canonical(dict(t.features)), t.message, t.other_load,
                 t.host, t.created, json.dumps(list(t.reference_samples))))
            added += 1
    return added


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    # IMMEDIATE: take the write lock at once, so two writers queue (up to the timeout) instead
    # of one failing when it upgrades a read lock
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if db.in_transaction:  # some failures (a full disk) have rolled it back already
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _fastest(trials: list[Trial]) -> Trial | None:
    """The fastest of one problem's `ok` trials on one target, by `comparable_times`: among
    the user's if there are any, else among the system's.

    Where some schedules were measured by more than one process (`polydl tune` measures its
    finalists again beside the analytic choice), only those count, each by its slowest
    measurement: a schedule is the best when it won every time it was timed. The fastest of
    many noisy single measurements is fast partly by luck, and its gain over the analytic
    schedule mostly goes when timed again beside it.
    see decisions: Tuned bests confirmed beside the analytic choice"""
    mine = [t for t in trials if t.origin == USER and t.seconds is not None]
    pool = mine or [t for t in trials if t.seconds is not None]
    if not pool:
        return None
    times = comparable_times(pool)
    slowest: dict[str, int] = {}  # schedule key -> index of its slowest trial
    count: dict[str, int] = {}
    for i, t in enumerate(pool):
        key = t.schedule_key
        count[key] = count.get(key, 0) + 1
        if key not in slowest or times[i] > times[slowest[key]]:
            slowest[key] = i
    confirmed = [i for key, i in slowest.items() if count[key] > 1]
    if confirmed:
        return pool[min(confirmed, key=times.__getitem__)]
    return pool[min(range(len(pool)), key=times.__getitem__)]


def _trials(rows: Iterable[tuple], origin: str) -> list[Trial]:
    return [
        Trial(problem=_problem(row[:5]), target_key=row[5], schedule=json.loads(row[6]),
              status=row[7], samples=tuple(json.loads(row[8])), features=json.loads(row[9]),
              message=row[10], other_load=row[11], host=row[12], created=row[13], origin=origin,
              reference_samples=tuple(json.loads(row[14])))
        for row in rows
    ]


def _problem(row: tuple) -> Problem:
    key, primitive, params, dtype, fingerprint = row
    return Problem(key, primitive, tuple(sorted(json.loads(params).items())), dtype, fingerprint)


def _canonical(data: object) -> str:
    return json.dumps(data, sort_keys=True)


def _where(clauses: list[str]) -> str:
    return f"WHERE {' AND '.join(clauses)}" if clauses else ""
