"""How a GEMM's operands lie in memory, as the GPU kernels copy them.

Takes a `GemmPlan` (its loops' strides in A, B and C); answers along which index each operand
runs, whether it runs in aligned vectors (16-byte copies, float4 loads, paired stores), and the
TMA views of its operands (`TensorMap`, or a `WindowMap` over a convolution's input). The tile
choice (`schedules.gpu.tiling`) and the kernels (`codegen.gpu`) both ask.
"""

from __future__ import annotations

from polydl.dtypes import DTYPES
from polydl.schedules.gpu.plans import GemmDim, GemmPlan, TensorMap, TmaOperands, WindowMap
from polydl.schedules.gpu.windows import window_map

TMA_MAX_RANK = 5


def contiguous_runs(plan: GemmPlan, operand: str, along: str, vec: int) -> bool:
    """Whether `vec` consecutive flat indices of the `along` loops ("m", "n" or "k"), from a
    multiple of vec, are `vec` consecutive, vec-aligned elements of `operand` ("a", "b", "c"):
    the innermost of those loops has unit stride, it and the loops around it that continue it
    in memory span an extent that vec divides, and every other stride of the operand, and its
    base offset, are multiples of vec."""
    dims = getattr(plan, along)
    if not dims or dims[-1].stride(operand) != 1:
        return False
    # inner loops that continue one another in memory (a 7 x 7 image's rows) form one run
    run, extent = 1, dims[-1].extent
    while run < len(dims) and dims[-run - 1].stride(operand) == extent:
        extent *= dims[-run - 1].extent
        run += 1
    if extent % vec:
        return False
    inner = dims[len(dims) - run:]
    others = [d.stride(operand) for d in plan.m + plan.n + plan.k + plan.batch
              if not any(d is x for x in inner)]
    base = {"a": plan.base_a, "b": plan.base_b, "c": plan.base_c}[operand]
    return all(x % vec == 0 for x in [base, *others])


def wgmma_b_major(plan: GemmPlan, vec: int = 8) -> str | None:
    """How the wgmma kernel copies B in 16-byte runs: "n" (contiguous along N) or "k" (along K,
    as a channels-last convolution's weights); None where A is not contiguous along K or B
    along neither."""
    if not contiguous_runs(plan, "a", "k", vec):
        return None
    if contiguous_runs(plan, "b", "n", vec):
        return "n"
    if contiguous_runs(plan, "b", "k", vec):
        return "k"
    return None


def operand_modes(plan: GemmPlan) -> tuple[str, str]:
    """Along which index each operand is contiguous: A "m" or "k", B "k" or "n"."""
    a_mode = "m" if plan.m[-1].stride_a == 1 and plan.k[-1].stride_a != 1 else "k"
    b_mode = "k" if plan.k[-1].stride_b == 1 and plan.n[-1].stride_b != 1 else "n"
    return a_mode, b_mode


def mma_vectors(plan: GemmPlan) -> tuple[int, int]:
    """Elements per copy of A and of B in the warp-level MMA kernel: 8 (16-byte runs) where the
    operand runs in aligned eights along the index it runs in memory (`operand_modes`), else 1."""
    a_mode, b_mode = operand_modes(plan)
    return (8 if contiguous_runs(plan, "a", a_mode, 8) else 1,
            8 if contiguous_runs(plan, "b", b_mode, 8) else 1)


def mma_vector(plan: GemmPlan) -> bool:
    """The warp-level MMA kernel copies both operands in 16-byte runs."""
    return mma_vectors(plan) == (8, 8)


def operand_runs(dims: tuple[GemmDim, ...], operand: str) -> list[tuple[int, int]]:
    """(extent, element stride) of `dims` for one operand, outermost first, a loop merged into
    the one inside it where its stride is the inner one's run (both 0 where the operand ignores
    them): loops that continue one another in memory (an image's p and q) are one run."""
    runs: list[tuple[int, int]] = []
    for d in reversed(dims):
        stride = d.stride(operand)
        if runs and stride == runs[-1][1] * runs[-1][0]:
            runs[-1] = (runs[-1][0] * d.extent, runs[-1][1])
        else:
            runs.append((d.extent, stride))
    return list(reversed(runs))


def _collapsed(dims: tuple[GemmDim, ...], operand: str) -> tuple[int, int] | None:
    """(extent, element stride) of `dims` read as one dimension of the operand: each loop's
    stride is the next inner one's stride times its extent."""
    runs = operand_runs(dims, operand)
    return runs[0] if len(runs) == 1 else None


def tma_operands(plan: GemmPlan, block_m: int = 64, block_n: int = 64, block_k: int = 64,
                 shape_a: tuple[int, ...] | None = None) -> TmaOperands | None:
    """TMA views of A (K-major) and B (N- or K-major), or None where the operands are not
    strided matrices that the tensor-memory accelerator can address: one contiguous dimension,
    16-byte aligned rows and base offsets, at most five dimensions. Given the shape of A's
    array, an A that is a sliding window over it (a channels-last convolution) is one too."""
    if plan.dtype_ab not in ("bfloat16", "float32"):
        return None
    tf32 = plan.dtype_ab == "float32"  # TF32 wgmma reads both operands K-major
    elem = DTYPES[plan.dtype_ab].bytes
    run = 16 // elem  # elements in 16 bytes
    if plan.base_a % run or plan.base_b % run:
        return None
    if 2 + len(plan.batch) > TMA_MAX_RANK:
        return None
    ak, am = _collapsed(plan.k, "a"), _collapsed(plan.m, "a")
    bk, bn = _collapsed(plan.k, "b"), _collapsed(plan.n, "b")
    # a batch loop one operand ignores (stride 0: NCHW images against the weights) is no
    # dimension of that operand's map
    a_batch = [d for d in plan.batch if d.stride_a]
    b_batch = [d for d in plan.batch if d.stride_b]
    batch_a = [d.stride_a for d in a_batch]
    batch_b = [d.stride_b for d in b_batch]
    names_a, names_b = tuple(f"z_{d.var}" for d in a_batch), tuple(f"z_{d.var}" for d in b_batch)
    extents_a, extents_b = tuple(d.extent for d in a_batch), tuple(d.extent for d in b_batch)
    a: TensorMap | WindowMap
    if ak and am and ak[1] == 1 and am[1] % run == 0:
        a = TensorMap((ak[0], am[0], *extents_a), (am[1] * elem, *(s * elem for s in batch_a)),
                      (block_k, block_m, *(1,) * len(a_batch)), ("k", "m", *names_a))
    else:
        window = window_map(plan, shape_a, block_m, block_k, elem) if shape_a else None
        if window is None:
            return None
        a = window
    if bk is None or bn is None or any(s % run or s <= 0 for s in batch_a + batch_b):
        return None
    ones = (1,) * len(b_batch)
    if bn[1] == 1 and bk[1] % run == 0 and not tf32:
        b = TensorMap((bn[0], bk[0], *extents_b), (bk[1] * elem, *(s * elem for s in batch_b)),
                      (64, block_k, *ones), ("n", "k", *names_b))
        major = "n"
    elif bk[1] == 1 and bn[1] % run == 0:
        b = TensorMap((bk[0], bn[0], *extents_b), (bn[1] * elem, *(s * elem for s in batch_b)),
                      (block_k, block_n, *ones), ("k", "n", *names_b))
        major = "k"
    else:
        return None
    if any(e >= 1 << 32 for e in a.extents + b.extents) or any(s >= 1 << 40 for s in a.strides + b.strides):
        return None
    return TmaOperands(a, b, major)
