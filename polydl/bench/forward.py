"""The forward primitives in the benchmark, GEMM and convolution: float64 results, numpy and
PyTorch (oneDNN) runners, and polydl's kernel for a `Case` whose primitive is `matmul`
(inputs a, b) or `conv2d` (inputs x, w; conv layouts `nchw16c` or `nchw`)."""

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


def numpy_conv2d(x: np.ndarray, w: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """Convolution as im2col + one BLAS GEMM; returns an NCHW view of an NHWC result."""
    n, c = x.shape[:2]
    k, _, r, s = w.shape
    if padding:
        x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    windows = np.lib.stride_tricks.sliding_window_view(x, (r, s), axis=(2, 3))
    windows = windows[:, :, ::stride, ::stride]  # [n][c][p][q][r][s]
    p, q = windows.shape[2:4]
    columns = windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * p * q, c * r * s)
    y = columns @ w.reshape(k, c * r * s).T
    return y.reshape(n, p, q, k).transpose(0, 3, 1, 2)


def gemm_references(a: np.ndarray, b: np.ndarray, torch: ModuleType | None) -> list[Runner]:
    c = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    runners = [
        Runner("numpy", lambda: np.matmul(a, b, out=c), lambda: np.asarray(a @ b)),
    ]
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        tc = torch.empty(c.shape, dtype=ta.dtype)
        runners.append(Runner(
            "torch.matmul",
            lambda: torch.matmul(ta, tb, out=tc),
            lambda: torch.matmul(ta, tb).numpy().copy(),
        ))
    return runners


def conv_references(
    x: np.ndarray, w: np.ndarray, case: Case, torch: ModuleType | None
) -> list[Runner]:
    s = case.size
    stride, padding = s["stride"], s["padding"]
    runners = [
        Runner(
            "numpy",
            lambda: numpy_conv2d(x, w, stride, padding),
            lambda: np.ascontiguousarray(numpy_conv2d(x, w, stride, padding)),
        )
    ]
    if torch is None:
        return runners
    conv2d = torch.nn.functional.conv2d
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    runners.append(Runner(
        "torch.nchw",
        lambda: conv2d(tx, tw, None, stride, padding),
        lambda: conv2d(tx, tw, None, stride, padding).numpy().copy(),
    ))
    last = torch.channels_last
    cx, cw = tx.contiguous(memory_format=last), tw.contiguous(memory_format=last)
    runners.append(Runner(
        "torch.channels_last",
        lambda: conv2d(cx, cw, None, stride, padding),
        lambda: conv2d(cx, cw, None, stride, padding).contiguous().numpy().copy(),
    ))
    if torch.backends.mkldnn.is_available():
        runners.append(mkldnn_runner("torch.mkldnn", torch, tx, tw, stride, padding))
    return runners


def mkldnn_runner(name: str, torch: ModuleType, tx: Any, tw: Any, stride: int, padding: int) -> Runner:
    """oneDNN's own blocked tensors: the activations and the weight, reordered once before the
    timed calls, stay blocked (as inference keeps them); the result as fp32 NCHW."""
    mx = tx.to_mkldnn()
    pad, step, dilation = [padding] * 2, [stride] * 2, [1, 1]
    mw = torch._C._nn.mkldnn_reorder_conv2d_weight(tw.to_mkldnn(), pad, step, dilation, 1)

    def mkldnn() -> Any:
        return torch.mkldnn_convolution(mx, mw, None, pad, step, dilation, 1)

    return Runner(name, mkldnn, lambda: mkldnn().to_dense().float().numpy().copy())


def build_polydl_gemm(case: Case, a: np.ndarray, b: np.ndarray,
                      schedule: str = "auto", constant: tuple[str, ...] = ()) -> PolydlBuild:
    s = case.size
    t0 = time.perf_counter()
    kernel = polydl.matmul(M=s["M"], N=s["N"], K=s["K"], dtype=case.dtype, schedule=schedule,
                           constant=constant)
    compile_s = time.perf_counter() - t0
    return PolydlBuild(polydl_runner(kernel, [a, b], np.asarray), compile_s,
                       kernel.schedule.describe(), "", kernel.nest.kept)


def build_polydl_conv(case: Case, x: np.ndarray, w: np.ndarray, layout: str,
                      schedule: str = "auto", constant: tuple[str, ...] = ()) -> PolydlBuild:
    s = case.size
    t0 = time.perf_counter()
    x_layout, _, y_layout = layout.partition("-")  # "nchw-nchw16c": NCHW in, blocks out
    kernel = polydl.conv2d(
        N=s["N"], C=s["C"], K=s["K"], H=s["H"], W=s["W"], R=s["R"], S=s["S"],
        stride=s["stride"], padding=s["padding"], dtype=case.dtype, layout=x_layout,
        schedule=schedule, out_layout=y_layout or None, constant=constant,
    )
    compile_s = time.perf_counter() - t0
    blocked = (y_layout or x_layout) == "nchw16c"
    if x_layout == "nchw16c":
        inputs = [layouts.to_nchw16c(x), layouts.to_kcrs16c16k(w)]
    else:
        inputs = [x, layouts.to_kcrs16k(w) if blocked else w]

    def plain(y: np.ndarray) -> np.ndarray:
        return layouts.from_nchw16c(y, s["K"]) if blocked else np.asarray(y)

    expected = [a.shape for a in kernel.arguments if a.is_input]
    if [i.shape for i in inputs] != expected:
        made = [i.shape for i in inputs]
        raise BenchError(f"layout {layout}: the kernel takes inputs {expected}, not {made}")
    return PolydlBuild(polydl_runner(kernel, inputs, plain), compile_s,
                       kernel.schedule.describe(), layout, kernel.nest.kept)


def input_shapes(case: Case) -> list[Shape]:
    s = case.size
    if case.primitive == "matmul":
        return [(s["M"], s["K"]), (s["K"], s["N"])]
    return [(s["N"], s["C"], s["H"], s["W"]), (s["K"], s["C"], s["R"], s["S"])]


def expected(case: Case, inputs: list[np.ndarray], torch: ModuleType | None) -> np.ndarray:
    """The result in float64 (PyTorch's conv when it is here, else numpy's)."""
    if case.primitive == "matmul":
        a, b = inputs
        return a.astype(np.float64) @ b.astype(np.float64)
    x, w = inputs
    s = case.size
    if torch is not None:
        y = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                       None, s["stride"], s["padding"])
        return y.numpy()
    return numpy_conv2d(x.astype(np.float64), w.astype(np.float64), s["stride"], s["padding"])


def _build_gemm(case: Case, inputs: list[np.ndarray], layout: str, schedule: str,
                constant: tuple[str, ...]) -> PolydlBuild:
    return build_polydl_gemm(case, inputs[0], inputs[1], schedule, constant)


def _build_conv(case: Case, inputs: list[np.ndarray], layout: str, schedule: str,
                constant: tuple[str, ...]) -> PolydlBuild:
    return build_polydl_conv(case, inputs[0], inputs[1], layout, schedule, constant)


def _gemm_references(
    case: Case, inputs: list[np.ndarray], torch: ModuleType | None
) -> list[Runner]:
    return gemm_references(inputs[0], inputs[1], torch)


def _conv_references(
    case: Case, inputs: list[np.ndarray], torch: ModuleType | None
) -> list[Runner]:
    return conv_references(inputs[0], inputs[1], case, torch)


def _conv_takes(case: Case, layout: str) -> bool:
    """The plain layouts, and NCHW in, blocks out for a float32 layer of fewer than 16 input
    channels (a network's stem; the blocked layout then sums 16 lanes of which C hold data)."""
    if layout == "nchw-nchw16c":
        return case.size["C"] < layouts.BLOCK and case.dtype == "float32"
    return layout in ("nchw16c", "nchw")


GEMM = Pass(input_shapes, expected, _build_gemm, _gemm_references, layouts=False, weights="B")
CONV = Pass(input_shapes, expected, _build_conv, _conv_references, weights="w", takes=_conv_takes)
