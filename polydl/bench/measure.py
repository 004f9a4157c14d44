"""One case of the GEMM, convolution and backward suites: random inputs, the float64 result,
polydl's kernel (the best layout that verifies) and the references, timed interleaved into a
`Row`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from polydl.bench.backward import BACKWARD, PRIMITIVES
from polydl.bench.builds import Pass, PolydlBuild, variant_speeds, verify
from polydl.bench.cases import BenchError, Case
from polydl.bench.forward import CONV, GEMM
from polydl.bench.results import Row, error_row, one_line
from polydl.bench.timing import Speeds, time_runners

# Conv layouts polydl may use. By default each is built and the fastest that verifies is kept
# (the blocked one loses where C is not a multiple of 16, e.g. conv1's C=3); without the
# comparison, the first that builds and verifies is used.
# "nchw-nchw16c" reads an NCHW x and gives a blocked y (`polydl.conv2d(out_layout=)`), as
# oneDNN's blocked path runs a layer of 3 input channels: built for the forward layers of
# fewer than 16 input channels only (`Pass.takes`).
CONV_LAYOUTS = ("nchw16c", "nchw", "nchw-nchw16c")
PASSES: dict[str, Pass] = {
    "matmul": GEMM,
    "conv2d": CONV,
    **{primitive: BACKWARD for primitive in PRIMITIVES},
}


def build_polydl(
    case: Case, inputs: list[np.ndarray], expected: np.ndarray, layouts: Sequence[str],
    compare_layouts: bool, repeat: int, schedule: str = "auto", kept_weights: bool = False,
) -> tuple[PolydlBuild, bool, float, dict[str, float], list[str]]:
    """polydl's kernel for `case`. A conv uses the first of `layouts` that builds and verifies,
    or with `compare_layouts` the fastest of them; `kept_weights`: built to keep the weights
    between calls (`Pass.weights`), as inference calls it. Returns (build, verified, relative
    error, speeds of the layouts compared, problems met)."""
    kind = PASSES[case.primitive]
    constant = kind.constant(kept_weights)
    if not kind.layouts:
        build = kind.build(case, inputs, "", schedule, constant)
        ok, err = verify(build.runner, expected, case.dtype)
        return build, ok, err, {}, [] if ok else [f"result differs (relative error {err:.1e})"]
    built: list[tuple[PolydlBuild, bool, float]] = []
    problems = []
    for layout in (layout for layout in layouts if kind.takes(case, layout)):
        try:
            build = kind.build(case, inputs, layout, schedule, constant)
        except Exception as exc:  # noqa: BLE001 - a layout that does not build is reported
            problems.append(f"{layout}: {one_line(exc)}")
            continue
        ok, err = verify(build.runner, expected, case.dtype)
        if not ok:
            problems.append(f"{layout}: result differs (relative error {err:.1e})")
        built.append((build, ok, err))
        if ok and not compare_layouts:
            break
    if not built:
        raise BenchError("; ".join(problems))
    good = [b for b in built if b[1]] or built
    speeds = variant_speeds(case, [b for b, _, _ in good], repeat)
    if speeds:
        good.sort(key=lambda b: -speeds[b[0].variant])
    build, ok, err = good[0]
    return build, ok, err, speeds, problems


def bench_case(
    case: Case, torch: ModuleType | None, repeat: int, budget_s: float, peak_gflops: float,
    layouts: Sequence[str] = CONV_LAYOUTS, compare_layouts: bool = True, seed: int = 0,
    schedule: str = "auto", kept_weights: bool = False,
) -> Row:
    kind = PASSES[case.primitive]
    rng = np.random.default_rng(seed)
    inputs = [rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
              for shape in kind.input_shapes(case)]
    expected = kind.expected(case, inputs, torch)

    t0 = time.perf_counter()
    try:
        build, ok, err, variants, problems = build_polydl(
            case, inputs, expected, layouts, compare_layouts, repeat, schedule, kept_weights
        )
    except Exception as exc:  # noqa: BLE001 - one case's failure is a row, not the end of the run
        return error_row(case, exc, peak_gflops, t0)
    status = "ok" if ok else "FAILED"
    reference_errors = {}
    verified = []
    for ref in kind.references(case, inputs, torch):
        ok, ref_err = verify(ref, expected, case.dtype)
        reference_errors[ref.name] = ref_err
        if ok:
            verified.append(ref)
    runners = [build.runner, *verified]
    rounds, samples = time_runners(runners, repeat, budget_s)
    speeds = Speeds.of(case.flops, samples)
    return Row(
        case.name,
        case.shape,
        case.flops,
        polydl_gflops=speeds.median.pop("polydl"),
        references=speeds.median,
        status=status,
        peak_gflops=peak_gflops,
        relative_error=err,
        compile_s=build.compile_s,
        variant=build.variant,
        schedule=build.schedule,
        message="; ".join(problems),
        rounds=rounds,
        samples={n: len(v) for n, v in samples.items()},
        variants=variants,
        fastest=speeds.fastest,
        round_gflops=speeds.rounds,
        reference_errors=reference_errors,
        kept=build.kept,
    )
