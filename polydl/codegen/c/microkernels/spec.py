"""What a batch-reduce GEMM microkernel computes (`BrgemmSpec`) and what codegen gets back
(`Microkernel`: a self-contained C function plus what it needs to link).

A spec is a value: every size and stride is a compile-time constant of the generated code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from polydl.schedules.postops import PostOps
from polydl.schedules.strides import distinct_blocks

# dtype -> (C type of A and B elements, C type of C elements and of the arithmetic)
ELEMENT_TYPES: dict[str, tuple[str, str]] = {
    "float32": ("float", "float"),
    "float64": ("double", "double"),
    "bfloat16": ("uint16_t", "float"),  # bf16 bits in, fp32 accumulation and output
}


@dataclass(frozen=True)
class BatchDim:
    """One reduction loop outside k that forms the batch; strides in elements."""

    extent: int
    a_stride: int
    b_stride: int


@dataclass(frozen=True)
class BrgemmSpec:
    """For every batch index tuple (i_0, ..., i_d), with a_off = sum i_d * a_stride_d and
    b_off likewise: `c[jb*c_nb + mm*c_m + nn*c_n] (+)= sum_kk a[a_off + mm*a_m + kk*a_k] *
    b[b_off + jb*b_nb + kk*b_k + nn*b_n]` for mm < m, nn < n, kk < k and jb < n_blocks.
    beta 1.0 accumulates into C, beta 0.0 overwrites it.

    `n_blocks` > 1 makes the columns of C `n_blocks` blocks of n, each at its own offset in B
    and C (a convolution's output-channel blocks in a blocked layout): one broadcast of A feeds
    the vectors of every block, where a call per block would broadcast it again.

    `b_pairs` gives B in k pairs (the order AMX tiles read): B's rows of `b_k` elements taken
    two at a time and interleaved, element (kk, nn) at
    `b[b_off + jb*b_nb + (kk - kk % 2)*b_k + 2*nn + kk % 2]` (b_n is 1, k and every batch and
    block stride of B even in rows: a copy made once for many calls, `schedules/cpu/amx_pairs.py`)."""

    m: int
    n: int
    k: int
    a_m: int
    a_k: int
    b_k: int
    b_n: int
    c_m: int
    c_n: int
    batch: tuple[BatchDim, ...] = ()
    dtype: str = "float32"
    beta: float = 1.0
    # The fused epilogue, applied to each C cell right before its store (None: plain store).
    postops: PostOps | None = None
    # A packed in panels of `a_panel_rows` rows (0: not packed): register tiles are exactly
    # that many rows (the last fewer), and the tile of rows m0.. starts at a + m0 * a_panel_m
    # (within it row i, step kk at i * a_m + kk * a_k).
    a_panel_rows: int = 0
    a_panel_m: int = 0
    n_blocks: int = 1
    b_nb: int = 0
    c_nb: int = 0
    b_pairs: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.batch, tuple):
            object.__setattr__(self, "batch", tuple(self.batch))
        if self.dtype not in ELEMENT_TYPES:
            raise ValueError(f"unknown microkernel dtype '{self.dtype}'; known: {', '.join(ELEMENT_TYPES)}")
        if self.beta not in (0.0, 1.0):
            raise ValueError(f"beta must be 0.0 (overwrite C) or 1.0 (accumulate), not {self.beta}")
        for name in ("m", "n", "k"):
            if getattr(self, name) < 1:
                raise ValueError(f"brgemm size {name}={getattr(self, name)} must be at least 1")
        if any(d.extent < 0 for d in self.batch):
            raise ValueError("batch extents must not be negative")
        if self.a_panel_rows < 0 or (self.a_panel_rows and self.batch):
            raise ValueError("A panels need a positive row count and no batch")
        if self.n_blocks < 1 or (self.n_blocks > 1 and self.a_panel_rows):
            raise ValueError("n blocks need a positive count and no A panels")
        if self.b_pairs and (self.b_n != 1 or self.k % 2 or self.dtype != "bfloat16"):
            raise ValueError("B in k pairs needs bfloat16, b_n 1 and an even k")
        if not _distinct_cells(self.m, self.c_m, self.n, self.c_n):
            raise ValueError(
                f"C strides c_m={self.c_m}, c_n={self.c_n} map two (m, n) cells to one element"
            )
        if self.n_blocks > 1 and not distinct_blocks(self.m, self.c_m, self.n, self.c_n,
                                                      self.n_blocks, self.c_nb):
            raise ValueError(f"C's block stride c_nb={self.c_nb} makes two blocks share a cell")

    @property
    def input_ctype(self) -> str:
        return ELEMENT_TYPES[self.dtype][0]

    @property
    def output_ctype(self) -> str:
        return ELEMENT_TYPES[self.dtype][1]

    @property
    def compute_dtype(self) -> str:
        return "float64" if self.dtype == "float64" else "float32"

    @property
    def batch_count(self) -> int:
        return math.prod(d.extent for d in self.batch)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.n_blocks * self.k * self.batch_count

    def one_block(self) -> BrgemmSpec:
        """The spec of block 0 alone (the others are the same at their offsets)."""
        return replace(self, n_blocks=1, b_nb=0, c_nb=0,
                       postops=self.postops.one_block() if self.postops else None)

    def transposed(self) -> BrgemmSpec:
        """The same computation seen as C^T[n][m] += B^T[n][k] * A^T[k][m]: A and B swap."""
        if self.n_blocks > 1:
            raise ValueError("a spec of several n blocks has no transposed form")
        if self.b_pairs:
            raise ValueError("a spec of B in k pairs has no transposed form")
        return replace(
            self,
            m=self.n,
            n=self.m,
            a_m=self.b_n,
            a_k=self.b_k,
            b_k=self.a_k,
            b_n=self.a_m,
            c_m=self.c_n,
            c_n=self.c_m,
            batch=tuple(BatchDim(d.extent, d.b_stride, d.a_stride) for d in self.batch),
            postops=self.postops.transposed() if self.postops else None,
        )

    def normalized(self, merge_k: bool = True) -> BrgemmSpec:
        """An equivalent spec with fewer loops: a stride along an extent-1 dimension is never
        used and becomes 1; extent-1 batch loops vanish; adjacent batch loops that step evenly
        merge into one; an innermost batch loop that continues k (its strides are k times
        those of k) merges into k; n blocks that continue n merge into n."""
        if self.n_blocks > 1 and _blocks_continue_n(self):
            return replace(self.one_block(), n=self.n * self.n_blocks).normalized(merge_k)
        if self.n_blocks == 1 and self.one_block() != self:
            return self.one_block().normalized(merge_k)
        m, n, k = self.m, self.n, self.k
        a_m = 1 if m == 1 else self.a_m
        c_m = 1 if m == 1 else self.c_m
        b_n = 1 if n == 1 else self.b_n
        c_n = 1 if n == 1 else self.c_n
        a_k = 1 if k == 1 else self.a_k
        b_k = 1 if k == 1 else self.b_k
        if any(d.extent == 0 for d in self.batch):
            return replace(self, a_m=a_m, c_m=c_m, b_n=b_n, c_n=c_n, a_k=a_k, b_k=b_k,
                           batch=(BatchDim(0, 0, 0),))
        dims: list[BatchDim] = []
        for d in self.batch:
            if d.extent == 1:
                continue
            if dims:
                outer = dims[-1]
                if outer.a_stride == d.extent * d.a_stride and outer.b_stride == d.extent * d.b_stride:
                    dims[-1] = BatchDim(outer.extent * d.extent, d.a_stride, d.b_stride)
                    continue
            dims.append(d)
        while merge_k and dims and dims[-1].a_stride == k * a_k and dims[-1].b_stride == k * b_k:
            k *= dims.pop().extent
        return replace(self, k=k, a_m=a_m, c_m=c_m, b_n=b_n, c_n=c_n, a_k=a_k, b_k=b_k,
                       batch=tuple(dims))


def _blocks_continue_n(spec: BrgemmSpec) -> bool:
    """Whether block jb's columns are columns n*jb.. of one wider n (in B, C and every
    post-op operand)."""
    n = spec.n
    operands = spec.postops.operands if spec.postops else ()
    return (not spec.b_pairs and spec.b_nb == n * spec.b_n and spec.c_nb == n * spec.c_n
            and all(o.nb == n * o.n for o in operands))


def _distinct_cells(m: int, c_m: int, n: int, c_n: int) -> bool:
    if m == 1 or n == 1:
        return (m == 1 or c_m != 0) and (n == 1 or c_n != 0)
    if abs(c_m) >= n * abs(c_n) > 0 or abs(c_n) >= m * abs(c_m) > 0:
        return True
    if m * n > 1 << 16:
        return False  # interleaved and too large to check: refuse rather than guess
    return len({i * c_m + j * c_n for i in range(m) for j in range(n)}) == m * n


@dataclass(frozen=True)
class Microkernel:
    """A generated batch-reduce GEMM: `source` defines
    `static void NAME(const T *restrict a, const T *restrict b, U *restrict c)` (T the input
    element type, U the output; helpers it needs are prefixed with NAME) and includes the
    headers it uses. `link_flags` are what the shared library must be linked with."""

    name: str
    source: str
    spec: BrgemmSpec
    backend: str  # "polydl" | "libxsmm"
    isa: str  # instruction set the code needs: one of polydl.target.cpu.ISAS
    form: str  # "outer-n" | "outer-m" | "dot-k" | "portable" | "libxsmm"
    mr: int = 1  # rows of C (m) in one register tile
    nr: int = 1  # columns of C (n) in one register tile
    unroll: int = 1  # k steps per loop iteration
    link_flags: tuple[str, ...] = ()
    estimated_cycles: float = 0.0  # the blocking model's estimate for one call
    counts_calls: bool = False  # reads `_pd_tile_generation`, which the caller bumps per call

    def describe(self) -> str:
        """One line for `polydl explain`."""
        s = self.spec
        n = f"{s.n}x{s.n_blocks} blocks" if s.n_blocks > 1 else f"{s.n}"
        shape = f"brgemm m={s.m} n={n} k={s.k} batch={s.batch_count} {s.dtype}"
        if self.backend == "libxsmm":
            return f"{shape}: LIBXSMM JIT ({self.form})"
        forms = {
            "outer-n": "outer products, vectors along n",
            "outer-m": "outer products, vectors along m (A, B swapped)",
            "dot-k": "dot products, vectors along k",
            "portable": "portable C",
        }
        return (
            f"{shape}: {self.isa} {forms[self.form]}, register tile {self.mr}x{self.nr}, "
            f"k unrolled {self.unroll}"
        )
