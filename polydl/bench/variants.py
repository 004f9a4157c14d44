"""A/B suites over the ResNet-50 layers, in the table of `polydl.bench`.

`resnet50_fused`: conv + bias + ReLU with the epilogues fused into the convolution's loops
("polydl"), against the same kernel with the epilogues left as separate loop nests (reference
"polydl.unfused": the same convolution schedule, `epilogues=()`), and PyTorch's conv (bias
inside) followed by an in-place ReLU on each oneDNN path.

`resnet50_bf16`: conv with bfloat16 inputs and fp32 accumulation and output ("polydl"), against
fp32 polydl on the same (bf16-rounded) numbers ("polydl.fp32", each at its faster layout), and
PyTorch's fp32 paths and its bf16 NCHW conv. Results are checked against a float64 conv of the
bf16-rounded inputs.

Every side is timed interleaved in one process, medians compared as ratios (see `timing`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from types import ModuleType
from typing import Any

import numpy as np

import polydl
from polydl import layouts
from polydl.api import build_kernel
from polydl.bench.builds import PolydlBuild, polydl_runner, variant_speeds
from polydl.bench.cases import BenchError, Case
from polydl.bench.forward import CONV, conv_references, mkldnn_runner
from polydl.bench.forward import expected as float64_result
from polydl.bench.results import Row, error_row, one_line
from polydl.bench.timing import Runner, Speeds, time_runners
from polydl.frontends import builders
from polydl.runtime.c.kernel import Kernel
from polydl.runtime.verify import relative_error

FUSE = ("bias", "relu")
LAYOUTS = ("nchw16c", "nchw")
REFERENCE_TOLERANCE_BF16 = 2e-2  # PyTorch's bf16 conv rounds its output to bf16


def _conv_kernel(case: Case, layout: str, dtype: str, fuse: tuple[str, ...],
                 constant: tuple[str, ...]) -> Kernel:
    s = case.size
    return polydl.conv2d(
        N=s["N"], C=s["C"], K=s["K"], H=s["H"], W=s["W"], R=s["R"], S=s["S"],
        stride=s["stride"], padding=s["padding"], dtype=dtype, layout=layout, fuse=fuse,
        constant=constant,
    )


def _layout_inputs(case: Case, layout: str, x: np.ndarray, w: np.ndarray, extra: Sequence[np.ndarray],
                   dtype: str) -> tuple[list[np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    k = case.size["K"]
    blocked = layout == "nchw16c"
    xs, ws = (layouts.to_nchw16c(x), layouts.to_kcrs16c16k(w)) if blocked else (x, w)
    if dtype == "bfloat16":
        import ml_dtypes

        xs, ws = xs.astype(ml_dtypes.bfloat16), ws.astype(ml_dtypes.bfloat16)
    more = []
    for e in extra:  # per-channel vectors, padded to whole blocks when blocked
        more.append(layouts.to_blocked_channels(e) if blocked else e)

    def plain(y: np.ndarray) -> np.ndarray:
        return layouts.from_nchw16c(y, k) if blocked else np.asarray(y)

    return [xs, ws, *more], plain


def _build(case: Case, layout: str, dtype: str, fuse: tuple[str, ...], x: np.ndarray, w: np.ndarray,
           extra: Sequence[np.ndarray], constant: tuple[str, ...],
           schedule: Any = None) -> tuple[PolydlBuild, Any]:
    t0 = time.perf_counter()
    if schedule is None:
        kernel = _conv_kernel(case, layout, dtype, fuse, constant)
    else:
        s = case.size
        nest, params = builders.conv2d(
            N=s["N"], C=s["C"], K=s["K"], H=s["H"], W=s["W"], R=s["R"], S=s["S"],
            stride=s["stride"], padding=s["padding"], dtype=dtype, layout=layout, fuse=fuse,
            **builders.target_options("conv2d", "c"))
        kernel = build_kernel(nest, params, schedule=schedule, constant=constant)
    compile_s = time.perf_counter() - t0
    inputs, plain = _layout_inputs(case, layout, x, w, extra, dtype)
    expected = [a.shape for a in kernel.arguments if a.is_input]
    if [i.shape for i in inputs] != expected:
        raise BenchError(f"layout {layout}: the kernel takes inputs {expected}")
    build = PolydlBuild(polydl_runner(kernel, inputs, plain), compile_s, kernel.schedule.describe(), layout,
                        kernel.nest.kept)
    return build, kernel


def _fastest(case: Case, candidates: list[tuple[str, Callable[[], tuple[PolydlBuild, Any]]]],
             expected: np.ndarray, repeat: int) -> tuple[PolydlBuild, Any, float, dict[str, float], list[str]]:
    """The fastest candidate that builds and verifies (fastest sample of a short interleaved run)."""
    built, problems = [], []
    for name, make in candidates:
        try:
            build, kernel = make()
        except Exception as exc:  # noqa: BLE001 - a layout that does not build is reported
            problems.append(f"{name}: {one_line(exc)}")
            continue
        err = relative_error(build.runner.fresh(), expected, "float32")
        if err > 1e-4:
            problems.append(f"{name}: result differs (relative error {err:.1e})")
            continue
        built.append((build, kernel, err))
    if not built:
        raise BenchError("; ".join(problems) or "nothing built")
    speeds = variant_speeds(case, [b for b, _, _ in built], repeat)
    if speeds:
        built.sort(key=lambda b: -speeds[b[0].variant])
    build, kernel, err = built[0]
    return build, kernel, err, speeds, problems


def _torch_fused(x: np.ndarray, w: np.ndarray, b: np.ndarray, case: Case, torch: ModuleType) -> list[Runner]:
    """PyTorch conv2d with its bias, then ReLU in place, on each oneDNN path."""
    s = case.size
    stride, padding = s["stride"], s["padding"]
    conv2d, relu_ = torch.nn.functional.conv2d, torch.relu_
    tx, tw, tb = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)
    runners = [Runner(
        "torch.nchw+bias+relu",
        lambda: relu_(conv2d(tx, tw, tb, stride, padding)),
        lambda: relu_(conv2d(tx, tw, tb, stride, padding)).numpy().copy(),
    )]
    last = torch.channels_last
    cx, cw = tx.contiguous(memory_format=last), tw.contiguous(memory_format=last)
    runners.append(Runner(
        "torch.channels_last+bias+relu",
        lambda: relu_(conv2d(cx, cw, tb, stride, padding)),
        lambda: relu_(conv2d(cx, cw, tb, stride, padding)).contiguous().numpy().copy(),
    ))
    return runners


def _torch_bf16(x: np.ndarray, w: np.ndarray, case: Case, torch: ModuleType,
                kept_weights: bool) -> list[Runner]:
    """PyTorch's bf16 convolution; timing inference (`kept_weights`), also oneDNN's on blocked
    bf16 tensors with the weights reordered once, before the timed calls, as polydl's kept
    weights are copied once."""
    s = case.size
    stride, padding = s["stride"], s["padding"]
    conv2d = torch.nn.functional.conv2d
    tx, tw = torch.from_numpy(x).bfloat16(), torch.from_numpy(w).bfloat16()
    runners = [Runner(
        "torch.nchw.bf16",
        lambda: conv2d(tx, tw, None, stride, padding),
        lambda: conv2d(tx, tw, None, stride, padding).float().numpy().copy(),
    )]
    if kept_weights and torch.backends.mkldnn.is_available():
        runners.append(mkldnn_runner("torch.mkldnn.bf16", torch, tx, tw, stride, padding))
    return runners


def _time_row(case: Case, build: PolydlBuild, references: list[Runner], expected: np.ndarray,
              tolerance: dict[str, float], err: float, repeat: int, budget_s: float,
              peak_gflops: float, variants: dict[str, float], problems: list[str],
              schedule: str) -> Row:
    reference_errors, verified = {}, []
    for ref in references:
        try:
            ref_err = relative_error(ref.fresh(), expected, "float32")
        except Exception as exc:  # noqa: BLE001 - a reference PyTorch cannot run is left out
            problems.append(f"{ref.name}: {one_line(exc)}")
            continue
        reference_errors[ref.name] = ref_err
        if ref_err <= tolerance.get(ref.name, 1e-4):
            verified.append(ref)
    runners = [build.runner, *verified]
    rounds, samples = time_runners(runners, repeat, budget_s)
    speeds = Speeds.of(case.flops, samples)
    return Row(
        case.name, case.shape, case.flops, polydl_gflops=speeds.median.pop("polydl"),
        references=speeds.median, status="ok", peak_gflops=peak_gflops, relative_error=err, compile_s=build.compile_s,
        variant=build.variant, schedule=schedule, message="; ".join(problems), rounds=rounds,
        samples={n: len(v) for n, v in samples.items()}, variants=variants, fastest=speeds.fastest,
        round_gflops=speeds.rounds, reference_errors=reference_errors, kept=build.kept,
    )


def fused_case(case: Case, torch: ModuleType | None, repeat: int, budget_s: float, peak_gflops: float,
               layouts: Sequence[str] = LAYOUTS, compare_layouts: bool = True, seed: int = 0,
               kept_weights: bool = False) -> Row:
    rng = np.random.default_rng(seed)
    s = case.size
    x = rng.uniform(-1.0, 1.0, (s["N"], s["C"], s["H"], s["W"])).astype(np.float32)
    w = rng.uniform(-1.0, 1.0, (s["K"], s["C"], s["R"], s["S"])).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, s["K"]).astype(np.float32)
    expected = np.maximum(float64_result(case, [x, w], torch) + b[None, :, None, None], 0.0)
    kept = CONV.constant(kept_weights)
    t0 = time.perf_counter()
    try:
        order = list(layouts) if compare_layouts else list(layouts)[:1]
        build, kernel, err, variants, problems = _fastest(
            case, [(lay, partial(_build, case, lay, "float32", FUSE, x, w, [b], kept))
                   for lay in order],
            expected, repeat)
        if not kernel.schedule.epilogues:
            problems.append("the epilogues were not fused")
        unfused, _ = _build(case, build.variant, "float32", FUSE, x, w, [b], kept,
                            schedule=replace(kernel.schedule, epilogues=()))
    except Exception as exc:  # noqa: BLE001 - one case's failure is a row, not the end of the run
        return error_row(case, exc, peak_gflops, t0)
    references = [Runner("polydl.unfused", unfused.runner.run, unfused.runner.fresh)]
    if torch is not None:
        references += _torch_fused(x, w, b, case, torch)
    return _time_row(case, build, references, expected, {}, err, repeat, budget_s, peak_gflops,
                     variants, problems, build.schedule)


def bf16_case(case: Case, torch: ModuleType | None, repeat: int, budget_s: float, peak_gflops: float,
              layouts: Sequence[str] = LAYOUTS, compare_layouts: bool = True, seed: int = 0,
              kept_weights: bool = False) -> Row:
    import ml_dtypes

    rng = np.random.default_rng(seed)
    s = case.size
    # the numbers bf16 can hold, in fp32: both precisions compute on exactly these inputs
    x = rng.uniform(-1.0, 1.0, (s["N"], s["C"], s["H"], s["W"])).astype(ml_dtypes.bfloat16).astype(np.float32)
    w = rng.uniform(-1.0, 1.0, (s["K"], s["C"], s["R"], s["S"])).astype(ml_dtypes.bfloat16).astype(np.float32)
    expected = float64_result(case, [x, w], torch)
    kept = CONV.constant(kept_weights)
    t0 = time.perf_counter()
    order = list(layouts) if compare_layouts else list(layouts)[:1]
    try:
        build, _, err, variants, problems = _fastest(
            case, [(lay, partial(_build, case, lay, "bfloat16", (), x, w, [], kept)) for lay in order],
            expected, repeat)
        fp32, _, _, fp32_variants, fp32_problems = _fastest(
            case, [(lay, partial(_build, case, lay, "float32", (), x, w, [], kept)) for lay in order],
            expected, repeat)
    except Exception as exc:  # noqa: BLE001 - one case's failure is a row, not the end of the run
        return error_row(case, exc, peak_gflops, t0)
    references = [Runner("polydl.fp32", fp32.runner.run, fp32.runner.fresh)]
    tolerance = {}
    if torch is not None:
        references += conv_references(x, w, case, torch)[1:]  # PyTorch's fp32 paths
        references += _torch_bf16(x, w, case, torch, kept_weights)
        tolerance.update({"torch.nchw.bf16": REFERENCE_TOLERANCE_BF16,
                          "torch.mkldnn.bf16": REFERENCE_TOLERANCE_BF16})
    variants = {f"bf16 {k}": v for k, v in variants.items()}
    variants.update({f"fp32 {k}": v for k, v in fp32_variants.items()})
    schedule = f"{build.schedule}  [fp32 {fp32.variant}: {fp32.schedule}]"
    return _time_row(case, build, references, expected, tolerance, err, repeat, budget_s, peak_gflops,
                     variants, problems + fp32_problems, schedule)


CASE_RUNNERS: dict[str, Callable[..., Row]] = {"resnet50_fused": fused_case, "resnet50_bf16": bf16_case}
