#!/usr/bin/env python3
"""Run a polydl benchmark suite against the reference libraries; see benchmarks/README.md.

    python benchmarks/run.py --suite gemm
    python benchmarks/run.py --suite resnet50 --case conv1 --case res2_3x3 --repeat 5
    python benchmarks/run.py --suite resnet50 --batch 32 --threads 16

Same as `polydl bench`, plus a default JSON path (benchmarks/results/SUITE.json), a per-case
timing budget and the choice of a warm compile cache.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from polydl.bench import SUITE_FILES  # noqa: E402 - after the path set-up


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="gemm", choices=sorted(SUITE_FILES))
    p.add_argument("--json", metavar="FILE",
                   help="write the report here (default: benchmarks/results/SUITE.json)")
    p.add_argument("--no-json", action="store_true", help="print the table only")
    p.add_argument("--case", action="append", default=[], help="only these cases (repeatable)")
    p.add_argument("--repeat", type=int, default=10, help="rounds per case, at most (default 10)")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="timing seconds per case (default: 10 for gemm, 12 for resnet50)")
    p.add_argument("--warm-cache", action="store_true",
                   help="use the normal compile cache instead of a fresh one (compile column "
                        "then shows cache hits, not cold compiles)")
    p.add_argument("--layout", action="append", choices=["nchw16c", "nchw", "nchw-nchw16c"],
                   help="conv layouts polydl may use (repeatable; default: all three; "
                        "nchw-nchw16c, NCHW in and blocks out, for layers of fewer than 16 "
                        "input channels only)")
    p.add_argument("--first-layout", action="store_true",
                   help="use the first layout that builds and verifies instead of building "
                        "each and keeping the fastest (one compile per layer instead of two)")
    p.add_argument("--batch", type=int, metavar="N",
                   help="minibatch of a convolution suite (default: the suite's, N=2)")
    p.add_argument("--threads", type=int, metavar="T",
                   help="threads for every side, pinned to the first T cores; polydl schedules "
                        "for T cores (default: OMP_NUM_THREADS, else every core)")
    p.add_argument("--schedule", default="auto", choices=("auto", "tuned"),
                   help="polydl's schedules: the analytic ranking's (auto) or the performance "
                        "database's (tuned: POLYDL_TUNING_DB, as `polydl tune --suite` stored "
                        "them; the rest analytic)")
    p.add_argument("--kept-weights", action="store_true",
                   help="time inference: the weights stay the same between calls; polydl "
                        "builds with constant= (its copies of them made at the first call), "
                        "oneDNN's blocked path has them reordered beforehand")
    args = p.parse_args(argv)

    from polydl import bench

    json_path = None if args.no_json else (
        args.json or str(ROOT / "benchmarks" / "results" / f"{args.suite}.json"))
    try:
        return bench.main(
            args.suite, json_path, args.case or None, args.repeat,
            budget_s=args.budget, cold_cache=not args.warm_cache,
            layouts=tuple(args.layout) if args.layout else bench.CONV_LAYOUTS,
            compare_layouts=not args.first_layout, batch=args.batch, threads=args.threads,
            schedule=args.schedule, kept_weights=args.kept_weights,
        )
    except bench.BenchError as exc:  # an unknown case, --batch on GEMMs, too many threads
        p.error(str(exc))


if __name__ == "__main__":
    sys.exit(main())
