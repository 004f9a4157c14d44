"""Named targets: the CPUs and GPUs polydl is commonly built for, without the machine at hand.

Cache sizes are per core for L1 and L2 and what one core may count on of the shared L3; the core
counts are those of a typical server part (the ranking balances parallel loops over them). A
machine that differs is described exactly by `polydl machine --json` run on it (and its
bandwidths and fork cost by editing that description).
"""

from __future__ import annotations

from dataclasses import replace

from polydl.target.cpu import CpuTarget
from polydl.target.gpu import CDNA, HOPPER, GpuTarget

KIB, MIB = 1024, 1024 * 1024
# The cost models' bandwidths and fork and join: a typical x86 server core's, as the ranking was
# tuned with (none is measured per preset yet); `CpuTarget`'s defaults, so presets rank as before.
SERVER_CORE = CpuTarget(l1_bytes_per_cycle=64.0, l2_bytes_per_cycle=32.0,
                        memory_bytes_per_cycle=8.0, socket_copy_bytes_per_s=8e9,
                        fork_join_cycles=13000.0, barrier_cycles=6500.0,
                        core_transfer_bytes_per_cycle=4.0)

CPU_PRESETS: dict[str, CpuTarget] = {
    # AVX2 + FMA: Haswell to Alder Lake, Zen 1-3
    "x86-64-v3": replace(SERVER_CORE, name="x86-64-v3", isa="avx2", march="x86-64-v3", cores=8,
                         l1_bytes=32 * KIB, l2_bytes=512 * KIB, l3_bytes=32 * MIB,
                         model="any x86-64-v3 CPU (AVX2, FMA)"),
    # AVX-512 F/BW/VL/DQ/CD: Skylake-SP to Ice Lake servers
    "x86-64-v4": replace(SERVER_CORE, name="x86-64-v4", isa="avx512", march="x86-64-v4", cores=16,
                         l1_bytes=48 * KIB, l2_bytes=1280 * KIB, l3_bytes=48 * MIB,
                         model="any x86-64-v4 CPU (AVX-512)"),
    "sapphirerapids": replace(SERVER_CORE, name="sapphirerapids", isa="avx512amx",
                              march="sapphirerapids", cores=16, l1_bytes=48 * KIB,
                              l2_bytes=2 * MIB, l3_bytes=60 * MIB,
                              model="Intel Xeon (Sapphire Rapids: AVX-512 BF16, AMX)"),
    "znver4": replace(SERVER_CORE, name="znver4", isa="avx512bf16", march="znver4", cores=16,
                      l1_bytes=32 * KIB, l2_bytes=1 * MIB, l3_bytes=32 * MIB,
                      model="AMD Zen 4 (AVX-512, BF16)"),
    # portable C: no -march, no intrinsics; builds with any C compiler for any CPU
    "generic": replace(SERVER_CORE, name="generic", isa="scalar", march="", cores=4,
                       l1_bytes=32 * KIB, l2_bytes=512 * KIB, l3_bytes=8 * MIB,
                       model="any CPU (portable C)"),
}

GPU_PRESETS: dict[str, GpuTarget] = {"hopper": HOPPER, "cdna": CDNA}

NATIVE = "native"
PRESET_NAMES = (NATIVE, *CPU_PRESETS, *GPU_PRESETS)
