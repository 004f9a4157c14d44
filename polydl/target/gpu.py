"""A GPU target: what the GPU schedule sizes its tiles against and the compiler builds for.

A `GpuTarget` holds the numbers the GPU schedule needs (warp width, shared memory per block,
registers per thread and per multiprocessor, threads per block, multiprocessor count, the
operand bytes the L2 keeps between tiles) and the architectures the compiler builds for. The
presets describe the chips polydl targets: NVIDIA Hopper (CUDA, sm_90) and AMD CDNA2/CDNA3 (HIP,
gfx90a and gfx942). Tests build one by hand to pin a decision.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import Any

from polydl.errors import TargetError


@dataclass(frozen=True)
class GpuTarget:
    name: str
    kind: str  # "cuda" | "hip": the backend that generates and builds its code
    architectures: tuple[str, ...]  # sm_90 | gfx90a, gfx942
    warp_size: int
    shared_memory_bytes: int  # per block without opting in to more
    shared_memory_optin_bytes: int  # per block after raising the kernel's dynamic limit
    registers_per_thread: int  # 32-bit registers a thread may use
    max_threads_per_block: int
    multiprocessors: int
    tensor_cores: bool  # bf16/fp16 warp-level MMA reachable from the generated source
    # 32-bit registers of a multiprocessor, shared by its resident blocks (65536 on every CUDA
    # architecture since sm_50)
    registers_per_multiprocessor: int = 65536
    # operand bytes that stay in the L2 between the tiles re-reading them: a share of the
    # L2 (Hopper's holds 50 MB) that other traffic leaves alone
    l2_resident_bytes: int = 8 << 20
    warpgroup_mma: bool = False  # Hopper's wgmma (built for sm_90a)
    tensor_memory_accelerator: bool = False  # Hopper's TMA bulk tensor copies and mbarriers
    # float32 products may run as TF32 on the tensor cores (10-bit mantissas, float32 sums): an
    # opt-in, as PyTorch's allow_tf32
    allow_tf32: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("cuda", "hip"):
            raise TargetError(f"GPU kind must be 'cuda' or 'hip', not {self.kind!r}", self.name)
        for arch in self.architectures:
            prefix = "sm_" if self.kind == "cuda" else "gfx"
            if not (isinstance(arch, str) and arch.startswith(prefix) and arch[len(prefix):].isalnum()):
                raise TargetError(f"{arch!r} is not a {self.kind} architecture ({prefix}...)", self.name)

    def describe(self) -> str:
        return (
            f"{self.name}: {self.kind} {', '.join(self.architectures)}, {self.multiprocessors} "
            f"multiprocessors, warp {self.warp_size}, {self.shared_memory_bytes // 1024} KiB shared "
            f"memory per block ({self.shared_memory_optin_bytes // 1024} KiB opted in), "
            f"{self.registers_per_multiprocessor // 1024} Ki registers a multiprocessor, "
            f"{self.l2_resident_bytes / (1 << 20):g} MiB of operands L2-resident, "
            f"tensor cores {'yes' if self.tensor_cores else 'no'}"
            + (", wgmma" if self.warpgroup_mma else "")
            + (", TMA" if self.tensor_memory_accelerator else "")
            + (", TF32 allowed" if self.allow_tf32 else "")
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["architectures"] = list(self.architectures)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "") -> GpuTarget:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        # fields with a default may be absent (descriptions written before they existed)
        missing = sorted(f.name for f in fields(cls) if f.name not in data and f.default is MISSING)
        if unknown or missing:
            raise TargetError(f"unknown field(s) {unknown}, missing field(s) {missing}", source)
        values = dict(data)
        if not isinstance(values["architectures"], list):
            raise TargetError("'architectures' must be a list", source)
        values["architectures"] = tuple(values["architectures"])
        for f in fields(cls):
            want = {"str": str, "int": int, "bool": bool}.get(str(f.type))
            if want is not None and f.name in values and (
                not isinstance(values[f.name], want) or (want is int and isinstance(values[f.name], bool))
            ):
                raise TargetError(f"'{f.name}' must be {str(f.type)}, not {values[f.name]!r}", source)
        try:
            return cls(**values)
        except TargetError as exc:
            raise TargetError(exc.message, source or exc.source) from None

    def key(self) -> str:
        return (
            f"{self.name}|{self.kind}|{','.join(self.architectures)}|w{self.warp_size}|"
            f"smem={self.shared_memory_bytes}|regs={self.registers_per_thread}|"
            f"sm={self.multiprocessors}|mma={int(self.tensor_cores)}|wgmma={int(self.warpgroup_mma)}"
            f"|tma={int(self.tensor_memory_accelerator)}|tf32={int(self.allow_tf32)}"
            f"|rf={self.registers_per_multiprocessor}|l2={self.l2_resident_bytes}"
        )


HOPPER = GpuTarget(
    name="nvidia-hopper",
    kind="cuda",
    architectures=("sm_90",),
    warp_size=32,
    shared_memory_bytes=48 * 1024,
    shared_memory_optin_bytes=227 * 1024,
    registers_per_thread=255,
    max_threads_per_block=1024,
    multiprocessors=132,
    tensor_cores=True,
    registers_per_multiprocessor=65536,
    l2_resident_bytes=8 << 20,
    warpgroup_mma=True,
    tensor_memory_accelerator=True,
)

CDNA = GpuTarget(
    name="amd-cdna",
    kind="hip",
    architectures=("gfx90a", "gfx942"),
    warp_size=64,
    shared_memory_bytes=64 * 1024,
    shared_memory_optin_bytes=64 * 1024,
    registers_per_thread=256,
    max_threads_per_block=1024,
    multiprocessors=104,
    tensor_cores=False,  # MFMA needs rocWMMA or intrinsics; the HIP path uses FMA
    # the schedule's numbers as for Hopper: the HIP kernels' choices do not depend on them yet
    registers_per_multiprocessor=65536,
    l2_resident_bytes=8 << 20,
)

# The description each GPU backend builds for when the caller names none.
DEFAULT_GPUS: dict[str, GpuTarget] = {"cuda": HOPPER, "hip": CDNA}
GPU_KINDS = tuple(DEFAULT_GPUS)


def device_for(kind: str, **overrides: object) -> GpuTarget:
    """The default description of `kind` with some numbers changed (tests pin decisions so)."""
    return replace(DEFAULT_GPUS[kind], **overrides)  # type: ignore[arg-type]
