#!/usr/bin/env python3
"""Thread scaling of polydl and oneDNN on the large ResNet-50 layers; see benchmarks/README.md.

    python benchmarks/scaling.py                         # 1, 2, 4, ... up to every core, N=32
    python benchmarks/scaling.py --threads 1,4,16 --batch 2 --case res2_3x3
    python benchmarks/scaling.py --suite gemm --case square_2048 --case bert_ffn1

Each thread count is one run of the benchmark suite (`polydl.bench.main`) in a child process
pinned to that many cores, so polydl schedules for that many cores and every side (polydl,
PyTorch's oneDNN paths, numpy) runs on the same threads, interleaved, with the FMA peak measured
in the same run. Prints a table, writes the JSON of every run together and, where matplotlib is
installed (`pip install 'polydl[bench]'`), a PNG of speed against threads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from polydl import bench  # noqa: E402 - after the path set-up
from polydl.bench.report import num  # noqa: E402

# The cases with the most work per call: for the convolutions one of each kind (3x3 at every
# resolution, 1x1 layers that feed 256 and more channels), for GEMM the large shapes.
LARGE_CASES = {
    "resnet50": ("res2_3x3", "res3_3x3", "res4_3x3", "res5_3x3", "res2_1x1b", "res4_1x1c"),
    "gemm": ("square_1024", "square_2048", "bert_qkv", "bert_ffn1", "bert_ffn2"),
}


def powers_of_two(cores: int) -> list[int]:
    counts = [1 << i for i in range(cores.bit_length()) if 1 << i <= cores]
    return counts if counts[-1] == cores else [*counts, cores]


def _speeds(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    env = report["environment"]
    peak = env["peak_gflops"]
    # the FMA loop's typical speed, for its own speed-up: a best sample of a busy host's loop
    # can stray 1.3x above its median
    typical = statistics.median(env.get("peak_samples") or [peak])
    return {row["case"]: {"polydl": row["polydl_gflops"],
                          "reference_gflops": row["best_reference_gflops"],
                          "reference": row["best_reference"],
                          "peak": peak,
                          "peak_median": typical,
                          "layout": row["variant"],
                          "status": row["status"]}
            for row in report["rows"]}


def scaling_table(runs: dict[int, dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    """Lines of the table and the summary (per case and thread count: both speeds, polydl's
    speed-up over its own one-thread speed, the FMA loop's over its own, % of that run's
    peak). The FMA loop's speed-up is the most any kernel can scale on the machine: one core
    alone runs at a higher clock than all of them together."""
    counts = sorted(runs)
    cases = [row["case"] for row in runs[counts[0]]["rows"]]
    speeds = {t: _speeds(runs[t]) for t in counts}
    lines = [f"{'case':<12} {'threads':>7} {'polydl':>9} {'best ref':>9} {'ratio':>6} "
             f"{'speed-up':>8} {'FMA x':>6} {'%peak':>6} {'peak':>7}  ref"]
    summary: dict[str, Any] = {}
    for case in cases:
        base = speeds[counts[0]][case]["polydl"]
        base_peak = speeds[counts[0]][case]["peak_median"]
        entries = []
        for t in counts:
            s = speeds[t][case]
            ratio = (s["polydl"] / s["reference_gflops"]
                     if s["polydl"] and s["reference_gflops"] else None)
            speedup = (s["polydl"] / base * counts[0]) if s["polydl"] and base else None
            fma = s["peak_median"] / base_peak * counts[0] if base_peak else None
            pct = 100 * s["polydl"] / s["peak"] if s["polydl"] else None
            entries.append({"threads": t, **s, "ratio": ratio, "speedup_over_1": speedup,
                            "fma_speedup_over_1": fma, "peak_percent": pct})
            lines.append(
                f"{case:<12} {t:>7} {num(s['polydl'], '.1f'):>9} {num(s['reference_gflops'], '.1f'):>9} "
                f"{num(ratio, '.2f'):>6} {num(speedup, '.1f'):>8} {num(fma, '.1f'):>6} {num(pct, '.0f'):>6} "
                f"{s['peak']:>7.0f}  {s['reference'] or '-'}")
        summary[case] = entries
    lines.append(f"(GFLOP/s, medians; speed-up = polydl over its {counts[0]}-thread speed, "
                 "scaled to one thread; FMA x = the same for the FMA loop's median; "
                 "best ref = the fastest correct reference: PyTorch's paths (oneDNN, MKL) "
                 "where PyTorch is installed)")
    return lines, summary


def plot(summary: dict[str, Any], path: str, title: str) -> bool:
    """Speed against threads per case, polydl solid and the best reference dashed; False
    without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    columns = min(3, len(summary))
    rows = math.ceil(len(summary) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False)
    for ax, (case, entries) in zip(axes.flat, summary.items(), strict=False):
        threads = [e["threads"] for e in entries]
        ax.plot(threads, [e["polydl"] or math.nan for e in entries], "o-", label="polydl")
        reference = next((e["reference"] for e in entries if e["reference"]), "reference")
        ax.plot(threads, [e["reference_gflops"] or math.nan for e in entries], "s--",
                label=reference)
        ax.plot(threads, [e["peak"] for e in entries], ":", color="grey", label="FMA peak")
        ax.set_xscale("log", base=2)
        ax.set_xticks(threads, [str(t) for t in threads])
        ax.set_title(case)
        ax.set_xlabel("threads")
        ax.set_ylabel("GFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(summary):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=sorted(LARGE_CASES), default="resnet50")
    p.add_argument("--threads", help="comma-separated thread counts (default: 1, 2, 4, ... "
                                     "up to every core this process may use)")
    p.add_argument("--batch", type=int, default=32,
                   help="minibatch N of the convolutions (default 32)")
    p.add_argument("--case", action="append", default=[],
                   help="cases (repeatable; default: " + "; ".join(
                       f"{suite}: {', '.join(names)}" for suite, names in LARGE_CASES.items()) + ")")
    p.add_argument("--layout", action="append", choices=["nchw16c", "nchw"],
                   help="polydl's layouts (default: nchw16c, the faster one on these layers)")
    p.add_argument("--repeat", type=int, default=5, help="rounds per case, at most")
    p.add_argument("--budget", type=float, default=3.0, help="timing seconds per case")
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "scaling.json"))
    p.add_argument("--png", default=str(ROOT / "benchmarks" / "results" / "scaling.png"))
    args = p.parse_args(argv)

    cores = len(os.sched_getaffinity(0))
    batch = None if args.suite == "gemm" else args.batch
    counts = ([int(t) for t in args.threads.split(",")] if args.threads
              else powers_of_two(cores))
    runs: dict[int, dict[str, Any]] = {}
    status = 0
    with tempfile.TemporaryDirectory(prefix="polydl-scaling-") as tmp:
        for t in counts:
            path = os.path.join(tmp, f"{t}.json")
            status |= bench.main(args.suite, path, args.case or list(LARGE_CASES[args.suite]),
                                 args.repeat, budget_s=args.budget,
                                 layouts=tuple(args.layout or ["nchw16c"]), compare_layouts=False,
                                 batch=batch, threads=t)
            runs[t] = json.loads(Path(path).read_text())
    lines, summary = scaling_table(runs)
    what = "GEMM shapes" if batch is None else f"ResNet-50 layers, N={batch}"
    print("\n".join(["", f"thread scaling, {what}, fp32", *lines]))
    report = {"suite": args.suite, "batch": batch, "threads": counts, "summary": summary,
              "runs": {str(t): runs[t] for t in counts}}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.json}")
    machine = runs[counts[-1]]["environment"]["machine"]
    title = f"{machine['model']}, {what}, fp32"
    if plot(summary, args.png, title):
        print(f"wrote {args.png}")
    else:
        print("no plot: matplotlib is not installed (pip install 'polydl[bench]')")
    return status


if __name__ == "__main__":
    sys.exit(main())
