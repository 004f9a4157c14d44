"""The CPU target: detection of this machine from OS facts, and hand-built targets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from polydl.errors import TargetError
from polydl.target import CpuTarget, host_target
from polydl.target.host import isa_from_flags


@pytest.mark.parametrize(
    "flags, isa",
    [
        ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"}, "avx512amx"),
        ({"avx512f", "avx512bw", "avx512vl", "amx_tile", "amx_bf16"}, "avx512"),  # AMX needs BF16
        ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx2", "fma"}, "avx512bf16"),
        ({"avx512f", "avx512bw", "avx512vl", "avx2", "fma"}, "avx512"),
        ({"avx512f", "avx2", "fma"}, "avx2"),  # AVX-512 without BW/VL is not used
        ({"avx2", "fma"}, "avx2"),
        ({"avx", "sse4_2"}, "scalar"),
        (set(), "scalar"),
    ],
)
def test_isa_from_cpu_flags(flags: set[str], isa: str) -> None:
    assert isa_from_flags(frozenset(flags)) == isa


def test_vector_lanes_follow_the_isa() -> None:
    assert CpuTarget(isa="avx512").vector_lanes("float32") == 16
    assert CpuTarget(isa="avx512").vector_lanes("bfloat16") == 32
    assert CpuTarget(isa="avx2").vector_lanes("float32") == 8
    assert CpuTarget(isa="avx2").vector_lanes("float64") == 4
    assert CpuTarget(isa="scalar").vector_lanes("float32") == 1


def test_unknown_isa_is_refused() -> None:
    with pytest.raises(TargetError, match="unknown ISA"):
        CpuTarget(isa="neon")


def test_key_changes_with_what_makes_a_schedule_transferable() -> None:
    base = CpuTarget(isa="avx2", cores=2)
    assert base.key() != CpuTarget(isa="avx2", cores=4).key()
    assert base.key() != CpuTarget(isa="avx2", cores=2, l2_bytes=2 * 1024 * 1024).key()
    assert base.key() == CpuTarget(isa="avx2", cores=2).key()


def test_this_machine_is_detected_once_and_sane() -> None:
    m = host_target()
    assert m is host_target()
    assert m.march != "native"  # a concrete name, meaningful on another machine
    assert m.tune != "native" and not (m.tune and m.tune == m.march)
    assert m.cores >= 1 and m.l1_bytes <= m.l2_bytes <= m.l3_bytes
    assert m.cache_line_bytes in (32, 64, 128)


BOUND_MAIN_THREAD = """
import os
import numpy as np
import polydl
from polydl.target.host import usable_cpus
before = len(os.sched_getaffinity(0))
kernel = polydl.matmul(M=256, N=256, K=32)
assert kernel.schedule.parallel, kernel.schedule.describe()
kernel(np.ones((256, 32), np.float32), np.ones((32, 256), np.float32))
print(before, len(os.sched_getaffinity(0)), usable_cpus())
"""


@pytest.mark.slow
def test_cores_survive_openmp_binding_the_main_thread(tmp_path: Path) -> None:
    """Under OMP_PROC_BIND the first parallel region binds the main thread to one core; the
    cores a later detection counts are still all the process's (its threads' union)."""
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("one CPU: nothing to bind away")
    env = {**os.environ, "OMP_PROC_BIND": "close", "OMP_PLACES": "cores",
           "OMP_NUM_THREADS": str(cpus), "POLYDL_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", BOUND_MAIN_THREAD], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    before, main_thread, usable = map(int, out)
    assert usable == before == cpus
    assert main_thread <= before  # (1 where the runtime binds the main thread)
