#!/usr/bin/env python3
"""PolyBench kernels at PolyBench 4.2's dataset sizes, polydl against `gcc -O3 -march=native
-fopenmp` of the same C, on 1 and on 2 threads.

    python benchmarks/polybench_sizes.py [--kernels lu,syrk] [--sizes mini,small,medium,large]
                                         [--threads 1,2] [--json FILE]

Each kernel and size runs in a child process that builds gcc's side once and polydl's for each
thread count (scheduled for that many cores), checks polydl's results against gcc's, then for
each thread count (set with `omp_set_num_threads`) times the
sides interleaved, round after round; the medians are compared. Both libraries are called
through ctypes (no Python argument checks on either side). A sample is K calls, each after the
outputs are restored from the pristine inputs (K sized so a sample takes a few milliseconds:
MINI and SMALL calls take microseconds); the restoring alone is timed the same way and taken
off. Prints every case with its ratio (gcc time / polydl time: above 1 polydl is faster), the
ratio distribution per size and thread count, and every case below 1.0x.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from polydl.bench.general_corpus import CORPUS  # noqa: E402

# PolyBench 4.2's official dataset sizes (polybench's <kernel>.h), as the corpus holds them
POLYBENCH_SIZES: dict[str, dict[str, dict[str, int]]] = {
    k.name: {d: dict(k.sizes(d)) for d in k.polybench} for k in CORPUS.values() if k.suite == "polybench"
}
SIZE_NAMES = ("mini", "small", "medium", "large")
GCC = ["gcc", "-O3", "-march=native", "-fopenmp"]
SAMPLE_SECONDS = 0.004  # a sample is at least this long (K calls of a short kernel)
TIME_BUDGET_SECONDS = 4.0  # rounds per thread count: as many as fit, 3 to 9


def child(name: str, size: str, threads: list[int]) -> dict[str, Any]:
    import numpy as np

    import polydl
    from polydl.bench.general import (
        constant_size_source,
        kernel_path,
        make_inputs,
        relative_error,
        tolerance,
    )
    from polydl.bench.general_signature import read_signature
    from polydl.frontends import load_spec

    sizes = POLYBENCH_SIZES[name][size]
    path = kernel_path(name)
    nest, params = load_spec(path, dict(sizes), target_kind="c")
    args = read_signature(path).arguments(params)
    from dataclasses import replace

    from polydl.api import target_of

    # polydl schedules for as many cores as the threads it runs on (a 1-thread run gets a
    # kernel without forks), as `polydl.bench` and benchmarks/general.py pin theirs
    kernels = {t: polydl.compile(path, params, target=replace(target_of("c"), cores=t))
               for t in threads}
    workdir = Path(tempfile.gettempdir()) / "polydl-polybench-sizes"
    workdir.mkdir(parents=True, exist_ok=True)
    src = workdir / f"{name}-{size}-{os.getpid()}.c"
    lib = src.with_suffix(".so")
    src.write_text("#include <math.h>\n" + constant_size_source(path.read_text(), nest.name, params))
    subprocess.run([*GCC, "-fPIC", "-shared", *[f"-D{k}={v}" for k, v in params.items()],
                    str(src), "-o", str(lib), "-lm"], check=True, capture_output=True, text=True)
    gcc_fn = getattr(ctypes.CDLL(str(lib)), nest.name)
    gcc_fn.restype = None
    polydl_fns = {}
    for t, kernel in kernels.items():
        polydl_fns[t] = getattr(ctypes.CDLL(str(kernel.library_path)), kernel.name)
        polydl_fns[t].restype = ctypes.c_int
    order = {"gcc": [a.name for a in args], "polydl": [a.name for a in kernel.arguments]}
    pristine = make_inputs(name, args, sizes)
    outputs = [a.name for a in args if not a.is_input]
    buffers = {side: {k: v.copy() for k, v in pristine.items()} for side in order}

    def bound(side: str, fn: Any) -> Any:
        values = buffers[side]
        cargs = [ctypes.c_void_p(values[n].ctypes.data) if values[n].shape
                 else (ctypes.c_float if values[n].dtype == np.float32 else ctypes.c_double)(
                     float(values[n])) for n in order[side]]

        def call() -> None:
            for n in outputs:
                np.copyto(values[n], pristine[n])
            fn(*cargs)

        return call

    def restore_only() -> None:
        for n in outputs:
            np.copyto(buffers["gcc"][n], pristine[n])

    dtype = np.dtype(next(a.dtype for a in args if not a.is_input))
    bound("gcc", gcc_fn)()
    error = 0.0
    for fn in polydl_fns.values():
        bound("polydl", fn)()
        error = max(error, *(relative_error(buffers["polydl"][n], buffers["gcc"][n]) for n in outputs))
    gomp = ctypes.CDLL("libgomp.so.1")
    result: dict[str, Any] = {"kernel": name, "size": size, "sizes": sizes,
                              "schedule": {str(t): k.schedule.describe() for t, k in kernels.items()},
                              "error": error, "correct": bool(error <= tolerance(dtype)), "ms": {}}
    for t in threads:
        gomp.omp_set_num_threads(t)
        calls = {"gcc": bound("gcc", gcc_fn), "polydl": bound("polydl", polydl_fns[t])}
        for call in calls.values():
            call()
        start = time.perf_counter()
        calls["gcc"]()
        once = max(time.perf_counter() - start, 1e-7)
        repeat = max(1, math.ceil(SAMPLE_SECONDS / once))
        rounds = int(min(9, max(3, TIME_BUDGET_SECONDS / (2 * once * repeat))))
        samples: dict[str, list[float]] = {"gcc": [], "polydl": [], "restore": []}
        for _ in range(rounds):
            for side, fn in (*calls.items(), ("restore", restore_only)):
                fn()  # untimed: the threads of the side before may still spin
                start = time.perf_counter()
                for _ in range(repeat):
                    fn()
                samples[side].append((time.perf_counter() - start) / repeat)
        restore = statistics.median(samples["restore"])
        result["ms"][str(t)] = {side: max(statistics.median(samples[side]) - restore, 1e-9) * 1e3
                                for side in ("gcc", "polydl")}
    return result


def run_child(name: str, size: str, threads: list[int]) -> dict[str, Any]:
    env = dict(os.environ, OMP_STACKSIZE="64M")
    env.pop("OMP_NUM_THREADS", None)
    command = (f"ulimit -s unlimited 2>/dev/null || ulimit -s 1048576; exec {sys.executable} "
               f"{Path(__file__).resolve()} --child {name}:{size} "
               f"--threads {','.join(map(str, threads))}")
    proc = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            data: dict[str, Any] = json.loads(line[len("RESULT "):])
            return data
    return {"kernel": name, "size": size, "error": math.inf, "correct": False, "ms": {},
            "status": "child failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1]}


def ratio(entry: dict[str, Any], threads: int) -> float | None:
    ms = entry["ms"].get(str(threads))
    return ms["gcc"] / ms["polydl"] if ms else None


def summary(results: list[dict[str, Any]], threads: list[int]) -> list[str]:
    lines = []
    for size in SIZE_NAMES:
        for t in threads:
            values = sorted(r for e in results if e["size"] == size
                            for r in [ratio(e, t)] if r is not None)
            if not values:
                continue
            q = (statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1
                 else values * 3)
            lines.append(f"{size:6s} {t} thread(s): {len(values)} kernels, min {values[0]:.2f}x "
                         f"q1 {q[0]:.2f}x median {q[1]:.2f}x q3 {q[2]:.2f}x max {values[-1]:.2f}x; "
                         f"{sum(v < 1.0 for v in values)} below 1.0x")
    slow = [(e["kernel"], e["size"], t, r) for e in results for t in threads
            for r in [ratio(e, t)] if r is not None and r < 1.0]
    lines.append("below 1.0x: " + (", ".join(f"{k} {s} {t}T {r:.2f}x" for k, s, t, r in slow)
                                   or "none"))
    wrong = [f"{e['kernel']} {e['size']}" for e in results if not e["correct"]]
    if wrong:
        lines.append("wrong or failed: " + ", ".join(wrong))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kernels", default=",".join(POLYBENCH_SIZES))
    parser.add_argument("--sizes", default=",".join(SIZE_NAMES))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    if args.child:
        name, size = args.child.split(":")
        print("RESULT " + json.dumps(child(name, size, threads)), flush=True)
        return 0
    names = [k for k in args.kernels.split(",") if k]
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [k for k in names if k not in POLYBENCH_SIZES] + [s for s in sizes if s not in SIZE_NAMES]
    if unknown:
        parser.error(f"unknown kernels or sizes {unknown}")
    results = []
    for size in sizes:
        for name in names:
            entry = run_child(name, size, threads)
            results.append(entry)
            cells = " ".join(
                f"{t}T {entry['ms'][str(t)]['polydl']:9.3f}/{entry['ms'][str(t)]['gcc']:9.3f} ms "
                f"{ratio(entry, t):5.2f}x" for t in threads if str(t) in entry["ms"])
            status = entry.get("status", "ok" if entry["correct"] else
                               f"WRONG (error {entry['error']:.1e})")
            print(f"{name:15s} {size:6s} {cells}  {status}", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
    for line in summary(results, threads):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
