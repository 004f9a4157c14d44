#!/usr/bin/env python3
"""Weights kept between calls against weights packed at every call; see benchmarks/README.md.

    python benchmarks/kept.py                                  # the default shapes, every core
    python benchmarks/kept.py --shapes 1x1000x2048,512x768x3072 --threads 2 --rounds 15

For each GEMM M x N x K, two kernels are built in one process: `polydl.matmul(M, N, K)`, which
packs B (where its schedule packs) at every call, and the same with `constant=("B",)`, which
packs B at its first call and keeps the copy. Both are checked against numpy's product, then
timed in interleaved rounds (order rotated, each turn after the other side's threads are idle
and after one untimed call). The table gives each side's median time a call, the median of
the per-round ratios and their range; the JSON has every round. Batch 1-2 classifiers are
where keeping pays: their B is read once a call, so its copy is most of their work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

# A ResNet-50 classifier at batch 1, 2, 32, 64; square and BERT-base layers.
DEFAULT_SHAPES = ("1x1000x2048", "2x1000x2048", "32x1000x2048", "64x1000x2048",
                  "512x512x512", "512x3072x768", "512x768x3072")
SIDES = ("per call", "kept")


def _shape(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is MxNxK, like 1x1000x2048: got '{text}'") from None
    if min(m, n, k) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive: got '{text}'")
    return m, n, k


def measure(m: int, n: int, k: int, rounds: int) -> dict[str, Any]:
    """Both kernels of one shape, verified, then timed interleaved."""
    import numpy as np

    import polydl
    from polydl.bench import timing
    from polydl.runtime.kernel import aligned_zeros

    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    kernels = {"per call": polydl.matmul(m, n, k), "kept": polydl.matmul(m, n, k, constant=("B",))}
    runners, errors = [], {}
    for side, kernel in kernels.items():
        c = aligned_zeros((m, n), np.dtype(np.float32))
        kernel(a, b, C=c)
        errors[side] = float(np.max(np.abs(c - expected)) / max(np.max(np.abs(expected)), 1e-30))
        if errors[side] > 1e-5:
            raise SystemExit(f"{m}x{n}x{k} {side}: relative error {errors[side]:.1e} against numpy")
        runners.append(timing.Runner(side, lambda kernel=kernel, c=c: kernel(a, b, C=c), lambda c=c: c))
    single = {r.name: timing.time_call(r.run, 1) for r in runners}
    _, inner = timing.plan(single, rounds, 1e9)  # the rounds asked for, whatever they take
    samples = timing.time_interleaved(runners, rounds, inner)
    per_round = timing.round_medians(samples)
    ratios = [p / q for p, q in zip(per_round["per call"], per_round["kept"], strict=True)]
    return {
        "shape": f"{m}x{n}x{k}", "M": m, "N": n, "K": k,
        "seconds": {side: statistics.median(samples[side]) for side in SIDES},
        "round_seconds": per_round,
        "speedup": statistics.median(ratios), "round_speedups": ratios,
        "errors": errors,
        "schedules": {side: kernel.schedule.describe() for side, kernel in kernels.items()},
    }


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'shape':<14} {'per call us':>12} {'kept us':>10} {'x':>6} {'rounds':>11}  per call's schedule"]
    for r in results:
        s, x = r["seconds"], r["round_speedups"]
        lines.append(f"{r['shape']:<14} {s['per call'] * 1e6:>12.1f} {s['kept'] * 1e6:>10.1f} "
                     f"{r['speedup']:>6.3f} {min(x):>5.2f}-{max(x):<5.2f}  {r['schedules']['per call']}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=lambda t: [_shape(s) for s in t.split(",")],
                        default=[_shape(s) for s in DEFAULT_SHAPES], help="comma-separated MxNxK")
    parser.add_argument("--threads", type=int, metavar="T",
                        help="threads, pinned to the first T cores (default: every core)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "kept.json")
    args = parser.parse_args()

    from polydl.bench.cases import BenchError
    from polydl.bench.threads import pinned_cores, run_pinned, runs_on

    try:
        cores = pinned_cores(args.threads)
    except BenchError as exc:
        parser.error(str(exc))
    if not runs_on(cores):  # numpy's BLAS and OpenMP read their threads at load: run again
        return run_pinned([sys.executable, *sys.argv], cores)

    from polydl.target.host import host_target

    print(f"kept weights: {host_target().describe()}, {len(cores)} threads, {args.rounds} rounds", flush=True)
    results = []
    for m, n, k in args.shapes:
        results.append(measure(m, n, k, max(1, args.rounds)))
        print(table(results[-1:])[-1], flush=True)
    print("\n".join(table(results)))
    print("(medians; x = the median of the rounds' per-call / kept ratios, rounds = their range)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"threads": len(cores), "rounds": args.rounds, "results": results},
                                    indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
