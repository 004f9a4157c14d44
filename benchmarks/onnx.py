#!/usr/bin/env python3
"""Whole ONNX image classifiers: polydl.onnx against onnxruntime on the same model, inputs and
threads.

    python benchmarks/onnx.py [--models resnet18,resnet50,mobilenet_v2,resnext50_32x4d]
                              [--batches 1,32] [--threads 2] [--rounds 7] [--torchvision]
                              [--warm-cache] [--no-pin] [--no-winograd] [--tuned-db FILE]
                              [--json FILE]

Models are the zoo's (`polydl.onnx.zoo`: torchvision's architectures as torch.onnx.export
writes them, random weights, BatchNorm folded), or with `--torchvision` torchvision's own,
exported with the legacy exporter (opset 17, dynamic batch) when torchvision is importable.
Each model has a symbolic batch; polydl compiles it once per batch size (`batch=`), with a
fresh compile cache unless `--warm-cache` (the compile column is a cold compile), and
onnxruntime runs the same model with `intra_op_num_threads` = threads, one inter-op thread and
every graph optimisation (ORT_ENABLE_ALL) and no spin-waiting between runs
(`session.intra_op.allow_spinning=0`: its idle workers would otherwise spin on the cores polydl
runs on next; its own time is the same either way).

polydl's output is checked against onnxruntime's first (error relative to the largest
magnitude, at most 1e-4, else the row is FAILED); then `--rounds` interleaved rounds (polydl,
onnxruntime, polydl, ...) each time one call of each side, right after an untimed call of the
same side (the other side's threads stop spinning meanwhile). The table gives medians, the
ratio onnxruntime ms / polydl ms (above 1: polydl is faster) and geometric means of the ratio
per batch size; the JSON (default benchmarks/results/onnx.json) keeps every sample.
With `--tuned-db FILE` (a database `polydl tune MODEL.onnx --batch B` filled on this machine)
each model is also compiled with `schedule="tuned"` from it and timed as a third side in the
same rounds: the table adds its time, its ratio to onnxruntime and its speed-up over the
analytic schedules.

Threads are fixed before any runtime loads (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
OPENBLAS_THREAD_TIMEOUT; a process started without them runs the benchmark in a child that has
them) and, with fewer threads than CPUs, the process is pinned to the first `--threads` CPUs
(as `taskset -c 0,1`) unless `--no-pin`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# This file is named onnx.py: its own folder must not shadow the onnx package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = ("resnet18", "resnet50", "mobilenet_v2", "resnext50_32x4d")
TORCHVISION_MODELS = DEFAULT_MODELS
TOLERANCE = 1e-4
IMAGE_SIZE = 224
CHILD_MARK = "POLYDL_ONNX_BENCH_CHILD"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated (default {','.join(DEFAULT_MODELS)})")
    parser.add_argument("--batches", default="1,32", help="comma-separated batch sizes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument("--torchvision", action="store_true",
                        help="torchvision's models (exported here) instead of the zoo's")
    parser.add_argument("--warm-cache", action="store_true",
                        help="use the normal compile cache (the compile column then shows "
                             "cache hits, not cold compiles)")
    parser.add_argument("--no-pin", action="store_true",
                        help="do not pin the process to the first --threads CPUs")
    parser.add_argument("--no-winograd", action="store_true",
                        help="direct 3x3 convolutions only (polydl.onnx.compile(winograd=False))")
    parser.add_argument("--tuned-db", metavar="FILE",
                        help="also time each model compiled with schedule='tuned' from this "
                             "performance database")
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "onnx.json"))
    parser.add_argument("--no-json", action="store_true")
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.batches = [int(b) for b in args.batches.split(",") if b]
    if args.threads < 1 or args.rounds < 1 or any(b < 1 for b in args.batches):
        parser.error("--threads, --rounds and every batch must be positive")
    return args


def onnx_package() -> Any:
    """The onnx package, by name: a checker that maps this file to the module `onnx` would
    otherwise read `import onnx` as an import of itself."""
    return importlib.import_module("onnx")


def thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
            "OPENBLAS_THREAD_TIMEOUT": "4"}


def needs_child(threads: int) -> bool:
    """Whether this process's runtimes would load with other thread settings than `threads`."""
    return os.environ.get(CHILD_MARK) != "1" and any(
        os.environ.get(name) != value for name, value in thread_env(threads).items())


def pin(threads: int) -> list[int] | None:
    """Pin this process (and every thread it starts later) to its first `threads` CPUs."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if threads < len(cpus):
        os.sched_setaffinity(0, cpus[:threads])
        return cpus[:threads]
    return cpus


# --- models ---------------------------------------------------------------------------------

def zoo_model(name: str, seed: int) -> Any:
    from polydl.onnx import zoo

    if name not in zoo.MODELS:
        raise SystemExit(f"unknown model {name!r}; the zoo has {', '.join(zoo.MODELS)}")
    return zoo.MODELS[name](batch=None, seed=seed)


def torchvision_model(name: str, seed: int, threads: int, workdir: Path) -> Any:
    """torchvision's `name` with random weights, as the legacy exporter writes it (eval mode:
    BatchNorm folded), with a dynamic batch axis; read back as a ModelProto."""
    import torch
    import torchvision

    onnx = onnx_package()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    module = getattr(torchvision.models, name)(weights=None).eval()
    path = workdir / f"{name}.onnx"
    with warnings.catch_warnings():  # the legacy exporter's deprecation notice
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, (torch.zeros(1, 3, IMAGE_SIZE, IMAGE_SIZE),), str(path),
                          dynamo=False, opset_version=17, input_names=["input"],
                          output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    return onnx.load(str(path))


def torchvision_available() -> bool:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True


# --- one model at one batch size ------------------------------------------------------------

def ort_session(model: Any, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # No spin-waiting between runs: onnxruntime's idle workers otherwise spin on the cores
    # polydl's call runs on next (measured: polydl's mobilenet_v2 call 15 ms alone, 15-62 ms
    # right after a spinning session), while onnxruntime's own time is the same either way.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def relative_error(got: Any, want: Any) -> float:
    import numpy as np

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape or not np.isfinite(got).all():
        return math.inf
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def timed_ms(call: Any) -> float:
    call()  # untimed: the other side's threads may still be spinning on the cores
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


def bench_one(name: str, model: Any, batch: int, args: argparse.Namespace,
              machine: Any) -> dict[str, Any]:
    import numpy as np

    import polydl.onnx

    row: dict[str, Any] = {"model": name, "batch": batch, "status": "ok", "polydl_ms": None,
                           "ort_ms": None, "ratio": None, "relative_error": None,
                           "compile_s": None, "polydl_samples_ms": [], "ort_samples_ms": []}
    x = np.random.default_rng(args.seed + batch).standard_normal(
        (batch, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
    session = ort_session(model, args.threads)
    (want,) = session.run(["output"], {"input": x})
    start = time.perf_counter()
    try:
        compiled = polydl.onnx.compile(model, machine=machine, batch=batch,
                                       winograd=not args.no_winograd)
        row["compile_s"] = time.perf_counter() - start
        tuned = None
        if args.tuned_db:
            os.environ["POLYDL_TUNING_DB"] = str(Path(args.tuned_db).resolve())
            tuned = polydl.onnx.compile(model, machine=machine, batch=batch,
                                        winograd=not args.no_winograd, schedule="tuned")
    except Exception as exc:  # a benchmark reports and goes on to the next model
        row["status"] = f"ERROR: {type(exc).__name__}: {exc}".splitlines()[0]
        return row
    row["relative_error"] = relative_error(compiled(x), want)
    if tuned is not None:
        row.update(tuned_relative_error=relative_error(tuned(x), want), tuned_samples_ms=[],
                   tuned_by=tuned.explain().count("(tuned: the database decided)"))
        row["relative_error"] = max(row["relative_error"], row["tuned_relative_error"])
    if not row["relative_error"] <= TOLERANCE:
        row["status"] = "FAILED"
    feeds = {"input": x}
    for _ in range(args.rounds):
        row["polydl_samples_ms"].append(timed_ms(lambda: compiled(x)))
        if tuned is not None:
            row["tuned_samples_ms"].append(timed_ms(lambda: tuned(x)))
        row["ort_samples_ms"].append(timed_ms(lambda: session.run(None, feeds)))
    row["polydl_ms"] = statistics.median(row["polydl_samples_ms"])
    row["ort_ms"] = statistics.median(row["ort_samples_ms"])
    row["ratio"] = row["ort_ms"] / row["polydl_ms"]
    if tuned is not None:
        row["tuned_ms"] = statistics.median(row["tuned_samples_ms"])
        row["tuned_ratio"] = row["ort_ms"] / row["tuned_ms"]
        row["tuned_speedup"] = row["polydl_ms"] / row["tuned_ms"]
    return row


# --- report ---------------------------------------------------------------------------------

def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


HEADER = (f"{'model':17s} {'batch':>5s} {'polydl ms':>10s} {'ort ms':>10s} {'ratio':>6s} "
          f"{'rel err':>8s} {'compile s':>9s}  status")


TUNED_HEADER = f" {'tuned ms':>9s} {'ratio':>6s} {'speedup':>7s} {'from db':>7s}"


def format_row(row: dict[str, Any], tuned: bool = False) -> str:
    extra = ""
    if tuned:
        extra = (f" {fmt(row.get('tuned_ms'), '.2f'):>9s} {fmt(row.get('tuned_ratio')):>6s} "
                 f"{fmt(row.get('tuned_speedup')):>7s} {row.get('tuned_by', '-')!s:>7s}")
    return (f"{row['model']:17s} {row['batch']:5d} {fmt(row['polydl_ms'], '.2f'):>10s} "
            f"{fmt(row['ort_ms'], '.2f'):>10s} {fmt(row['ratio']):>6s}{extra} "
            f"{fmt(row['relative_error'], '.1e'):>8s} {fmt(row['compile_s'], '.1f'):>9s}  "
            f"{row['status']}")


def summary(rows: list[dict[str, Any]], batches: list[int]) -> dict[str, Any]:
    by_batch = {}
    for batch in batches:
        ok = [r for r in rows if r["batch"] == batch and r["status"] == "ok"]
        ratios = [r["ratio"] for r in ok]
        by_batch[str(batch)] = {"geomean_ratio": geomean(ratios), "models": len(ratios),
                                "min_ratio": min(ratios) if ratios else None}
        tuned = [r["tuned_ratio"] for r in ok if r.get("tuned_ratio")]
        if tuned:
            by_batch[str(batch)].update(tuned_geomean_ratio=geomean(tuned), tuned_min_ratio=min(tuned))
    return {"by_batch": by_batch,
            "failed": [f"{r['model']}@{r['batch']}" for r in rows if r["status"] != "ok"]}


def environment(args: argparse.Namespace, machine: Any, source: str,
                cpus: list[int] | None) -> dict[str, Any]:
    import numpy as np
    import onnxruntime

    import polydl

    onnx = onnx_package()
    env = {"machine": machine.describe(), "threads": args.threads, "pinned_cpus": cpus,
           "model_source": source, "polydl": polydl.__version__, "onnx": onnx.__version__,
           "onnxruntime": onnxruntime.__version__, "numpy": np.__version__}
    if source == "torchvision":
        import torch
        import torchvision

        env.update(torch=torch.__version__, torchvision=torchvision.__version__)
    return env


def run(args: argparse.Namespace) -> int:
    cpus = None if args.no_pin else pin(args.threads)
    from polydl.bench.harness import private_compile_cache
    from polydl.bench.load import CpuMeter
    from polydl.bench.report import NOISY_SHARE
    from polydl.target import host_target

    machine = host_target()
    source = "zoo"
    if args.torchvision:
        if torchvision_available():
            source = "torchvision"
        else:
            print("torchvision is not importable: using the zoo's models", file=sys.stderr)
    env = environment(args, machine, source, cpus)
    print(f"machine  {env['machine']}")
    print(f"threads  {args.threads} per side (pinned to CPUs {cpus}); models from {source}; "
          f"onnxruntime {env['onnxruntime']} (ORT_ENABLE_ALL, inter-op 1); {args.rounds} rounds")
    tuned = bool(args.tuned_db)
    header = HEADER.replace(f" {'rel err':>8s}", (TUNED_HEADER if tuned else "") + f" {'rel err':>8s}")
    print(header, flush=True)
    meter = CpuMeter()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="polydl-onnx-bench-") as workdir:
        for name in args.models:
            model = (torchvision_model(name, args.seed, args.threads, Path(workdir))
                     if source == "torchvision" else zoo_model(name, args.seed))
            for batch in args.batches:
                with private_compile_cache(not args.warm_cache):
                    row = bench_one(name, model, batch, args, machine)
                rows.append(row)
                print(format_row(row, tuned), flush=True)
    result = summary(rows, args.batches)
    for batch, values in result["by_batch"].items():
        print(f"batch {batch}: geometric mean ort/polydl {fmt(values['geomean_ratio'])} over "
              f"{values['models']} models (min {fmt(values['min_ratio'])})"
              + (f"; tuned {fmt(values['tuned_geomean_ratio'])} (min {fmt(values['tuned_min_ratio'])})"
                 if "tuned_geomean_ratio" in values else ""))
    share = meter.other_share()
    env["other_cpu_share"] = share
    if share is not None:
        print(f"other processes took {100 * share:.0f}% of the CPU time during the run"
              + ("; the cores were shared, expect noise" if share >= NOISY_SHARE else ""))
    if result["failed"]:
        print(f"failed: {', '.join(result['failed'])}")
    if not args.no_json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        settings = {"models": args.models, "batches": args.batches, "rounds": args.rounds,
                    "winograd": not args.no_winograd, "tuned_db": args.tuned_db,
                    "tolerance": TOLERANCE, "image_size": IMAGE_SIZE, "seed": args.seed,
                    "cold_cache": not args.warm_cache}
        path.write_text(json.dumps(
            {"benchmark": "onnx", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
             "environment": env, "settings": settings, "rows": rows, "summary": result},
            indent=2) + "\n")
        print(f"wrote {path}")
    return 1 if result["failed"] else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if needs_child(args.threads):
        env = {**os.environ, **thread_env(args.threads), CHILD_MARK: "1"}
        sys.stdout.flush()
        argv = sys.argv[1:] if argv is None else argv
        return subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv],
                              env=env).returncode
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
