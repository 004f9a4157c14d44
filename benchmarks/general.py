#!/usr/bin/env python3
"""General loop nests: PolyBench's 30 kernels and 40-odd DL operators written in plain C, as
polydl builds them, beside the same C built by `gcc -O3 -march=native -fopenmp`, by the same
with `-ffast-math`, and by `clang-19 -O3 -march=native -mllvm -polly -mllvm -polly-parallel`
(sizes as -D constants), and PyTorch eager for the DL operators.

    python benchmarks/general.py [--suite all|dl|polybench] [--kernels gemm,softmax]
        [--threads 1,2] [--rounds 7] [--sizes bench|test|mini|small|medium|large]
        [--json FILE]

Every side runs with the same threads (OMP_NUM_THREADS and PyTorch's pool; each count of
--threads in turn, default: the cores this process may use), pinned to as many of this
process's cores, for which polydl schedules. Each kernel and thread count runs
in its own child process with an unlimited stack (Polly's 3mm overflows 8 MiB); a child that
crashes is run again without Polly, then reported as an error; a kernel polydl refuses is a row
with its refusal. Prints the per-kernel table as it goes (median ms, polydl's speedup over each
side), then the distributions of those speedups (geometric mean, 10th percentile, lowest, ten
slowest), and writes everything to JSON (default general-<sizes>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from polydl.bench.general import SIDES, Result, default_workdir, run_kernel  # noqa: E402
from polydl.bench.general_corpus import CORPUS, DATASETS, SUITES, kernels_of  # noqa: E402
from polydl.bench.general_report import (  # noqa: E402
    machine,
    summarise,
    summary_lines,
    table_header,
    table_row,
)
from polydl.bench.threads import import_torch, pinned_cores  # noqa: E402


def child(name: str, dataset: str, sides: tuple[str, ...], rounds: int, threads: int) -> None:
    torch = import_torch(threads) if "torch" in sides else None
    workdir = default_workdir()
    workdir.mkdir(parents=True, exist_ok=True)
    result = run_kernel(name, CORPUS[name].sizes(dataset), sides, rounds, workdir,
                        torch_available=torch is not None, threads=threads)
    print("RESULT " + json.dumps(result.to_json()), flush=True)


def run_child(name: str, threads: int, args: argparse.Namespace,
              sides: tuple[str, ...]) -> dict | None:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_STACKSIZE="64M",
               OPENBLAS_NUM_THREADS=str(threads), OPENBLAS_THREAD_TIMEOUT="4")
    command = (f"ulimit -s unlimited 2>/dev/null || ulimit -s 1048576; exec {sys.executable} "
               f"{Path(__file__).resolve()} --child {name} --sizes {args.sizes} "
               f"--rounds {args.rounds} --threads {threads} --sides {','.join(sides)}")
    # pinned to as many cores as threads, as `polydl.bench` runs: polydl schedules for the
    # cores the process may use, so a 1-thread run gets kernels scheduled for one core
    cores = pinned_cores(threads)
    try:
        proc = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True,
                              timeout=args.timeout, stdin=subprocess.DEVNULL,
                              preexec_fn=lambda: os.sched_setaffinity(0, cores))
    except subprocess.TimeoutExpired:
        return Result(name, CORPUS[name].sizes(args.sizes), threads,
                      status=f"error: timed out after {args.timeout} s").to_json()
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    sys.stderr.write(proc.stderr[-2000:])
    return None


def run_one(name: str, threads: int, args: argparse.Namespace) -> dict:
    sides = SIDES if CORPUS[name].suite == "dl" else tuple(s for s in SIDES if s != "torch")
    data = run_child(name, threads, args, sides)
    if data is None:
        data = run_child(name, threads, args, tuple(s for s in sides if s != "polly"))
        if data is not None:
            data["notes"].append("polly crashed")
    if data is None:
        data = Result(name, CORPUS[name].sizes(args.sizes), threads,
                      status="error: the child crashed").to_json()
    return data


def thread_counts(text: str) -> list[int]:
    try:
        counts = [int(t) for t in text.split(",") if t]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected thread counts like 1,2,16, got {text!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("all", *SUITES), default="all")
    parser.add_argument("--kernels", default="", help="comma-separated; default: the suite's")
    parser.add_argument("--threads", type=thread_counts,
                        default=[len(os.sched_getaffinity(0))])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", choices=DATASETS, default="bench")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds a kernel's child may take (then an error row)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sides", default=",".join(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.sizes, tuple(args.sides.split(",")), args.rounds, args.threads[0])
        return 0
    cores = len(os.sched_getaffinity(0))
    if max(args.threads) > cores:  # each count runs pinned to as many cores
        parser.error(f"--threads {max(args.threads)}: this process may use {cores} cores")
    names = [k for k in args.kernels.split(",") if k] or kernels_of(args.suite)
    unknown = [k for k in names if k not in CORPUS]
    if unknown:
        parser.error(f"unknown kernels {unknown}; known: {', '.join(CORPUS)}")
    results: list[dict] = []
    print(table_header(), flush=True)
    for name in names:
        for threads in args.threads:
            data = run_one(name, threads, args)
            results.append(data)
            print(table_row(data), flush=True)
    summary = summarise(results)
    for line in summary_lines(summary):
        print(line)
    path = Path(args.json or f"general-{args.sizes}.json")
    path.write_text(json.dumps(
        {"machine": machine(), "threads": args.threads, "rounds": args.rounds,
         "sizes": args.sizes, "suite": args.suite, "kernels": names, "results": results,
         "summary": summary}, indent=2))
    print(f"wrote {path}")
    return 1 if any(r["status"].startswith(("wrong", "error")) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
