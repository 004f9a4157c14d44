"""A transpose (each array at unit stride along a different loop) is ranked with square tiles
of those two loops innermost, whatever their extents."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import polydl
from polydl.target import CpuTarget

ROOT = Path(__file__).resolve().parents[3]
TARGET = CpuTarget(name="server", isa="avx2", cores=2)

NCHW_TO_NHWC = (ROOT / "benchmarks" / "general" / "nchw_to_nhwc.c").read_text()


def test_a_layout_change_is_tiled_by_cache_lines_of_both_arrays() -> None:
    """No loop here is longer than 64 (the plain tiles' threshold): before, only the written
    order was ranked, writing one element per line of y (2x slower on a 2-core Xeon)."""
    kernel = polydl.compile(NCHW_TO_NHWC, {"N": 2, "C": 48, "H": 5, "W": 40}, target=TARGET)
    schedule = kernel.schedule.describe()
    # y streams along c: innermost, each vector store a whole run of y
    assert schedule.startswith("order n > h > w.t > c.t > w > c; tiles c=16, w=16"), schedule
    x = np.random.default_rng(0).random((2, 48, 5, 40), dtype=np.float32)
    np.testing.assert_array_equal(kernel(x), x.transpose(0, 2, 3, 1))


def test_a_copy_that_streams_is_not_tiled_as_a_transpose() -> None:
    copy = NCHW_TO_NHWC.replace("y[n][h][w][c]", "y[n][c][h][w]").replace(
        "float y[N][H][W][C]", "float y[N][C][H][W]")
    kernel = polydl.compile(copy, {"N": 2, "C": 48, "H": 5, "W": 40}, target=TARGET)
    assert "tiles" not in kernel.schedule.describe()
    x = np.random.default_rng(1).random((2, 48, 5, 40), dtype=np.float32)
    np.testing.assert_array_equal(kernel(x), x)
