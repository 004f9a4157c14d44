"""Batch-reduce GEMM microkernels: generated, compiled alone, run and compared with numpy.

Each kernel is wrapped in `entry(a, b, c)`, built with gcc into a shared library and run on
random data laid out by the spec's strides (negative ones included: the pointers then point
into the middle of their buffers). Every element of C's buffer that is not a cell of C must
come back untouched, which checks the masked stores of ragged edges. AVX-512 kernels only
compile where the CPU lacks AVX-512F.
"""

from __future__ import annotations

import itertools
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import cffi
import numpy as np
import pytest

from polydl.codegen.c.microkernels import (
    BatchDim,
    BrgemmSpec,
    Microkernel,
    amx,
    choose_microkernel,
    libxsmm_available,
    portable,
)
from polydl.codegen.c.microkernels.blocking import (
    VECTOR_UNITS,
    a_lines_missed,
    choose_outer_product,
)
from polydl.errors import ScheduleError
from polydl.schedules.cpu.register_blocking import lines_per_set, step_cycles

GCC = shutil.which("gcc") or shutil.which("cc") or "gcc"
pytestmark = pytest.mark.skipif(shutil.which(GCC) is None, reason="needs a C compiler")


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


FLAGS = cpu_flags()
RUNNABLE = {
    "scalar": True,
    "avx2": {"avx2", "fma"} <= FLAGS,
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= FLAGS,
}
RUNNABLE["avx512bf16"] = RUNNABLE["avx512"] and "avx512_bf16" in FLAGS
RUNNABLE["avx512amx"] = RUNNABLE["avx512bf16"] and {"amx_tile", "amx_bf16"} <= FLAGS

NUMPY_TYPES = {"float32": (np.float32, np.float32), "float64": (np.float64, np.float64),
               "bfloat16": (np.uint16, np.float32)}


# --- compile, run, compare -----------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    spec: BrgemmSpec
    isa: str
    backend: str = "polydl"


# what a generated function does on entry for its AMX kernels (they keep tile configurations
# and packed constants only within one of its calls)
COUNT_CALL = "  __atomic_add_fetch(&_pd_tile_generation, 1, __ATOMIC_RELAXED);\n"


def entry_source(mk: Microkernel, entry: str, enter: bool = True) -> str:
    """`mk` and a function `entry` that calls it once; `enter`: as a new call of a generated
    function (`COUNT_CALL`)."""
    in_t, out_t = mk.spec.input_ctype, mk.spec.output_ctype
    return (
        f"{mk.source}\nvoid {entry}(const void *a, const void *b, void *c)\n{{\n"
        f"{COUNT_CALL if enter and '_pd_tile_generation' in mk.source else ''}"
        f"  {mk.name}((const {in_t} *)a, (const {in_t} *)b, ({out_t} *)c);\n}}\n"
    )


def gcc(sources: list[str], out: Path, link: bool, flags: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    c_file = out.with_suffix(".c")
    c_file.write_text("\n".join(sources))
    mode = ["-shared", "-fPIC"] if link else ["-c", "-fPIC"]
    extra = shlex.split(os.environ.get("POLYDL_TEST_CFLAGS", ""))  # e.g. -fsanitize=address
    cmd = [GCC, "-O2", "-std=gnu11", "-Wall", "-Werror", *extra, *mode, str(c_file), "-o", str(out)]
    return subprocess.Popen([*cmd, *(flags if link else ())], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


# Never unloaded: LIBXSMM putenv()s strings that live in the library, so unloading it would
# leave dangling pointers in the process environment (the runtime keeps libraries loaded too).
_LOADED: list[object] = []


class KernelLibrary:
    """Every case's kernel, compiled up front in a few translation units (parsing
    immintrin.h dominates the cost of one small kernel), run through cffi."""

    def __init__(self, cases: list[Case], directory: Path) -> None:
        self.ffi = cffi.FFI()
        self.entries: dict[Case, tuple[Microkernel, str, int]] = {}
        groups: dict[tuple[bool, tuple[str, ...]], list[tuple[Case, Microkernel, str]]] = {}
        for i, case in enumerate(dict.fromkeys(cases)):
            mk = choose_microkernel(case.spec, case.isa, f"_pd_k{i}", backend=case.backend)
            runnable = RUNNABLE[case.isa]
            groups.setdefault((runnable, mk.link_flags), []).append((case, mk, f"entry_{i}"))
            self.ffi.cdef(f"void entry_{i}(const void *a, const void *b, void *c);")
        jobs = []
        chunk = 24
        for g, ((runnable, flags), members) in enumerate(groups.items()):
            for start in range(0, len(members), chunk):
                part = members[start:start + chunk]
                out = directory / f"chunk{g}_{start}.{'so' if runnable else 'o'}"
                sources = [entry_source(mk, entry) for _, mk, entry in part]
                jobs.append((gcc(sources, out, runnable, flags), out, runnable, part))
        self.libraries = []
        for proc, out, runnable, part in jobs:
            output, _ = proc.communicate()
            assert proc.returncode == 0, f"{out.with_suffix('.c')}:\n{output[:5000]}"
            lib = self.ffi.dlopen(str(out)) if runnable else None
            _LOADED.append((self.ffi, lib))
            self.libraries.append(lib)
            for case, mk, entry in part:
                self.entries[case] = (mk, entry, len(self.libraries) - 1)

    def run(self, case: Case, a: Operand, b: Operand, c: Operand) -> None:
        _, entry, index = self.entries[case]
        getattr(self.libraries[index], entry)(*pointers(self.ffi, (a, b, c)))


def pointers(ffi: cffi.FFI, operands: tuple[Operand, ...]) -> list[object]:
    """Each operand's pointer: the address of its element `base`."""
    return [ffi.cast("char *", ffi.from_buffer(op.buffer)) + op.base * op.buffer.itemsize
            for op in operands]


def extent_range(terms: list[tuple[int, int]]) -> tuple[int, int]:
    """Lowest and highest offset of sum(i * stride) over i < extent."""
    lo = sum(min(0, (e - 1) * s) for e, s in terms if e > 0)
    hi = sum(max(0, (e - 1) * s) for e, s in terms if e > 0)
    return lo, hi


@dataclass
class Operand:
    buffer: np.ndarray
    base: int  # index of the element the kernel's pointer points at


def make_operand(rng: np.random.Generator, terms: list[tuple[int, int]], dtype: str,
                 pad: int = 19) -> Operand:
    lo, hi = extent_range(terms)
    size = hi - lo + 1 + 2 * pad
    values = rng.uniform(-1, 1, size).astype(np.float32)
    if dtype == "bfloat16":
        buffer = (values.view(np.uint32) >> 16).astype(np.uint16)
    else:
        buffer = values.astype(NUMPY_TYPES[dtype][0])
    return Operand(buffer, pad - lo)


def as_float64(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def reference(spec: BrgemmSpec, a: Operand, b: Operand, c: Operand) -> np.ndarray:
    """The brgemm definition, straight from the spec's strides, in float64."""
    mm = np.arange(spec.m)[:, None]
    nn = np.arange(spec.n)[None, :]
    kk_row = np.arange(spec.k)[None, :]
    kk_col = np.arange(spec.k)[:, None]
    av = as_float64(a.buffer, spec.dtype)
    bv = as_float64(b.buffer, spec.dtype)
    want = c.buffer.astype(np.float64)
    for jb in range(spec.n_blocks):
        acc = np.zeros((spec.m, spec.n))
        for idx in itertools.product(*(range(d.extent) for d in spec.batch)):
            a_off = sum(i * d.a_stride for i, d in zip(idx, spec.batch, strict=True))
            b_off = jb * spec.b_nb + sum(i * d.b_stride for i, d in zip(idx, spec.batch, strict=True))
            a_mat = av[a.base + a_off + mm * spec.a_m + kk_row * spec.a_k]
            b_mat = bv[b.base + b_off + kk_col * spec.b_k + nn * spec.b_n]
            acc += a_mat @ b_mat
        cells = c.base + jb * spec.c_nb + mm * spec.c_m + nn * spec.c_n
        want[cells] = acc + (want[cells] if spec.beta else 0.0)
    return want


def check(library: KernelLibrary, case: Case, seed: int = 0) -> Microkernel:
    """Run the case's kernel on random operands; C must match the reference everywhere."""
    mk = library.entries[case][0]
    if not RUNNABLE[case.isa]:
        return mk  # compiled only
    spec = case.spec
    a, b, c = random_operands(spec, np.random.default_rng(seed))
    want = reference(spec, a, b, c)
    library.run(case, a, b, c)
    assert_matches(spec, c, want)
    return mk


def random_operands(spec: BrgemmSpec, rng: np.random.Generator) -> tuple[Operand, Operand, Operand]:
    """A, B and C of a call of `spec`, random, padded on both sides."""
    batch_a = [(d.extent, d.a_stride) for d in spec.batch]
    batch_b = [(d.extent, d.b_stride) for d in spec.batch]
    a = make_operand(rng, [(spec.m, spec.a_m), (spec.k, spec.a_k), *batch_a], spec.dtype)
    blocks = spec.n_blocks
    b = make_operand(rng, [(spec.k, spec.b_k), (spec.n, spec.b_n), (blocks, spec.b_nb), *batch_b],
                     spec.dtype)
    c = make_operand(rng, [(spec.m, spec.c_m), (spec.n, spec.c_n), (blocks, spec.c_nb)],
                     spec.compute_dtype)
    return a, b, c


def assert_matches(spec: BrgemmSpec, c: Operand, want: np.ndarray, message: str = "") -> None:
    """C equals the reference everywhere, to the rounding of k x batch products."""
    steps = spec.k * max(spec.batch_count, 1)
    tol = 1e-12 if spec.dtype == "float64" else 1e-6
    np.testing.assert_allclose(c.buffer.astype(np.float64), want, rtol=tol * 4,
                               atol=tol * 4 * steps, err_msg=message)


# --- the cases ------------------------------------------------------------------------------


def layout(name: str, m: int, n: int, k: int) -> dict[str, int]:
    """Strides of A, B, C for a named layout."""
    return {
        # row-major, dense
        "dense": dict(a_m=k, a_k=1, b_k=n, b_n=1, c_m=n, c_n=1),
        # row-major with leading dimensions larger than the block (a block of a bigger matrix)
        "padded": dict(a_m=k + 3, a_k=1, b_k=n + 5, b_n=1, c_m=n + 7, c_n=1),
        # m is the unit-stride dimension of A and C (column-major A and C)
        "m-major": dict(a_m=1, a_k=m + 2, b_k=n + 1, b_n=1, c_m=1, c_n=m + 3),
        # everything column-major (Fortran order)
        "col-major": dict(a_m=1, a_k=m + 2, b_k=1, b_n=k + 1, c_m=1, c_n=m + 3),
        # B transposed (B[n][k]): k unit-stride in A and B, as in a linear layer
        "nt": dict(a_m=k + 1, a_k=1, b_k=1, b_n=k + 2, c_m=n, c_n=1),
        # nothing unit-stride
        "strided": dict(a_m=2 * k + 1, a_k=2, b_k=3 * n + 1, b_n=3, c_m=2 * n + 3, c_n=2),
        # B and C rows walk backwards
        "negative": dict(a_m=k, a_k=1, b_k=-n - 1, b_n=1, c_m=-n - 2, c_n=1),
    }[name]


def batch_dims(kind: str, m: int, n: int, k: int, s: dict[str, int]) -> tuple[BatchDim, ...]:
    a_span = abs(m * s["a_m"]) + abs(k * s["a_k"])
    b_span = abs(k * s["b_k"]) + abs(n * s["b_n"])
    if kind == "none":
        return ()
    if kind == "one":
        return (BatchDim(3, a_span + 1, b_span + 2),)
    if kind == "two":
        # a 2 x 3 window: strides that neither collapse nor continue k
        return (BatchDim(2, 3 * a_span + 5, 3 * b_span + 7), BatchDim(3, a_span + 1, b_span))
    if kind == "into-k":
        # the batch continues k: normalisation merges it into a longer k loop
        return (BatchDim(2, k * s["a_k"], k * s["b_k"]),)
    if kind == "empty":
        return (BatchDim(0, a_span, b_span),)
    raise ValueError(kind)


def spec_for(shape: tuple[int, int, int], lay: str, batch: str, dtype: str = "float32",
             beta: float = 1.0) -> BrgemmSpec:
    m, n, k = shape
    s = layout(lay, m, n, k)
    return BrgemmSpec(m=m, n=n, k=k, **s, batch=batch_dims(batch, m, n, k, s), dtype=dtype,
                      beta=beta)


def label(shape: tuple[int, int, int]) -> str:
    return "x".join(map(str, shape))


SHAPES = [(1, 1, 1), (3, 5, 7), (17, 31, 3), (31, 17, 64), (28, 64, 9), (6, 16, 2), (14, 33, 5)]
LAYOUTS = ["dense", "padded", "m-major", "nt", "strided", "negative"]
ISAS = ["scalar", "avx2", "avx512"]
VECTOR_ISAS = ["avx2", "avx512"]

# The conv block that matters: a row of 28 output pixels x 64 channels, 64 input channels,
# batch over the 3 x 3 window of a 30-pixel-wide input; and a GEMM panel.
CONV = BrgemmSpec(m=28, n=64, k=64, a_m=64, a_k=1, b_k=64, b_n=1, c_m=64, c_n=1,
                  batch=(BatchDim(3, 30 * 64, 3 * 64 * 64), BatchDim(3, 64, 64 * 64)))
GEMM = BrgemmSpec(m=64, n=256, k=256, a_m=256, a_k=1, b_k=256, b_n=1, c_m=256, c_n=1)
# The blocked-layout (nchw16c) conv call: 56 output pixels x 16 channels, 16 input channels,
# batch over 4 channel blocks and the 3 x 3 window; B's k rows are adjacent 16-wide rows.
CONV16 = BrgemmSpec(m=56, n=16, k=16, a_m=16, a_k=1, b_k=16, b_n=1, c_m=16, c_n=1,
                    batch=(BatchDim(4, 58 * 58 * 16, 9 * 256), BatchDim(3, 58 * 16, 3 * 256),
                           BatchDim(3, 16, 256)))

# A's rows 4 KiB apart: register tiles of fewer rows (`test_rows_of_a_stay_within_the_l1_sets`)
ALIASED_A = BrgemmSpec(m=30, n=16, k=40, a_m=1024, a_k=1, b_k=16, b_n=1, c_m=16, c_n=1)
LAYOUT_CASES = [
    pytest.param(Case(spec_for(shape, lay, "one", beta=float(sum(shape) % 2)), isa),
                 id=f"{label(shape)}-{lay}-{isa}")
    for shape in SHAPES for lay in LAYOUTS for isa in ISAS
] + [pytest.param(Case(ALIASED_A, isa), id=f"aliased-a-{isa}") for isa in ISAS]
BATCH_CASES = [
    pytest.param(Case(spec_for((13, 20, 11), lay, batch, beta=beta), isa),
                 id=f"{lay}-{batch}-beta{beta:g}-{isa}")
    for lay in ("dense", "m-major", "nt") for batch in ("none", "one", "two", "into-k", "empty")
    for beta in (0.0, 1.0) for isa in ISAS
]
DTYPE_CASES = [
    pytest.param(Case(spec_for(shape, lay, "two", dtype=dtype), isa),
                 id=f"{label(shape)}-{lay}-{dtype}-{isa}")
    for shape in ((3, 5, 7), (17, 31, 20)) for lay in ("dense", "m-major", "nt", "strided")
    for dtype in ("float64", "bfloat16") for isa in ISAS
]
# vdpbf16ps kernels (k in pairs, odd k, ragged n, both orientations): run where the CPU has
# AVX-512 BF16, compiled only elsewhere.
BF16_DOT_CASES = [
    pytest.param(Case(spec_for(shape, lay, batch, dtype="bfloat16", beta=beta), "avx512bf16"),
                 id=f"{label(shape)}-{lay}-{batch}-beta{beta:g}")
    for shape in ((3, 5, 7), (17, 31, 20), (28, 64, 9)) for lay in ("dense", "padded", "m-major", "strided")
    for batch, beta in (("none", 0.0), ("two", 1.0))
] + [pytest.param(Case(replace(CONV, dtype="bfloat16"), "avx512bf16"), id="conv")]
# AMX tile kernels (ragged tile rows and columns, k chunks of 32, 24, 20 and 2, both
# orientations, batches, beta 0 and 1; odd k falls back to vdpbf16ps): run where the CPU has
# AMX-BF16, compiled only elsewhere.
AMX_LAYOUTS = ("dense", "padded", "negative", "col-major")
AMX_CASES = [
    pytest.param(Case(spec_for(shape, lay, batch, dtype="bfloat16", beta=beta), "avx512amx"),
                 id=f"{label(shape)}-{lay}-{batch}-beta{beta:g}")
    for shape in ((17, 31, 20), (50, 16, 64), (40, 33, 48), (5, 16, 2), (28, 64, 9))
    for lay in AMX_LAYOUTS
    for batch, beta in (("none", 0.0), ("two", 1.0), ("into-k", 1.0), ("empty", 1.0))
] + [pytest.param(Case(replace(spec, dtype="bfloat16"), "avx512amx"), id=name)
     for name, spec in (("conv", CONV), ("gemm", GEMM), ("conv16", CONV16))]
BLOCK_CASES = [
    pytest.param(Case(spec, isa), id=f"{name}-{isa}")
    for name, spec in (("conv", CONV), ("gemm", GEMM)) for isa in VECTOR_ISAS
]


def blocked_conv(rows: int, n: int, blocks: int, dtype: str = "float32", beta: float = 1.0,
                 c_gap: int = 0) -> BrgemmSpec:
    """A 3 x 3 convolution call in a blocked layout over `blocks` output-channel blocks of
    n: B (weights) and C (output) at a block stride each, A (input) shared by every block."""
    w = rows + 2
    b_block = 2 * 9 * n * 16
    return BrgemmSpec(m=rows, n=n, k=16, a_m=16, a_k=1, b_k=n, b_n=1, c_m=n, c_n=1,
                      batch=(BatchDim(2, w * w * 16, 9 * n * 16), BatchDim(3, w * 16, 3 * n * 16),
                             BatchDim(3, 16, n * 16)),
                      dtype=dtype, beta=beta, n_blocks=blocks, b_nb=b_block,
                      c_nb=rows * n + c_gap)


# Several output-channel blocks in one call: whole vectors per block (one register tile over
# blocks), a block width that is not whole vectors and the dtypes without their own form (one
# call per block), C's blocks apart or adjacent (normalised into one wider n).
N_BLOCKS_CASES = [
    pytest.param(Case(blocked_conv(rows, n, blocks, dtype, beta, gap), isa),
                 id=f"{rows}x{n}x{blocks}-{dtype}-beta{beta:g}-gap{gap}-{isa}")
    for rows, n, blocks, dtype, beta, gap, isa in (
        (7, 16, 4, "float32", 1.0, 33, "avx512"), (7, 16, 3, "float32", 0.0, 5, "avx512"),
        (7, 16, 2, "float64", 1.0, 3, "avx512"), (14, 16, 2, "float32", 1.0, 1, "avx2"),
        (5, 8, 4, "float32", 0.0, 3, "avx2"), (7, 12, 3, "float32", 1.0, 7, "avx512"),
        (7, 16, 2, "float32", 1.0, 9, "scalar"), (7, 16, 4, "bfloat16", 1.0, 17, "avx512"),
        (7, 16, 3, "bfloat16", 0.0, 2, "avx512bf16"), (6, 32, 2, "bfloat16", 1.0, 0, "avx512amx"),
        (7, 16, 4, "float32", 1.0, -7 * 16 * 2, "avx512"),  # blocks walking backwards
    )
]
LIBXSMM_CASES = [
    pytest.param(Case(spec_for(shape, lay, batch, beta=beta), "avx2", "libxsmm"),
                 id=f"{label(shape)}-{lay}-{batch}-beta{beta:g}")
    for shape, lay, batch, beta in (
        ((64, 256, 64), "dense", "none", 1.0),
        ((28, 64, 64), "padded", "one", 0.0),
        ((13, 20, 11), "dense", "two", 1.0),  # several batch loops: an offset table
        ((13, 20, 11), "dense", "into-k", 1.0),
        ((13, 20, 11), "col-major", "one", 1.0),  # the transposed form
        ((17, 31, 3), "dense", "one", 0.0),
    )
] + [pytest.param(Case(CONV, "avx2", "libxsmm"), id="conv")]


def all_cases() -> list[Case]:
    params = [*LAYOUT_CASES, *BATCH_CASES, *DTYPE_CASES, *BLOCK_CASES, *BF16_DOT_CASES, *AMX_CASES,
              *N_BLOCKS_CASES]
    if libxsmm_available():
        params += LIBXSMM_CASES
    return [p.values[0] for p in params]  # type: ignore[misc]


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> KernelLibrary:
    return KernelLibrary(all_cases(), tmp_path_factory.mktemp("microkernels"))


@pytest.mark.parametrize("case", LAYOUT_CASES)
@pytest.mark.slow
def test_layouts_and_odd_shapes(library: KernelLibrary, case: Case) -> None:
    check(library, case)


@pytest.mark.parametrize("case", BATCH_CASES)
def test_batches_and_beta(library: KernelLibrary, case: Case) -> None:
    check(library, case)


@pytest.mark.parametrize("case", DTYPE_CASES)
def test_float64_and_bfloat16(library: KernelLibrary, case: Case) -> None:
    check(library, case)


@pytest.mark.parametrize("case", BF16_DOT_CASES)
def test_avx512_bf16_dot_products(library: KernelLibrary, case: Case) -> None:
    mk = check(library, case)
    if mk.form.startswith("outer"):
        assert "_mm512_dpbf16_ps(" in mk.source


@pytest.mark.parametrize("case", AMX_CASES)
def test_amx_tile_kernels(library: KernelLibrary, case: Case) -> None:
    mk = check(library, case)
    if case.spec.normalized().k % 2 == 0:  # an "into-k" batch can make k even
        assert "_tile_dpbf16ps(" in mk.source and mk.isa == "avx512amx"
    else:  # no whole k pairs for the tiles: the vdpbf16ps kernel
        assert "_tile_dpbf16ps(" not in mk.source and "_mm512_dpbf16_ps(" in mk.source


@pytest.mark.parametrize("rows, b_constant, configurations", [(80, True, 2), (56, False, 1)])
def test_amx_kernel_builds_with_mamx(tmp_path: Path, rows: int, b_constant: bool,
                                     configurations: int) -> None:
    """The whole kernel, compiled for a CPU with AMX, issues tile loads, products and stores
    and keeps the vdpbf16ps kernel as its fallback. A call in one tile configuration (56 rows:
    two blocks of tiles of 16 and 12) leaves it loaded for the next; one in two (80 rows: 48,
    then 32) loads both and releases the tiles."""
    mk = choose_microkernel(replace(CONV16, m=rows, dtype="bfloat16"), "avx512amx", "_pd_amx",
                            b_constant=b_constant)
    # B packed once per generation where one block of n holds it; the configuration kept
    assert ("_pd_tile_generation" in mk.source) == (b_constant or configurations == 1)
    assert ("_tile_release();" in mk.source) == (configurations > 1)
    c_file = tmp_path / "k.c"
    c_file.write_text(entry_source(mk, "entry"))
    asm = tmp_path / "k.s"
    subprocess.run([GCC, "-O3", "-march=sapphirerapids", "-Wall", "-Werror", "-S", str(c_file),
                    "-o", str(asm)], check=True)
    text = asm.read_text()
    for instruction in ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored", "vdpbf16ps"):
        assert instruction in text, instruction
    assert ("tilerelease" in text) == (configurations > 1)


def _amx_library(directory: Path, specs: dict[str, BrgemmSpec]) -> tuple[cffi.FFI, object]:
    """One translation unit: each spec's kernel behind `run_NAME` (a call within a call of the
    generated function) and `enter` (a new call of it)."""
    directory.mkdir()
    ffi = cffi.FFI()
    sources = []
    for name, spec in specs.items():
        mk = choose_microkernel(spec, "avx512amx", f"_pd_{name}")
        sources.append(entry_source(mk, f"run_{name}", enter=False))
        ffi.cdef(f"void run_{name}(const void *a, const void *b, void *c);")
    sources.append(f"void enter(void)\n{{\n{COUNT_CALL}}}\n")
    ffi.cdef("void enter(void);")
    out = directory / "amx.so"
    proc = gcc(sources, out, link=True)
    output, _ = proc.communicate()
    assert proc.returncode == 0, output[:5000]
    lib = ffi.dlopen(str(out))
    _LOADED.append((ffi, lib))
    return ffi, lib


@pytest.mark.skipif(not RUNNABLE["avx512amx"], reason="needs a CPU with AMX-BF16")
def test_amx_kernels_keep_and_reload_tile_configurations(tmp_path: Path) -> None:
    """Calls within one call of the generated function alternate kernels of one configuration
    each (kept loaded between calls), of two (which release the tiles) and, across a new call,
    a kernel of another library that loads its own: every result matches the reference."""
    specs = {"rows28": replace(CONV16, m=28, dtype="bfloat16"),
             "wide": spec_for((16, 32, 32), "dense", "two", dtype="bfloat16"),
             "rows80": replace(CONV16, m=80, dtype="bfloat16")}
    ffi, lib = _amx_library(tmp_path / "one", specs)
    other_ffi, other = _amx_library(tmp_path / "two", {"rows7": replace(CONV16, m=7, dtype="bfloat16")})
    rng = np.random.default_rng(0)

    def run(ffi: cffi.FFI, library: object, name: str, spec: BrgemmSpec) -> None:
        a, b, c = random_operands(spec, rng)
        want = reference(spec, a, b, c)
        getattr(library, f"run_{name}")(*pointers(ffi, (a, b, c)))
        assert_matches(spec, c, want, name)

    lib.enter()
    for name in ("rows28", "rows28", "wide", "rows28", "rows80", "rows28", "wide"):
        run(ffi, lib, name, specs[name])
    other.enter()
    run(other_ffi, other, "rows7", replace(CONV16, m=7, dtype="bfloat16"))
    lib.enter()
    run(ffi, lib, "rows28", specs["rows28"])


# bf16 specs whose B rows pair up (`BrgemmSpec.b_pairs`): every batch and block stride of B is
# an even number of rows. A blocked conv call (batch merged into k: chunks across batch steps),
# one over two blocks of n, and a GEMM panel three tile columns wide with a ragged m.
PAIRED_SPECS = {
    "conv16": replace(CONV16, m=28, dtype="bfloat16"),
    "blocks": replace(CONV16, m=14, dtype="bfloat16", n_blocks=2, b_nb=4 * 9 * 256, c_nb=28 * 16,
                      c_m=16, batch=CONV16.batch[:1]),
    "gemm": BrgemmSpec(m=37, n=48, k=30, a_m=30, a_k=1, b_k=64, b_n=1, c_m=48, c_n=1,
                       dtype="bfloat16"),
}


def in_pairs(spec: BrgemmSpec, b: Operand) -> Operand:
    """B in k pairs: its rows of b_k elements, counted from the kernel's pointer, taken two at
    a time and interleaved (what the generated function's copy holds)."""
    row = spec.b_k
    values = b.buffer[b.base:]
    rows = -(-len(values) // (2 * row)) * 2
    flat = np.zeros(rows * row, np.uint16)
    flat[:len(values)] = values
    return Operand(flat.reshape(rows // 2, 2, row).transpose(0, 2, 1).reshape(-1).copy(), 0)


def _paired_library(directory: Path, kernels: dict[str, Microkernel]) -> tuple[cffi.FFI, object]:
    directory.mkdir()
    ffi = cffi.FFI()
    for name in kernels:
        ffi.cdef(f"void run_{name}(const void *a, const void *b, void *c);")
    out = directory / "pairs.so"
    proc = gcc([entry_source(mk, f"run_{name}") for name, mk in kernels.items()], out, link=True)
    output, _ = proc.communicate()
    assert proc.returncode == 0, output[:5000]
    lib = ffi.dlopen(str(out))
    _LOADED.append((ffi, lib))
    return ffi, lib


def _check_paired(ffi: cffi.FFI, lib: object, name: str, spec: BrgemmSpec) -> None:
    rng = np.random.default_rng(3)
    a, b, c = random_operands(spec, rng)
    want = reference(spec, a, b, c)  # B in its own layout
    pairs = in_pairs(spec, b)  # held through the call
    getattr(lib, f"run_{name}")(*pointers(ffi, (a, pairs, c)))
    assert_matches(spec, c, want, name)


def test_the_portable_kernel_reads_b_in_k_pairs(tmp_path: Path) -> None:
    """The AMX kernel's fallback where the OS refuses the tile state: portable C reading the
    pairs copy gives the product of B in its own layout."""
    kernels = {}
    for name, spec in PAIRED_SPECS.items():
        paired = replace(spec.one_block(), b_pairs=True)
        kernels[name] = Microkernel(
            name=f"_pd_{name}", spec=paired, backend="polydl", isa="scalar", form="portable",
            source=portable.render_portable_kernel(paired.normalized(), f"_pd_{name}", name))
    ffi, lib = _paired_library(tmp_path / "portable", kernels)
    for name, spec in PAIRED_SPECS.items():
        _check_paired(ffi, lib, name, spec.one_block())


def test_b_in_k_pairs_is_the_amx_kernels_alone() -> None:
    """Tiles load B in pairs in place: nothing is copied or permuted; a spec whose B rows
    cannot pair, or an ISA without tiles, is refused."""
    mk = choose_microkernel(replace(PAIRED_SPECS["conv16"], b_pairs=True), "avx512amx", "_pd_p")
    assert "_tile_dpbf16ps(" in mk.source and "_mm512_permutexvar_epi16" not in mk.source
    assert "_packed" not in mk.source.split("/* B in k pairs")[0].split("_vnni")[-1]
    assert f"{4 * CONV16.b_k});" in mk.source  # tile rows of pairs 2 * b_k elements apart
    with pytest.raises(ScheduleError, match="AMX kernel only"):
        choose_microkernel(replace(PAIRED_SPECS["conv16"], b_pairs=True), "avx512bf16", "_pd_p")
    with pytest.raises(ScheduleError, match="not in k pairs"):
        choose_microkernel(replace(PAIRED_SPECS["conv16"], b_pairs=True), "avx512amx", "_pd_p",
                           backend="libxsmm")
    with pytest.raises(ValueError, match="k pairs"):
        replace(PAIRED_SPECS["gemm"], k=31, b_pairs=True)
    with pytest.raises(ValueError, match="transposed"):
        replace(PAIRED_SPECS["gemm"], b_pairs=True).transposed()


@pytest.mark.skipif(not RUNNABLE["avx512amx"], reason="needs a CPU with AMX-BF16")
def test_amx_tiles_read_b_in_k_pairs(tmp_path: Path) -> None:
    kernels = {name: choose_microkernel(replace(spec, b_pairs=True), "avx512amx", f"_pd_{name}")
               for name, spec in PAIRED_SPECS.items()}
    ffi, lib = _paired_library(tmp_path / "amx", kernels)
    for name, spec in PAIRED_SPECS.items():
        _check_paired(ffi, lib, name, spec)


def test_bf16_dot_product_kernel_builds_with_mavx512bf16(tmp_path: Path) -> None:
    """The whole kernel, compiled for a CPU with AVX-512 BF16, issues vdpbf16ps."""
    mk = choose_microkernel(replace(CONV, dtype="bfloat16"), "avx512bf16", "_pd_dp")
    c_file = tmp_path / "k.c"
    c_file.write_text(entry_source(mk, "entry"))
    asm = tmp_path / "k.s"
    subprocess.run([GCC, "-O3", "-mavx512f", "-mavx512bf16", "-Wall", "-Werror", "-S", str(c_file),
                    "-o", str(asm)], check=True)
    text = asm.read_text()
    assert "vdpbf16ps" in text and "vpermw" in text
    assert not [line for line in text.splitlines() if "%zmm" in line and "(%rsp)" in line]


@pytest.mark.parametrize("case", BLOCK_CASES)
def test_conv_and_gemm_blocks(library: KernelLibrary, case: Case) -> None:
    check(library, case)


@pytest.mark.parametrize("case", N_BLOCKS_CASES)
def test_several_n_blocks(library: KernelLibrary, case: Case) -> None:
    check(library, case)


def test_n_blocks_share_one_register_tile() -> None:
    """7 rows of one 16-lane block are 7 accumulators, too few for two FMA pipes of 4 cycles'
    latency; over 4 blocks the register tile spans several blocks, each broadcast of A
    feeding one FMA per block."""
    one = choose_microkernel(blocked_conv(7, 16, 1), "avx512", "k")
    four = choose_microkernel(blocked_conv(7, 16, 4, c_gap=33), "avx512", "k")
    assert (one.mr, one.nr) == (7, 16)
    assert four.form == "outer-n" and four.mr == 7 and four.nr in (32, 48, 64)
    assert four.estimated_cycles < 4 * one.estimated_cycles
    assert "16x4 blocks" in four.describe()
    # no register tile across blocks: one call per block, said so
    ragged = choose_microkernel(blocked_conv(7, 12, 3, c_gap=7), "avx512", "k")
    assert "one call per block" in ragged.source
    # adjacent blocks are one wider n
    adjacent = blocked_conv(7, 16, 4)
    wide = replace(adjacent, b_nb=16, b_k=64, c_nb=16, c_m=64,
                   batch=tuple(replace(d, b_stride=d.b_stride * 4) for d in adjacent.batch))
    assert wide.normalized().n == 64 and wide.normalized().n_blocks == 1
    with pytest.raises(ValueError):
        replace(adjacent, c_nb=16)  # blocks overlapping in C


# --- decisions ------------------------------------------------------------------------------


def test_forms_follow_the_strides() -> None:
    shape = (17, 31, 20)
    forms = {lay: choose_microkernel(spec_for(shape, lay, "one"), "avx2", "k").form
             for lay in LAYOUTS}
    assert forms == {"dense": "outer-n", "padded": "outer-n", "m-major": "outer-m",
                     "nt": "dot-k", "strided": "portable", "negative": "outer-n"}
    scalar = choose_microkernel(spec_for(shape, "dense", "one"), "scalar", "k")
    assert scalar.form == "portable" and scalar.isa == "scalar"
    assert "immintrin" not in scalar.source and "__attribute__" not in scalar.source


@pytest.mark.parametrize("isa, registers", [("avx2", 16), ("avx512", 32)])
@pytest.mark.parametrize("m, n", [(28, 64), (64, 256), (7, 48), (100, 16), (3, 3)])
def test_register_tile_fits_the_register_file(isa: str, registers: int, m: int, n: int) -> None:
    spec = BrgemmSpec(m=m, n=n, k=64, a_m=64, a_k=1, b_k=n, b_n=1, c_m=n, c_n=1)
    unit = VECTOR_UNITS[isa]
    blocking = choose_outer_product(spec.normalized(), unit)
    assert blocking.rows * blocking.vectors + blocking.vectors + 1 <= registers
    mk = choose_microkernel(spec, isa, "k")
    assert mk.form == "outer-n"
    assert (mk.mr, mk.nr) == (blocking.rows, blocking.vectors * blocking.lanes)


def test_blocking_for_the_conv_and_gemm_blocks() -> None:
    # AVX2: 12 accumulators (6 rows x 2 vectors) cover these shapes without waste;
    # AVX-512 keeps at least 24 of its 32 registers accumulating.
    for spec in (CONV, GEMM):
        avx2 = choose_microkernel(spec, "avx2", "k")
        assert avx2.mr * avx2.nr // 8 == 12
        avx512 = choose_microkernel(spec, "avx512", "k")
        assert avx512.mr * avx512.nr // 16 >= 24


@pytest.mark.parametrize("isa", VECTOR_ISAS)
@pytest.mark.parametrize("lay, dtype", [("dense", "float32"), ("nt", "float32"),
                                        ("m-major", "float32"), ("dense", "bfloat16"),
                                        ("nt", "bfloat16"), ("dense", "float64")])
@pytest.mark.slow
def test_register_tile_does_not_spill(lay: str, dtype: str, isa: str, tmp_path: Path) -> None:
    """The accumulators stay in registers: no vector register goes to or from the stack."""
    mk = choose_microkernel(spec_for((64, 96, 64), lay, "one", dtype=dtype), isa, "_pd_spill")
    c_file = tmp_path / "k.c"
    c_file.write_text(entry_source(mk, "entry"))
    asm = tmp_path / "k.s"
    subprocess.run([GCC, "-O3", "-S", str(c_file), "-o", str(asm)], check=True)
    register = "%zmm" if isa == "avx512" else "%ymm"
    spills = [line for line in asm.read_text().splitlines()
              if register in line and ("(%rsp)" in line or "(%rbp)" in line)]
    assert not spills, "\n".join(spills[:10])


def test_normalisation_merges_loops() -> None:
    spec = BrgemmSpec(m=4, n=8, k=16, a_m=16, a_k=1, b_k=8, b_n=1, c_m=8, c_n=1,
                      batch=(BatchDim(2, 3 * 64, 3 * 128), BatchDim(3, 64, 128),
                             BatchDim(1, 5, 5), BatchDim(4, 16, 128)))
    s = spec.normalized()
    # the extent-1 loop vanishes, the last continues k, then (2, 3) collapse into one loop
    assert s.k == 64 and s.batch == (BatchDim(6, 64, 128),)
    assert s.flops == spec.flops
    assert spec.transposed().transposed() == spec


def test_invalid_specs() -> None:
    with pytest.raises(ValueError):
        BrgemmSpec(m=2, n=2, k=1, a_m=1, a_k=1, b_k=1, b_n=1, c_m=1, c_n=1)  # C cells overlap
    with pytest.raises(ValueError):
        spec_for((2, 2, 2), "dense", "none", beta=0.5)
    with pytest.raises(ValueError):
        spec_for((2, 2, 2), "dense", "none", dtype="int8")
    with pytest.raises(ValueError):
        choose_microkernel(spec_for((2, 2, 2), "dense", "none"), "neon", "k")
    with pytest.raises(ScheduleError):
        choose_microkernel(spec_for((2, 2, 2), "dense", "none"), "avx2", "k", backend="mkl")


# --- LIBXSMM --------------------------------------------------------------------------------

needs_libxsmm = pytest.mark.skipif(not libxsmm_available(), reason="libxsmm is not installed")


@needs_libxsmm
@pytest.mark.parametrize("case", LIBXSMM_CASES)
def test_libxsmm_backend(library: KernelLibrary, case: Case) -> None:
    mk = check(library, case)
    assert mk.backend == "libxsmm" and "-lxsmm" in mk.link_flags


@needs_libxsmm
@pytest.mark.parametrize("lay, dtype", [("strided", "float32"), ("nt", "float32"),
                                        ("m-major", "float32"), ("negative", "float32"), ("dense", "bfloat16")])
def test_libxsmm_refuses_what_it_cannot_express(lay: str, dtype: str) -> None:
    with pytest.raises(ScheduleError):
        choose_microkernel(spec_for((8, 8, 8), lay, "one", dtype=dtype), "avx2", "k",
                           backend="libxsmm")


def test_auto_is_polydls_own_kernel() -> None:
    for lay in LAYOUTS:
        mk = choose_microkernel(spec_for((8, 8, 8), lay, "one"), "avx2", "k", backend="auto")
        assert mk.backend == "polydl" and mk.link_flags == ()


def test_one_vector_wide_tiles_keep_their_broadcasts_in_registers(tmp_path: Path) -> None:
    """A 7 x 7 / 2 stem's call: one 16-channel block, rows 2 floats apart, k = 7 over 3 x 7
    batches. gcc keeps each row's broadcast A element in a register through the unrolled k
    steps, so rows past 8 are priced as spills: 8-row tiles, no zmm stack traffic (28-row
    tiles made 131 stack moves and ran 0.7x as fast)."""
    spec = BrgemmSpec(m=64, n=16, k=7, a_m=2, a_k=1, b_k=16, b_n=1, c_m=16, c_n=1,
                      batch=(BatchDim(3, 230 * 230, 7 * 7 * 16), BatchDim(7, 230, 7 * 16)))
    blocking = choose_outer_product(spec.normalized(), VECTOR_UNITS["avx512"])
    assert (blocking.rows, blocking.vectors) == (8, 1)
    # wider tiles keep the budget of the whole register file (6 x 4 on 32 registers), and so
    # do one-vector tiles whose B (36 KiB over a 3 x 3 window of 4 blocks) more tiles would
    # read again from L2 (ran 136 against 210 GFLOP/s in 8-row tiles)
    assert choose_outer_product(GEMM.normalized(), VECTOR_UNITS["avx512"]).accumulators >= 24
    assert choose_outer_product(CONV16.normalized(), VECTOR_UNITS["avx512"]).rows >= 28
    mk = choose_microkernel(spec, "avx512", "_pd_stem")
    c_file = tmp_path / "k.c"
    c_file.write_text(entry_source(mk, "entry"))
    asm = tmp_path / "k.s"
    subprocess.run([GCC, "-O3", "-S", str(c_file), "-o", str(asm)], check=True)
    spills = [line for line in asm.read_text().splitlines()
              if "%zmm" in line and ("(%rsp)" in line or "(%rbp)" in line)]
    assert not spills, "\n".join(spills[:10])


def test_rows_of_a_stay_within_the_l1_sets() -> None:
    """Rows of A 4 KiB apart fall in one L1 set: a register tile reads no more of them than
    the set has ways but one (4096 x 16 x 1024 on two Zen 4 cores ran 20 GFLOP/s in tiles
    of 28 rows, 180 in 6); rows that spread over the sets keep the whole register file."""
    assert lines_per_set(4096, 28) == 28 and lines_per_set(12288, 5) == 5
    assert lines_per_set(2048, 14) == 7 and lines_per_set(4160, 28) == 1
    assert lines_per_set(4, 28) == 1  # rows in one line (A packed in panels)
    unit = VECTOR_UNITS["avx512"]
    skinny = BrgemmSpec(m=64, n=16, k=1024, a_m=1024, a_k=1, b_k=16, b_n=1, c_m=16, c_n=1)
    assert choose_outer_product(skinny, unit, 32 * 1024).rows == 7  # 8 ways
    assert choose_outer_product(skinny, unit, 48 * 1024).rows == 11  # 12 ways
    assert choose_outer_product(replace(skinny, a_m=1040), unit, 32 * 1024).rows >= 16
    # A read down its columns (a k stride of a line or more): no line serves two k steps
    by_column = replace(skinny, a_m=1, a_k=64)
    assert choose_outer_product(by_column, unit, 32 * 1024).rows >= 16
    # the code generator passes the target's L1 down to the kernel
    small_l1 = choose_microkernel(ALIASED_A, "avx512", "k", l1_bytes=32 * 1024)
    large_l1 = choose_microkernel(ALIASED_A, "avx512", "k", l1_bytes=48 * 1024)
    assert small_l1.mr <= 7 < large_l1.mr <= 11


# A strided 1 x 1 layer's call on a 56 x 56 input (256 -> 128 channels, stride 2, blocked):
# 28 output columns two input columns apart, 8 output-channel blocks, 16 input-channel blocks
# 49 pages apart: each row's 16 lines of A share one L1 set.
STRIDED_1X1 = BrgemmSpec(m=28, n=16, k=16, a_m=32, a_k=1, b_k=16, b_n=1, c_m=16, c_n=1,
                         batch=(BatchDim(16, 56 * 56 * 16, 256),), n_blocks=8, b_nb=16 * 256,
                         c_nb=28 * 28 * 16)


def test_rows_of_a_that_thrash_the_l1_sets_take_wide_register_tiles(tmp_path: Path) -> None:
    """On 12 ways, every vector strip of B reads such rows of A from L2 again: fewer, wider
    strips (6 x 4) read them half as often as 14 x 2 (measured 0.84-0.89 of its time on 16
    Sapphire Rapids cores). On 8 ways the ranking tiles such a batch instead, and the tile
    stays. Rows that share lines across the batch (a 3 x 3 window) are left alone."""
    unit = VECTOR_UNITS["avx512"]
    assert a_lines_missed(STRIDED_1X1, 48 * 1024) == 16
    assert a_lines_missed(STRIDED_1X1, 32 * 1024) == 0
    assert a_lines_missed(replace(STRIDED_1X1, batch=(BatchDim(8, 56 * 56 * 16, 256),)),
                          48 * 1024) == 0  # 8 lines a set: within the ways
    assert a_lines_missed(blocked_conv(14, 16, 8), 48 * 1024) == 0
    wide = choose_outer_product(STRIDED_1X1, unit, 48 * 1024)
    assert (wide.rows, wide.vectors) == (6, 4)
    assert (choose_outer_product(STRIDED_1X1, unit, 32 * 1024).rows,
            choose_outer_product(STRIDED_1X1, unit, 32 * 1024).vectors) == (14, 2)
    mk = choose_microkernel(STRIDED_1X1, "avx512", "_pd_wide", l1_bytes=48 * 1024)
    assert (mk.mr, mk.nr) == (6, 64)
    if not RUNNABLE["avx512"]:
        pytest.skip("no AVX-512 here: the kernel's result is checked where it runs")
    ffi, lib = _paired_library(tmp_path / "wide", {"wide": mk})
    rng = np.random.default_rng(5)
    a, b, c = random_operands(STRIDED_1X1, rng)
    want = reference(STRIDED_1X1, a, b, c)
    lib.run_wide(*pointers(ffi, (a, b, c)))  # type: ignore[attr-defined]
    assert_matches(STRIDED_1X1, c, want, "wide")


def test_avx2_blocking_keeps_a_register_spare() -> None:
    """4 x 3 (all 16 ymm registers) measured slower than 6 x 2 on a 131-wide GEMM: a ragged
    n is covered by 6 x 2 tiles and a narrower tail tile instead."""
    spec = BrgemmSpec(m=66, n=131, k=509, a_m=509, a_k=1, b_k=131, b_n=1, c_m=131, c_n=1)
    blocking = choose_outer_product(spec, VECTOR_UNITS["avx2"])
    assert blocking.accumulators + blocking.vectors + 2 <= 16
    assert (blocking.rows, blocking.vectors) == (6, 2)


def test_avx2_tiles_leave_the_fma_chains_slack() -> None:
    """A 1 x 1 layer's call over 56 columns and 8 output-channel blocks: 4 x 2 tiles (8
    chains, exactly two pipes times 4 cycles) divide 56, yet ran 0.88-0.94x the speed of
    6 x 2 tiles and a 2 x 2 edge on Zen 3; with the unit's chain slack the code generator
    takes the latter, while the ranking's step (no slack) prices both alike."""
    unit = VECTOR_UNITS["avx2"]
    assert unit.chain_slack >= 1
    spec = blocked_conv(56, 16, 8)
    mk = choose_microkernel(spec, "avx2", "k")
    assert (mk.mr, mk.nr) == (6, 16)
    assert step_cycles(unit, 8, 6) == step_cycles(unit, 12, 8) / 1.5  # both at the peak, unslacked
    assert step_cycles(unit, 8, 6, slack=True) > step_cycles(unit, 12, 8, slack=True) / 1.5


@pytest.mark.parametrize("m, rows, block", [(56, 48, 28), (64, 48, 32), (50, 32, 25), (28, 48, 28),
                                            (80, 48, 48), (112, 48, 48), (128, 32, 32)])
def test_amx_row_blocks_of_one_height_where_no_more_tiles(m: int, rows: int, block: int) -> None:
    """Equal blocks of C rows (one tile configuration) only where they take as many blocks
    and tiles as full blocks and a remainder (80 rows in 2 x 40 would be 6 tiles, not 5)."""
    assert amx.row_block(m, rows) == block
