#!/usr/bin/env python3
"""One GEMM built for every CPU preset on this machine: what each library contains and how fast
the ones this CPU can run are. Threads as `polydl bench` sets them (one per core unless
OMP_NUM_THREADS says otherwise; OpenBLAS's idle workers sleep at once).

    python benchmarks/targets.py [--size 1024] [--rounds 7] [--json FILE]

For each target (the presets and `native`): the instruction set its disassembly shows (ymm/zmm
registers, AMX `tdpbf16ps` for the bf16 GEMM), then, where this CPU can run it, fp32 GFLOP/s
timed interleaved with numpy's matmul (the same inputs, one call of each per round; medians of
the rounds) and the ratio polydl/numpy. Every result is checked against a float64 product.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import polydl  # noqa: E402
from polydl.bench.threads import thread_environment, threads_prepared  # noqa: E402
from polydl.target import CPU_PRESETS, host_target  # noqa: E402
from polydl.target.host import cannot_run_here  # noqa: E402


def instructions(library: Path) -> dict[str, int]:
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)],
                          capture_output=True, text=True, check=True).stdout
    return {"ymm": text.count("ymm"), "zmm": text.count("zmm"), "tdpbf16ps": text.count("tdpbf16ps")}


def timed(fn, rounds: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "targets.json"))
    args = p.parse_args(argv)
    if not threads_prepared():  # numpy's BLAS reads its thread settings when it loads
        env = {**os.environ, **thread_environment(host_target().cores)}
        return subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode
    n = args.size
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    import ml_dtypes

    a16, b16 = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    expected16 = a16.astype(np.float64) @ b16.astype(np.float64)
    native = host_target()
    print(f"this machine: {native.describe()}")
    rows = []
    for name, target in [("native", native), *CPU_PRESETS.items()]:
        fp32 = polydl.matmul(M=n, N=n, K=n, machine=target)
        bf16 = polydl.matmul(M=n, N=n, K=n, dtype="bfloat16", machine=target)
        row: dict[str, object] = {
            "target": name, "isa": target.isa, "march": target.effective_march or "-",
            "fp32": instructions(fp32.library_path), "bf16": instructions(bf16.library_path),
            "schedule": fp32.schedule.describe(),
        }
        reason = cannot_run_here(target)
        if reason:
            row["runs_here"] = False
        else:
            out = fp32(a, b)
            err = float(np.max(np.abs(out - expected)) / np.max(np.abs(expected)))
            err16 = float(np.max(np.abs(bf16(a16, b16) - expected16)) / np.max(np.abs(expected16)))
            ours, ref = [], []
            c, c_numpy = np.zeros((n, n), np.float32), np.zeros((n, n), np.float32)
            fp32(a, b, C=c)
            for _ in range(args.rounds):  # interleaved: one of each per round, outputs reused
                ours += timed(lambda: fp32(a, b, C=c), 1)  # noqa: B023
                ref += timed(lambda: np.matmul(a, b, out=c_numpy), 1)  # noqa: B023
            flops = 2 * n**3
            row.update(runs_here=True, rel_error=err, bf16_rel_error=err16,
                       gflops=flops / statistics.median(ours) / 1e9,
                       numpy_gflops=flops / statistics.median(ref) / 1e9)
            row["ratio"] = row["gflops"] / row["numpy_gflops"]  # type: ignore[operator]
        rows.append(row)
    print(f"\nGEMM {n}^3: instructions in each library (fp32 / bf16) and fp32 speed, "
          f"median of {args.rounds} rounds interleaved with numpy")
    print(f"{'target':16s} {'isa':11s} {'-march':15s} {'zmm fp32':>9s} {'zmm bf16':>9s} "
          f"{'tdpbf16ps':>9s} {'GFLOP/s':>8s} {'numpy':>8s} {'ratio':>6s}  error")
    for r in rows:
        speed = (f"{r['gflops']:8.1f} {r['numpy_gflops']:8.1f} {r['ratio']:6.2f}  "
                 f"{r['rel_error']:.1e}/{r['bf16_rel_error']:.1e}" if r["runs_here"]
                 else f"{'cannot run here':>25s}")
        print(f"{r['target']:16s} {r['isa']:11s} {r['march']:15s} {r['fp32']['zmm']:9d} "  # type: ignore[index]
              f"{r['bf16']['zmm']:9d} {r['bf16']['tdpbf16ps']:9d} {speed}")  # type: ignore[index]
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": native.to_dict(), "size": n, "rows": rows}, indent=1))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
