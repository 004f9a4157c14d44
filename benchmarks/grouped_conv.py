#!/usr/bin/env python3
"""Depthwise and grouped 3x3 convolutions built by polydl (layouts nchw and nchw16c) against
PyTorch's `torch.nn.functional.conv2d` on the same NCHW data, with the same thread count.

    OMP_NUM_THREADS=2 python benchmarks/grouped_conv.py [--threads 2] [--calls 20] [--json FILE]

The calls alternate: one untimed call of a side right before each timed one (so the other
OpenMP runtime's spinning threads are gone and this side's are awake), the table gives the
medians and the ratio of polydl's time to PyTorch's (below 1: polydl is faster). Every
kernel's result is checked against PyTorch's first.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import polydl  # noqa: E402
from polydl import layouts  # noqa: E402

# name, (N, C, K, H, W, R, S, stride, padding, groups)
CASES = (
    ("dw 96 112x112 s1", (1, 96, 96, 112, 112, 3, 3, 1, 1, 96)),
    ("dw 96 112x112 s2", (1, 96, 96, 112, 112, 3, 3, 2, 1, 96)),
    ("dw N=32 144 56x56 s1", (32, 144, 144, 56, 56, 3, 3, 1, 1, 144)),
    ("g32 128 28x28 s1", (1, 128, 128, 28, 28, 3, 3, 1, 1, 32)),
)
LAYOUTS = ("nchw16c", "nchw")


def _timed(call: Callable[[], object], calls: int, other: Callable[[], object]) -> list[float]:
    times = []
    for _ in range(calls):
        other()
        call()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--case", action="append", help="run only cases whose name has this")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    rows = []
    for name, (n, c, k, h, w, r, s, stride, padding, groups) in CASES:
        if args.case and not any(part in name for part in args.case):
            continue
        rng = np.random.default_rng(0)
        x = rng.uniform(-1, 1, (n, c, h, w)).astype(np.float32)
        wt = rng.uniform(-1, 1, (k, c // groups, r, s)).astype(np.float32)
        tx, tw = torch.from_numpy(x), torch.from_numpy(wt)
        want = torch.nn.functional.conv2d(tx, tw, stride=stride, padding=padding, groups=groups)

        torch_call = functools.partial(torch.nn.functional.conv2d, tx, tw, stride=stride,
                                       padding=padding, groups=groups)

        for layout in LAYOUTS:
            kernel = polydl.conv2d(N=n, C=c, K=k, H=h, W=w, R=r, S=s, stride=stride,
                                   padding=padding, layout=layout, groups=groups)
            blocked = layout == "nchw16c"
            inputs = ([layouts.to_nchw16c(x), layouts.to_conv_weights(wt, groups)] if blocked
                      else [x, wt])
            got = np.asarray(kernel(*inputs))
            got = layouts.from_nchw16c(got, k) if blocked else got
            err = float(np.abs(got - want.numpy()).max())
            assert err < 1e-3, f"{name} {layout}: differs from PyTorch by {err:.2e}"
            polydl_call = functools.partial(kernel, *inputs)
            mine, theirs = [], []
            for _ in range(args.calls):  # interleaved: one of each per round
                mine += _timed(polydl_call, 1, torch_call)
                theirs += _timed(torch_call, 1, polydl_call)
            row = {
                "case": name, "layout": layout, "polydl_ms": statistics.median(mine) * 1e3,
                "torch_ms": statistics.median(theirs) * 1e3,
                "schedule": kernel.schedule.describe(),
            }
            row["ratio"] = row["polydl_ms"] / row["torch_ms"]
            rows.append(row)
            print(f"{name:24} {layout:8} polydl {row['polydl_ms']:8.3f} ms  torch "
                  f"{row['torch_ms']:8.3f} ms  ratio {row['ratio']:5.2f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
