"""Times polydl's tensor-core GEMM at several block tiles (the candidates the GPU schedule
chooses among), to check the schedule's choice on the device:

    python benchmarks/gpu_tiles.py [M N K]

Prints each tile's median time (CUDA events, random bf16 inputs) next to torch.matmul's.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polydl.codegen.gpu.generate import generate_gpu  # noqa: E402
from polydl.frontends import builders  # noqa: E402
from polydl.poly.model import build_model  # noqa: E402
from polydl.runtime.gpu.kernel import GpuKernel  # noqa: E402
from polydl.runtime.gpu.toolchain import compile_gpu_library  # noqa: E402
from polydl.schedules.gpu.planning import gpu_schedule  # noqa: E402
from polydl.schedules.gpu.plans import GpuSchedule  # noqa: E402
from polydl.schedules.gpu.variants import MmaTiling  # noqa: E402
from polydl.target.gpu import DEFAULT_GPUS  # noqa: E402

VARIANTS = [  # (BM, BN, BK, warps_m, warps_n, stages)
    (128, 256, 32, 2, 4, 3), (128, 256, 64, 2, 4, 3), (128, 256, 64, 2, 4, 4),
    (256, 128, 64, 4, 2, 3), (128, 128, 64, 2, 2, 4), (128, 128, 32, 2, 4, 4),
    (128, 128, 64, 2, 4, 3),
]


def main() -> int:
    import torch

    m, n, k = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (4096, 4096, 4096)
    nest, params = builders.matmul(m, n, k)
    nest = replace(nest, arrays=tuple(replace(a, dtype="bfloat16") if a.name in "AB" else a for a in nest.arrays))
    model = build_model(nest, params)
    base = gpu_schedule(model, DEFAULT_GPUS["cuda"])
    print("schedule's choice:", base.describe(), flush=True)
    work = Path(tempfile.mkdtemp())

    def build(v: tuple[int, ...]) -> tuple[tuple[int, ...], GpuKernel]:
        bm, bn, bk, wm, wn, stages = v
        plan = base.kernels[0]
        tiling = MmaTiling(bm, bn, bk, warps_m=wm, warps_n=wn, stages=stages)
        sched = GpuSchedule(base.target, (replace(plan, gemm=replace(plan.gemm, tiling=tiling)),))
        code = generate_gpu(model, sched)
        lib = compile_gpu_library(code, work / "_".join(map(str, v)))
        return v, GpuKernel(code, nest, params, sched, model.flops, lambda arrays: None, lib)

    with ThreadPoolExecutor(8) as pool:
        kernels = list(pool.map(build, VARIANTS))
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(k, n, device="cuda").bfloat16()
    c = torch.zeros(m, n, device="cuda")
    want = a.double() @ b.double()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def median_ms(fn, reps: int = 20) -> float:  # type: ignore[no-untyped-def]
        fn()
        torch.cuda.synchronize()
        out = []
        for _ in range(reps):
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        return statistics.median(out)

    ref = median_ms(lambda: a @ b)
    flops = 2 * m * n * k
    print(f"torch.matmul bf16: {ref:.3f} ms {flops / ref / 1e9:.0f} TF/s")
    for v, kern in kernels:
        c.zero_()
        kern(a, b, C=c)
        err = (torch.linalg.norm(c.double() - want) / torch.linalg.norm(want)).item()
        t = median_ms(lambda kern=kern: kern(a, b, C=c))
        print(f"tile {v}: {t:.3f} ms {flops / t / 1e9:.0f} TF/s ratio {ref / t:.2f} err {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
