"""`polydl tune` (one spec or a whole suite, in this process or on Ray) and `polydl model`."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from polydl import settings
from polydl.errors import PolyDLError
from polydl.target.cpu import CpuTarget
from polydl.tuner.search import STRATEGIES, LocalExecutor, Progress, SearchSpaces, tune_problems
from polydl.tuner.suites import SuiteProblem, suite_problems
from polydl.tuning.costmodel import CostModel, evaluate, groups_of
from polydl.tuning.database import PerfDatabase
from polydl.tuning.records import OK, Trial, comparable_times


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (`--repeat 0` would time nothing, `--trials 0` measure
    nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_tune_options(c: argparse.ArgumentParser) -> None:
    c.add_argument("--suite", metavar="NAME|FILE",
                   help="tune every layer of a suite (gemm, resnet50, ...) or suite file")
    c.add_argument("--trials", type=positive_int, default=32, help="candidates measured per problem")
    c.add_argument("--strategy", default="auto", choices=STRATEGIES,
                   help="auto: exhaustive where the space fits --trials, else guided")
    c.add_argument("--db", metavar="FILE", help="the performance database (default: "
                   "POLYDL_TUNING_DB, else tuning.sqlite in the cache)")
    c.add_argument("--model", metavar="FILE", help="the cost model that guides the search "
                   "(default: POLYDL_COST_MODEL, else costmodel.txt in the cache, if trained)")
    where = c.add_mutually_exclusive_group()
    where.add_argument("--workers", type=positive_int, metavar="N",
                       help="N workers of a local Ray cluster, each on its share of the cores")
    where.add_argument("--ray", metavar="ADDRESS", help="the workers of an existing Ray cluster")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_model_command(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("model", help="train or evaluate the learned cost model")
    actions = c.add_subparsers(dest="action", required=True)
    for name, help, func in (("train", "train on the database's trials", cmd_model_train),
                             ("eval", "how well the model picks on the database's problems",
                              cmd_model_eval)):
        a = actions.add_parser(name, help=help)
        a.add_argument("--db", metavar="FILE", help="the performance database")
        a.add_argument("--model", metavar="FILE", help="the model file (default: "
                       "POLYDL_COST_MODEL, else costmodel.txt in the cache)")
        a.set_defaults(func=func)


def network_only_flags(args: argparse.Namespace, batch: bool = True) -> list[str]:
    """The flags of ONNX networks given in `args` (`--batch` too where `batch`: a suite takes
    it), for an error that names them where a loop nest or a suite would ignore them."""
    flags = (("--batch", batch and getattr(args, "batch", None) is not None),
             ("--images-per-pass", getattr(args, "images_per_pass", None) is not None),
             ("--no-winograd", bool(getattr(args, "no_winograd", False))))
    return [flag for flag, given in flags if given]


def cmd_tune(args: argparse.Namespace, target: CpuTarget,
             load: Callable[[], list[tuple[str, Any, dict[str, int]]]], network: bool = False) -> int:
    """`load` gives the spec's problems (name, nest, sizes): one loop nest, or a network's
    distinct kernels."""
    if args.suite and args.spec:
        raise PolyDLError("give a spec or --suite, not both")
    if args.suite:
        given = network_only_flags(args, batch=False)
        if given:
            raise PolyDLError(f"{', '.join(given)}: for ONNX networks, not for --suite")
        problems = suite_problems(args.suite, args.batch)
    elif args.spec:
        problems = [SuiteProblem(name, nest, dict(params)) for name, nest, params in load()]
    else:
        raise PolyDLError("tune needs a spec or --suite NAME")
    db = PerfDatabase(args.db)
    model = _guiding_model(args.model)
    if args.workers is not None:
        from polydl.tuner.distributed import worker_cpus

        target = replace(target, cores=len(worker_cpus(args.workers)[0]))
    # the spaces' processes fork first, before Ray's threads start in this one; the workers
    # and their measuring processes start while the spaces are computed
    computing = SearchSpaces([(p.nest, p.params) for p in problems], target)
    executor: Any = LocalExecutor()
    try:
        if args.workers is not None:
            from polydl.tuner.distributed import local_executor

            executor, target = local_executor(args.workers, target)
        elif args.ray:
            from polydl.tuner.distributed import cluster_executor

            executor = cluster_executor(args.ray, target)
        executor.prestart(target)
        spaces = computing.result()
        if network:  # a network's copies, pools and element-wise steps: nothing to choose
            chosen = [(p, s) for p, s in zip(problems, spaces, strict=True) if len(s) > 1]
            print(f"network  {len(problems)} distinct kernels, {len(chosen)} with schedules to "
                  "choose from")
            problems, spaces = [p for p, _ in chosen], [s for _, s in chosen]
        print(f"target   {target.describe()}")
        print(f"guide    {'cost model ' + str(args.model or settings.cost_model()) if model else 'analytic model'}")
        tune_problems([(p.name, p.nest, p.params) for p in problems], spaces, target=target,
                      executor=executor, report=lambda name, r: print(_result_line(name, r), flush=True),
                      progress=lambda name: _progress(name, args.no_progress), trials=args.trials,
                      strategy=args.strategy, db=db, cost_model=model)
    finally:
        computing.close()
        if hasattr(executor, "shutdown"):
            executor.shutdown()
    print(f"stored   {db.path}")
    return 0


def _guiding_model(path: str | None) -> CostModel | None:
    if path:
        return CostModel.load(path)
    default = settings.cost_model()
    if not default.is_file():
        return None
    try:
        return CostModel.load(default)
    except PolyDLError:
        return None  # no LightGBM, or an old file: the analytic model guides


def _result_line(name: str, result: Any) -> str:
    ok = [t for t in result.measured if t.status == OK]
    failed = len(result.measured) - len(ok)
    best = result.best
    analytic = next((t for t in ok if t.schedule_key == result.analytic_key), None)
    gain = ""
    if best is not None and analytic is not None and best.seconds:
        slower, fastest = comparable_times([analytic, best])
        gain = f", {slower / fastest:.2f}x the analytic schedule"
    time = f"{best.seconds * 1e3:.3f} ms" if best and best.seconds else "no ok trial"
    again = (f"; the {len(result.confirmed) - 1} fastest timed again beside the analytic"
             if result.confirmed else "")
    return (f"{name:24s} best {time}{gain}; measured {len(result.measured)} of {result.space} "
            f"({result.strategy}), {failed} not ok, {result.skipped} already in the database{again}")


class _progress:
    """A tqdm bar with the best time so far where tqdm is installed; else nothing."""

    def __init__(self, name: str, disabled: bool) -> None:
        self.name, self.bar = name, None
        if disabled or not sys.stderr.isatty():
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=0, desc=name, unit="cand", leave=False, file=sys.stderr)

    def __enter__(self) -> Progress | None:
        if self.bar is None:
            return None
        bar = self.bar

        def update(done: int, total: int, best: Trial | None) -> None:
            bar.total = total
            bar.n = done
            if best is not None and best.seconds:
                bar.set_postfix_str(f"best {best.seconds * 1e3:.3f} ms")
            bar.refresh()

        return update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_model_train(args: argparse.Namespace) -> int:
    db = PerfDatabase(args.db)
    model = CostModel.train(db.trials())
    path = args.model or settings.cost_model()
    model.save(path)
    print(f"trained  on {model.trained_on} trials, {len(model.feature_names)} features")
    margin = model.switch_margin
    if math.isinf(margin):
        picks = "the analytic choice: on the families held out in training the model's first points did no better"
    elif margin == 0:
        picks = "its first point: on the families held out in training that picked best"
    else:
        picks = (f"its first point where it predicts the analytic choice more than {2 ** margin:.2f}x "
                 "slower, else the analytic choice (the margin that picked best on the families "
                 "held out in training)")
    print(f"picks    {picks}")
    print(f"stored   {path}")
    return 0


def cmd_model_eval(args: argparse.Namespace) -> int:
    db = PerfDatabase(args.db)
    path = args.model or settings.cost_model()
    model = CostModel.load(path)
    picks = evaluate(model, groups_of(db.trials()))
    if not picks:
        raise PolyDLError(f"no problem in {db.path} has two or more ok trials to evaluate on")
    for p in picks:
        print(f"{p.label[:60]:60s} pick {p.quality:6.1%} of the best (rank {p.rank_of_pick + 1} "
              f"of {p.candidates}), first within 5% after {p.first_good}")
    within = sum(p.quality >= 1 / 1.05 for p in picks) / len(picks)
    mean = math.fsum(p.quality for p in picks) / len(picks)
    print(f"summary  {within:.0%} of {len(picks)} problems within 5% of the best; mean "
          f"{mean:.1%}, worst {min(p.quality for p in picks):.1%} (on its own training data)")
    return 0
