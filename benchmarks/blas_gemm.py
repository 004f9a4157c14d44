#!/usr/bin/env python3
"""The BLAS-form GEMM (`C = alpha A B + beta C`, written in C) against the plain `C += A B`
of `examples/matmul.c`, both built by polydl for the same sizes and dtype: the cost of the
`C *= beta` sweep and the scaled copy of A around the same microkernel schedule.

    python benchmarks/blas_gemm.py [--rounds 3] [--calls 15] [--json FILE]

Each round times `--calls` calls of one kernel, then of the other (interleaved rounds); the
table gives the medians and the ratio of the BLAS form's time to matmul.c's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import polydl  # noqa: E402

# (dtype, BLAS-form source and its size names, (M, N, K))
CASES = (
    ("float64", "benchmarks/general/gemm.c", ("NI", "NJ", "NK"), (800, 900, 1000)),
    ("float32", "examples/gemm_blas.c", ("M", "N", "K"), (1024, 1024, 1024)),
    ("float32", "examples/gemm_blas.c", ("M", "N", "K"), (2048, 2048, 2048)),
)


def _matmul_source(dtype: str) -> Path:
    """examples/matmul.c in the case's element type."""
    text = (ROOT / "examples" / "matmul.c").read_text()
    if dtype == "float64":
        text = text.replace("float", "double")
    path = Path(tempfile.mkdtemp(prefix="polydl-blas-")) / "matmul.c"
    path.write_text(text)
    return path


def _median_ms(kernel, arrays: dict, calls: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        kernel(**arrays)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "blas_gemm.json"))
    opts = parser.parse_args()
    rng = np.random.default_rng(0)
    results = []
    print(f"{'dtype':8} {'M x N x K':>16} {'BLAS form ms':>13} {'matmul.c ms':>12} {'ratio':>6}")
    for dtype, source, names, (m, n, k) in CASES:
        blas = polydl.compile(ROOT / source, dict(zip(names, (m, n, k), strict=True)))
        plain = polydl.compile(_matmul_source(dtype), {"M": m, "N": n, "K": k})
        a = rng.random((m, k)).astype(dtype)
        b = rng.random((k, n)).astype(dtype)
        c = np.zeros((m, n), dtype)
        blas_ms, plain_ms = [], []
        for _ in range(opts.rounds):
            blas_ms.append(_median_ms(blas, {"C": c, "A": a, "B": b, "alpha": 1.5, "beta": 0.5},
                                      opts.calls))
            plain_ms.append(_median_ms(plain, {"C": c, "A": a, "B": b}, opts.calls))
        row = {"dtype": dtype, "M": m, "N": n, "K": k,
               "blas_ms": statistics.median(blas_ms), "matmul_ms": statistics.median(plain_ms)}
        row["ratio"] = row["blas_ms"] / row["matmul_ms"]
        results.append(row)
        print(f"{dtype:8} {f'{m}x{n}x{k}':>16} {row['blas_ms']:13.2f} {row['matmul_ms']:12.2f} "
              f"{row['ratio']:6.3f}")
    Path(opts.json).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.json).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {opts.json}")


if __name__ == "__main__":
    main()
