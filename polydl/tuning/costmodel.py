"""The learned cost model: gradient-boosted trees (LightGBM) that predict how much slower than
the best of its problem a candidate schedule runs, from its features (`features.py`).

Trained on the performance database's `ok` trials: within each (problem, target) the label of
a trial is log2(its median time / the fastest median), so problems of any size share one scale
and the model learns which schedules lose, not how long a shape takes. Picking for a shape never
measured ranks its search space by the prediction, and takes the first point instead of the
analytic choice only where it predicts the analytic choice slower by more than a margin that
training validates (`CostModel.pick`).

LightGBM because the data are a few thousand rows of mixed-scale numbers, where boosted trees
need no feature scaling and train in a second; its model file is text (loading it runs no
code, unlike a pickle) and it is a small optional dependency (`polydl[tune]`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from polydl.errors import PolyDLError
from polydl.runtime.cache import write_atomic
from polydl.tuning import records
from polydl.tuning.features import vector
from polydl.tuning.records import Trial

FORMAT = "polydl-cost-model 1"
PARAMS = {
    "objective": "regression",
    "learning_rate": 0.05,
    "num_leaves": 15,
    "min_data_in_leaf": 5,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.9,
    "bagging_freq": 1,
    "deterministic": True,
    "num_threads": 1,
    "seed": 0,
    "verbose": -1,
}
ROUNDS = 300
# How much slower (log2) the model must predict the analytic choice than its own first point
# before it picks that point instead: the one of these that picked best when training held
# each family of problems out in turn (`_validated_margin`). A model can rank the problems of
# a family it never saw worse than the analytic model does, or better; the margin chosen by the
# training data's own held-out families follows whichever picks better
# (see decisions: The learned model's switch margin).
SWITCH_MARGINS = (0.0, math.log2(1.02), math.log2(1.05), math.inf)
# Problems split into this many folds where the trials hold one family (primitive) only.
FOLDS = 4


def _lightgbm() -> Any:
    try:
        import lightgbm
    except ImportError:
        raise PolyDLError("the cost model needs LightGBM: pip install 'polydl[tune]'") from None
    return lightgbm


Group = tuple[str, str]  # (problem key, target key)


def groups_of(trials: Iterable[Trial]) -> dict[Group, list[Trial]]:
    """The `ok` trials with features, by (problem, target); one trial per schedule, its
    measurements pooled (`records.pooled`): the fastest of several noisy measurements would
    label a schedule measured twice faster than one measured once."""
    by_group: dict[Group, dict[str, list[Trial]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        if t.status == records.OK and t.features and t.seconds is not None:
            by_group[(t.problem.key, t.target_key)][t.schedule_key].append(t)
    return {group: [records.pooled(measurements) for measurements in schedules.values()]
            for group, schedules in by_group.items()}


def slowdowns(group: Sequence[Trial]) -> list[float]:
    """log2(time / fastest time of the group) of each trial."""
    times = records.comparable_times(group)
    fastest = min(times)
    return [math.log2(x / fastest) for x in times]


@dataclass
class CostModel:
    booster: object  # lightgbm.Booster
    feature_names: tuple[str, ...]
    trained_on: int  # trials
    switch_margin: float = 0.0  # one of SWITCH_MARGINS (`pick`)

    @classmethod
    def train(cls, trials: Iterable[Trial], rounds: int = ROUNDS) -> CostModel:
        groups = groups_of(trials)
        booster, names, rows = _fit(groups, rounds)
        return cls(booster, names, rows, _validated_margin(groups, rounds))

    def pick(self, scores: Sequence[float], analytic: int | None) -> int:
        """Which of the candidates scored to build: the one predicted fastest, unless
        `analytic` (the analytic choice's index) is predicted within `switch_margin` of it."""
        first = min(range(len(scores)), key=scores.__getitem__)
        if analytic is not None and scores[analytic] - scores[first] < self.switch_margin:
            return analytic
        return first

    def predict(self, features: Sequence[Mapping[str, float]]) -> list[float]:
        """Predicted log2 slowdown against the best of the problem: lower is better."""
        if not features:
            return []
        rows = [vector(dict(f), self.feature_names) for f in features]
        predicted = self.booster.predict(np.asarray(rows, dtype=np.float64))  # type: ignore[attr-defined]
        return [float(v) for v in predicted]

    def save(self, path: Path | str) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        margin = None if math.isinf(self.switch_margin) else self.switch_margin  # JSON has no inf
        header = json.dumps({"format": FORMAT, "features": list(self.feature_names),
                             "trained_on": self.trained_on, "switch_margin": margin})
        text = self.booster.model_to_string()  # type: ignore[attr-defined]
        # through a temporary file renamed into place: a lookup reading the model while
        # `polydl model train` rewrites it sees the old one or the new one, never half of one
        write_atomic(path, (header + "\n" + text).encode())

    @classmethod
    def load(cls, path: Path | str) -> CostModel:
        path = Path(path)
        try:
            header, _, text = path.read_text().partition("\n")
            meta = json.loads(header)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PolyDLError(f"{path}: not a polydl cost model ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise PolyDLError(f"{path}: not a polydl cost model (format {FORMAT!r} expected); "
                              "train one with `polydl model train`")
        features = meta.get("features")
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise PolyDLError(f"{path}: the model's header names no feature list; train it again "
                              "with `polydl model train`")
        lgb = _lightgbm()
        try:
            booster = lgb.Booster(model_str=text)
        except Exception as exc:  # noqa: BLE001 - LightGBM raises its own error types
            raise PolyDLError(f"{path}: the model cannot be read ({exc})") from None
        # a model saved before the margin existed picks as it did: its first point
        margin = meta.get("switch_margin", 0.0)
        return cls(booster, tuple(features), int(meta.get("trained_on", 0)),
                   math.inf if margin is None else float(margin))


@dataclass(frozen=True)
class PickQuality:
    """How good the model's pick is on one measured group: best time / time of the pick."""

    group: Group
    label: str
    candidates: int
    quality: float  # 1.0: it picked the fastest
    rank_of_pick: int  # 0 = fastest
    first_good: int  # measurements in the model's order until one within 5% of the best


def evaluate(model: CostModel, groups: Mapping[Group, Sequence[Trial]]) -> list[PickQuality]:
    out = []
    for group, trials in groups.items():
        if len(trials) < 2:
            continue
        scores = model.predict([t.features for t in trials])
        order = sorted(range(len(trials)), key=lambda i: scores[i])
        times = records.comparable_times(trials)
        fastest = min(times)
        by_time = sorted(range(len(trials)), key=lambda i: times[i])
        pick = model.pick(scores, analytic_index([t.features for t in trials]))
        good = next(n for n, i in enumerate(order, 1) if times[i] <= fastest * 1.05)
        out.append(PickQuality(group, trials[0].problem.describe(), len(trials),
                               fastest / times[pick], by_time.index(pick), good))
    return out


def analytic_index(features: Sequence[Mapping[str, float]]) -> int | None:
    """The index of the analytic choice among candidates' features (`space.search_space`
    marks it `analytic_choice`), for `CostModel.pick`; None where none is marked."""
    return next((i for i, f in enumerate(features) if f.get("analytic_choice")), None)


def _fit(groups: Mapping[Group, Sequence[Trial]], rounds: int) -> tuple[object, tuple[str, ...], int]:
    """The boosted trees of the groups of two or more trials: (booster, feature names, rows)."""
    lgb = _lightgbm()
    rows = [t for g in groups.values() if len(g) > 1 for t in g]
    if len(rows) < 10:
        raise PolyDLError(f"too few measurements to train on ({len(rows)} ok trials in "
                          "problems with two or more): tune some problems first")
    names = tuple(sorted({n for t in rows for n in t.features}))
    x = [vector(dict(t.features), names) for g in groups.values() if len(g) > 1 for t in g]
    y = [s for g in groups.values() if len(g) > 1 for s in slowdowns(g)]
    data = lgb.Dataset(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64),
                       feature_name=list(names), free_raw_data=False)
    return lgb.train(PARAMS, data, num_boost_round=rounds), names, len(rows)


def _folds(groups: Mapping[Group, Sequence[Trial]]) -> list[set[Group]]:
    """The groups by family (the problem's primitive: GEMMs, forward convolutions, ...), as a
    model meets a family it was never trained on; where there is one family, `FOLDS` folds of
    its problems."""
    families: dict[str, set[Group]] = defaultdict(set)
    for group, trials in groups.items():
        families[trials[0].problem.primitive].add(group)
    if len(families) > 1:
        return list(families.values())
    ordered = sorted(groups)
    return [set(ordered[i::FOLDS]) for i in range(min(FOLDS, len(ordered)))]


def _validated_margin(groups: Mapping[Group, Sequence[Trial]], rounds: int) -> float:
    """The `SWITCH_MARGINS` entry whose picks were within 5% of the best measured on the most
    problems, each fold predicted by a model trained on the others (ties: the smaller
    margin, trusting the model); 0 where no fold could be held out."""
    hits = [0] * len(SWITCH_MARGINS)
    for held in _folds(groups):
        try:
            booster, names, _ = _fit({g: t for g, t in groups.items() if g not in held}, rounds)
        except PolyDLError:  # too few trials outside this fold
            continue
        model = CostModel(booster, names, 0)
        for group in held:
            trials = groups[group]
            analytic = analytic_index([t.features for t in trials])
            if len(trials) < 2 or analytic is None:
                continue
            scores = model.predict([t.features for t in trials])
            times = records.comparable_times(trials)
            best = min(times)
            for j, margin in enumerate(SWITCH_MARGINS):
                chosen = replace(model, switch_margin=margin).pick(scores, analytic)
                hits[j] += times[chosen] <= best * 1.05
    return SWITCH_MARGINS[max(range(len(SWITCH_MARGINS)), key=lambda j: (hits[j], -j))]
