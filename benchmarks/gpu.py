"""GPU benchmark: polydl's CUDA kernels against PyTorch (cuBLAS/cuDNN), same run, same device.

    python benchmarks/gpu.py [--json FILE] [--quick] [--repeat N]

Cases: GEMM (fp32, bf16 inputs with fp32 output, 4096^3 bf16 included), batched GEMM, and the
ResNet-50 convolution suite (polydl/bench/suites/resnet50_conv.json, N=2, fp32). Every case is
first checked against a float64 reference (PyTorch on the GPU) with fresh random inputs and a
poisoned output; then polydl and the reference library are timed with CUDA events around
each call, interleaved, and the medians compared. PyTorch's fp32 convolutions and matmuls run
with TF32 off (the same arithmetic as polydl's FMA kernels); the TF32 column shows cuDNN with
TF32 on, for context. Prints a table and writes JSON (default benchmarks/results/gpu.json).
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

BATCHED = (Path(__file__).resolve().parents[1] / "examples" / "batched_matmul.c").read_text()


def retype(nest: LoopNest, dtypes: dict[str, str]) -> LoopNest:
    """The nest with some arrays' element types changed (bfloat16 inputs, float32 output)."""
    return replace(nest, arrays=tuple(replace(a, dtype=dtypes.get(a.name, a.dtype)) for a in nest.arrays))


def gemm_case(m: int, n: int, k: int, dtype: str) -> dict[str, Any]:
    nest, params = builders.matmul(m, n, k)
    if dtype == "bfloat16":
        nest = retype(nest, {"A": "bfloat16", "B": "bfloat16"})
    return {"name": f"gemm_{m}x{n}x{k}_{'bf16' if dtype == 'bfloat16' else 'fp32'}", "kind": "gemm",
            "nest": nest, "params": params, "dtype": dtype, "flops": 2 * m * n * k}


def bmm_case(b: int, m: int, n: int, k: int, dtype: str) -> dict[str, Any]:
    nest = read_c(BATCHED, "<bmm>").nest
    if dtype == "bfloat16":
        nest = retype(nest, {"X": "bfloat16", "Y": "bfloat16"})
    return {"name": f"bmm_{b}x{m}x{n}x{k}_{'bf16' if dtype == 'bfloat16' else 'fp32'}", "kind": "bmm",
            "nest": nest, "params": {"B": b, "M": m, "N": n, "K": k}, "dtype": dtype,
            "flops": 2 * b * m * n * k}


def conv_cases(batch: int) -> list[dict[str, Any]]:
    suite = json.loads((SUITES_DIR / "resnet50_conv.json").read_text())
    out = []
    for layer in suite["layers"]:
        sizes = {k: layer[k] for k in ("C", "K", "H", "W", "R", "S", "stride", "padding")}
        nest, params = builders.conv2d(N=batch, **sizes)
        p = (layer["H"] + 2 * layer["padding"] - layer["R"]) // layer["stride"] + 1
        q = (layer["W"] + 2 * layer["padding"] - layer["S"]) // layer["stride"] + 1
        out.append({"name": layer["name"], "kind": "conv", "nest": nest, "params": params,
                    "dtype": "float32", "layer": {**sizes, "N": batch},
                    "flops": 2 * batch * layer["K"] * p * q * layer["C"] * layer["R"] * layer["S"]})
    return out


def inputs_for(case: dict[str, Any], torch: Any) -> list[Any]:
    dev = "cuda"
    p = case["params"]
    bf = case["dtype"] == "bfloat16"
    tdt = torch.bfloat16 if bf else torch.float32
    if case["kind"] == "gemm":
        shapes = [(p["M"], p["K"]), (p["K"], p["N"])]
    elif case["kind"] == "bmm":
        shapes = [(p["B"], p["M"], p["K"]), (p["B"], p["K"], p["N"])]
    else:
        lay = case["layer"]
        shapes = [(lay["N"], lay["C"], lay["H"], lay["W"]), (lay["K"], lay["C"], lay["R"], lay["S"])]
    return [torch.randn(s, device=dev, dtype=torch.float32).to(tdt) for s in shapes]


def torch_reference(case: dict[str, Any], torch: Any, args: list[Any], dtype: Any) -> Any:
    a, b = (x.to(dtype) for x in args)
    if case["kind"] in ("gemm", "bmm"):
        return torch.matmul(a, b)
    lay = case["layer"]
    return torch.nn.functional.conv2d(a, b, stride=lay["stride"], padding=lay["padding"])


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="benchmarks/results/gpu.json")
    ap.add_argument("--quick", action="store_true", help="a few cases only")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--only", action="append", default=[])
    args = ap.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    cases = [
        gemm_case(4096, 4096, 4096, "bfloat16"),
        gemm_case(4096, 4096, 4096, "float32"),
        gemm_case(1024, 1024, 1024, "bfloat16"),
        gemm_case(1024, 1024, 1024, "float32"),
        gemm_case(1000, 2048, 513, "float32"),
        gemm_case(1000, 2048, 520, "bfloat16"),
        bmm_case(16, 512, 512, 512, "float32"),
        bmm_case(16, 512, 512, 512, "bfloat16"),
        *conv_cases(2),
    ]
    if args.quick:
        cases = [c for c in cases if c["kind"] != "conv" or c["name"] in ("conv1", "res2_3x3", "res3_1x1a_s2")]
    if args.only:
        cases = [c for c in cases if c["name"] in args.only]
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        kernels = list(pool.map(lambda c: build_kernel(c["nest"], c["params"], target="cuda"), cases))
    print(f"built {len(kernels)} kernels in {time.time() - t0:.1f} s", flush=True)
    rows = []
    for case, kernel in zip(cases, kernels, strict=True):
        args_dev = inputs_for(case, torch)
        ref = torch_reference(case, torch, args_dev, torch.float64)
        out_dtype = torch.float32
        out = torch.full(ref.shape, float("nan"), device="cuda", dtype=out_dtype)
        out.zero_()  # the kernel accumulates (+=) into its output
        kernel(*args_dev, **{kernel.outputs[0].name: out})
        torch.cuda.synchronize()
        err = (torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref)).item()
        tol = 1e-2 if case["dtype"] == "bfloat16" else 1e-5
        ok = bool(math.isfinite(err) and err < tol)
        if case["kind"] == "conv":
            lay = case["layer"]

            def reference(a=args_dev, lay=lay) -> Any:
                return torch.nn.functional.conv2d(a[0], a[1], stride=lay["stride"], padding=lay["padding"])
        else:
            def reference(a=args_dev) -> Any:
                return torch.matmul(a[0], a[1])

        def ours(a=args_dev, out=out, kernel=kernel) -> Any:
            return kernel(*a, **{kernel.outputs[0].name: out})

        rounds_ours, rounds_ref = [], []
        for _ in range(3):  # interleave the two, a few samples each round
            rounds_ours += time_cuda(torch, ours, max(1, args.repeat // 3))
            rounds_ref += time_cuda(torch, reference, max(1, args.repeat // 3))
        t_ours, t_ref = statistics.median(rounds_ours), statistics.median(rounds_ref)
        g_ours, g_ref = time_graph(torch, ours, args.repeat), time_graph(torch, reference, args.repeat)
        row = {
            "case": case["name"], "dtype": case["dtype"], "ok": ok, "rel_error": err,
            "polydl_ms": t_ours * 1e3, "torch_ms": t_ref * 1e3,
            "polydl_tflops": case["flops"] / t_ours / 1e12, "torch_tflops": case["flops"] / t_ref / 1e12,
            "ratio": t_ref / t_ours, "schedule": kernel.schedule.describe(),
            "graph_polydl_ms": statistics.median(g_ours) * 1e3 if g_ours else None,
            "graph_torch_ms": statistics.median(g_ref) * 1e3 if g_ref else None,
        }
        row["graph_ratio"] = (row["graph_torch_ms"] / row["graph_polydl_ms"]
                              if g_ours and g_ref else None)
        if case["kind"] == "conv":
            torch.backends.cudnn.allow_tf32 = True
            row["torch_tf32_ms"] = statistics.median(time_cuda(torch, reference, 5)) * 1e3
            torch.backends.cudnn.allow_tf32 = False
        rows.append(row)
        print(f"{row['case']:26s} {'ok ' if ok else 'BAD'} err={err:.1e} polydl {row['polydl_ms']:8.3f} ms "
              f"{row['polydl_tflops']:7.2f} TF/s | torch {row['torch_ms']:8.3f} ms {row['torch_tflops']:7.2f} TF/s"
              f" | ratio {row['ratio']:.2f} graph {row['graph_ratio'] or float('nan'):.2f}", flush=True)
    conv_names = {c["name"] for c in cases if c["kind"] == "conv"}
    convs = [r["ratio"] for r in rows if r["case"] in conv_names]
    conv_graph = [r["graph_ratio"] for r in rows if r["case"] in conv_names and r["graph_ratio"]]
    gemm = next((r for r in rows if r["case"] == "gemm_4096x4096x4096_bf16"), None)
    summary = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "all_correct": all(r["ok"] for r in rows),
        "gemm_4096_bf16_ratio": gemm["ratio"] if gemm else None,
        "gemm_4096_bf16_graph_ratio": gemm["graph_ratio"] if gemm else None,
        "resnet50_conv_geomean_ratio": geomean(convs),
        "resnet50_conv_geomean_graph_ratio": geomean(conv_graph),
    }
    print("\n| case | dtype | ok | rel err | polydl ms | torch ms | polydl TF/s | torch TF/s | ratio |"
          " graph polydl ms | graph torch ms | graph ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['dtype']} | {'yes' if r['ok'] else 'NO'} | {r['rel_error']:.1e} | "
              f"{r['polydl_ms']:.3f} | {r['torch_ms']:.3f} | {r['polydl_tflops']:.1f} | "
              f"{r['torch_tflops']:.1f} | {r['ratio']:.2f} | {_fmt(r['graph_polydl_ms'], '.3f')} | "
              f"{_fmt(r['graph_torch_ms'], '.3f')} | {_fmt(r['graph_ratio'], '.2f')} |")
    print(json.dumps(summary, indent=1))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0 if summary["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
