"""`schedule="tuned"`: the schedule the tuning knowledge gives for a problem on a target.

In order: the fastest trial of the performance database for this exact problem and target;
else the learned cost model's pick from the search space (where a model is trained and its
library installed; the analytic choice unless the model predicts a point faster by more than
the margin its training validated); else the analytic ranking. The answer says which one decided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from polydl import settings
from polydl.errors import PolyDLError
from polydl.poly.model import PolyModel
from polydl.schedules.cpu.auto import auto_schedule
from polydl.schedules.schedule import Schedule
from polydl.target.cpu import CpuTarget
from polydl.tuning.costmodel import CostModel
from polydl.tuning.database import PerfDatabase
from polydl.tuning.records import Problem
from polydl.tuning.space import search_space, tuning_model

DATABASE, MODEL, ANALYTIC = "database", "model", "analytic"


@dataclass(frozen=True)
class TunedChoice:
    schedule: Schedule
    decided_by: str  # DATABASE, MODEL or ANALYTIC
    reason: str


def tuned_schedule(model: PolyModel, target: CpuTarget, db: PerfDatabase | None = None,
                   cost_model: CostModel | None = None) -> TunedChoice:
    learned, why_not = _learned(model, target, db, cost_model)
    if learned is not None:
        return learned
    chosen = auto_schedule(tuning_model(model), target).schedule
    return TunedChoice(chosen, ANALYTIC,
                       f"not in the database and {why_not}: the analytic ranking's best")


def learned_schedule(model: PolyModel, target: CpuTarget, db: PerfDatabase | None = None,
                     cost_model: CostModel | None = None) -> TunedChoice | None:
    """The database's or else the cost model's answer; None where neither has one (the
    analytic ranking decides, as `schedule="auto"` would)."""
    return _learned(model, target, db, cost_model)[0]


def _learned(model: PolyModel, target: CpuTarget, db: PerfDatabase | None,
             cost_model: CostModel | None) -> tuple[TunedChoice | None, str]:
    """`learned_schedule`'s answer, and where it has none, why no cost model answered (the
    model file read once)."""
    db = db or PerfDatabase()
    problem = Problem.of(model.nest, model.params)
    best = db.best(problem.key, target.key())
    if best is not None:
        n = len(db.trials(problem.key, target.key()))
        where = "the system database" if best.origin == "system" else str(db.path)
        return TunedChoice(Schedule.from_dict(dict(best.schedule)), DATABASE,
                           f"the fastest of {n} trials in {where} "
                           f"({(best.seconds or 0) * 1e3:.3f} ms)"), ""
    why_not = ""
    if cost_model is None:
        cost_model, why_not = _default_model()
    if cost_model is None:
        return None, why_not
    space = search_space(model, target)
    scores = cost_model.predict([c.features for c in space])
    analytic = next((i for i, c in enumerate(space) if c.analytic), None)
    pick = cost_model.pick(scores, analytic)
    first = min(range(len(space)), key=lambda i: scores[i])
    if pick != first:
        how = (f"the analytic choice kept: the model predicts its first point only "
               f"{2 ** (scores[pick] - scores[first]):.3f}x faster, within the margin its training "
               f"validated ({_margin(cost_model.switch_margin)})")
    else:
        how = f"predicted {2 ** scores[pick]:.2f}x the best"
    return TunedChoice(space[pick].schedule, MODEL, (
        f"not in the database: the cost model's pick of {len(space)} candidates "
        f"({how}; trained on {cost_model.trained_on} trials)")), ""


def _margin(margin: float) -> str:
    return "the analytic choice always" if math.isinf(margin) else f"{2 ** margin:.2f}x"


def _default_model() -> tuple[CostModel | None, str]:
    path = settings.cost_model()
    if not path.is_file():
        return None, f"no cost model at {path} (`polydl model train`)"
    try:
        return CostModel.load(path), ""
    except PolyDLError as exc:
        return None, f"the cost model cannot be used ({exc})"
