#!/usr/bin/env python3
"""General loop nests: the classic polyhedral kernels and DL operators written in plain C,
as polydl builds them, beside the same C built by `gcc -O3` and by `clang-19 -O3
-march=native -mllvm -polly -mllvm -polly-parallel -lgomp` (sizes as -D constants), and
PyTorch eager for the DL operators. Same threads for every side (OMP_NUM_THREADS, default 2;
the gcc build is the original code: one thread).

    python benchmarks/general.py [--kernels gemm,2mm] [--threads 2] [--rounds 7]
                                 [--sizes bench|small] [--json FILE]

Each kernel runs in its own child process with an unlimited stack (Polly's 3mm overflows
8 MiB); a child that crashes is run again without the side that crashed it. Prints a table
(median milliseconds, speedups over gcc) and the geometric means; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from polydl.bench.general import (  # noqa: E402
    CLASSIC,
    DL_OPERATORS,
    SIZES,
    Result,
    default_workdir,
    run_kernel,
)
from polydl.bench.threads import import_torch  # noqa: E402

SIDES = ("polydl", "gcc", "polly", "torch")


def child(name: str, sizes: str, sides: tuple[str, ...], rounds: int, threads: int) -> None:
    torch = import_torch(threads) if "torch" in sides else None
    workdir = default_workdir()
    workdir.mkdir(parents=True, exist_ok=True)
    chosen = SIZES[name][0 if sizes == "bench" else 1]
    result = run_kernel(name, chosen, sides, rounds, workdir, torch)
    print("RESULT " + json.dumps(result.to_json()), flush=True)


def run_child(name: str, args: argparse.Namespace, sides: tuple[str, ...]) -> dict | None:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_STACKSIZE="64M",
               OPENBLAS_NUM_THREADS=str(args.threads), OPENBLAS_THREAD_TIMEOUT="4")
    command = (f"ulimit -s unlimited 2>/dev/null || ulimit -s 1048576; exec {sys.executable} "
               f"{Path(__file__).resolve()} --child {name} --sizes {args.sizes} "
               f"--rounds {args.rounds} --threads {args.threads} --sides {','.join(sides)}")
    proc = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    sys.stderr.write(proc.stderr[-2000:])
    return None


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default=",".join(SIZES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", choices=("bench", "small"), default="bench")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sides", default=",".join(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.sizes, tuple(args.sides.split(",")), args.rounds, args.threads)
        return 0
    names = [k for k in args.kernels.split(",") if k]
    unknown = [k for k in names if k not in SIZES]
    if unknown:
        parser.error(f"unknown kernels {unknown}; known: {', '.join(SIZES)}")
    results: list[dict] = []
    print(f"{'kernel':17s} {'polydl ms':>10s} {'gcc ms':>9s} {'polly ms':>9s} {'torch ms':>9s} "
          f"{'polydl/gcc':>10s} {'polly/gcc':>9s} {'vs polly':>8s} {'vs torch':>8s}  status",
          flush=True)
    for name in names:
        sides = SIDES if name in DL_OPERATORS else SIDES[:3]
        data = run_child(name, args, sides)
        if data is None and "polly" in sides:
            data = run_child(name, args, tuple(s for s in sides if s != "polly"))
            if data is not None:
                data["notes"].append("polly crashed")
        if data is None:
            data = Result(name, SIZES[name][0]).to_json() | {"status": "error: the child crashed"}
        results.append(data)
        ms = data["ms"]

        def ratio(a: str, b: str, ms: dict = ms) -> float | None:
            return ms[b] / ms[a] if a in ms and b in ms and ms[a] > 0 else None

        print(f"{name:17s} {fmt(ms.get('polydl'), '.3f'):>10s} {fmt(ms.get('gcc'), '.3f'):>9s} "
              f"{fmt(ms.get('polly'), '.3f'):>9s} {fmt(ms.get('torch'), '.3f'):>9s} "
              f"{fmt(ratio('polydl', 'gcc')):>10s} {fmt(ratio('polly', 'gcc')):>9s} "
              f"{fmt(ratio('polydl', 'polly')):>8s} {fmt(ratio('polydl', 'torch')):>8s}  "
              f"{data['status']}{'; ' + '; '.join(data['notes']) if data['notes'] else ''}",
              flush=True)
    summary = _summary(results)
    for line in summary["lines"]:
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"threads": args.threads, "rounds": args.rounds, "sizes": args.sizes,
             "results": results, "summary": summary["values"]}, indent=2))
        print(f"wrote {args.json}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


def _summary(results: list[dict]) -> dict:
    def speed(r: dict, side: str, over: str) -> float | None:
        ms = r["ms"]
        return ms[over] / ms[side] if side in ms and over in ms and ms[side] > 0 else None

    classic = [r for r in results if r["kernel"] in CLASSIC]
    ok = [r for r in classic if r["status"] == "ok"]
    dl = [r for r in results if r["kernel"] in DL_OPERATORS and r["status"] == "ok"]
    values = {
        "classic_kernels": len(classic),
        "classic_accepted_and_correct": len(ok),
        "polydl_over_gcc_geomean": geomean([speed(r, "polydl", "gcc") for r in ok]),
        "polly_over_gcc_geomean": geomean([speed(r, "polly", "gcc") for r in ok]),
        "polydl_over_polly_geomean": geomean([speed(r, "polydl", "polly") for r in ok]),
        "slower_than_gcc": [r["kernel"] for r in ok if (speed(r, "polydl", "gcc") or 1) < 1],
        "dl_polydl_over_torch_geomean": geomean([speed(r, "polydl", "torch") for r in dl]),
    }
    lines = [
        f"classic kernels: {len(ok)}/{len(classic)} accepted and correct; geometric mean speedup "
        f"over gcc -O3: polydl {fmt(values['polydl_over_gcc_geomean'])}x, Polly "
        f"{fmt(values['polly_over_gcc_geomean'])}x (polydl/Polly "
        f"{fmt(values['polydl_over_polly_geomean'])}x)",
        f"slower than gcc -O3: {', '.join(values['slower_than_gcc']) or 'none'}",
        f"DL operators: {len(dl)} correct; geometric mean polydl vs PyTorch eager "
        f"{fmt(values['dl_polydl_over_torch_geomean'])}x",
    ]
    return {"lines": lines, "values": values}


if __name__ == "__main__":
    sys.exit(main())
