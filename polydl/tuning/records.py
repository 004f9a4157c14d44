"""What the performance database holds: problems (a loop nest at its sizes) and trials (one
schedule of one problem measured on one target), as values that serialise to JSON.

Every trial is kept, not only the winner: failed and noisy trials say what not to try again,
and all of them are the cost model's training data.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from polydl.ir import LoopNest, fingerprint

OK = "ok"
COMPILE_FAILED = "compile_failed"  # the candidate did not lower or the C compiler refused it
WRONG_RESULT = "wrong_result"  # built and ran, but its output differs from the reference
TIMED_OUT = "timed_out"  # the measuring process exceeded its time limit
CRASHED = "crashed"  # the measuring process died (a signal) while running this candidate
NOISY = "noisy"  # timed while other work shared the cores: kept, never chosen as the best
STATUSES = (OK, COMPILE_FAILED, WRONG_RESULT, TIMED_OUT, CRASHED, NOISY)
# Trials that need not be measured again when a tuning run resumes.
FINAL_STATUSES = frozenset({OK, COMPILE_FAILED, WRONG_RESULT, CRASHED, TIMED_OUT})


def problem_key(nest: LoopNest, params: Mapping[str, int]) -> str:
    """Identity of a problem: its loop nest as IR (independent of spelling) and its sizes."""
    text = repr((nest.params, nest.arrays, nest.body)) + json.dumps(dict(params), sort_keys=True)
    if nest.kept:  # a kept input packs for free: another problem (nests keeping none keep their keys)
        text += f"kept={nest.kept}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def schedule_key(schedule: Mapping[str, Any]) -> str:
    """Identity of a schedule's JSON (its informative notes left out)."""
    data = {k: v for k, v in schedule.items() if k != "notes"}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:24]


def nest_dtype(nest: LoopNest) -> str:
    return "/".join(sorted({a.dtype for a in nest.arrays}))


@dataclass(frozen=True)
class Problem:
    key: str
    primitive: str  # the nest's name
    params: tuple[tuple[str, int], ...]
    dtype: str
    fingerprint: str = ""  # of the nest alone, sizes aside: problems of one primitive share it

    @classmethod
    def of(cls, nest: LoopNest, params: Mapping[str, int]) -> Problem:
        return cls(problem_key(nest, params), nest.name, tuple(sorted(dict(params).items())),
                   nest_dtype(nest), hashlib.sha256(fingerprint(nest).encode()).hexdigest()[:24])

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.params)

    def describe(self) -> str:
        return f"{self.primitive}({', '.join(f'{k}={v}' for k, v in self.params)}) {self.dtype}"


@dataclass(frozen=True)
class Trial:
    """One schedule of `problem` measured on the target `target_key` names."""

    problem: Problem
    target_key: str  # CpuTarget.key(): every field that changes code or a measured time
    schedule: Mapping[str, Any]  # Schedule.to_dict()
    status: str
    samples: tuple[float, ...] = ()  # seconds per call, in the order measured
    features: Mapping[str, float] = field(default_factory=dict)
    message: str = ""
    other_load: float | None = None  # share of the cores other processes took while timing
    host: str = ""
    created: float = 0.0
    origin: str = "user"  # "user" or "system": which database it was read from
    # seconds per call of the problem's reference schedule, timed interleaved with this one in
    # the same measuring process: the machine's speed at the time, which the ratio cancels
    reference_samples: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"trial status must be one of {', '.join(STATUSES)}, not {self.status!r}")

    @property
    def seconds(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def relative(self) -> float | None:
        """Seconds against the reference's from the same process: the median of the rounds'
        ratios where every round timed both (the measuring process commits its rounds for all
        its candidates at once), so a round that a burst of other work slowed for one side
        counts as one odd ratio, not as a shift of one side's median; else the ratio of the
        medians (a candidate timed once)."""
        if self.seconds is None or not self.reference_samples:
            return None
        ratios = self.round_ratios
        if ratios:
            return statistics.median(ratios)
        return self.seconds / statistics.median(self.reference_samples)

    @property
    def round_ratios(self) -> tuple[float, ...]:
        """Each round's sample over the reference's in that round; none where the rounds do
        not pair (a candidate timed once, or no reference)."""
        if len(self.samples) == len(self.reference_samples) > 1:
            return tuple(t / r for t, r in zip(self.samples, self.reference_samples, strict=True))
        return ()

    @property
    def schedule_key(self) -> str:
        return schedule_key(self.schedule)

    def to_dict(self) -> dict[str, Any]:
        """One JSON object per trial (the `polydl db export` line), the problem inlined."""
        p = self.problem
        return {
            "problem": p.key, "primitive": p.primitive, "params": dict(p.params), "dtype": p.dtype,
            "fingerprint": p.fingerprint, "target": json.loads(self.target_key),
            "schedule": dict(self.schedule), "status": self.status, "samples": list(self.samples),
            "seconds": self.seconds, "features": dict(self.features), "message": self.message,
            "other_load": self.other_load, "host": self.host, "created": self.created,
            "reference_samples": list(self.reference_samples),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trial:
        problem = Problem(str(data["problem"]), str(data["primitive"]),
                          tuple(sorted((str(k), int(v)) for k, v in dict(data["params"]).items())),
                          str(data["dtype"]), str(data.get("fingerprint", "")))
        load = data.get("other_load")
        return cls(
            problem=problem,
            target_key=json.dumps(data["target"], sort_keys=True),
            schedule=dict(data["schedule"]),
            status=str(data["status"]),
            samples=tuple(float(s) for s in data.get("samples", ())),
            features={str(k): float(v) for k, v in dict(data.get("features", {})).items()},
            message=str(data.get("message", "")),
            other_load=None if load is None else float(load),
            host=str(data.get("host", "")),
            created=float(data.get("created", 0.0)),
            reference_samples=tuple(float(s) for s in data.get("reference_samples", ())),
        )


def comparable_times(trials: Sequence[Trial]) -> list[float]:
    """Times of one problem's trials that can be compared with each other: their ratios to
    the reference timed beside each (the machine's speed drifts between measuring processes,
    and differs between cores), or their seconds where any trial was measured without one."""
    if trials and all(t.relative is not None for t in trials):
        return [t.relative for t in trials]  # type: ignore[misc]
    return [t.seconds if t.seconds is not None else math.inf for t in trials]


def pooled(measurements: Sequence[Trial]) -> Trial:
    """One schedule's measurements of one problem as one trial. Where each paired its rounds
    with the reference's, all their rounds together: their label is then the median of every
    round's ratio. A request's rounds share the machine's slower and faster spells, which
    move the ratios from one second to the next, so measurements taken apart in time average
    them out (see decisions: Tuning labels pooled over the rounds' ratios). Else the
    measurement of median time (of two, the faster)."""
    if len(measurements) == 1:
        return measurements[0]
    if all(t.round_ratios for t in measurements):
        return replace(measurements[0],
                       samples=tuple(s for t in measurements for s in t.samples),
                       reference_samples=tuple(s for t in measurements for s in t.reference_samples))
    times = comparable_times(measurements)
    order = sorted(range(len(measurements)), key=times.__getitem__)
    return measurements[order[(len(order) - 1) // 2]]


def checked_trial(data: object) -> Trial:
    """`Trial.from_dict` for data from outside (an exported line): a ValueError saying which
    field is missing or of the wrong type, instead of whatever the conversion would raise."""
    if not isinstance(data, dict):
        raise ValueError(f"a trial is a JSON object, not {_json_type(data)}")
    missing = [name for name in _REQUIRED if name not in data]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    for name in ("problem", "primitive", "dtype", "status", "fingerprint", "message", "host"):
        if name in data and not isinstance(data[name], str):
            raise ValueError(f"'{name}' must be a string, not {_json_type(data[name])}")
    if data["status"] not in STATUSES:
        raise ValueError(f"unknown status {data['status']!r}; one of {', '.join(STATUSES)}")
    checks = {
        "params": lambda v: isinstance(v, dict) and all(_is_int(s) for s in v.values()),
        "target": lambda v: isinstance(v, dict),
        "schedule": lambda v: isinstance(v, dict),
        "samples": lambda v: isinstance(v, list) and all(_is_number(s) for s in v),
        "reference_samples": lambda v: isinstance(v, list) and all(_is_number(s) for s in v),
        "features": lambda v: isinstance(v, dict) and all(_is_number(f) for f in v.values()),
        "other_load": lambda v: v is None or _is_number(v),
        "created": _is_number,
    }
    for name, ok in checks.items():
        if name in data and not ok(data[name]):
            raise ValueError(f"'{name}' must be {_EXPECTED[name]}, not {json.dumps(data[name])[:60]}")
    return Trial.from_dict(data)


_REQUIRED = ("problem", "primitive", "params", "dtype", "target", "schedule", "status")
_EXPECTED = {
    "params": "an object of integer sizes", "target": "an object", "schedule": "an object",
    "samples": "a list of numbers", "reference_samples": "a list of numbers", "features": "an object of numbers",
    "other_load": "a number or null", "created": "a number",
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
