"""The tuning database: measured schedules, keyed by primitive, sizes, dtype and machine.

A small SQLite file (`POLYDL_TUNING_DB`, default `tuning.sqlite` in the cache directory) so a
shape is tuned once per machine and every later compile with `schedule="tuned"` reuses it. The
records are also the training data for predicting schedules of shapes never tuned.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from polydl import settings
from polydl.errors import PolyDLError
from polydl.ir import LoopNest
from polydl.schedules.schedule import Schedule

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tuned (
    key TEXT NOT NULL,
    machine TEXT NOT NULL,
    primitive TEXT NOT NULL,
    params TEXT NOT NULL,
    dtype TEXT NOT NULL,
    schedule TEXT NOT NULL,
    seconds REAL NOT NULL,
    gflops REAL NOT NULL,
    trials INTEGER NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (key, machine)
)
"""


def default_path() -> Path:
    return settings.tuning_db()


def nest_key(nest: LoopNest, params: dict[str, int]) -> str:
    """Identity of a primitive: its loop nest (as IR, independent of spelling) and sizes."""
    text = repr((nest.params, nest.arrays, nest.body)) + json.dumps(params, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class TuningRecord:
    schedule: Schedule
    seconds: float
    gflops: float
    trials: int


class TuningDatabase:
    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._connect() as db:
                db.execute(_SCHEMA)
        except sqlite3.DatabaseError as exc:  # not a database, unreadable, read-only, ...
            raise PolyDLError(
                f"tuning database {self.path} cannot be used ({exc}); move it away or set "
                "POLYDL_TUNING_DB to another file"
            ) from None

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def lookup(self, key: str, machine: str) -> TuningRecord | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT schedule, seconds, gflops, trials FROM tuned WHERE key=? AND machine=?",
                (key, machine),
            ).fetchone()
        if row is None:
            return None
        return TuningRecord(Schedule.from_json(row[0]), row[1], row[2], row[3])

    def store(
        self,
        key: str,
        machine: str,
        primitive: str,
        params: dict[str, int],
        dtype: str,
        record: TuningRecord,
    ) -> None:
        """Keep the faster of the stored and the new record."""
        old = self.lookup(key, machine)
        if old is not None and old.seconds <= record.seconds:
            return
        with self._connect() as db:
            db.execute(
                "INSERT OR REPLACE INTO tuned VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    key,
                    machine,
                    primitive,
                    json.dumps(params, sort_keys=True),
                    dtype,
                    record.schedule.to_json(),
                    record.seconds,
                    record.gflops,
                    record.trials,
                    time.time(),
                ),
            )

    def records(self) -> list[dict[str, object]]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT primitive, params, dtype, machine, schedule, seconds, gflops FROM tuned"
            ).fetchall()
        return [
            dict(primitive=r[0], params=json.loads(r[1]), dtype=r[2], machine=r[3],
                 schedule=json.loads(r[4]), seconds=r[5], gflops=r[6])
            for r in rows
        ]
