"""The convolution backward passes in the benchmark: inputs, float64 results, PyTorch runners
and polydl's kernel for a `Case` whose primitive is `conv2d_backward_data` (inputs dy, w;
result dx) or `conv2d_backward_weights` (inputs x, dy; result dw), as the `Pass` `BACKWARD`.

PyTorch runs `aten.convolution_backward` (what autograd and `torch.nn.grad` call) on plain
NCHW and on channels-last tensors, both oneDNN paths on CPU; the faster is the reference.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import numpy as np

import polydl
from polydl import layouts
from polydl.bench.builds import Pass, PolydlBuild, Shape, polydl_runner
from polydl.bench.cases import BenchError, Case
from polydl.bench.timing import Runner

PRIMITIVES = ("conv2d_backward_data", "conv2d_backward_weights")


def input_shapes(case: Case) -> list[Shape]:
    s = case.size
    p, q = case.output_hw
    x, w, dy = (s["N"], s["C"], s["H"], s["W"]), (s["K"], s["C"], s["R"], s["S"]), (s["N"], s["K"], p, q)
    return [dy, w] if case.primitive == "conv2d_backward_data" else [x, dy]


def numpy_gradient(case: Case, inputs: list[np.ndarray]) -> np.ndarray:
    """dx or dw in float64, by one einsum per filter tap."""
    s = case.size
    stride, pad = s["stride"], s["padding"]
    p, q = case.output_hw
    data = case.primitive == "conv2d_backward_data"
    if data:
        dy, w = (a.astype(np.float64) for a in inputs)
        xp = np.zeros((s["N"], s["C"], s["H"] + 2 * pad, s["W"] + 2 * pad))
    else:
        x, dy = (a.astype(np.float64) for a in inputs)
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        w = np.zeros((s["K"], s["C"], s["R"], s["S"]))
    for i in range(s["R"]):
        for j in range(s["S"]):
            rows = slice(i, i + stride * (p - 1) + 1, stride)
            cols = slice(j, j + stride * (q - 1) + 1, stride)
            if data:
                xp[:, :, rows, cols] += np.einsum("nkpq,kc->ncpq", dy, w[:, :, i, j], optimize=True)
            else:
                w[:, :, i, j] = np.einsum("nkpq,ncpq->kc", dy, xp[:, :, rows, cols], optimize=True)
    return xp[:, :, pad : pad + s["H"], pad : pad + s["W"]] if data else w


def _aten_backward(case: Case, torch: ModuleType, tensors: dict[str, Any]) -> Any:
    s = case.size
    data = case.primitive == "conv2d_backward_data"
    mask = [data, not data, False]
    out = torch.ops.aten.convolution_backward(
        tensors["dy"], tensors["x"], tensors["w"], None, [s["stride"]] * 2, [s["padding"]] * 2,
        [1, 1], False, [0, 0], 1, mask,
    )
    return out[0] if data else out[1]


def expected(case: Case, inputs: list[np.ndarray], torch: ModuleType | None) -> np.ndarray:
    if torch is None:
        return numpy_gradient(case, inputs)
    tensors = {k: torch.from_numpy(v).double() for k, v in _named(case, inputs).items()}
    return _aten_backward(case, torch, tensors).numpy()


def _named(case: Case, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """dy, x and w: the one a pass does not read is zeros of its shape (aten wants all)."""
    s = case.size
    if case.primitive == "conv2d_backward_data":
        dy, w = inputs
        x = np.zeros((s["N"], s["C"], s["H"], s["W"]), dtype=dy.dtype)
    else:
        x, dy = inputs
        w = np.zeros((s["K"], s["C"], s["R"], s["S"]), dtype=x.dtype)
    return {"dy": dy, "x": x, "w": w}


def references(case: Case, inputs: list[np.ndarray], torch: ModuleType | None) -> list[Runner]:
    if torch is None:
        return []
    plain = {k: torch.from_numpy(v) for k, v in _named(case, inputs).items()}
    last = {k: v.contiguous(memory_format=torch.channels_last) for k, v in plain.items()}
    return [_runner(name, case, torch, tensors)
            for name, tensors in (("torch.nchw", plain), ("torch.channels_last", last))]


def _runner(name: str, case: Case, torch: ModuleType, tensors: dict[str, Any]) -> Runner:
    def run() -> Any:
        return _aten_backward(case, torch, tensors)

    def fresh() -> np.ndarray:
        return np.asarray(run().contiguous().numpy()).copy()

    return Runner(name, run, fresh)


def build_polydl(case: Case, inputs: list[np.ndarray], layout: str,
                 schedule: str = "auto", constant: tuple[str, ...] = ()) -> PolydlBuild:
    if constant:  # `BACKWARD.weights` is None: a training step's weights change every step
        raise BenchError(f"the backward passes keep no input between calls, not {constant}")
    s = case.size
    data = case.primitive == "conv2d_backward_data"
    build = polydl.conv2d_backward_data if data else polydl.conv2d_backward_weights
    t0 = time.perf_counter()
    kernel = build(
        N=s["N"], C=s["C"], K=s["K"], H=s["H"], W=s["W"], R=s["R"], S=s["S"],
        stride=s["stride"], padding=s["padding"], dtype=case.dtype, layout=layout,
        schedule=schedule,
    )
    compile_s = time.perf_counter() - t0
    blocked = layout == "nchw16c"
    if blocked:
        first, second = inputs
        args = ([layouts.to_nchw16c(first), layouts.to_kcrs16c16k(second)] if data
                else [layouts.to_nchw16c(first), layouts.to_nchw16c(second)])
    else:
        args = list(inputs)

    def plain(out: np.ndarray) -> np.ndarray:
        if not blocked:
            return np.asarray(out)
        return (layouts.from_nchw16c(out, s["C"]) if data
                else layouts.from_kcrs16c16k(out, s["K"], s["C"]))

    wanted = [a.shape for a in kernel.arguments if a.is_input]
    if [a.shape for a in args] != wanted:
        raise BenchError(f"layout {layout}: the kernel takes inputs {wanted}, not "
                         f"{[a.shape for a in args]}")
    return PolydlBuild(polydl_runner(kernel, args, plain), compile_s,
                       kernel.schedule.describe(), layout)


BACKWARD = Pass(input_shapes, expected, build_polydl, references)
