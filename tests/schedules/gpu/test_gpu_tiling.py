"""The GPU tile choice reads the hardware from the target it is given: the register file of a
multiprocessor and the operand bytes the L2 keeps between tiles are `GpuTarget` fields, set by
hand here to pin the decisions that follow them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from polydl.frontends import builders
from polydl.ir import LoopNest
from polydl.poly.model import build_model
from polydl.schedules.gpu.planning import gpu_schedule
from polydl.schedules.gpu.plans import GemmPlan
from polydl.schedules.gpu.variants import TmaTiling
from polydl.target.gpu import DEFAULT_GPUS, HOPPER, GpuTarget, device_for


def _gemm(nest: LoopNest, params: Mapping[str, int], target: GpuTarget) -> GemmPlan:
    (gemm,) = [k.gemm for k in gpu_schedule(build_model(nest, dict(params)), target).kernels if k.gemm is not None]
    return gemm


def test_an_operand_counts_once_only_where_it_stays_in_the_l2() -> None:
    # NCHW 1 x 1, 64 -> 64 channels: the weights (A: 64 x 64 bf16, 8 KiB) are one tile along
    # M. Where the L2 keeps 8 KiB of them, only the input's tiles move and 64 x 64 tiles (twice
    # the grid) win; where it keeps less, both operands count and the wider tile wins.
    nest, params = builders.conv2d(32, 64, 64, 56, 56, 1, 1, dtype="bfloat16", accumulate=False)
    kept = _gemm(nest, params, device_for("cuda", l2_resident_bytes=8 * 1024))
    assert (kept.size(kept.m), kept.size(kept.k)) == (64, 64)
    assert (kept.tiling.block_m, kept.tiling.block_n) == (64, 64)
    reread = _gemm(nest, params, device_for("cuda", l2_resident_bytes=4 * 1024))
    assert (reread.tiling.block_m, reread.tiling.block_n) == (64, 128)
    assert _gemm(nest, params, HOPPER).tiling == kept.tiling  # Hopper's preset keeps 8 MiB


def test_two_blocks_a_multiprocessor_only_where_the_register_file_holds_both() -> None:
    # a 1 x 1 layer of 64 channels: one K step a tile, two blocks of one consumer warpgroup
    # share a multiprocessor; each thread of two 256-thread blocks gets 64 of 32 Ki registers
    # (a 64 x 64 tile's consumer needs 64)
    nest, params = builders.conv2d(32, 64, 64, 56, 56, 1, 1, layout="nhwc", dtype="bfloat16", accumulate=False)
    paired = _gemm(nest, params, device_for("cuda", registers_per_multiprocessor=32 * 1024)).tiling
    assert isinstance(paired, TmaTiling) and paired.blocks_per_sm == 2
    alone = _gemm(nest, params, device_for("cuda", registers_per_multiprocessor=16 * 1024)).tiling
    assert isinstance(alone, TmaTiling) and alone.blocks_per_sm == 1
    # the consumers' share after `setmaxnreg` follows the register file too
    tile = TmaTiling(64, 64, 64, stages=6, blocks_per_sm=2)
    assert tile.register_split(HOPPER) == (40, 216)
    assert tile.register_split(replace(HOPPER, registers_per_multiprocessor=128 * 1024)) == (40, 232)


def test_the_hardware_fields_are_in_the_json_and_the_key() -> None:
    hopper = DEFAULT_GPUS["cuda"]
    assert (hopper.registers_per_multiprocessor, hopper.l2_resident_bytes) == (65536, 8 << 20)
    data = hopper.to_dict()
    assert GpuTarget.from_dict(data) == hopper
    # a description written before the fields existed loads with the values they had
    old = {k: v for k, v in data.items() if k not in ("registers_per_multiprocessor", "l2_resident_bytes")}
    assert GpuTarget.from_dict(old) == hopper
    assert replace(hopper, l2_resident_bytes=4 << 20).key() != hopper.key()
    assert replace(hopper, registers_per_multiprocessor=32768).key() != hopper.key()
    assert "64 Ki registers a multiprocessor, 8 MiB of operands L2-resident" in hopper.describe()
