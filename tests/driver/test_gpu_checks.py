"""The GPU tile model checked by timed candidates: the fastest of the best-ranked tiles is
kept and named; without a device nothing changes. (The device's timings are simulated here;
`tests/runtime/gpu/test_gpu_kernel.py` runs the real ones on a GPU.)"""

from __future__ import annotations

from typing import Any

import pytest

from polydl import settings
from polydl.api import lower
from polydl.driver import gpu_checks
from polydl.errors import PolyDLError
from polydl.frontends import builders
from polydl.schedules.gpu.planning import replanned, tile_counts

TILES = settings.gpu_timed_tiles()  # the default, six


def _gemm(schedule: Any) -> Any:
    return next(k for k in schedule.kernels if k.gemm is not None)


class _Built:
    """A stand-in for a built kernel: its library named by its tile, on a machine with or
    without a device."""

    def __init__(self, schedule: Any, device: bool = True) -> None:
        t = _gemm(schedule).gemm.tiling
        self.library_path = f"lib_{t.block_m}x{t.block_n}x{t.block_k}_{t.threads}_{t.blocks_per_sm}.so"
        self.device = device

    def has_device(self) -> bool:
        return self.device


@pytest.fixture(autouse=True)
def _unloaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    closed: list[str] = []
    monkeypatch.setattr(gpu_checks, "unload", closed.append)
    return closed


def test_the_fastest_of_the_top_tiles_is_kept(monkeypatch: pytest.MonkeyPatch, _unloaded: list[str]) -> None:
    nest, params = builders.conv2d(32, 256, 128, 28, 28, 1, 1, 2, 0, accumulate=False)
    compilation = lower(nest, params, "cuda")
    (name, count), = tile_counts(compilation.model, compilation.schedule).items()
    assert count >= TILES
    built: list[Any] = []

    def build(code: Any, schedule: Any) -> Any:
        built.append(schedule)
        return _Built(schedule)

    # the model's second-ranked tile runs fastest
    monkeypatch.setattr(gpu_checks, "device_seconds",
                        lambda kernels: [3e-3, 1e-3, *[2e-3] * (len(kernels) - 2)])
    checked = gpu_checks.timed(compilation, build)
    assert len(built) == 1 + TILES  # the current kernel, then each candidate
    second = _gemm(replanned(compilation.model, compilation.schedule, {name: 1})).gemm.tiling
    assert _gemm(checked.schedule).gemm.tiling == second != _gemm(compilation.schedule).gemm.tiling
    assert f"{name} timed {TILES} tiles" in checked.decision.reason
    assert "3.0000 ms" in checked.decision.reason and "1.0000 ms" in checked.decision.reason
    assert checked.code.source != compilation.code.source
    # every other candidate's library is closed, the kept one not
    assert len(_unloaded) == TILES - 1 and _Built(checked.schedule).library_path not in _unloaded


def test_nothing_is_timed_without_a_device() -> None:
    nest, params = builders.matmul(512, 512, 512)
    compilation = lower(nest, params, "cuda")
    assert gpu_checks.timed(compilation, lambda code, schedule: _Built(schedule, device=False)) is compilation


def test_a_candidate_that_does_not_build_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    from polydl.errors import CompileError

    nest, params = builders.matmul(512, 512, 512)
    compilation = lower(nest, params, "cuda")
    picked = _gemm(compilation.schedule).gemm.tiling
    seen: list[Any] = []

    def build(code: Any, schedule: Any) -> Any:
        seen.append(schedule)
        if len(seen) > 1 and _gemm(schedule).gemm.tiling == picked:  # the model's own pick, as a candidate
            raise CompileError("nvcc", ["nvcc"], "simulated")
        return _Built(schedule)

    monkeypatch.setattr(gpu_checks, "device_seconds", lambda kernels: [1e-3] * len(kernels))
    checked = gpu_checks.timed(compilation, build)
    assert "failed" in checked.decision.reason
    assert _gemm(checked.schedule).gemm.tiling != _gemm(compilation.schedule).gemm.tiling


def test_a_tile_within_the_noise_of_the_models_pick_does_not_replace_it(monkeypatch: pytest.MonkeyPatch) -> None:
    nest, params = builders.matmul(512, 512, 512)
    compilation = lower(nest, params, "cuda")
    monkeypatch.setattr(gpu_checks, "device_seconds", lambda kernels: [1.00e-3, 0.99e-3, *[2e-3] * (len(kernels) - 2)])
    checked = gpu_checks.timed(compilation, lambda code, schedule: _Built(schedule))
    assert _gemm(checked.schedule).gemm.tiling == _gemm(compilation.schedule).gemm.tiling


def test_a_device_without_room_for_the_operands_keeps_the_models_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    from polydl.errors import PolyDLError

    nest, params = builders.matmul(512, 512, 512)
    compilation = lower(nest, params, "cuda")

    def full(kernels: Any) -> Any:
        raise PolyDLError("cannot allocate 1048576 bytes on the device")

    monkeypatch.setattr(gpu_checks, "device_seconds", full)
    checked = gpu_checks.timed(compilation, lambda code, schedule: _Built(schedule))
    assert _gemm(checked.schedule).gemm.tiling == _gemm(compilation.schedule).gemm.tiling


def test_one_tile_a_gemm_times_nothing() -> None:
    nest, params = builders.matmul(512, 512, 512)
    compilation = lower(nest, params, "cuda")
    with settings.override(gpu_tiles=1):
        assert gpu_checks.timed(compilation, lambda code, schedule: _Built(schedule)) is compilation
    with settings.override(gpu_tiles="six"), pytest.raises(PolyDLError, match="POLYDL_GPU_TILES"):
        gpu_checks.timed(compilation, lambda code, schedule: _Built(schedule))
