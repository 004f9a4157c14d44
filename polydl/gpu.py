"""The GPU description: what the GPU schedule sizes its tiles against, per target.

A `GpuDevice` holds the numbers the GPU schedule needs (warp width, shared memory per block,
registers per thread, threads per block, multiprocessor count) and the architectures the
compiler builds for. The presets describe the chips polydl targets: NVIDIA Hopper (CUDA, sm_90)
and AMD CDNA2/CDNA3 (HIP, gfx90a and gfx942). Tests build one by hand to pin a decision.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GpuDevice:
    name: str
    target: str  # "cuda" | "hip"
    architectures: tuple[str, ...]  # sm_90 | gfx90a, gfx942
    warp_size: int
    shared_memory_bytes: int  # per block without opting in to more
    shared_memory_optin_bytes: int  # per block after raising the kernel's dynamic limit
    registers_per_thread: int  # 32-bit registers a thread may use
    max_threads_per_block: int
    multiprocessors: int
    tensor_cores: bool  # bf16/fp16 warp-level MMA reachable from the generated source
    warpgroup_mma: bool = False  # Hopper's wgmma (built for sm_90a)

    def key(self) -> str:
        return (
            f"{self.name}|{self.target}|{','.join(self.architectures)}|w{self.warp_size}|"
            f"smem={self.shared_memory_bytes}|regs={self.registers_per_thread}|"
            f"sm={self.multiprocessors}|mma={int(self.tensor_cores)}|wgmma={int(self.warpgroup_mma)}"
        )


HOPPER = GpuDevice(
    name="nvidia-hopper",
    target="cuda",
    architectures=("sm_90",),
    warp_size=32,
    shared_memory_bytes=48 * 1024,
    shared_memory_optin_bytes=227 * 1024,
    registers_per_thread=255,
    max_threads_per_block=1024,
    multiprocessors=132,
    tensor_cores=True,
    warpgroup_mma=True,
)

CDNA = GpuDevice(
    name="amd-cdna",
    target="hip",
    architectures=("gfx90a", "gfx942"),
    warp_size=64,
    shared_memory_bytes=64 * 1024,
    shared_memory_optin_bytes=64 * 1024,
    registers_per_thread=256,
    max_threads_per_block=1024,
    multiprocessors=104,
    tensor_cores=False,  # MFMA needs rocWMMA or intrinsics; the HIP path uses FMA
)

DEVICES: dict[str, GpuDevice] = {"cuda": HOPPER, "hip": CDNA}
GPU_TARGETS = tuple(DEVICES)


def device_for(target: str, **overrides: object) -> GpuDevice:
    return replace(DEVICES[target], **overrides)  # type: ignore[arg-type]
