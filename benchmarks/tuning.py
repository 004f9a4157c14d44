#!/usr/bin/env python3
"""Tuning: how well the learned cost model predicts schedules, how fast the search finds them,
how tuning throughput scales with workers.

    python benchmarks/tuning.py collect [--suites gemm,resnet50,...] [--per-problem 24]
                                        [--workers N] [--threads T] [--db FILE] [--time-limit S]
    python benchmarks/tuning.py throughput [--workers 1,8] [--threads T] [--candidates 48]
    python benchmarks/tuning.py analyze [--db FILE] [--json FILE]

`collect` measures, per problem of each suite, the analytic choice, the next best half of
`--per-problem` by analytic cost and as many drawn at random from the rest of the search space
(seeded), on `--workers` disjoint shares of `--threads` cores each (the measuring processes of
`polydl.tuning.measure`, driven by threads: `tuner.PoolExecutor`); every trial goes to the
database. It resumes: trials already there are not measured again. `throughput` times the same
candidates with 1 and N workers on fresh databases and reports candidates per hour. `analyze`
reads the database: leave one suite out (train the cost model on the others' trials, predict the
held-out suite's problems): the fraction of problems whose pick is within 5% of the best
measured, the mean and worst pick; measurements until one within 5% of the best, in the model's
order against the expectation of random order ((n + 1) / (g + 1) for g good of n); and the best
measured against the analytic choice per suite (geometric mean). Prints a table, writes JSON
(default benchmarks/results/tuning.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from polydl.poly.model import build_model  # noqa: E402
from polydl.target.host import host_target  # noqa: E402
from polydl.tuning import records  # noqa: E402
from polydl.tuning.costmodel import CostModel, evaluate, groups_of  # noqa: E402
from polydl.tuning.database import PerfDatabase  # noqa: E402
from polydl.tuning.distributed import worker_cpus  # noqa: E402
from polydl.tuning.measure import Limits, Request  # noqa: E402
from polydl.tuning.records import Problem  # noqa: E402
from polydl.tuning.space import search_space  # noqa: E402
from polydl.tuning.suites import suite_problems  # noqa: E402
from polydl.tuning.tuner import PoolExecutor, trial_of  # noqa: E402

SUITES = ("gemm", "resnet50", "resnet50_bwd_data", "resnet50_bwd_weights")
CHUNK = 3  # candidates per request (interleaved in one measuring process)
LIMITS = Limits(budget_s=0.3, max_rounds=9)


def chosen_candidates(space: list, per_problem: int, seed: str) -> list:
    """The analytic choice, the next best by analytic cost and a seeded random sample."""
    top = space[: max(1, per_problem // 2)]
    rest = space[len(top):]
    rng = random.Random(seed)
    return top + rng.sample(rest, min(len(rest), per_problem - len(top)))


def _space(job: tuple) -> list:
    nest, params, target = job
    return search_space(build_model(nest, params), target)


def collect(args: argparse.Namespace) -> None:
    shares = worker_cpus(args.workers) if not args.threads else [
        tuple(range(i * args.threads, (i + 1) * args.threads)) for i in range(args.workers)]
    target = replace(host_target(), cores=len(shares[0]))
    db = PerfDatabase(args.db, system=False)
    executor = PoolExecutor(shares)
    start = time.monotonic()
    print(f"target {target.describe()}; {len(shares)} workers on cores {shares}", flush=True)
    for suite in args.suites.split(","):
        problems = suite_problems(suite)
        # the search spaces of a suite at once, one process per core (seconds each)
        with ProcessPoolExecutor(sum(len(s) for s in shares)) as pool:
            spaces = list(pool.map(_space, [(p.nest, p.params, target) for p in problems]))
        # every problem's requests at once, a few candidates each: all workers stay busy
        jobs = []
        for p, space in zip(problems, spaces, strict=True):
            problem = Problem.of(p.nest, p.params)
            done = db.measured(problem.key, target.key())
            todo = [c for c in chosen_candidates(space, args.per_problem, problem.key) if c.key not in done]
            jobs += [(problem, p, todo[i:i + CHUNK]) for i in range(0, len(todo), CHUNK)]
        requests = [Request(p.nest, p.params, target, tuple(c.schedule.to_dict() for c in chunk),
                            limits=LIMITS) for _, p, chunk in jobs]
        for index, outcomes in executor.run(requests):
            problem, p, chunk = jobs[index]
            db.add([trial_of(problem, target, c, o) for c, o in zip(chunk, outcomes, strict=True)])
            if args.time_limit and time.monotonic() - start > args.time_limit:
                print("time limit reached: run again to resume", flush=True)
                return
        print(f"{suite:22s} {len(problems)} problems, {sum(len(c) for _, _, c in jobs)} measured, "
              f"{time.monotonic() - start:7.1f} s so far", flush=True)


def throughput(args: argparse.Namespace) -> dict:
    problems = [p for s in ("resnet50", "gemm") for p in suite_problems(s)][::3]
    target = replace(host_target(), cores=args.threads)
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        spaces = list(pool.map(_space, [(p.nest, p.params, target) for p in problems]))
    jobs = []
    for p, space in zip(problems, spaces, strict=True):
        picked = chosen_candidates(space, max(1, args.candidates // len(problems)), "throughput")
        jobs += [Request(p.nest, p.params, target, tuple(c.schedule.to_dict() for c in picked[i:i + 2]),
                         limits=LIMITS) for i in range(0, len(picked), 2)]
    results = {}
    for workers in [int(w) for w in args.workers_list.split(",")]:
        shares = [tuple(range(i * args.threads, (i + 1) * args.threads)) for i in range(workers)]
        os.environ["POLYDL_CACHE_DIR"] = f"/tmp/polydl-throughput-{workers}"  # cold compiles
        t0 = time.monotonic()
        measured = sum(len(o) for _, o in PoolExecutor(shares).run(jobs))
        seconds = time.monotonic() - t0
        results[workers] = {"candidates": measured, "seconds": seconds, "per_hour": measured / seconds * 3600}
        print(f"workers {workers:3d}: {measured} candidates in {seconds:7.1f} s = "
              f"{measured / seconds * 3600:8.0f} per hour", flush=True)
    one = results[min(results)]["per_hour"]
    for w, r in results.items():
        r["speedup"] = r["per_hour"] / one
        r["efficiency"] = r["speedup"] / (w / min(results))
    return results


def analyze(args: argparse.Namespace) -> dict:
    db = PerfDatabase(args.db, system=False)
    trials = db.trials()
    suite_of = {}
    for suite in SUITES:
        for p in suite_problems(suite):
            suite_of[records.problem_key(p.nest, p.params)] = suite
    by_suite: dict[str, list] = defaultdict(list)
    for t in trials:
        by_suite[suite_of.get(t.problem.key, "other")].append(t)
    out: dict = {"suites": {}, "problems": []}
    print(f"{'held out':22s} {'problems':>8s} {'within 5%':>9s} {'mean':>6s} {'worst':>6s} "
          f"{'model n':>7s} {'random n':>8s} {'tuned/analytic':>14s}")
    for held in [s for s in SUITES if by_suite.get(s)]:
        train = [t for s, ts in by_suite.items() if s != held for t in ts]
        model = CostModel.train(train)
        groups = groups_of(by_suite[held])
        picks = evaluate(model, groups)
        randoms, gains = [], []
        for ts in groups.values():
            times = [t.seconds for t in ts]
            best = min(times)
            good = sum(x <= best / 0.95 for x in times)
            randoms.append((len(ts) + 1) / (good + 1))
            analytic = next((t for t in ts if t.features.get("analytic_choice")), None)
            if analytic is not None:
                gains.append(analytic.seconds / best)
        within = sum(p.quality >= 1 / 1.05 for p in picks) / len(picks)
        row = {
            "problems": len(picks), "within_5pct": within,
            "mean_pick": statistics.fmean(p.quality for p in picks),
            "worst_pick": min(p.quality for p in picks),
            "model_measurements": statistics.fmean(p.first_good for p in picks),
            "random_measurements": statistics.fmean(randoms),
            "tuned_vs_analytic_geomean": math.exp(statistics.fmean(math.log(g) for g in gains)) if gains else None,
        }
        out["suites"][held] = row
        out["problems"] += [{"suite": held, "problem": p.label, "candidates": p.candidates,
                             "pick": p.quality, "first_good": p.first_good} for p in picks]
        print(f"{held:22s} {row['problems']:8d} {within:9.0%} {row['mean_pick']:6.1%} "
              f"{row['worst_pick']:6.1%} {row['model_measurements']:7.2f} "
              f"{row['random_measurements']:8.2f} {row['tuned_vs_analytic_geomean'] or 0:14.3f}")
    rows = list(out["suites"].values())
    total = sum(r["problems"] for r in rows)
    out["overall"] = {
        "problems": total,
        "within_5pct": sum(r["within_5pct"] * r["problems"] for r in rows) / total,
        "measurement_ratio": sum(r["random_measurements"] * r["problems"] for r in rows)
        / sum(r["model_measurements"] * r["problems"] for r in rows),
    }
    print(f"overall: {out['overall']['within_5pct']:.0%} of {total} held-out problems within 5%; "
          f"random search needs {out['overall']['measurement_ratio']:.1f}x the model's measurements")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--suites", default=",".join(SUITES))
    c.add_argument("--per-problem", type=int, default=24)
    c.add_argument("--workers", type=int, default=1)
    c.add_argument("--threads", type=int, default=0, help="cores per worker (default: an equal share)")
    c.add_argument("--db", default=str(HERE / "results" / "tuning.sqlite"))
    c.add_argument("--time-limit", type=float, default=0)
    t = sub.add_parser("throughput")
    t.add_argument("--workers", dest="workers_list", default="1,8")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--candidates", type=int, default=48)
    t.add_argument("--json", type=Path)
    a = sub.add_parser("analyze")
    a.add_argument("--db", default=str(HERE / "results" / "tuning.sqlite"))
    a.add_argument("--json", type=Path, default=HERE / "results" / "tuning.json")
    args = parser.parse_args()
    if args.command == "collect":
        collect(args)
    elif args.command == "throughput":
        result = throughput(args)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    else:
        result = analyze(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
