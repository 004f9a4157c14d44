"""A row of vector sums held in registers across the taps that sum into it
(schedules/cpu/register_tiles.py chooses the tile, codegen/c/register_tiles.py prints it)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import polydl
from polydl import layouts
from polydl.poly.model import build_model
from polydl.schedules.cpu.auto import auto_schedule
from polydl.schedules.cpu.register_blocking import unit_for
from polydl.schedules.cpu.register_tiles import MAX_ROW, SPARE_REGISTERS
from polydl.target.host import cannot_run_here, host_target
from polydl.target.presets import CPU_PRESETS

HAS_VECTORS = host_target().isa != "scalar"

# A user's own nest of the same form: a 1-D filter over 8 independent lanes, the taps in the
# middle, the lane loop innermost.
FILTER = """
void filter(int N, int T, const float x[N + T - 1][8], const float w[T][8], float y[N][8]) {
  for (int i = 0; i < N; i++)
    for (int t = 0; t < T; t++)
      for (int l = 0; l < 8; l++)
        y[i][l] -= x[i + t][l] * w[t][l] + 0.5f * w[t][l];
}
"""


def _depthwise_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int,
                         pads: tuple[int, int, int, int]) -> np.ndarray:
    """ReLU6(depthwise 3 x 3 + b) in NCHW, float64."""
    return np.clip(_depthwise(x, w, stride, pads) + b[None, :, None, None], 0.0, 6.0)


def _depthwise(x: np.ndarray, w: np.ndarray, stride: int, pads: tuple[int, int, int, int]) -> np.ndarray:
    """A depthwise 3 x 3 convolution in NCHW, float64."""
    top, left, bottom, right = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    N, C, H, W = xp.shape
    P, Q = (H - 3) // stride + 1, (W - 3) // stride + 1
    y = np.zeros((N, C, P, Q))
    for r in range(3):
        for s in range(3):
            window = xp[:, :, r:r + stride * (P - 1) + 1:stride, s:s + stride * (Q - 1) + 1:stride]
            y += window * w[None, :, 0, r, s, None, None]
    return y


@pytest.mark.skipif(not HAS_VECTORS, reason="this machine's target has no vector ISA")
@pytest.mark.parametrize(("N", "C", "H", "W", "stride", "pads"), [
    (2, 32, 12, 112, 1, (1, 1, 1, 1)),   # 14 tiles of 8; the first and last miss a tap
    (3, 48, 9, 15, 2, (1, 1, 1, 1)),     # stride 2: 8 outputs a row, one tile
    (1, 16, 5, 14, 1, (1, 0, 2, 1)),     # ragged padding: 13 outputs in tiles of 7
    (2, 16, 4, 3, 1, (1, 1, 1, 1)),      # a row narrower than a tile
])
@pytest.mark.slow
def test_a_blocked_depthwise_convolution_sums_each_row_in_registers(
    N: int, C: int, H: int, W: int, stride: int, pads: tuple[int, int, int, int],
) -> None:
    # two cores, as CI's: on 16 the rows' tiles become the parallel loop instead
    kernel = polydl.conv2d(N, C, C, H, W, 3, 3, stride=stride, padding=pads, layout="nchw16c",
                           groups=C, fuse=("bias", "clip(0,6)"), accumulate=False,
                           machine=replace(host_target(), cores=2))
    order = kernel.schedule.order
    assert order[-5:] == ("q.t", "r", "s", "q", "k"), kernel.schedule.describe()
    Q = (W + pads[1] + pads[3] - 3) // stride + 1
    tile = dict(kernel.schedule.tiles)["q"]
    # as many outputs as the registers hold beside the tap's operands (AVX-512: 8 of 32
    # registers; AVX2: 6 of 16, each output two of them), in tiles of equal width
    unit = unit_for(host_target().isa)
    vectors = -(-64 // unit.vector_bytes)
    widest = min(MAX_ROW, (unit.registers - SPARE_REGISTERS) // vectors, Q)
    assert tile <= widest and -(-Q // tile) == -(-Q // widest)
    # 16 lanes: one vector of AVX-512, two parts of AVX2's
    assert f"vector_size({min(64, unit.vector_bytes)})" in kernel.source
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = rng.standard_normal((C, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32)
    y = kernel(layouts.to_nchw16c(x), layouts.to_conv_weights(w, C), b)
    expected = _depthwise_reference(x, w, b, stride, pads)
    np.testing.assert_allclose(layouts.from_nchw16c(y, C), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_VECTORS, reason="this machine's target has no vector ISA")
@pytest.mark.parametrize(("preset", "width", "parts"), [("x86-64-v3", 32, 2), ("x86-64-v4", 64, 1)])
def test_a_row_wider_than_the_registers_is_summed_in_parts_of_their_width(
    preset: str, width: int, parts: int,
) -> None:
    """A 16-lane row on AVX2 is two 8-lane vectors a tile output: GCC kept one 64-byte
    vector of its extension in memory there, every sum passing through the stack on each tap
    (a depthwise 3 x 3 layer 2.8x as slow as in parts)."""
    N, C, H, W = 1, 32, 6, 13
    kernel = polydl.conv2d(N, C, C, H, W, 3, 3, padding=1, layout="nchw16c", groups=C,
                           machine=replace(CPU_PRESETS[preset], cores=2))
    assert kernel.schedule.order[-5:] == ("q.t", "r", "s", "q", "k"), kernel.schedule.describe()
    assert f"vector_size({width})" in kernel.source
    assert ("_pd_row0_0_1 " in kernel.source) == (parts == 2)
    reason = cannot_run_here(CPU_PRESETS[preset])
    if reason:
        pytest.skip(reason)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = rng.standard_normal((C, 1, 3, 3)).astype(np.float32)
    y = kernel(layouts.to_nchw16c(x), layouts.to_conv_weights(w, C))
    expected = _depthwise(x, w, 1, (1, 1, 1, 1))
    np.testing.assert_allclose(layouts.from_nchw16c(y, C), expected, rtol=1e-5, atol=1e-5)


def test_a_user_nest_of_the_same_form_is_tiled_and_subtracts() -> None:
    N, T = 37, 5
    kernel = polydl.compile(FILTER, {"N": N, "T": T})
    assert kernel.schedule.order == ("i.t", "t", "i", "l"), kernel.schedule.describe()
    assert "vector_size(32)" in kernel.source
    rng = np.random.default_rng(4)
    x = rng.standard_normal((N + T - 1, 8)).astype(np.float32)
    w = rng.standard_normal((T, 8)).astype(np.float32)
    y0 = rng.standard_normal((N, 8)).astype(np.float32)
    y = kernel(x=x, w=w, y=y0.copy())
    expected = y0.astype(np.float64) - sum(
        x[t:t + N].astype(np.float64) * w[t] + 0.5 * w[t].astype(np.float64) for t in range(T))
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def _max_pool_reference(x: np.ndarray, size: int, stride: int, pad: int) -> np.ndarray:
    """Max pooling of a blocked x [N][CB][H][W][16], the padding left out (np.fmax: a NaN
    input loses to any number, as fmaxf has it)."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad), (0, 0)), constant_values=-np.inf)
    P = (x.shape[2] + 2 * pad - size) // stride + 1
    Q = (x.shape[3] + 2 * pad - size) // stride + 1
    y = np.full((*x.shape[:2], P, Q, x.shape[4]), -np.inf, np.float32)
    for r in range(size):
        for s in range(size):
            y = np.fmax(y, xp[:, :, r:r + stride * (P - 1) + 1:stride, s:s + stride * (Q - 1) + 1:stride])
    return y


@pytest.mark.skipif(not HAS_VECTORS, reason="this machine's target has no vector ISA")
@pytest.mark.parametrize(("N", "C", "H", "W", "size", "stride", "pad"), [
    (2, 32, 16, 112, 3, 2, 1),  # ResNet's: 56 outputs a row in tiles of 8, the edges miss a tap
    (1, 16, 9, 15, 3, 1, 1),    # 15 outputs a row in tiles of equal width
    (1, 16, 8, 8, 2, 2, 0),     # no padding: every tap over the whole tile
])
def test_a_max_pooling_keeps_each_row_of_maxima_in_registers(
    N: int, C: int, H: int, W: int, size: int, stride: int, pad: int,
) -> None:
    """`y = fmaxf(y, x)` over a window: the row's maxima are compared lane by lane in
    registers, loaded and stored once (before: a load and a store of y at every tap)."""
    kernel = polydl.pool2d(N, C, H, W, size, size, stride=stride, padding=pad, kind="max",
                           layout="nchw16c", machine=replace(host_target(), cores=2))
    assert kernel.schedule.order[-5:] == ("q.t", "r", "s", "q", "c"), kernel.schedule.describe()
    assert "_pd_row0_m" in kernel.source  # the lanes' comparison masks
    rng = np.random.default_rng(8)
    x = rng.standard_normal((N, C // 16, H, W, 16)).astype(np.float32)
    x[0, 0, 1, :5, :3] = np.nan  # a NaN loses, as to fmaxf
    np.testing.assert_array_equal(kernel(x), _max_pool_reference(x, size, stride, pad))


MIN_FILTER = """
void lowest(int N, int T, const float x[N + T - 1][8], float y[N][8]) {
  for (int i = 0; i < N; i++)
    for (int t = 0; t < T; t++)
      for (int l = 0; l < 8; l++)
        y[i][l] = x[i + t][l] < y[i][l] ? x[i + t][l] : y[i][l];
}
"""


def test_a_running_minimum_written_as_a_select_is_tiled_too() -> None:
    """`c = e < c ? e : c`, the form ONNX max and min pooling take, is a minimum of the row."""
    N, T = 29, 4
    kernel = polydl.compile(MIN_FILTER, {"N": N, "T": T})
    assert kernel.schedule.order == ("i.t", "t", "i", "l"), kernel.schedule.describe()
    assert "_pd_row0_m" in kernel.source
    rng = np.random.default_rng(9)
    x = rng.standard_normal((N + T - 1, 8)).astype(np.float32)
    y0 = rng.standard_normal((N, 8)).astype(np.float32)
    expected = np.minimum(y0, np.min([x[t:t + N] for t in range(T)], axis=0))
    np.testing.assert_array_equal(kernel(x=x, y=y0.copy()), expected)


def _auto(source: str, params: dict[str, int], preset: str) -> polydl.Schedule:
    from polydl.frontends.loading import load_spec
    nest, bound = load_spec(source, params, None, None, None)
    return auto_schedule(build_model(nest, bound), CPU_PRESETS[preset]).schedule


def test_the_tile_fits_the_registers_of_the_target() -> None:
    # 8 floats a lane row: one AVX2 register, so 8 outputs fit 16 registers with the tap's
    # operands; portable C has no vectors to hold them in
    assert dict(_auto(FILTER, {"N": 64, "T": 3}, "x86-64-v3").tiles) == {"i": 8}
    assert dict(_auto(FILTER, {"N": 64, "T": 3}, "x86-64-v4").tiles) == {"i": 8}
    assert "i.t" not in _auto(FILTER, {"N": 64, "T": 3}, "generic").order


def test_a_nest_whose_lanes_are_not_last_keeps_its_order() -> None:
    strided = FILTER.replace("x[i + t][l]", "x[i + t][7 - l]")
    assert "i.t" not in _auto(strided, {"N": 64, "T": 3}, "x86-64-v4").order


# Each row sums the row before it: the rows cannot be tiled outside the taps.
RECURRENCE = """
void recurrence(int N, int T, const float w[T][8], float y[N][8]) {
  for (int i = 1; i < N; i++)
    for (int t = 0; t < T; t++)
      for (int l = 0; l < 8; l++)
        y[i][l] += y[i - 1][l] * w[t][l];
}
"""


def test_a_row_tile_against_a_dependence_is_not_taken() -> None:
    assert "i.t" not in _auto(RECURRENCE, {"N": 64, "T": 3}, "x86-64-v4").order
    N, T = 20, 3
    kernel = polydl.compile(RECURRENCE, {"N": N, "T": T})
    assert "i.t" not in kernel.schedule.order and "vector_size" not in kernel.source
    rng = np.random.default_rng(5)
    w = rng.uniform(-0.5, 0.5, (T, 8)).astype(np.float32)
    y0 = rng.standard_normal((N, 8)).astype(np.float32)
    expected = y0.astype(np.float64)
    for i in range(1, N):
        for t in range(T):
            expected[i] += expected[i - 1] * w[t]
    np.testing.assert_allclose(kernel(w=w, y=y0.copy()), expected, rtol=1e-4, atol=1e-4)
