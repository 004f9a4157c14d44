"""The GEMM kernel variants a GPU GEMM statement is tiled for: one frozen type per kernel.

Each variant holds exactly the numbers its kernel takes, and answers what the tile choice
(`schedules.gpu.tiling`) and code generation ask of any tile (`GemmTiling`): its threads,
shared-memory bytes and registers a thread, whether `blocks_per_sm` blocks fit a
multiprocessor, whether the operand copies divide among the threads, its template. A new
variant is a new type here and a template, not a string tested in several modules.

- `FmaTiling`: the FMA kernel (any GPU), a register tile of outputs a thread;
- `MmaTiling`: warp-level `mma.sync` fragments (bf16 tensor cores);
- `WgmmaTiling`: Hopper's warpgroup MMA over operands copied by cp.async;
- `TmaTiling`: Hopper's TMA-fed, warp-specialised, persistent warpgroup MMA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from polydl.target.gpu import GpuTarget

# an 8 x 8 FMA tile's registers a thread, operand offsets and copies included
FMA_TILE_REGISTERS = 128
# The FMA kernel's warp tiles: 16 x 8 outputs a thread in 64 x 64 warp tiles, for operands
# that load as float4s (see decisions: GPU FMA warp tiles)
WARP_THREAD_TILE = (16, 8)


class GemmTiling(Protocol):
    """A block tile BM x BN stepping BK along K, as every variant answers for it."""

    label: ClassVar[str]  # the variant's name in the schedule's description (stored with lowerings)
    template: ClassVar[str]  # the kernel's template under codegen/templates
    # shared memory taken dynamically, opted in above the default per-block limit (else static)
    dynamic_shared_memory: ClassVar[bool]
    warpgroup_mma: ClassVar[bool]  # issues wgmma: built for the architecture-specific sm_90a

    @property
    def block_m(self) -> int: ...

    @property
    def block_n(self) -> int: ...

    @property
    def block_k(self) -> int: ...

    @property
    def splits(self) -> int:
        """Blocks sharing one output tile, each over a slice of K."""
        ...

    @property
    def blocks_per_sm(self) -> int:
        """Blocks a multiprocessor the kernel is built to hold at once."""
        ...

    @property
    def threads(self) -> int: ...

    @property
    def shared_bytes(self) -> int: ...

    @property
    def registers(self) -> int:
        """32-bit registers a thread holds for its part of the tile."""
        ...

    def blocks_fit(self, target: GpuTarget) -> bool:
        """Whether `blocks_per_sm` blocks fit a multiprocessor of `target`."""
        ...

    def loads_divide(self) -> bool:
        """Every thread copies the same number of elements of both operand tiles, as the
        kernel assumes."""
        ...

    def describe(self) -> str: ...


def _described(t: GemmTiling, notes: list[str]) -> str:
    return f"block tile {t.block_m}x{t.block_n}x{t.block_k}, {t.threads} threads" + "".join(
        f", {n}" for n in notes)


def _copies_divide(t: GemmTiling, vec: int) -> bool:
    """Both operand tiles copy in `vec`-element runs, the same number a thread."""
    return all(cells % (vec * t.threads) == 0 for cells in (t.block_m * t.block_k, t.block_k * t.block_n))


def _split_note(splits: int) -> list[str]:
    return [f"K split {splits} ways"] if splits > 1 else []


@dataclass(frozen=True)
class FmaTiling:
    """The FMA kernel: each thread a `thread_m` x `thread_n` register tile of outputs, operands
    double-buffered in static shared memory."""

    block_m: int
    block_n: int
    block_k: int
    thread_m: int = 8  # outputs a thread along M and N
    thread_n: int = 8
    splits: int = 1
    # blocks the kernel's registers are held to (`__launch_bounds__`); 1: as ptxas chooses
    blocks_per_sm: int = 1

    label: ClassVar[str] = "fma"
    template: ClassVar[str] = "gpu/gemm_fma.j2"
    dynamic_shared_memory: ClassVar[bool] = False
    warpgroup_mma: ClassVar[bool] = False

    @property
    def warp_tiles(self) -> bool:
        """Threads in warp tiles (16 x 8 a thread) rather than two 4 x 4 halves (8 x 8)."""
        return (self.thread_m, self.thread_n) == WARP_THREAD_TILE

    @property
    def threads(self) -> int:
        return (self.block_m // self.thread_m) * (self.block_n // self.thread_n)

    @property
    def shared_bytes(self) -> int:
        return 2 * self.block_k * (self.block_m + self.block_n + 8) * 4

    @property
    def registers(self) -> int:
        return self.thread_m * self.thread_n + self.thread_m + self.thread_n

    def blocks_fit(self, target: GpuTarget) -> bool:
        # the launch bound holds every thread to its share of the register file
        return (self.blocks_per_sm == 1
                or self.blocks_per_sm * self.threads * FMA_TILE_REGISTERS <= target.registers_per_multiprocessor)

    def loads_divide(self) -> bool:
        return _copies_divide(self, 1)

    def describe(self) -> str:
        blocks = [f"{self.blocks_per_sm} blocks a multiprocessor"] if self.blocks_per_sm > 1 else []
        return _described(self, _split_note(self.splits) + blocks)


@dataclass(frozen=True)
class MmaTiling:
    """Warp-level tensor-core fragments: `warps_m` x `warps_n` warps, a `stages`-deep ring of
    operand tiles in shared memory."""

    block_m: int
    block_n: int
    block_k: int
    warps_m: int
    warps_n: int
    stages: int
    splits: int = 1

    label: ClassVar[str] = "mma"
    template: ClassVar[str] = "gpu/gemm_mma.j2"
    dynamic_shared_memory: ClassVar[bool] = True
    warpgroup_mma: ClassVar[bool] = False

    @property
    def blocks_per_sm(self) -> int:
        return 1

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def shared_bytes(self) -> int:
        # rows padded by 8 elements along K, M or N, as the operand runs
        m, n, k = self.block_m, self.block_n, self.block_k
        return self.stages * (max(m * (k + 8), k * (m + 8)) + max(k * (n + 8), n * (k + 8))) * 2

    @property
    def registers(self) -> int:
        fm, fn = self.block_m // self.warps_m // 16, self.block_n // self.warps_n // 16
        return fm * fn * 8 + (fm + fn) * 4

    def blocks_fit(self, target: GpuTarget) -> bool:
        return True

    def loads_divide(self) -> bool:
        return _copies_divide(self, 8)  # an operand may be copied in 16-byte runs

    def describe(self) -> str:
        return _described(self, _split_note(self.splits))


@dataclass(frozen=True)
class WgmmaTiling:
    """Hopper's warpgroup MMA, one warpgroup (128 threads) per 64 rows, operands copied into a
    `stages`-deep ring by 16-byte cp.async."""

    block_m: int
    block_n: int
    block_k: int
    stages: int
    splits: int = 1

    label: ClassVar[str] = "wgmma"
    template: ClassVar[str] = "gpu/gemm_wgmma.j2"
    dynamic_shared_memory: ClassVar[bool] = True
    warpgroup_mma: ClassVar[bool] = True

    @property
    def blocks_per_sm(self) -> int:
        return 1

    @property
    def threads(self) -> int:
        return 128 * (self.block_m // 64)

    @property
    def shared_bytes(self) -> int:
        return self.stages * (self.block_m + self.block_n) * self.block_k * 2

    @property
    def registers(self) -> int:
        return self.block_n // 2 + 32

    def blocks_fit(self, target: GpuTarget) -> bool:
        return True

    def loads_divide(self) -> bool:
        return _copies_divide(self, 8)

    def describe(self) -> str:
        return _described(self, _split_note(self.splits))


@dataclass(frozen=True)
class TmaTiling:
    """Hopper's TMA-fed, warp-specialised wgmma: a producer warpgroup and one consumer
    warpgroup per 64 rows; persistent blocks walk the output tiles (no K split)."""

    block_m: int
    block_n: int
    block_k: int
    stages: int
    operand_bytes: int = 2  # 2 (bf16) or 4 (float32 read as TF32)
    blocks_per_sm: int = 1  # blocks resident on a multiprocessor at once (1 or 2)

    label: ClassVar[str] = "tma"
    template: ClassVar[str] = "gpu/gemm_tma.j2"
    dynamic_shared_memory: ClassVar[bool] = True
    warpgroup_mma: ClassVar[bool] = True

    @property
    def splits(self) -> int:
        return 1

    @property
    def threads(self) -> int:
        return 128 * (1 + self.block_m // 64)

    @property
    def shared_bytes(self) -> int:
        # operand stages, two mbarriers per stage, 1 KiB for alignment, and a 64 x 32 float
        # staging tile (rows padded to 36) per consumer warpgroup
        return (self.stages * ((self.block_m + self.block_n) * self.block_k * self.operand_bytes + 16) + 1024
                + 16 + self.block_m // 64 * 64 * 36 * 4)

    @property
    def registers(self) -> int:
        return self.block_n // 2 + 32

    def blocks_fit(self, target: GpuTarget) -> bool:
        """Each block also holds 1 KiB of shared memory the hardware reserves; ptxas compiles
        every thread, consumers too, within the launch bound's share of the register file
        (64 Ki / threads / blocks), whatever `setmaxnreg` moves later (a 64 x 256 tile's
        consumer needs 154 of the 128 two blocks leave)."""
        if self.blocks_per_sm == 1:
            return True
        return (self.block_m == 64
                and self.blocks_per_sm * (self.shared_bytes + 1024) <= target.shared_memory_optin_bytes + 1024
                and self.registers <= target.registers_per_multiprocessor // (self.blocks_per_sm * self.threads))

    def register_split(self, target: GpuTarget) -> tuple[int, int]:
        """(producer, consumer) registers a thread keeps after `setmaxnreg`: the register file
        shared by the blocks of a multiprocessor, the producer warpgroup down to 40, the
        consumers up to what is left, in steps of 8 (at most 232 with one block)."""
        producer = 40
        per_block = target.registers_per_multiprocessor // self.blocks_per_sm
        consumers = self.threads - 128
        return producer, min(232, (per_block - 128 * producer) // consumers // 8 * 8)

    def loads_divide(self) -> bool:
        return True  # TMA copies whole boxes

    def describe(self) -> str:
        blocks = [f"{self.blocks_per_sm} blocks a multiprocessor"] if self.blocks_per_sm > 1 else []
        tf32 = ["float32 operands as TF32"] if self.operand_bytes == 4 else []
        return _described(self, blocks + tf32)

