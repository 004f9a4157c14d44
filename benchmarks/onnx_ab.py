#!/usr/bin/env python3
"""Two polydl trees on the same ONNX networks, in one process, interleaved with onnxruntime.

    python benchmarks/onnx_ab.py --base DIR [--models resnet18,resnet50,mobilenet_v2,resnext50_32x4d]
                                 [--batches 1,32] [--threads 2] [--rounds 7] [--work DIR] [--json FILE]

`--base` is another checkout of polydl (an earlier commit: `git worktree add DIR COMMIT`). Each
tree's own CLI builds every zoo model as an ahead-of-time library (`polydl compile model.onnx
--batch B -o DIR`); then one process loads both libraries and onnxruntime and runs rounds of
base, this tree, onnxruntime, each timed call right after an untimed one of the same side.
A shared machine's speed drifts between runs (a 2-core VM's Winograd layers took 16.6 or 36.6
ms depending on the minute, within one process): side by side in the same rounds, the ratio
of the two trees is what a change did. Outputs are checked against onnxruntime (1e-4 of the
largest magnitude). Threads: OMP_NUM_THREADS and onnxruntime's intra-op threads = `--threads`,
set before anything loads (the process re-runs itself with them).
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
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# benchmarks/onnx.py is a sibling: this folder must not shadow the onnx package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))
DEFAULT_MODELS = ("resnet18", "resnet50", "mobilenet_v2", "resnext50_32x4d")
SIDES = ("base", "this")


def _build(tree: Path, model: Path, batch: int, out: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "polydl.cli", "compile", str(model), "--batch", str(batch),
                    "--name", "net", "-o", str(out)], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def _library(folder: Path, batch: int, classes: int):  # noqa: ANN202 - a ctypes callable
    function = ctypes.CDLL(str(folder / "libnet.so")).net
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    out = np.zeros((batch, classes), np.float32)
    return function, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the other polydl checkout")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--work", type=Path, default=Path("/tmp/polydl-onnx-ab"))
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "onnx_ab.json"))
    args = parser.parse_args()
    if os.environ.get("OMP_NUM_THREADS") != str(args.threads):
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        sys.exit(subprocess.run([sys.executable, *sys.argv], env=env).returncode)

    import onnx
    import onnxruntime as ort

    from polydl.onnx import zoo

    trees = {"base": args.base.resolve(), "this": ROOT}
    rows = []
    print(f"threads {args.threads}; onnxruntime {ort.__version__}; {args.rounds} rounds; "
          f"base {trees['base']}")
    print(f"{'model':16s} {'batch':>5s} {'base ms':>9s} {'this ms':>9s} {'ort ms':>9s} "
          f"{'base/this':>9s} {'ort/this':>8s}")
    for name in args.models.split(","):
        path = args.work / f"{name}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        model = zoo.MODELS[name](batch=None)
        onnx.save(model, path)
        classes = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
        for batch in (int(b) for b in args.batches.split(",")):
            x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
            calls, outputs = {}, {}
            for side in SIDES:
                folder = args.work / side / f"{name}_{batch}"
                _build(trees[side], path, batch, folder)
                function, out = _library(folder, batch, classes)
                outputs[side] = out
                calls[side] = (lambda f=function, o=out, x=x: f(x.ctypes.data, o.ctypes.data))
            options = ort.SessionOptions()
            options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            feed = {session.get_inputs()[0].name: x}
            calls["ort"] = lambda s=session, feed=feed: s.run(None, feed)
            times: dict[str, list[float]] = {side: [] for side in calls}
            for _ in range(args.rounds):
                for side, call in calls.items():
                    call()
                    start = time.perf_counter()
                    status = call()
                    times[side].append(time.perf_counter() - start)
                    if side != "ort" and status != 0:
                        sys.exit(f"{name} batch {batch}: the {side} library returned {status}")
            want = session.run(None, feed)[0]
            errors = {side: float(np.abs(outputs[side] - want).max() / np.abs(want).max())
                      for side in SIDES}
            ms = {side: statistics.median(v) * 1e3 for side, v in times.items()}
            ok = all(e <= 1e-4 for e in errors.values())
            rows.append({"model": name, "batch": batch, "ms": ms, "samples": times,
                         "errors": errors, "ok": ok})
            print(f"{name:16s} {batch:5d} {ms['base']:9.2f} {ms['this']:9.2f} {ms['ort']:9.2f} "
                  f"{ms['base'] / ms['this']:9.2f} {ms['ort'] / ms['this']:8.2f}"
                  + ("" if ok else f"  FAILED {errors}"), flush=True)
    for batch in sorted({r["batch"] for r in rows}):
        chosen = [r["ms"] for r in rows if r["batch"] == batch]
        base, this = (math.exp(statistics.fmean(math.log(m["ort"] / m[key]) for m in chosen))
                      for key in SIDES)
        print(f"batch {batch}: geometric mean ort/base {base:.2f}, ort/this {this:.2f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
