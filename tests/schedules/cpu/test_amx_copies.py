"""bf16 calls on AMX: the kernel copies B into k pairs at every call unless the thread's previous
call read the same constant B, or the calls read one copy of B in k pairs made before the nest
(`amx_pairs.py`); the ranking counts those copies, and a strided bf16 B is copied into
unit-stride blocks before the calls (`MicrokernelBinding.pack_b`)."""

from dataclasses import replace

from polydl.frontends import builders
from polydl.poly.model import build_model
from polydl.schedules.cpu.amx_pairs import PairedB, pairable_b, pairs_b
from polydl.schedules.cpu.cost import amx_repacked_bytes
from polydl.schedules.cpu.rank import rank
from polydl.schedules.schedule import MicrokernelBinding, Schedule
from polydl.target import CpuTarget

AMX = CpuTarget(isa="avx512amx", cores=16)
CALL = MicrokernelBinding("S0", m="q", n="k", k="c", batch=("cb", "r", "s"))
INNER = ("cb", "r", "s", "q", "k", "c")


def _conv(dtype: str, n: int = 2, c: int = 64, k: int = 256, hw: int = 8, layout: str = "nchw16c",
          kept: bool = False) -> object:
    # rows of 8: a call over one row (7 x 7 layers run their positions as one loop)
    nest, params = builders.conv2d(N=n, C=c, K=k, H=hw, W=hw, R=1, S=1, layout=layout,
                                   dtype=dtype)
    return build_model(nest.keeping(("w",)) if kept else nest, params)


def test_a_copy_serves_the_calls_until_the_weights_block_changes() -> None:
    model = _conv("bfloat16")
    per_call = 16 * 16 * 4 * 2  # a 16 x 16 block of bf16 weights per input-channel block, 4 blocks
    blocks_outside = Schedule(order=("n", "kb", "p") + INNER, microkernel=CALL)
    blocks_inside = Schedule(order=("n", "p", "kb") + INNER, microkernel=CALL)
    # one copy per image and block; with the blocks innermost, one per call (8 rows more)
    assert amx_repacked_bytes(model, AMX, blocks_outside, blocks_outside.order) == 2 * 16 * per_call
    assert amx_repacked_bytes(model, AMX, blocks_inside, blocks_inside.order) == 2 * 8 * 16 * per_call
    images_inside = Schedule(order=("kb", "p", "n") + INNER, microkernel=CALL)
    assert amx_repacked_bytes(model, AMX, images_inside, images_inside.order) == 16 * per_call


def test_only_amx_bf16_calls_copy() -> None:
    schedule = Schedule(order=("n", "p", "kb") + INNER, microkernel=CALL)
    assert amx_repacked_bytes(_conv("float32"), AMX, schedule, schedule.order) == 0
    avx512 = CpuTarget(isa="avx512bf16", cores=16)
    assert amx_repacked_bytes(_conv("bfloat16"), avx512, schedule, schedule.order) == 0


def test_a_wide_or_packed_b_is_copied_at_every_call() -> None:
    nest, params = builders.matmul(M=256, N=256, K=64, dtype="bfloat16")
    model = build_model(nest, params)
    call = MicrokernelBinding("S0", m="i", n="j", k="k")
    wide = Schedule(order=("j.t", "i.t", "i", "j", "k"), tiles=(("i", 64), ("j", 64)), microkernel=call)
    # 4 x 4 calls, each copying its 64 x 64 block of B: more than one block of tile columns
    assert amx_repacked_bytes(model, AMX, wide, wide.order) == 16 * 64 * 64 * 2
    narrow = Schedule(order=("j.t", "i.t", "i", "j", "k"), tiles=(("i", 64), ("j", 32)),
                      microkernel=call)
    assert amx_repacked_bytes(model, AMX, narrow, narrow.order) == 8 * 64 * 32 * 2


def test_amx_ranking_keeps_the_weights_block_across_consecutive_calls() -> None:
    """ResNet-50's res5_1x1c at N=2 (then calls over one 7-wide row): with the output-channel
    blocks the innermost loop outside the calls, every call copied its weights again and ran
    1.74x as long on 16 cores."""
    model = _conv("bfloat16", c=512, k=2048)
    best = rank(model, AMX)[0].schedule
    outer = [loop for loop in best.order if loop not in INNER]
    assert outer[-1] in ("p", "n")  # rows or images follow the blocks: the copy is reused
    fp32_best = rank(_conv("float32", c=512, k=2048), AMX)[0].schedule
    assert amx_repacked_bytes(_conv("float32", c=512, k=2048), AMX, fp32_best, fp32_best.order) == 0


def test_weights_kept_between_calls_are_read_in_k_pairs() -> None:
    """With the images outside the blocks, every image's calls copy every block of weights
    again. Weights the caller keeps are copied in k pairs (rows of 16 output channels paired)
    at the first call instead; weights given anew at each call are not."""
    images_outside = Schedule(order=("n", "kb", "p") + INNER, microkernel=CALL)
    model = _conv("bfloat16", n=8)
    weights = 256 * 64 * 2
    assert amx_repacked_bytes(model, AMX, images_outside, images_outside.order) == 8 * weights
    assert pairable_b(model, images_outside) == PairedB("w", 16, 256 * 64, kept=False)
    assert pairs_b(model, AMX, images_outside) is None
    kept = _conv("bfloat16", n=8, kept=True)
    assert pairs_b(kept, AMX, images_outside) == PairedB("w", 16, 256 * 64, kept=True)
    # the ranking still prices the calls' own copies: the choice is the one without keeping
    assert rank(kept, AMX)[0].schedule == rank(model, AMX)[0].schedule


def test_only_amx_calls_on_pairable_weights_read_them_in_pairs() -> None:
    schedule = Schedule(order=("n", "kb", "p") + INNER, microkernel=CALL)
    model = _conv("bfloat16", n=8)
    kept = _conv("bfloat16", n=8, kept=True)
    assert pairs_b(kept, CpuTarget(isa="avx512bf16", cores=16), schedule) is None
    assert pairable_b(_conv("float32", n=8), schedule) is None
    # weights packed by the schedule, or read through LIBXSMM, are not the kernel's to pair
    for call in (replace(CALL, pack_b=True), replace(CALL, backend="libxsmm")):
        assert pairable_b(model, replace(schedule, microkernel=call)) is None
    # channels-last weights run along the input channels: rows of k are not rows of n
    nhwc = _conv("bfloat16", n=8, layout="nhwc")
    call = MicrokernelBinding("S0", m="q", n="k", k="c", batch=("r", "s"))
    flat = Schedule(order=("n", "p", "k.t", "r", "s", "q", "k", "c"), tiles=(("k", 64),), microkernel=call)
    assert pairable_b(nhwc, flat) is None
    # an odd number of rows along k
    gemm_call = MicrokernelBinding("S0", m="i", n="j", k="k")
    for k, paired in ((31, None), (30, PairedB("B", 64, 30 * 64, kept=False))):
        nest, params = builders.matmul(M=64, N=64, K=k, dtype="bfloat16")
        whole = Schedule(order=("i", "j", "k"), microkernel=gemm_call)
        assert pairable_b(build_model(nest, params), whole) == paired
