"""GPU benchmark: polydl's CUDA kernels against PyTorch (cuBLAS/cuDNN), same run, same device.

    python benchmarks/gpu.py [--json FILE] [--quick] [--repeat N] [--set NAME] [--only CASE]

Case sets (`--set`, repeatable; default all):
- gemm: GEMMs and batched GEMMs. "_bf16" takes bf16 inputs and accumulates into an fp32 C
  (C += A B), against the faster of PyTorch's bf16 matmul (a bf16 C written, none read: less
  memory moved) and `addmm`/`baddbmm` with `out_dtype=float32` (the same work, PyTorch 2.8 and
  later; its time is in the JSON as `same_work_torch_ms`); "_bf16out" is C = A B with a bf16 C
  (the starting value fused into the kernel), PyTorch's bf16 matmul exactly; 4096^3 and 8192^3
  among them.
- conv2, conv32: the ResNet-50 convolutions (polydl/bench/suites/resnet50_conv.json), fp32,
  NCHW, at N=2 and N=32.
- conv32_bf16: the same at N=32 with bf16 activations, weights and outputs.
- fused32: conv + bias + ReLU at N=32, fp32, one polydl kernel against cuDNN's convolution
  followed by PyTorch's bias add and ReLU.
- nhwc32_bf16, fused32_nhwc_bf16: the bf16 convolutions (and conv + bias + ReLU) at N=32 in
  channels-last layout, against cuDNN on channels-last tensors (its tensor-core layout).
- nhwc32_tf32: fp32 channels-last convolutions at N=32 built for a target with
  `allow_tf32=True`, against cuDNN with TF32 allowed (the one set where PyTorch runs TF32).
polydl's convolutions are built with `accumulate=False` (y = conv, as cuDNN's beta = 0: the
zero start is fused into the kernel, which never reads y). Every case is first checked against a
float64 reference (PyTorch on the GPU) with fresh random inputs and a NaN-filled output (zeroed
where the kernel adds into it); then polydl and the reference library are timed with CUDA events
around each call, interleaved, and the medians compared. PyTorch's fp32 convolutions and
matmuls run with TF32 off (the same arithmetic as polydl's FMA kernels). "peak %" is the case's
polydl TFLOP/s against the device's measured peak for its input type (TF32 for the TF32 set):
PyTorch's 8192^3 matmul in this run. Prints a table and writes JSON (default benchmarks/results/gpu.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polydl.api import build_kernel  # noqa: E402
from polydl.bench.cases import SUITES_DIR  # noqa: E402
from polydl.frontends import builders  # noqa: E402
from polydl.frontends.c_loopnest import read_c  # noqa: E402
from polydl.ir import LoopNest  # noqa: E402
from polydl.target.gpu import device_for  # noqa: E402

TF32 = device_for("cuda", allow_tf32=True)

BATCHED = (Path(__file__).resolve().parents[1] / "examples" / "batched_matmul.c").read_text()
# C = A B with the starting value written by the nest (fused into the GEMM kernel's store)
GEMM_SET = """
void gemm_set(int M, int N, int K, float C[M][N], const float A[M][K], const float B[K][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      C[i][j] = 0.0f;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
}
"""
SETS = ("gemm", "conv2", "conv32", "conv32_bf16", "fused32", "nhwc32_bf16", "fused32_nhwc_bf16", "nhwc32_tf32")
QUICK_LAYERS = ("conv1", "res2_3x3", "res3_1x1a_s2", "res4_1x1b")


def retype(nest: LoopNest, dtypes: dict[str, str]) -> LoopNest:
    """The nest with some arrays' element types changed (bfloat16 inputs, float32 output)."""
    return replace(nest, arrays=tuple(replace(a, dtype=dtypes.get(a.name, a.dtype)) for a in nest.arrays))


def gemm_case(m: int, n: int, k: int, dtype: str, bf16_out: bool = False) -> dict[str, Any]:
    if bf16_out:  # C = A B: the output is overwritten
        nest = retype(read_c(GEMM_SET, "<gemm_set>").nest, {"A": "bfloat16", "B": "bfloat16", "C": "bfloat16"})
        params = {"M": m, "N": n, "K": k}
    else:
        nest, params = builders.matmul(m, n, k)
        if dtype == "bfloat16":
            nest = retype(nest, {"A": "bfloat16", "B": "bfloat16"})
    tag = "bf16out" if bf16_out else ("bf16" if dtype == "bfloat16" else "fp32")
    return {"name": f"gemm_{m}x{n}x{k}_{tag}", "kind": "gemm", "set": "gemm", "nest": nest, "params": params,
            "overwrites": bf16_out, "dtype": dtype, "out_dtype": "bfloat16" if bf16_out else "float32",
            "flops": 2 * m * n * k}


def bmm_case(b: int, m: int, n: int, k: int, dtype: str) -> dict[str, Any]:
    nest = read_c(BATCHED, "<bmm>").nest
    if dtype == "bfloat16":
        nest = retype(nest, {"X": "bfloat16", "Y": "bfloat16"})
    return {"name": f"bmm_{b}x{m}x{n}x{k}_{'bf16' if dtype == 'bfloat16' else 'fp32'}", "kind": "bmm",
            "set": "gemm", "nest": nest, "params": {"B": b, "M": m, "N": n, "K": k}, "dtype": dtype,
            "out_dtype": "float32", "flops": 2 * b * m * n * k}


def conv_cases(batch: int, set_name: str, dtype: str = "float32", fuse: tuple[str, ...] = (),
               layout: str = "nchw", tf32: bool = False) -> list[dict[str, Any]]:
    suite = json.loads((SUITES_DIR / "resnet50_conv.json").read_text())
    tag = ("fused" if fuse else "conv") + ("_bf16" if dtype == "bfloat16" else "") + (
        "_nhwc" if layout == "nhwc" else "") + ("_tf32" if tf32 else "")
    kind = "fused" if fuse else "conv"
    out = []
    for layer in suite["layers"]:
        sizes = {k: layer[k] for k in ("C", "K", "H", "W", "R", "S", "stride", "padding")}
        # bf16 convolutions write bf16, as cuDNN's do
        nest, params = builders.conv2d(N=batch, **sizes, dtype=dtype, fuse=fuse, layout=layout,
                                       accumulate=False, out_dtype=dtype)
        p = (layer["H"] + 2 * layer["padding"] - layer["R"]) // layer["stride"] + 1
        q = (layer["W"] + 2 * layer["padding"] - layer["S"]) // layer["stride"] + 1
        name = layer["name"] if (batch, tag) == (2, "conv") else f"{layer['name']}_n{batch}_{tag}"
        out.append({"name": name, "layer_name": layer["name"], "kind": kind, "nest": nest, "params": params,
                    "set": set_name, "layout": layout, "overwrites": True, "tf32": tf32,
                    "dtype": dtype, "out_dtype": dtype, "layer": {**sizes, "N": batch},
                    "flops": 2 * batch * layer["K"] * p * q * layer["C"] * layer["R"] * layer["S"]})
    return out


def inputs_for(case: dict[str, Any], torch: Any) -> list[Any]:
    """The kernel's inputs in argument order, on the GPU."""
    p = case["params"]
    tdt = torch.bfloat16 if case["dtype"] == "bfloat16" else torch.float32
    if case["kind"] == "gemm":
        shapes = [(p["M"], p["K"]), (p["K"], p["N"])]
    elif case["kind"] == "bmm":
        shapes = [(p["B"], p["M"], p["K"]), (p["B"], p["K"], p["N"])]
    else:
        lay = case["layer"]
        shapes = [(lay["N"], lay["C"], lay["H"], lay["W"]), (lay["K"], lay["C"], lay["R"], lay["S"])]
    args = [torch.randn(s, device="cuda", dtype=torch.float32).to(tdt) for s in shapes]
    if case.get("layout") == "nhwc":  # channels-last memory, NCHW shapes (PyTorch's convention)
        args = [a.contiguous(memory_format=torch.channels_last) for a in args]
    if case["kind"] == "fused":  # the bias has the output's type
        args.append(torch.randn(case["layer"]["K"], device="cuda", dtype=torch.float32).to(tdt))
    return args


def torch_op(case: dict[str, Any], torch: Any, args: list[Any], c: Any = None) -> Any:
    """PyTorch's computation of the case on `args` (in their dtype): the timed reference. With
    `c` (a bf16 GEMM adding into a float32 C): C + A B in float32, as polydl's kernel computes
    (cuBLAS reading and writing the float32 C, not writing a bf16 product)."""
    F = torch.nn.functional
    if case["kind"] in ("gemm", "bmm"):
        if c is not None:
            add = torch.addmm if case["kind"] == "gemm" else torch.baddbmm
            return add(c, args[0], args[1], out_dtype=torch.float32)
        return torch.matmul(args[0], args[1])
    lay = case["layer"]
    y = F.conv2d(args[0], args[1], stride=lay["stride"], padding=lay["padding"])
    if case["kind"] == "fused":  # cuDNN's convolution, then PyTorch's bias add and ReLU
        return torch.relu_(y.add_(args[2].view(1, -1, 1, 1)))
    return y


def kernel_view(case: dict[str, Any], value: Any) -> Any:
    """A PyTorch tensor as polydl's kernel takes or gives it: channels-last tensors as their
    N, H, W, C arrays (the same memory)."""
    if case.get("layout") == "nhwc" and value.dim() == 4:
        return value.permute(0, 2, 3, 1)
    return value


def time_cuda(torch: Any, fn: Any, repeat: int) -> list[float]:
    fn()
    torch.cuda.synchronize()
    # calibrate the inner count so one sample takes ~20 ms
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    inner = max(1, min(200, int(20.0 / once)))
    samples = []
    for _ in range(repeat):
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / inner / 1e3)
    return samples


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def time_graph(torch: Any, fn: Any, repeat: int) -> list[float] | None:
    """Kernel time without the host: `inner` calls captured in one CUDA graph, replayed."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        inner = 20
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(inner):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(repeat):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / inner / 1e3)
        return samples
    except Exception as exc:  # capture is best effort: report eager numbers only
        print(f"  (graph capture failed: {type(exc).__name__}: {exc})", flush=True)
        torch.cuda.synchronize()
        return None


def all_cases() -> list[dict[str, Any]]:
    return [
        gemm_case(4096, 4096, 4096, "bfloat16"),
        gemm_case(4096, 4096, 4096, "bfloat16", bf16_out=True),
        gemm_case(8192, 8192, 8192, "bfloat16", bf16_out=True),
        gemm_case(4096, 4096, 4096, "float32"),
        gemm_case(1024, 1024, 1024, "bfloat16", bf16_out=True),
        gemm_case(1024, 1024, 1024, "float32"),
        gemm_case(1000, 2048, 513, "float32"),
        gemm_case(1000, 2048, 520, "bfloat16"),
        bmm_case(16, 512, 512, 512, "float32"),
        bmm_case(16, 512, 512, 512, "bfloat16"),
        *conv_cases(2, "conv2"),
        *conv_cases(32, "conv32"),
        *conv_cases(32, "conv32_bf16", dtype="bfloat16"),
        *conv_cases(32, "fused32", fuse=("bias", "relu")),
        *conv_cases(32, "nhwc32_bf16", dtype="bfloat16", layout="nhwc"),
        *conv_cases(32, "fused32_nhwc_bf16", dtype="bfloat16", fuse=("bias", "relu"), layout="nhwc"),
        *conv_cases(32, "nhwc32_tf32", layout="nhwc", tf32=True),
    ]


def measured_peaks(torch: Any, repeat: int) -> dict[str, float]:
    """TFLOP/s of PyTorch's 8192^3 matmul per input type (float32 with and without TF32): the
    device's reachable peak."""
    peaks = {}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32), ("tf32", torch.float32)):
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        a, b = (torch.randn(8192, 8192, device="cuda").to(dtype) for _ in range(2))
        t = statistics.median(time_cuda(torch, lambda a=a, b=b: torch.matmul(a, b), max(3, repeat // 3)))
        peaks[name] = 2 * 8192**3 / t / 1e12
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.empty_cache()
    return peaks


def run_case(case: dict[str, Any], kernel: Any, torch: Any, repeat: int, peaks: dict[str, float]) -> dict[str, Any]:
    args_dev = inputs_for(case, torch)
    ref = kernel_view(case, torch_op(case, torch, [x.double() for x in args_dev]))
    ref_shape = ref.shape
    args_ours = [kernel_view(case, x) for x in args_dev]
    out_dtype = torch.bfloat16 if case["out_dtype"] == "bfloat16" else torch.float32
    # a kernel that overwrites its output gets NaN there (a cell it skips shows); one that adds
    # into it (C += A B) gets zeros
    fill = float("nan") if case.get("overwrites") else 0.0
    out = torch.full(ref.shape, fill, device="cuda", dtype=out_dtype)
    kernel(*args_ours, **{kernel.outputs[0].name: out})
    torch.cuda.synchronize()
    err = (torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref)).item()
    tol = 1e-2 if "bfloat16" in (case["dtype"], case["out_dtype"]) or case.get("tf32") else 1e-5
    ok = bool(math.isfinite(err) and err < tol)
    del ref

    # bf16 operands added into a float32 C: PyTorch's bf16 product (writing bf16, reading no C:
    # less memory moved than polydl's kernel) and, where this PyTorch has `out_dtype` (2.8 and
    # later), the same work (C + A B in float32); the ratio takes the faster of the two
    c_ref = None
    if case["kind"] in ("gemm", "bmm") and case["dtype"] == "bfloat16" and not case.get("overwrites"):
        c_ref = torch.zeros(ref_shape, device="cuda", dtype=torch.float32)
        try:
            torch_op(case, torch, args_dev, c_ref)
        except (TypeError, RuntimeError):
            c_ref = None

    def reference(a: list[Any] = args_dev) -> Any:
        return torch_op(case, torch, a)

    def same_work(a: list[Any] = args_dev) -> Any:
        return torch_op(case, torch, a, c_ref)

    def ours(a: list[Any] = args_ours, out: Any = out) -> Any:
        return kernel(*a, **{kernel.outputs[0].name: out})

    torch.backends.cudnn.allow_tf32 = bool(case.get("tf32"))  # the reference runs as ours may
    rounds_ours, rounds_ref, rounds_same = [], [], []
    for _ in range(3):  # interleave them, a few samples each round
        rounds_ours += time_cuda(torch, ours, max(1, repeat // 3))
        rounds_ref += time_cuda(torch, reference, max(1, repeat // 3))
        if c_ref is not None:
            rounds_same += time_cuda(torch, same_work, max(1, repeat // 3))
    t_ours, t_ref = statistics.median(rounds_ours), statistics.median(rounds_ref)
    t_same = statistics.median(rounds_same) if rounds_same else None
    fastest = reference if t_same is None or t_ref <= t_same else same_work
    t_ref = min(t_ref, t_same or t_ref)
    g_ours, g_ref = time_graph(torch, ours, repeat), time_graph(torch, fastest, repeat)
    torch.backends.cudnn.allow_tf32 = False
    row = {
        "case": case["name"], "set": case["set"], "dtype": case["dtype"], "ok": ok, "rel_error": err,
        "polydl_ms": t_ours * 1e3, "torch_ms": t_ref * 1e3,
        "polydl_tflops": case["flops"] / t_ours / 1e12, "torch_tflops": case["flops"] / t_ref / 1e12,
        "ratio": t_ref / t_ours, "schedule": kernel.schedule.describe(),
        "reference": "float32 C + A B (out_dtype)" if fastest is same_work else "PyTorch's op",
        "same_work_torch_ms": t_same * 1e3 if t_same is not None else None,
        "graph_polydl_ms": statistics.median(g_ours) * 1e3 if g_ours else None,
        "graph_torch_ms": statistics.median(g_ref) * 1e3 if g_ref else None,
    }
    row["peak_percent"] = 100 * row["polydl_tflops"] / peaks["tf32" if case.get("tf32") else case["dtype"]]
    row["graph_ratio"] = (row["graph_torch_ms"] / row["graph_polydl_ms"] if g_ours and g_ref else None)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="benchmarks/results/gpu.json")
    ap.add_argument("--quick", action="store_true", help="a few cases of each set")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--set", action="append", default=[], choices=SETS)
    ap.add_argument("--only", action="append", default=[])
    args = ap.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    cases = all_cases()
    if args.set:
        cases = [c for c in cases if c["set"] in args.set]
    if args.quick:
        cases = [c for c in cases if c["kind"] in ("gemm", "bmm") and "8192" not in c["name"]
                 or c.get("layer_name") in QUICK_LAYERS]
    if args.only:
        cases = [c for c in cases if c["name"] in args.only]
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        kernels = list(pool.map(
            lambda c: build_kernel(c["nest"], c["params"], target=TF32 if c.get("tf32") else "cuda"), cases))
    print(f"built {len(kernels)} kernels in {time.time() - t0:.1f} s", flush=True)
    peaks = measured_peaks(torch, args.repeat)
    print("measured peak TFLOP/s (PyTorch 8192^3 matmul): " + ", ".join(f"{k} {v:.0f}" for k, v in peaks.items()))
    rows = []
    for case, kernel in zip(cases, kernels, strict=True):
        row = run_case(case, kernel, torch, args.repeat, peaks)
        rows.append(row)
        print(f"{row['case']:30s} {'ok ' if row['ok'] else 'BAD'} err={row['rel_error']:.1e} "
              f"polydl {row['polydl_ms']:8.3f} ms {row['polydl_tflops']:7.2f} TF/s | torch {row['torch_ms']:8.3f} ms "
              f"{row['torch_tflops']:7.2f} TF/s | ratio {row['ratio']:.2f} "
              f"graph {row['graph_ratio'] or float('nan'):.2f}",
              flush=True)
    summary: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "peak_tflops": peaks, "all_correct": all(r["ok"] for r in rows),
    }
    for name in SETS:
        ratios = [r["ratio"] for r in rows if r["set"] == name]
        graphs = [r["graph_ratio"] for r in rows if r["set"] == name and r["graph_ratio"]]
        if ratios:
            summary[f"{name}_geomean_ratio"] = geomean(ratios)
            summary[f"{name}_geomean_graph_ratio"] = geomean(graphs)
            summary[f"{name}_min_ratio"] = min(ratios)
    for r in rows:
        if r["set"] == "gemm":
            summary[f"{r['case']}_ratio"] = r["ratio"]
    print("\n| case | ok | rel err | polydl ms | torch ms | polydl TF/s | torch TF/s | peak % | ratio |"
          " graph ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {'yes' if r['ok'] else 'NO'} | {r['rel_error']:.1e} | "
              f"{r['polydl_ms']:.3f} | {r['torch_ms']:.3f} | {r['polydl_tflops']:.1f} | "
              f"{r['torch_tflops']:.1f} | {r['peak_percent']:.0f} | {r['ratio']:.2f} | "
              f"{_fmt(r['graph_ratio'], '.2f')} |")
    print(json.dumps(summary, indent=1))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0 if summary["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
