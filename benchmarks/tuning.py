#!/usr/bin/env python3
"""Tuning: how well the learned cost model predicts schedules, how fast the search finds them,
how tuning throughput scales with workers.

    python benchmarks/tuning.py collect [--suites gemm,resnet50,...] [--per-problem 24]
                                        [--workers N] [--threads T] [--chunk 0] [--problems a,b]
                                        [--repeats 1] [--db FILE] [--time-limit S]
    python benchmarks/tuning.py throughput [--workers 1,8] [--threads T] [--candidates 64]
                                           [--mode tune|requests]
    python benchmarks/tuning.py picks [--db FILE] [--top 8] [--workers N] [--threads T]
    python benchmarks/tuning.py analyze [--db FILE] [--full-space] [--json FILE]
    python benchmarks/tuning.py versus [--suite resnet50] [--batch N] [--threads T] [--db FILE]
                                       [--cases a,b] [--repeat 21] [--budget 6] [--json FILE]

`collect` measures, per problem of each suite, the analytic choice, the next best half of
`--per-problem` by analytic cost and as many drawn at random from the rest of the search space
(seeded), `--chunk` candidates per measuring process (0: all of a problem's), each process
timing the problem's analytic choice beside them as the reference, on `--workers` disjoint
shares of `--threads` cores each (`tuner.PoolExecutor`), the requests with the most work
first; every trial goes to the database. `--repeats R` measures every point R times, in R
passes over all the suites, so that a point's measurements lie minutes apart; the analysis
pools them (`records.pooled`). It resumes: trials already there are not measured again.
`throughput` tunes the same problems with 1 and N workers on fresh databases and compile
caches and reports candidates per hour (the search spaces, computed once before, not counted).
`picks` measures, per problem, the points that the model trained without the problem's suite
ranks first over the whole search space (`--top`), as a model-guided search measures them first.
`analyze` reads the database: leave one suite out (train the cost model on the others' trials,
predict the held-out suite's problems): the fraction of problems whose pick is within 5% of the
best measured, the mean and worst pick; measurements until one within 5% of the best, in the
model's order against the expectation of random order ((n + 1) / (g + 1) for g good of n),
and with `--full-space` the same over every problem's whole search space (exact where `picks`
measured the model's first points), in the model's order, the analytic order and the order
`polydl tune`'s guided search starts in (the analytic choice, then the model's and the analytic
order in turn: `tuner.guided_order`), with the model's pick of the whole space (its first
point, or the analytic choice within the margin its training validated) against the best
measured; the best measured against the analytic choice per suite (geometric mean);
and how far the labels can be told apart (`label_noise`). Prints a table, writes JSON
(default benchmarks/results/tuning.json).

`versus` measures what tuning gives a user, apart from the tuner's own figures: per layer of a
suite (at `--batch`, on `--threads` pinned cores, as `polydl bench` runs it), the kernel that
`schedule="tuned"` builds from the database against the analytic one, both verified against the
suite's reference, timed interleaved in rounds (`polydl.bench.timing`); the ratio is the median
of the per-round ratios. A layer whose tuned schedule is the analytic one counts 1.0 untimed.
Prints a table and the geometric mean, writes JSON (default benchmarks/results/versus.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from polydl.bench.builds import verify  # noqa: E402
from polydl.bench.cases import load_suite, select_cases  # noqa: E402
from polydl.bench.measure import PASSES  # noqa: E402
from polydl.bench.targets import geometric_mean  # noqa: E402
from polydl.bench.threads import import_torch, pinned_cores, run_pinned, runs_on  # noqa: E402
from polydl.bench.timing import Runner, round_medians, time_runners  # noqa: E402
from polydl.poly.model import build_model  # noqa: E402
from polydl.target.cpu import CpuTarget  # noqa: E402
from polydl.target.host import host_target  # noqa: E402
from polydl.tuner import search as tuner  # noqa: E402
from polydl.tuner.distributed import worker_cpus  # noqa: E402
from polydl.tuner.measure import Limits, Request, spread  # noqa: E402
from polydl.tuner.search import (  # noqa: E402
    PoolExecutor,
    SearchSpaces,
    analytic_choice,
    problem_flops,
    referenced_request,
    referenced_trials,
    search_spaces,
    tune_problems,
)
from polydl.tuner.suites import suite_layout, suite_problems  # noqa: E402
from polydl.tuning import records  # noqa: E402
from polydl.tuning.costmodel import CostModel, analytic_index, evaluate, groups_of  # noqa: E402
from polydl.tuning.database import PerfDatabase  # noqa: E402
from polydl.tuning.lookup import tuned_schedule  # noqa: E402
from polydl.tuning.records import Problem  # noqa: E402
from polydl.tuning.space import search_space  # noqa: E402

SUITES = ("gemm", "resnet50", "resnet50_bwd_data", "resnet50_bwd_weights")
LIMITS = Limits(budget_s=0.3, max_rounds=9)
THROUGHPUT_PROBLEMS = 16


def chosen_candidates(space: list, per_problem: int, seed: str) -> list:
    """The analytic choice, the next best by analytic cost and a seeded random sample."""
    top = space[: max(1, per_problem // 2)]
    rest = space[len(top):]
    rng = random.Random(seed)
    return top + rng.sample(rest, min(len(rest), per_problem - len(top)))


def random_sample(space_keys: list, per_problem: int, seed: str) -> set:
    """The points `chosen_candidates` drew at random for a problem (beyond the top half by
    analytic cost): the sample the share of good points in the rest of the space is estimated
    from, never the points measured because a model ranked them first."""
    return set(chosen_candidates(space_keys, per_problem, seed)[max(1, per_problem // 2):])


def pinned_shares(workers: int, threads: int) -> list[tuple[int, ...]]:
    """`workers` disjoint runs of `threads` cores from core 0."""
    return [tuple(range(i * threads, (i + 1) * threads)) for i in range(workers)]


def longest_first(requests: list[Request], flops: list[float]) -> list[int]:
    """The order to hand requests to the workers: the most work first (flops times
    candidates), so that no long request starts last while the other workers sit idle."""
    return sorted(range(len(requests)), key=lambda i: -flops[i] * len(requests[i].schedules))


def collect(args: argparse.Namespace) -> None:
    shares = worker_cpus(args.workers) if not args.threads else pinned_shares(args.workers, args.threads)
    target = replace(host_target(), cores=len(shares[0]))
    db = PerfDatabase(args.db, system=False)
    executor = PoolExecutor(shares)
    start = time.monotonic()
    print(f"target {target.describe()}; {len(shares)} workers on cores {shares}", flush=True)
    suites = {suite: [p for p in suite_problems(suite) if not args.problems or p.name in args.problems.split(",")]
              for suite in args.suites.split(",")}
    # the search spaces of a suite at once, one process per core (seconds each)
    spaces = {suite: search_spaces([(p.nest, p.params) for p in problems], target)
              for suite, problems in suites.items()}
    # each pass measures every point once more: a point's measurements lie a pass apart, so
    # the machine's slower spells, which the rounds of one request share, average out
    for repeat in range(1, args.repeats + 1):
        for suite, problems in suites.items():
            jobs, flops = [], []
            for p, space in zip(problems, spaces[suite], strict=True):
                problem = Problem.of(p.nest, p.params)
                done = Counter(t.schedule_key for t in db.trials(problem.key, target.key())
                               if t.status in records.FINAL_STATUSES)
                todo = [c for c in chosen_candidates(space, args.per_problem, problem.key)
                        if done[c.key] < repeat]
                size = args.chunk or len(todo) or 1
                reference = analytic_choice(space)  # timed beside every chunk
                jobs += [(problem, p, todo[i:i + size], reference) for i in range(0, len(todo), size)]
                flops += [problem_flops(space)] * len(range(0, len(todo), size))
            requests = [referenced_request(p.nest, p.params, target, chunk, reference, LIMITS)
                        for _, p, chunk, reference in jobs]
            # every problem's requests at once, the longest first: all workers stay busy
            order = longest_first(requests, flops)
            for index, outcomes in executor.run([requests[i] for i in order]):
                problem, p, chunk, reference = jobs[order[index]]
                db.add(referenced_trials(problem, target, chunk, reference, outcomes))
                if args.time_limit and time.monotonic() - start > args.time_limit:
                    print("time limit reached: run again to resume", flush=True)
                    return
            print(f"{suite:22s} pass {repeat}: {len(problems)} problems, "
                  f"{sum(len(c) for _, _, c, _ in jobs)} measured, {time.monotonic() - start:7.1f} s so far",
                  flush=True)


class RequestLog:
    """When each measuring request began and ended, and on which worker's cores (around
    `tuner.measure`, which the workers call): how much of a run the workers were busy, and how
    far apart their last requests ended."""

    def __init__(self) -> None:
        self.spans: list[tuple[tuple[int, ...] | None, float, float]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> RequestLog:
        real = self._real = tuner.measure

        def timed(request: Request) -> list:
            start = time.monotonic()
            try:
                return real(request)
            finally:
                with self._lock:
                    self.spans.append((request.cpus, start, time.monotonic()))

        tuner.measure = timed
        return self

    def __exit__(self, *exc: object) -> None:
        tuner.measure = self._real

    def summary(self, t0: float, seconds: float, workers: int) -> dict:
        ends: dict = {}
        for cpus, _, end in self.spans:
            ends[cpus] = max(ends.get(cpus, 0.0), end - t0)
        busy = sum(end - start for _, start, end in self.spans)
        return {"requests": len(self.spans), "busy_share": busy / (workers * seconds),
                "last_ends": sorted(ends.values())}


def throughput(args: argparse.Namespace) -> dict:
    every = [p for s in ("resnet50", "gemm") for p in suite_problems(s)]
    # problems spread over both suites, two per worker of 8; as many candidates of each
    problems = [every[i * len(every) // THROUGHPUT_PROBLEMS] for i in range(THROUGHPUT_PROBLEMS)]
    target = replace(host_target(), cores=args.threads)
    per_problem = max(1, args.candidates // len(problems))
    jobs: list[Request] = []
    if args.mode == "requests":  # the tuner's mode computes the spaces per worker count below
        spaces = search_spaces([(p.nest, p.params) for p in problems], target)
        flops = []
        for p, space in zip(problems, spaces, strict=True):
            picked = chosen_candidates(space, per_problem, "throughput")
            jobs += [Request(p.nest, p.params, target, tuple(c.schedule.to_dict() for c in picked[i:i + 2]),
                             limits=LIMITS) for i in range(0, len(picked), 2)]
            flops += [problem_flops(space)] * len(range(0, len(picked), 2))
        jobs = [jobs[i] for i in longest_first(jobs, flops)]
    named = [(p.name, p.nest, p.params) for p in problems]
    results = {}
    for workers in [int(w) for w in args.workers_list.split(",")]:
        shares = pinned_shares(workers, args.threads)
        scratch = Path(tempfile.mkdtemp(prefix=f"polydl-throughput-{workers}-"))
        os.environ["POLYDL_CACHE_DIR"] = str(scratch / "cache")  # cold compiles
        executor = PoolExecutor(shares)
        if args.mode == "tune":
            # as `polydl tune --suite --workers`: the measuring processes start while the search
            # spaces are computed (again here, out of the timed part, as the first ones)
            computing = SearchSpaces([(p.nest, p.params) for p in problems], target)
            executor.prestart(target)
            spaces = computing.result()
        t0 = time.monotonic()
        with RequestLog() as log:
            if args.mode == "requests":  # the candidates' requests straight to the workers
                measured = sum(len(o) for _, o in executor.run(jobs))
            else:  # what `polydl tune --suite` does: problems side by side, one worker each
                results_of: list = []
                tune_problems(named, spaces, target=target, executor=executor,
                              report=lambda _, r, out=results_of: out.append(r), trials=per_problem,
                              strategy="guided", db=PerfDatabase(scratch / "tuning.sqlite", system=False),
                              limits=LIMITS)
                measured = sum(len(r.measured) for r in results_of)
        seconds = time.monotonic() - t0
        shutil.rmtree(scratch, ignore_errors=True)
        spent = log.summary(t0, seconds, workers)
        results[workers] = {"candidates": measured, "seconds": seconds,
                            "per_hour": measured / seconds * 3600, **spent}
        print(f"workers {workers:3d}: {measured} candidates in {seconds:7.1f} s = "
              f"{measured / seconds * 3600:8.0f} per hour; the workers busy "
              f"{spent['busy_share']:.0%} of it, their last requests ending at "
              f"{spent['last_ends'][0]:.1f}-{spent['last_ends'][-1]:.1f} s", flush=True)
    one = results[min(results)]["per_hour"]
    for w, r in results.items():
        r["speedup"] = r["per_hour"] / one
        r["efficiency"] = r["speedup"] / (w / min(results))
    return results


def _target_space(job: tuple) -> tuple[str, str, list]:
    """(problem key, target key, [(schedule key, features)] of its search space, analytic
    choice first, then by analytic cost)."""
    problem_key, target_key, nest, params = job
    target = CpuTarget.from_dict(json.loads(target_key))
    space = search_space(build_model(nest, params), target)
    return problem_key, target_key, [(c.key, dict(c.features)) for c in space]


def spaces_of(trials: list, problems: dict) -> dict:
    """The search space of every (problem, target) the trials measured, computed now."""
    jobs = sorted({(t.problem.key, t.target_key) for t in trials if t.problem.key in problems})
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        found = pool.map(_target_space, [(k, target, *problems[k]) for k, target in jobs])
        return {(k, target): space for k, target, space in found}


def search_counts(model: CostModel, space: list, trials: list, per_problem: int, seed: str) -> dict:
    """Over the whole search space: measurements until one within 5% of the best measured, in
    the model's order and in the analytic order, unmeasured points counted as misses (an upper
    bound; `picks` measures the model's first points, which makes it exact there), and the
    expectation of random order, the share of good points among the points `collect` did not
    take by analytic cost estimated from its random sample. Also how the model's pick of the
    whole space (what `schedule="tuned"` compiles without a database hit) compares with the
    best measured, where it was measured."""
    times = dict(zip((t.schedule_key for t in trials), records.comparable_times(trials), strict=True))
    best = min(times.values())
    good = {k for k, x in times.items() if x <= best / 0.95}
    keys = [k for k, _ in space]
    top = max(1, per_problem // 2)
    rest = keys[top:]
    sampled = [k for k in random_sample(keys, per_problem, seed) if k in times]
    good_rest = sum(k in good for k in sampled) / len(sampled) * len(rest) if sampled else 0.0
    estimated_good = sum(k in good for k in keys[:top]) + good_rest
    scores = model.predict([f for _, f in space])
    by_model = [keys[i] for i in sorted(range(len(keys)), key=scores.__getitem__)]

    # what `polydl tune`'s guided strategy measures first: the analytic choice (the space's
    # first point, the reference of every trial), then the model's and the analytic order in
    # turn (after its first batch it also takes neighbours of the fastest measured, which
    # cannot be replayed here)
    guided = [keys[i] for i in tuner.guided_order(range(len(keys)), scores, 0)] if keys else []

    def until_good(order: list) -> int:
        return next((n for n, k in enumerate(order, 1) if k in good), len(order))
    # what `schedule="tuned"` builds without a database hit: the model's first point, or the
    # analytic choice within the margin the model's training validated (`CostModel.pick`)
    first = keys[model.pick(scores, analytic_index([f for _, f in space]))] if keys else None
    return {"space": len(keys), "model": until_good(by_model), "analytic": until_good(keys),
            "guided": until_good(guided), "random": (len(keys) + 1) / (estimated_good + 1),
            "space_pick": best / times[first] if first in times else None}


def suite_index() -> tuple[dict, dict]:
    """Each problem key of the CPU suites: its suite, and its (nest, params)."""
    suite_of, problems = {}, {}
    for suite in SUITES:
        for p in suite_problems(suite):
            key = records.problem_key(p.nest, p.params)
            suite_of[key], problems[key] = suite, (p.nest, p.params)
    return suite_of, problems


def trials_by_suite(trials: list, suite_of: dict) -> dict[str, list]:
    """The trials by the suite of their problem ("other" for a problem of no suite)."""
    by_suite: dict[str, list] = defaultdict(list)
    for t in trials:
        by_suite[suite_of.get(t.problem.key, "other")].append(t)
    return by_suite


def picks(args: argparse.Namespace) -> None:
    """Measure, per problem, the points the model trained without the problem's suite ranks
    first over the whole search space (what a model-guided search measures first, and what
    `schedule="tuned"` compiles without a database hit), beside the analytic choice as
    `collect` does; points already measured are not measured again."""
    shares = pinned_shares(args.workers, args.threads)
    db = PerfDatabase(args.db, system=False)
    suite_of, problems = suite_index()
    by_suite = trials_by_suite(db.trials(), suite_of)
    jobs, flops = [], []
    for held in [s for s in SUITES if by_suite.get(s)]:
        model = CostModel.train([t for s, ts in by_suite.items() if s != held for t in ts])
        groups = sorted({(t.problem.key, t.target_key) for t in by_suite[held]})
        for target_key in sorted({target for _, target in groups}):
            target = CpuTarget.from_dict(json.loads(target_key))
            if target.cores != args.threads:
                raise SystemExit(f"{held}: trials for {target.cores} cores; run with --threads {target.cores}")
            keys = [k for k, target in groups if target == target_key]
            for key, space in zip(keys, search_spaces([problems[k] for k in keys], target), strict=True):
                scores = model.predict([c.features for c in space])
                done = db.measured(key, target_key)
                first = [space[i] for i in sorted(range(len(space)), key=scores.__getitem__)[:args.top]]
                todo = [c for c in first if c.key not in done]
                reference = analytic_choice(space)
                problem = Problem.of(*problems[key])
                for i in range(0, len(todo), args.chunk):
                    jobs.append((problem, target, todo[i:i + args.chunk], reference))
                    flops.append(problem_flops(space))
    requests = [referenced_request(*problems[problem.key], target, chunk, reference, LIMITS)
                for problem, target, chunk, reference in jobs]
    print(f"{sum(len(c) for _, _, c, _ in jobs)} points to measure in {len(jobs)} requests on "
          f"{len(shares)} workers", flush=True)
    start = time.monotonic()
    order = longest_first(requests, flops)
    for index, outcomes in PoolExecutor(shares).run([requests[i] for i in order]):
        problem, target, chunk, reference = jobs[order[index]]
        db.add(referenced_trials(problem, target, chunk, reference, outcomes))
    print(f"measured in {time.monotonic() - start:.1f} s", flush=True)


def label_noise(trials: list) -> dict:
    """How far a collection's labels can be told apart: each trial's per-round ratios to its
    reference spread ((p75 - p25) / median, as `measure.spread`) at the median trial and the
    90th percentile, with the rounds at the median; and per problem the reference's median in
    its slowest request over its fastest, at the median problem and the 90th percentile. The
    best of 16 labels that each err by a few percent is that much faster than it is."""
    spreads, rounds = [], []
    references = defaultdict(set)
    for t in trials:
        ratios = t.round_ratios
        if ratios:
            spreads.append(spread(ratios))
            rounds.append(len(ratios))
        if t.reference_samples:
            references[(t.problem.key, t.target_key)].add(statistics.median(t.reference_samples))
    apart = [max(v) / min(v) for v in references.values() if len(v) > 1]

    def at(values: list, q: float) -> float | None:
        return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else None

    return {"ratio_spread_median": at(spreads, 0.5), "ratio_spread_p90": at(spreads, 0.9),
            "rounds_median": at(rounds, 0.5), "reference_apart_median": at(apart, 0.5),
            "reference_apart_p90": at(apart, 0.9), "problems_with_requests": len(apart)}


def analyze(args: argparse.Namespace) -> dict:
    db = PerfDatabase(args.db, system=False)
    trials = db.trials()
    suite_of, problems = suite_index()
    spaces = spaces_of(trials, problems) if args.full_space else {}
    if spaces:
        # every trial with the features the analysis gives its schedule now (records stored
        # before a feature existed train with it too)
        features = {(k, target, key): f for (k, target), space in spaces.items() for key, f in space}
        trials = [replace(t, features=features.get((t.problem.key, t.target_key, t.schedule_key), t.features))
                  for t in trials]
    by_suite = trials_by_suite(trials, suite_of)
    out: dict = {"suites": {}, "problems": []}
    print(f"{'held out':22s} {'problems':>8s} {'within 5%':>9s} {'analytic':>8s} {'mean':>6s} {'worst':>6s} "
          f"{'model n':>7s} {'random n':>8s} {'tuned/analytic':>14s}"
          + (f" {'space':>5s} {'model N':>7s} {'analytic N':>10s} {'guided N':>8s} {'random N':>8s} {'pick':>4s} "
             f"{'pick in 5%':>10s} {'pick':>7s}" if spaces else ""))
    for held in [s for s in SUITES if by_suite.get(s)]:
        train = [t for s, ts in by_suite.items() if s != held for t in ts]
        model = CostModel.train(train)
        groups = groups_of(by_suite[held])
        picks = evaluate(model, groups)
        randoms, gains, counts = [], [], []
        for group, ts in groups.items():
            times = records.comparable_times(ts)
            best = min(times)
            good = sum(x <= best / 0.95 for x in times)
            randoms.append((len(ts) + 1) / (good + 1))
            analytic = next((x for t, x in zip(ts, times, strict=True) if t.features.get("analytic_choice")), None)
            if analytic is not None:
                gains.append(analytic / best)
            if group in spaces:
                counts.append(search_counts(model, spaces[group], ts, args.per_problem, group[0]))
        within = sum(p.quality >= 1 / 1.05 for p in picks) / len(picks)
        row = {
            "problems": len(picks), "within_5pct": within,
            "analytic_within_5pct": sum(g <= 1.05 for g in gains) / len(gains) if gains else None,
            "mean_pick": statistics.fmean(p.quality for p in picks),
            "worst_pick": min(p.quality for p in picks),
            "model_measurements": statistics.fmean(p.first_good for p in picks),
            "random_measurements": statistics.fmean(randoms),
            "tuned_vs_analytic_geomean": math.exp(statistics.fmean(math.log(g) for g in gains)) if gains else None,
        }
        if counts:
            row["full_space"] = {name: statistics.fmean(c[name] for c in counts)
                                 for name in ("space", "model", "analytic", "guided", "random")}
            measured_picks = [c["space_pick"] for c in counts if c["space_pick"] is not None]
            row["full_space"]["picks_measured"] = len(measured_picks)
            row["full_space"]["pick_within_5pct"] = (
                sum(q >= 1 / 1.05 for q in measured_picks) / len(measured_picks) if measured_picks else None)
            row["full_space"]["pick_mean"] = statistics.fmean(measured_picks) if measured_picks else None
        out["suites"][held] = row
        out["problems"] += [{"suite": held, "problem": p.label, "candidates": p.candidates,
                             "pick": p.quality, "first_good": p.first_good} for p in picks]
        line = (f"{held:22s} {row['problems']:8d} {within:9.0%} {row['analytic_within_5pct'] or 0:8.0%} "
                f"{row['mean_pick']:6.1%} {row['worst_pick']:6.1%} {row['model_measurements']:7.2f} "
                f"{row['random_measurements']:8.2f} {row['tuned_vs_analytic_geomean'] or 0:14.3f}")
        if counts:
            f = row["full_space"]
            line += (f" {f['space']:5.0f} {f['model']:7.1f} {f['analytic']:10.1f} {f['guided']:8.1f}"
                     f" {f['random']:8.1f}")
            if f["picks_measured"]:
                line += f" {f['picks_measured']:4d} {f['pick_within_5pct']:10.0%} {f['pick_mean']:7.1%}"
        print(line)
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
    noise = out["labels"] = label_noise([t for t in trials if t.status == records.OK])
    if noise["ratio_spread_median"] is not None:
        print(f"labels: a trial's per-round ratios to its reference spread {noise['ratio_spread_median']:.1%} "
              f"(median trial, {noise['rounds_median']} rounds), {noise['ratio_spread_p90']:.1%} (90th percentile)"
              + (f"; a problem's reference, slowest request / fastest: {noise['reference_apart_median']:.2f} "
                 f"(median problem), {noise['reference_apart_p90']:.2f} (90th percentile)"
                 if noise["reference_apart_median"] is not None else ""))
    if all("full_space" in r for r in rows):
        model_n = sum(r["full_space"]["model"] * r["problems"] for r in rows)
        analytic_n = sum(r["full_space"]["analytic"] * r["problems"] for r in rows)
        guided_n = sum(r["full_space"]["guided"] * r["problems"] for r in rows)
        random_n = sum(r["full_space"]["random"] * r["problems"] for r in rows)
        out["overall"]["full_space"] = {"random_vs_model": random_n / model_n,
                                        "random_vs_analytic": random_n / analytic_n,
                                        "random_vs_guided": random_n / guided_n}
        print(f"over the whole search space: random search needs {random_n / model_n:.1f}x the "
              f"model's measurements, {random_n / analytic_n:.1f}x the analytic order's and "
              f"{random_n / guided_n:.1f}x the guided search's (the analytic choice, then the "
              "model's and the analytic order in turn)")
        measured = sum(r["full_space"]["picks_measured"] for r in rows)
        if measured:
            within = sum((r["full_space"]["pick_within_5pct"] or 0) * r["full_space"]["picks_measured"]
                         for r in rows) / measured
            out["overall"]["full_space"]["pick_within_5pct"] = within
            print(f"the model's pick of the whole space: {within:.0%} of the {measured} "
                  f"measured within 5% of the best measured")
    return out


def versus_row(case, problem, target: CpuTarget, torch, repeat: int, budget_s: float) -> dict:
    """One layer of `versus`: the `schedule="tuned"` kernel against the analytic one (the
    database of `POLYDL_TUNING_DB`), both verified, timed interleaved; the ratio is the median
    of the per-round ratios of their speeds (1.0 untimed where the two schedules are one)."""
    kind = PASSES[case.primitive]
    decided = tuned_schedule(build_model(problem.nest, problem.params), target).decided_by
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1.0, 1.0, size=shape).astype(np.float32) for shape in kind.input_shapes(case)]
    expected = kind.expected(case, inputs, torch)
    layout = suite_layout(case.primitive, case.size)
    builds = {name: kind.build(case, inputs, layout, name, ()) for name in ("auto", "tuned")}
    for name, build in builds.items():
        ok, err = verify(build.runner, expected, case.dtype)
        if not ok:
            raise SystemExit(f"{case.name}: the {name} kernel differs (relative error {err:.1e})")
    row = {"layer": case.name, "decided_by": decided, "analytic_schedule": builds["auto"].schedule,
           "tuned_schedule": builds["tuned"].schedule}
    if row["analytic_schedule"] == row["tuned_schedule"]:
        return {**row, "ratio": 1.0, "same": True, "analytic_gflops": None, "tuned_gflops": None, "rounds": 0}
    runners = [Runner(n, b.runner.run, b.runner.fresh) for n, b in builds.items()]
    rounds, samples = time_runners(runners, repeat, budget_s)
    per_round = round_medians(samples)
    return {**row, "same": False, "rounds": rounds,
            "ratio": statistics.median(a / t for a, t in zip(per_round["auto"], per_round["tuned"], strict=True)),
            "analytic_gflops": case.flops / statistics.median(samples["auto"]) / 1e9,
            "tuned_gflops": case.flops / statistics.median(samples["tuned"]) / 1e9}


def versus(args: argparse.Namespace) -> dict:
    os.environ["POLYDL_TUNING_DB"] = str(Path(args.db).resolve())  # a pinned child inherits it
    cores = pinned_cores(args.threads or None)
    if not runs_on(cores):
        sys.exit(run_pinned([sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]], cores))
    target = host_target()
    torch = import_torch(len(cores))
    cases = select_cases(load_suite(args.suite, args.batch), args.cases.split(",") if args.cases else None)
    nests = {p.name: p for p in suite_problems(args.suite, args.batch)}
    print(f"target {target.describe()}; {len(cores)} threads; database {args.db}", flush=True)
    print(f"{'layer':16s} {'decided by':10s} {'analytic':>10s} {'tuned':>10s} {'ratio':>7s}  tuned schedule")
    rows = []
    for case in cases:
        row = versus_row(case, nests[case.name], target, torch, args.repeat, args.budget)
        rows.append(row)
        speeds = ("same schedule", "") if row["same"] else (
            f"{row['analytic_gflops']:.0f}", f"{row['tuned_gflops']:.0f}")
        print(f"{case.name:16s} {row['decided_by']:10s} {speeds[0]:>10s} {speeds[1]:>10s} "
              f"{row['ratio']:7.3f}  {row['tuned_schedule']}", flush=True)
    mean = geometric_mean([r["ratio"] for r in rows])
    differ = [r["ratio"] for r in rows if not r["same"]]
    print(f"geometric mean, tuned / analytic: {mean:.3f} over {len(rows)} layers "
          f"({len(differ)} with another schedule" + (f": {geometric_mean(differ):.3f}" if differ else "") + ")")
    return {"suite": args.suite, "batch": args.batch, "threads": len(cores), "target": target.describe(),
            "geomean": mean, "rows": rows}


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
    c.add_argument("--chunk", type=int, default=0,
                   help="candidates per measuring process, timed interleaved (0: a problem's all)")
    c.add_argument("--problems", default="", help="only these layers or shapes (names, comma-separated)")
    c.add_argument("--repeats", type=int, default=1,
                   help="measurements of every point, in passes over all the suites (labels pool them)")
    t = sub.add_parser("throughput")
    t.add_argument("--workers", dest="workers_list", default="1,8")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--candidates", type=int, default=64)
    t.add_argument("--mode", choices=("tune", "requests"), default="tune",
                   help="tune: the problems through the tuner as `polydl tune --suite` runs them; "
                        "requests: the candidates' measuring requests straight to the workers")
    t.add_argument("--json", type=Path)
    k = sub.add_parser("picks")
    k.add_argument("--db", default=str(HERE / "results" / "tuning.sqlite"))
    k.add_argument("--top", type=int, default=8, help="the model's first points of each space")
    k.add_argument("--workers", type=int, default=1)
    k.add_argument("--threads", type=int, default=2, help="cores per worker: as `collect` measured")
    k.add_argument("--chunk", type=int, default=3)
    a = sub.add_parser("analyze")
    a.add_argument("--db", default=str(HERE / "results" / "tuning.sqlite"))
    a.add_argument("--json", type=Path, default=HERE / "results" / "tuning.json")
    a.add_argument("--full-space", action="store_true",
                   help="compute every problem's search space again: measurement counts over "
                        "all of it, and the current features for every trial (minutes)")
    a.add_argument("--per-problem", type=int, default=24, help="as `collect` measured")
    v = sub.add_parser("versus")
    v.add_argument("--suite", default="resnet50")
    v.add_argument("--batch", type=int, default=None)
    v.add_argument("--threads", type=int, default=0, help="pinned cores (default: all)")
    v.add_argument("--db", default=os.environ.get("POLYDL_TUNING_DB") or str(HERE / "results" / "tuning.sqlite"))
    v.add_argument("--cases", default="", help="only these layers (names, comma-separated)")
    v.add_argument("--repeat", type=int, default=21, help="rounds at most")
    v.add_argument("--budget", type=float, default=6.0, help="timing seconds per layer at most")
    v.add_argument("--json", type=Path, default=HERE / "results" / "versus.json")
    args = parser.parse_args()
    if args.command == "versus":
        result = versus(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    elif args.command == "collect":
        collect(args)
    elif args.command == "picks":
        picks(args)
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
