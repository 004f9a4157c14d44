"""The machine's peak fp32 speed, measured in the same run as the cases by an FMA loop."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import cffi
import numpy as np

from polydl.runtime.c.toolchain import compile_library, current_toolchain
from polydl.runtime.loading import load_for_life

# Independent accumulators per thread: enough to cover FMA latency x FMA pipes (4 x 2 on current
# x86 cores) with room to spare, and few enough to stay in registers (16 ymm, 32 zmm).
_PEAK_ISA = {
    "avx512": ("__m512", "_mm512_set1_ps", "_mm512_fmadd_ps", 16, 24, ("-mavx512f",)),
    "avx2": ("__m256", "_mm256_set1_ps", "_mm256_fmadd_ps", 8, 12, ("-mavx2", "-mfma")),
}


def peak_source(isa: str) -> tuple[str, int, int, tuple[str, ...]]:
    """C source of an FMA-throughput loop for `isa`: (source, lanes, accumulators, flags)."""
    key = "avx512" if isa.startswith("avx512") else isa
    if key in _PEAK_ISA:
        vec, set1, fma, lanes, accs, flags = _PEAK_ISA[key]
        step = "\n".join(f"      acc{i} = {fma}(acc{i}, a, b);" for i in range(accs))
        add = "_mm256_add_ps" if key == "avx2" else "_mm512_add_ps"
        store = "_mm256_storeu_ps" if key == "avx2" else "_mm512_storeu_ps"
        header = "#include <immintrin.h>"
        reduce = (
            f"{vec} total = acc0;\n"
            + "".join(f"    total = {add}(total, acc{i});\n" for i in range(1, accs))
            + f"    float lanes_out[{lanes}];\n    {store}(lanes_out, total);\n"
            + f"    float s = 0.f;\n    for (int l = 0; l < {lanes}; l++) s += lanes_out[l];"
        )
    else:  # scalar: plain floats, contracted to FMA where the ISA has it
        vec, set1, lanes, accs, flags = "float", "", 1, 12, ()
        step = "\n".join(f"      acc{i} = acc{i} * a + b;" for i in range(accs))
        header = ""
        reduce = "float s = " + " + ".join(f"acc{i}" for i in range(accs)) + ";"
    init = "\n".join(f"    {vec} acc{i} = {set1}({1.0 + i / 64:.6f}f);" for i in range(accs))
    source = f"""{header}
#include <omp.h>

int fma_threads(void) {{
  int threads = 1;
  #pragma omp parallel
  {{
    #pragma omp single
    threads = omp_get_num_threads();
  }}
  return threads;
}}

/* acc = acc * a + b with a < 1 converges: no overflow, no denormals. */
void fma_loop(long iterations, float *sink) {{
  #pragma omp parallel
  {{
    const {vec} a = {set1}(0.999999f), b = {set1}(1e-6f);
{init}
    for (long i = 0; i < iterations; i++) {{
{step}
    }}
    {reduce}
    sink[omp_get_thread_num() * 16] = s;
  }}
}}
"""
    return source, lanes, accs, flags


class FmaPeak:
    """The machine's peak fp32 GFLOP/s, measured by an FMA loop on every OpenMP thread."""

    def __init__(self, isa: str) -> None:
        source, self.lanes, self.accumulators, flags = peak_source(isa)
        self.isa = isa
        self._dir = tempfile.TemporaryDirectory(prefix="polydl-peak-")
        path = Path(self._dir.name)
        (path / "fma_peak.c").write_text(source)
        compile_library(current_toolchain(), path / "fma_peak.c", path / "libfma_peak.so", flags)
        self._ffi = cffi.FFI()
        self._ffi.cdef("int fma_threads(void); void fma_loop(long iterations, float *sink);")
        self._lib = load_for_life(self._ffi, path / "libfma_peak.so")
        self.threads = int(self._lib.fma_threads())
        self._sink = np.zeros(self.threads * 16 + 16, dtype=np.float32)
        self._iterations = self._calibrate()

    def _run(self, iterations: int) -> float:
        pointer = self._ffi.cast("float *", self._sink.ctypes.data)
        t0 = time.perf_counter()
        self._lib.fma_loop(iterations, pointer)
        return time.perf_counter() - t0

    def _calibrate(self, target_s: float = 0.1) -> int:
        iterations = 1 << 16
        while True:
            seconds = self._run(iterations)
            if seconds > target_s / 4 or iterations > 1 << 34:
                return max(int(iterations * target_s / max(seconds, 1e-9)), 1)
            iterations *= 4

    def measure(self, samples: int = 5) -> list[float]:
        """`samples` GFLOP/s readings of about 0.1 s each."""
        flops = 2.0 * self.threads * self._iterations * self.accumulators * self.lanes
        return [flops / self._run(self._iterations) / 1e9 for _ in range(samples)]

    def close(self) -> None:
        self._dir.cleanup()
