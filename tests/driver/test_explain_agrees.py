"""`explain` agrees with itself and with the code: for every scheduler path (the ranked
microkernel band, the general scheduler's bands, its wavefront of tiles, the written order), the
summary, the schedule section and `kernel.schedule.describe()` say the same about each nest's
parallel loops, tiles and fused statements, and the parallel loops they claim are the
`#pragma omp parallel for` lines of the generated C, one per parallel loop nest, in order."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

import polydl
from polydl.api import lower
from polydl.driver.compilation import Compilation
from polydl.driver.explain import explain
from polydl.frontends import builders, load_spec
from polydl.frontends.c_loopnest import parse_c
from polydl.schedules.schedule import GENERAL_SCHEDULER_NOTE, Schedule
from polydl.target import resolve_target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MACHINE = "x86-64-v3"  # a preset: the same decisions on every host

# A triangular solve: isl's only parallelism is a wavefront of tiles, which would split the
# sums into x[i]; the general scheduler keeps the written order, sequential.
TRISOLV = """
void trisolv(int N, const double L[N][N], double x[N], const double b[N]) {
  for (int i = 0; i < N; i++) {
    x[i] = b[i];
    for (int j = 0; j < i; j++)
      x[i] -= L[i][j] * x[j];
    x[i] = x[i] / L[i][i];
  }
}"""


def _softmax() -> Compilation:
    return lower(*load_spec(EXAMPLES / "softmax.c", {"N": 512, "D": 1024}), machine=MACHINE)


def _layernorm() -> Compilation:
    return lower(*load_spec(EXAMPLES / "layernorm.c", {"N": 256, "D": 768}), machine=MACHINE)


def _jacobi_rows() -> Compilation:
    # the written order: each sweep's rows in parallel inside the sequential time loop
    return lower(*load_spec(EXAMPLES / "jacobi2d.c", {"T": 20, "N": 200}), machine=MACHINE)


def _wavefront() -> Compilation:
    # no parallel loop: tiles along the anti-diagonals run in parallel
    return lower(*load_spec(EXAMPLES / "wavefront.c", {"N": 2000}), machine=MACHINE)


def _matmul() -> Compilation:
    return lower(*load_spec(EXAMPLES / "matmul.c", {"M": 256, "N": 256, "K": 256}), machine=MACHINE)


def _gemm_blas() -> Compilation:
    # distributed: `C *= beta` is a nest of its own before the GEMM's
    return lower(*load_spec(EXAMPLES / "gemm_blas.c", {"M": 240, "N": 400, "K": 160}), machine=MACHINE)


def _conv2d() -> Compilation:
    nest, params = builders.conv2d(N=2, C=16, K=32, H=14, W=14, R=3, S=3, padding=1,
                                   fuse=("bias", "relu"))
    return lower(nest, params, machine=MACHINE)


def _conv2d_fed() -> Compilation:
    # four images for four cores: each thread pads the image it convolves, inside the parallel
    # loop, into a slice of the scratch array of its own
    nest, params = builders.conv2d(N=4, C=32, K=32, H=9, W=7, R=3, S=3, padding=1,
                                   fuse=("bias", "relu"))
    return lower(nest, params, replace(resolve_target("c", MACHINE), cores=4))


def _trisolv() -> Compilation:
    return lower(parse_c(TRISOLV), {"N": 600}, machine=MACHINE)


# each kernel, and how each of its nests' parallel claims begin: which path it takes (a band
# nest's loops are the ranking's to choose)
CASES = {
    "softmax": (_softmax, [["parallel loop 0"]]),  # written order, rows in parallel
    "layernorm": (_layernorm, [["parallel loop 0"]]),
    "jacobi2d rows": (_jacobi_rows, [["parallel loop 0", "parallel loop 0"]]),
    "wavefront": (_wavefront, [["parallel: wavefront of tiles"]]),
    "matmul": (_matmul, [["parallel "]]),
    "gemm_blas": (_gemm_blas, [["parallel "], ["parallel "]]),  # C *= beta, then the GEMM
    # the padding copy (8 K cells: worth no fork), then the convolution
    "conv2d": (_conv2d, [[], ["parallel "]]),
    "conv2d fed": (_conv2d_fed, [["parallel "]]),  # the copy inside the convolution's band
    "trisolv": (_trisolv, [[]]),  # written order, sequential
}


def _parts(segment: str) -> list[str]:
    """What one band (or a band nest's line, or a band `describe()`) says about loops, tiles,
    parallel loops and fusion, in its order."""
    keep = ("band (", "loops ", "order ", "tiles ", "parallel", "fused ", "sequential")
    parts = [p for p in segment.split("; ") if p.startswith(keep)]
    return [("loops " + p[len("order "):]) if p.startswith("order ") else p for p in parts]


def _segments(line: str) -> list[str]:
    """A nest's one-line description as its segments: a band nest's line, or each band of a
    general-scheduler nest (`<who>: band ... | band ...`)."""
    if line.startswith(("loops ", "order ")):
        return [line]
    if "band (" not in line:
        return []  # no loops
    bands = line[line.index("band ("):]
    return bands.split(" | ")


def _summary_nests(text: str) -> dict[int, list[str]]:
    summary = text.split("\nsummary:\n", 1)[1].split("\n\ndetails:", 1)[0].splitlines()
    nests: dict[int, list[str]] = {}
    current = None
    for line in summary:
        head = re.match(r"  nest (\d+)(?: \(main\))? \[[^\]]*\]: (.*)$", line)
        if head:
            current = int(head.group(1))
            nests[current] = _segments(head.group(2)) if head.group(2).startswith("loops ") else []
        elif line.startswith("    band (") and current is not None:
            nests[current].append(line.strip())
    return nests


def _schedule_nests(text: str) -> tuple[str, dict[int, list[str]]]:
    """The schedule line's text and each nest's line of the schedule section."""
    section = text.split("\nschedule: ", 1)[1]
    first, rest = section.split("\n", 1)
    nests = {}
    for line in rest.splitlines():
        m = re.match(r"  nest (\d+)(?: \(main\))?: (.*)$", line)
        if m:
            nests[int(m.group(1))] = _segments(m.group(2))
    return first, nests


def _described(describe: str) -> list[str]:
    general = "main nest by the general (affine) scheduler"
    if describe.startswith(general):
        return _segments(describe[len(general):])
    return [describe]


def _claims(segments: list[str]) -> list[str]:
    """The parallel loop nests a nest's segments claim: each `parallel ...` other than none."""
    return [p for s in segments for p in _parts(s) if p.startswith("parallel") and p != "parallel none"]


def _loops_claimed(claim: str) -> int:
    if claim.startswith("parallel loops "):
        return len(claim.split(","))
    if claim.startswith(("parallel loop ", "parallel: wavefront")):
        return 1
    return len(claim.removesuffix(" (a private sum per thread)").split(","))


def _pragmas(c: Compilation) -> list[int]:
    """The collapse depth of each `#pragma omp parallel for` (or `#pragma omp for` in a parallel
    region) on a loop of the kernel's nests, in order (the kernel function only; a scratch
    array's clearing per thread slice is no nest; a region's own pragma claims no loop)."""
    source = c.code.source
    body = source[source.index(f"\nint {c.model.nest.name}("):].splitlines()
    depths = []
    for i, line in enumerate(body):
        if not re.match(r"#pragma omp (parallel )?for\b", line.strip()):
            continue
        loop = body[i + 1].strip()
        if loop.startswith("for (long _pd_slice "):
            continue
        assert re.match(r"for \(long _t\d+ ", loop), f"a parallel pragma on no nest loop: {loop}"
        collapse = re.search(r"collapse\((\d+)\)", line)
        depths.append(int(collapse.group(1)) if collapse else 1)
    return depths


@pytest.mark.parametrize("case", CASES)
def test_summary_schedule_section_describe_and_pragmas_agree(case: str) -> None:
    make, expected = CASES[case]
    c = make()
    assert c.scheduled is not None
    text = explain(c, ranking=0)
    summary = _summary_nests(text)
    schedule_line, section = _schedule_nests(text)
    main = c.scheduled.main_group
    described = c.schedule.describe()
    assert schedule_line == described

    # one record, three places: the same bands, tiles, parallel loops and fused statements
    assert set(section) == {p.group for p in c.scheduled.groups}
    for group, segments in section.items():
        if group in summary:
            assert [_parts(s) for s in summary[group]] == [_parts(s) for s in segments], group
        else:  # a nest without loops: the summary names it on one line
            assert not _claims(segments)
    assert [_parts(s) for s in _described(described)] == [_parts(s) for s in section[main]]
    # the stored lowering's schedule (and so a cached kernel's) says the same
    assert Schedule.from_json(c.schedule.to_json()).describe() == described

    # the claims are the code's parallel loops: a claim without a pragma or a pragma without a
    # claim fails, nest by nest in the order the code runs them
    claims = [_claims(section[p.group]) for p in c.scheduled.groups]
    assert [len(nest) for nest in claims] == [len(nest) for nest in expected], claims
    assert all(claim.startswith(start) for nest, starts in zip(claims, expected, strict=True)
               for claim, start in zip(nest, starts, strict=True)), claims
    pragmas = _pragmas(c)
    flat = [claim for nest in claims for claim in nest]
    assert len(pragmas) == len(flat), (flat, pragmas)
    for claim, depth in zip(flat, pragmas, strict=True):
        assert depth <= _loops_claimed(claim), (claim, depth)


def test_a_kernel_describes_what_the_general_scheduler_did() -> None:
    """`describe()` of a general-scheduler kernel names its bands, tiles and parallel loop,
    built or taken from the compile cache."""
    params = {"N": 2000}
    built = polydl.compile(EXAMPLES / "wavefront.c", params, machine=MACHINE)
    cached = polydl.compile(EXAMPLES / "wavefront.c", params, machine=MACHINE)
    text = built.schedule.describe()
    assert text == cached.schedule.describe() == _wavefront().schedule.describe()
    assert text.startswith("main nest by the general (affine) scheduler: affine scheduler: ")
    assert re.search(r"band \(i, j\) of S0; tiles (\d+)x\1 \(\d+ KiB per tile\); parallel: wavefront of tiles",
                     text)
    # one parallel region, the tiles of each anti-diagonal shared out in it
    assert "#pragma omp parallel\n" in built.source and "#pragma omp for" in built.source
    rows = _jacobi_rows().schedule.describe()
    assert "written order" in rows and "band (t) of S0, S1; sequential" in rows
    # what is generated does not depend on the description
    assert "schedule: main nest by the general (affine) scheduler\n" in built.source


def test_locals_are_listed_as_locals_with_where_they_live() -> None:
    arrays = explain(_softmax(), ranking=0).split("  arrays:\n", 1)[1].split("\n\n", 1)[0]
    assert "_pd_top_0: float32[512] local, the C local 'top' at " in arrays
    assert "_pd_sum_1: float32[512] local, the C local 'sum' at " in arrays
    # the schedule keeps each row's maximum and sum in one iteration of the row loop
    assert arrays.count("a register scalar per iteration of (i)") == 2
    assert "_pd_top_0: float32[512] output" not in arrays
    # the generated code's schedule line says the same of each
    code = _softmax().code.source
    for line in arrays.splitlines():
        if "register scalar" in line:
            assert line.split(": ", 1)[0].strip() + ": a register scalar per iteration of (i)" in code
    arrays = explain(_conv2d_fed(), ranking=0).split("  arrays:\n", 1)[1].split("\n\n", 1)[0]
    assert "xp: float32[4x32x11x9] local (scratch), one slice of its first index per thread" in arrays
    arrays = explain(_conv2d(), ranking=0).split("  arrays:\n", 1)[1].split("\n\n", 1)[0]
    assert "xp: float32[2x16x16x16] local (scratch), the whole array" in arrays
    arrays = explain(_gemm_blas(), ranking=0).split("  arrays:\n", 1)[1].split("\n\n", 1)[0]
    assert "_pd_A_scaled: float32[240x160] local (scratch), the whole array" in arrays


def test_a_kernels_schedule_given_back_generates_its_own_account() -> None:
    """The general scheduler's note a compiled kernel's schedule carries is made again when the
    schedule is given back, so the code's comment never repeats an old one."""
    kernel = polydl.compile(str(EXAMPLES / "softmax.c"), {"N": 64, "D": 96}, machine="x86-64-v3")
    stale = replace(kernel.schedule, notes=((GENERAL_SCHEDULER_NOTE, "an old account"),))
    again = polydl.compile(str(EXAMPLES / "softmax.c"), {"N": 64, "D": 96}, machine="x86-64-v3",
                           schedule=stale)
    assert "an old account" not in again.source
    assert dict(again.schedule.notes)[GENERAL_SCHEDULER_NOTE] == dict(kernel.schedule.notes)[GENERAL_SCHEDULER_NOTE]
