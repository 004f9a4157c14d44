"""The cost model reads the target's bandwidths and fork and join: a ranking decision follows
each, with nothing else of the target changed."""

from dataclasses import replace

from polydl.frontends import builders
from polydl.poly.model import build_model
from polydl.schedules.cpu.rank import rank
from polydl.target import CpuTarget

MANY = CpuTarget(isa="avx512", cores=16, l1_bytes=48 * 1024, l2_bytes=2 * 1024 * 1024)
TWO = CpuTarget(isa="avx2", cores=2, l1_bytes=32 * 1024, l2_bytes=512 * 1024, l3_bytes=8 << 20)


def test_a_cheap_fork_splits_a_small_gemm_over_the_cores() -> None:
    """64 x 64 x 64 on 16 cores: at the default fork and join (13000 cycles) one call on one
    core; at 1000 cycles row tiles in parallel."""
    model = build_model(*builders.matmul(64, 64, 64))
    assert MANY.fork_join_cycles == 13000.0
    dear = rank(model, MANY)[0].schedule
    cheap = rank(model, replace(MANY, fork_join_cycles=1000.0))[0].schedule
    assert dear.microkernel is not None and not dear.parallel
    assert cheap.microkernel is not None and cheap.parallel


def test_fast_memory_puts_the_row_blocks_outside() -> None:
    """256 x 1024 x 1024 on two AVX2 cores over a packed B: at 8 bytes a cycle from memory the
    n blocks are the outer (parallel) loop, each thread's B blocks read once; at 64 the m
    blocks, whose A blocks then stay in L2 across the n blocks."""
    model = build_model(*builders.matmul(256, 1024, 1024))
    slow = rank(model, TWO)[0].schedule
    fast = rank(model, replace(TWO, memory_bytes_per_cycle=64.0))[0].schedule
    assert slow.parallel == ("j.t",) and fast.parallel == ("i.t",)

