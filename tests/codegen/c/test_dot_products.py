"""A sum along an innermost loop into one cell (a dot product) runs in vectors also where it
sits in a triangular loop of a parallel region: gcc's loop splitting turned that `omp simd
reduction` back into scalar code (`toolchain.GCC_CFLAGS`), and syrk ran at 0.4x gcc."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest

import polydl
from polydl.api import target_of
from polydl.runtime.c.toolchain import current_toolchain, is_gcc

SYRK = """void syrk(int N, int M, double C[N][N], const double A[N][M]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j <= i; j++)
      for (int k = 0; k < M; k++)
        C[i][j] += A[i][k] * A[j][k];
}
"""


@pytest.mark.skipif(shutil.which("objdump") is None or not is_gcc(current_toolchain().compiler),
                    reason="needs objdump and gcc")
def test_a_triangular_dot_product_in_a_parallel_loop_runs_in_vectors() -> None:
    target = replace(target_of("c"), cores=4)
    k = polydl.compile(SYRK, {"N": 96, "M": 80}, target=target)
    assert "#pragma omp simd reduction" in k.source and "omp parallel for" in k.source
    assembly = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(k.library_path)],
                              capture_output=True, text=True, check=True).stdout
    # its only multiply-adds: packed ones (gcc's scalar form is vfmadd231sd)
    assert re.search(r"vfmadd\d+pd", assembly), "the dot product runs one element at a time"
    rng = np.random.default_rng(0)
    a, c = rng.random((96, 80)), rng.random((96, 96))
    want = c + np.tril(a @ a.T)
    k(C=c, A=a)
    np.testing.assert_allclose(np.tril(c), np.tril(want), rtol=1e-12)
