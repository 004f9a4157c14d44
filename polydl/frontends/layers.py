"""The other layers of a network as loop nests: fully-connected (forward and both backward
passes), pooling, element-wise ops, batch-norm (inference and training statistics), LSTM cell.

Takes sizes and options; returns `(LoopNest, params)`, like `builders`: arguments are validated
first (`ArgumentError` naming the argument), then the C spec is written and parsed. GEMM-shaped
nests keep the microkernel's operand order (`C[m][n] += A[m][k] * B[k][n]`, n unit stride),
transposing an operand into a local array where the layer's convention differs.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from polydl.dtypes import DTYPES
from polydl.errors import ArgumentError
from polydl.frontends.builders import FLOAT_DTYPES, LAYOUTS
from polydl.frontends.spec_writing import (
    Built,
    choice_arg,
    declaration,
    epilogue_names,
    epilogue_nests,
    function_text,
    integer_arg,
    nest,
    parse_built,
    zero_based,
)
from polydl.layouts import BLOCK

POOL_KINDS = ("max", "avg")
ELTWISE_KINDS = ("relu", "add", "scale_shift")
LSTM_GATES = 4  # input, forget, cell candidate, output: PyTorch's order


def _dtype(dtype: object) -> tuple[str, str]:
    """(C element type, float literal suffix) of a validated dtype."""
    ctype = DTYPES[choice_arg("dtype", dtype, FLOAT_DTYPES)].c_type
    return ctype, "f" if ctype == "float" else ""


def _literal(value: float, suffix: str) -> str:
    text = repr(float(value))
    if "e" not in text and "." not in text:
        text += ".0"
    return text + suffix


def _math(name: str, ctype: str) -> str:
    """The C math function for the element type: `expf` for float, `exp` for double."""
    return name if ctype == "float" else name[:-1]


def _positive_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentError(name, f"must be a number, not {type(value).__name__} {value!r}")
    if not math.isfinite(float(value)) or float(value) <= 0:
        raise ArgumentError(name, f"must be a positive finite number, not {value!r}")
    return float(value)


# ----------------------------------------------------------------------------- fully-connected


def linear(N: int, C: int, K: int, dtype: str = "float32", fuse: Sequence[str] = ()) -> Built:
    """`y[n][k] += x[n][c] * w[k][c]`, then the `fuse` epilogues in order (bias b[K], relu,
    residual shaped like y, scale_shift scale[K] and shift[K]); called as `k(x, w, *fused) -> y`.
    w is PyTorch's [out][in] layout; it is transposed into a local wt[C][K] so the GEMM streams
    unit-stride rows."""
    sizes = {"N": integer_arg("N", N), "C": integer_arg("C", C), "K": integer_arg("K", K)}
    ctype, suffix = _dtype(dtype)
    epilogues = epilogue_names(fuse)
    arrays = [
        declaration(ctype, "y", ["N", "K"], False),
        declaration(ctype, "wt", ["C", "K"], False),
        declaration(ctype, "x", ["N", "C"], True),
        declaration(ctype, "w", ["K", "C"], True),
    ]
    nests = [
        nest(zero_based(("c", "C"), ("k", "K")), "wt[c][k] = w[k][c];"),
        nest(zero_based(("n", "N"), ("k", "K"), ("c", "C")), "y[n][k] += x[n][c] * wt[c][k];"),
    ]
    fused_arrays, fused_nests = epilogue_nests(
        epilogues, ctype, [("n", "N"), ("k", "K")], ("[n][k]", ["N", "K"]), ("[k]", ["K"])
    )
    arrays += fused_arrays
    nests += fused_nests
    text = function_text("linear", list(sizes), arrays, nests)
    return parse_built("linear", text, sizes, local=("wt",))


def linear_backward_data(N: int, C: int, K: int, dtype: str = "float32") -> Built:
    """`dx[n][c] += dy[n][k] * w[k][c]`; called as `k(dy, w) -> dx`."""
    sizes = {"N": integer_arg("N", N), "C": integer_arg("C", C), "K": integer_arg("K", K)}
    ctype, _ = _dtype(dtype)
    arrays = [
        declaration(ctype, "dx", ["N", "C"], False),
        declaration(ctype, "dy", ["N", "K"], True),
        declaration(ctype, "w", ["K", "C"], True),
    ]
    body = nest(zero_based(("n", "N"), ("c", "C"), ("k", "K")), "dx[n][c] += dy[n][k] * w[k][c];")
    return parse_built("linear_backward_data", function_text("linear_backward_data", list(sizes), arrays,
                                                     [body]), sizes)


def linear_backward_weights(N: int, C: int, K: int, dtype: str = "float32") -> Built:
    """`dw[k][c] += dy[n][k] * x[n][c]`; called as `k(x, dy) -> dw`."""
    sizes = {"N": integer_arg("N", N), "C": integer_arg("C", C), "K": integer_arg("K", K)}
    ctype, _ = _dtype(dtype)
    arrays = [
        declaration(ctype, "dw", ["K", "C"], False),
        declaration(ctype, "x", ["N", "C"], True),
        declaration(ctype, "dy", ["N", "K"], True),
    ]
    body = nest(zero_based(("k", "K"), ("c", "C"), ("n", "N")), "dw[k][c] += dy[n][k] * x[n][c];")
    return parse_built("linear_backward_weights", function_text("linear_backward_weights", list(sizes),
                                                        arrays, [body]), sizes)


# ----------------------------------------------------------------------------- pooling


def _activation(layout: str, channels: int, rows: int | str, cols: int | str) -> list[str]:
    if layout == "nchw16c":
        return ["N", str(-(-channels // BLOCK)), str(rows), str(cols), str(BLOCK)]
    return ["N", "C", str(rows), str(cols)]


def _channel_loops(layout: str, channels: int) -> tuple[list[tuple[str, int | str, int | str]],
                                                        list[tuple[str, int | str, int | str]]]:
    """(loops before the spatial ones, loops after them) over the channels of a layout."""
    if layout == "nchw16c":
        return [("cb", 0, -(-channels // BLOCK))], [("c", 0, BLOCK)]
    return [("c", 0, "C")], []


def _at(layout: str, rows: str, cols: str) -> str:
    if layout == "nchw16c":
        return f"[n][cb][{rows}][{cols}][c]"
    return f"[n][c][{rows}][{cols}]"


def pool2d(
    N: int,
    C: int,
    H: int,
    W: int,
    R: int,
    S: int,
    stride: int = 1,
    padding: int = 0,
    kind: str = "max",
    dtype: str = "float32",
    layout: str = "nchw",
) -> Built:
    """Max or average pooling of R x S windows: `k(x) -> y`, y[N][C][P][Q] (nchw16c: blocked).
    Padded cells are skipped by max and count as zeros for avg (PyTorch's defaults)."""
    sizes = {
        name: integer_arg(name, value)
        for name, value in (("N", N), ("C", C), ("H", H), ("W", W), ("R", R), ("S", S))
    }
    stride = integer_arg("stride", stride)
    padding = integer_arg("padding", padding, minimum=0)
    kind = choice_arg("kind", kind, POOL_KINDS)
    ctype, suffix = _dtype(dtype)
    layout = choice_arg("layout", layout, LAYOUTS)
    for size, extent in (("H", "R"), ("W", "S")):
        if 2 * padding > sizes[extent]:
            raise ArgumentError(
                "padding", f"must be at most half the window ({extent}={sizes[extent]}), not {padding}"
            )
        if sizes[size] + 2 * padding < sizes[extent]:
            raise ArgumentError(
                extent, f"the window {extent}={sizes[extent]} exceeds the padded input "
                f"{size} + 2*padding = {sizes[size] + 2 * padding}",
            )
    P = (sizes["H"] + 2 * padding - sizes["R"]) // stride + 1
    Q = (sizes["W"] + 2 * padding - sizes["S"]) // stride + 1
    outer, inner = _channel_loops(layout, sizes["C"])
    out_loops = [("n", 0, "N"), *outer, ("p", 0, P), ("q", 0, Q), *inner]
    window = [("n", 0, "N"), *outer, ("p", 0, P), ("q", 0, Q), ("r", 0, "R"), ("s", 0, "S"),
              *inner]
    row = (f"p * {stride} + r" if stride > 1 else "p + r") + (f" - {padding}" if padding else "")
    col = (f"q * {stride} + s" if stride > 1 else "q + s") + (f" - {padding}" if padding else "")
    y, x = "y" + _at(layout, "p", "q"), "x" + _at(layout, row, col)
    if kind == "max":
        lowest = "-3.4028234663852886e+38f" if ctype == "float" else "-1.7976931348623157e+308"
        update = f"{y} = {_math('fmaxf', ctype)}({y}, {x});"
        nests = [nest(out_loops, f"{y} = {lowest};")]
    else:
        update = f"{y} += {x} / {_literal(sizes['R'] * sizes['S'], suffix)};"
        nests = []
    if padding:
        update = (f"if ({row} >= 0 && {row} < H && {col} >= 0 && {col} < W)\n"
                  + "  " * (len(window) + 2) + update)
    nests.append(nest(window, update))
    arrays = [
        declaration(ctype, "y", _activation(layout, sizes["C"], P, Q), False),
        declaration(ctype, "x", _activation(layout, sizes["C"], "H", "W"), True),
    ]
    return parse_built("pool2d", function_text("pool2d", list(sizes), arrays, nests), sizes)


# ----------------------------------------------------------------------------- element-wise


def eltwise(
    N: int, C: int, H: int = 1, W: int = 1, kind: str = "relu", dtype: str = "float32"
) -> Built:
    """An element-wise op on [N][C][H][W] tensors: "relu" `k(x) -> y`, "add" `k(a, b) -> y`,
    "scale_shift" `k(x, scale[C], shift[C]) -> y = x * scale[c] + shift[c]`."""
    kind = choice_arg("kind", kind, ELTWISE_KINDS)
    sizes = {
        name: integer_arg(name, value) for name, value in (("N", N), ("C", C), ("H", H), ("W", W))
    }
    ctype, suffix = _dtype(dtype)
    shape = ["N", "C", "H", "W"]
    at = "[n][c][h][w]"
    arrays = [declaration(ctype, "y", shape, False)]
    if kind == "relu":
        arrays.append(declaration(ctype, "x", shape, True))
        body = f"y{at} = {_math('fmaxf', ctype)}(x{at}, {_literal(0.0, suffix)});"
    elif kind == "add":
        arrays += [declaration(ctype, "a", shape, True), declaration(ctype, "b", shape, True)]
        body = f"y{at} = a{at} + b{at};"
    else:
        arrays += [
            declaration(ctype, "x", shape, True),
            declaration(ctype, "scale", ["C"], True),
            declaration(ctype, "shift", ["C"], True),
        ]
        body = f"y{at} = x{at} * scale[c] + shift[c];"
    loops = zero_based(("n", "N"), ("c", "C"), ("h", "H"), ("w", "W"))
    name = f"eltwise_{kind}"
    return parse_built(name, function_text(name, list(sizes), arrays, [nest(loops, body)]), sizes)


# ----------------------------------------------------------------------------- batch-norm


def batchnorm_inference(
    N: int, C: int, H: int, W: int, eps: float = 1e-5, dtype: str = "float32"
) -> Built:
    """`y = (x - mean[c]) / sqrt(var[c] + eps) * gamma[c] + beta[c]`, folded into one scale and
    shift per channel first; called as `k(x, gamma, beta, mean, var) -> y`."""
    sizes = {
        name: integer_arg(name, value) for name, value in (("N", N), ("C", C), ("H", H), ("W", W))
    }
    eps = _positive_real("eps", eps)
    ctype, suffix = _dtype(dtype)
    shape = ["N", "C", "H", "W"]
    arrays = [
        declaration(ctype, "y", shape, False),
        declaration(ctype, "scale", ["C"], False),
        declaration(ctype, "shift", ["C"], False),
        declaration(ctype, "x", shape, True),
        *(declaration(ctype, name, ["C"], True) for name in ("gamma", "beta", "mean", "var")),
    ]
    sqrt = _math("sqrtf", ctype)
    nests = [
        nest(zero_based(("c", "C")),
             f"scale[c] = gamma[c] / {sqrt}(var[c] + {_literal(eps, suffix)});"),
        nest(zero_based(("c", "C")), "shift[c] = beta[c] - mean[c] * scale[c];"),
        nest(zero_based(("n", "N"), ("c", "C"), ("h", "H"), ("w", "W")),
             "y[n][c][h][w] = x[n][c][h][w] * scale[c] + shift[c];"),
    ]
    text = function_text("batchnorm_inference", list(sizes), arrays, nests)
    return parse_built("batchnorm_inference", text, sizes, local=("scale", "shift"))


def batchnorm_statistics(N: int, C: int, H: int, W: int, dtype: str = "float32") -> Built:
    """Training-mode batch statistics per channel: `k(x) -> (mean[C], var[C])`, the variance
    biased (divided by N*H*W), as batch-norm normalises with."""
    sizes = {
        name: integer_arg(name, value) for name, value in (("N", N), ("C", C), ("H", H), ("W", W))
    }
    ctype, suffix = _dtype(dtype)
    count = _literal(sizes["N"] * sizes["H"] * sizes["W"], suffix)
    shape = ["N", "C", "H", "W"]
    arrays = [
        declaration(ctype, "mean", ["C"], False),
        declaration(ctype, "var", ["C"], False),
        declaration(ctype, "x", shape, True),
    ]
    loops = zero_based(("c", "C"), ("n", "N"), ("h", "H"), ("w", "W"))
    centred = "(x[n][c][h][w] - mean[c])"
    nests = [
        nest(loops, f"mean[c] += x[n][c][h][w] / {count};"),
        nest(loops, f"var[c] += {centred} * {centred} / {count};"),
    ]
    text = function_text("batchnorm_statistics", list(sizes), arrays, nests)
    return parse_built("batchnorm_statistics", text, sizes)


# ----------------------------------------------------------------------------- LSTM


def lstm_cell(N: int, C: int, K: int, dtype: str = "float32") -> Built:
    """One LSTM step as in the batch-reduce GEMM paper: the four gates are one GEMM of
    [x, h_prev] (N x (C+K)) with w[4][C+K][K] into gates[4][N][K]; the epilogue applies the
    bias b[4][K], sigmoid and tanh. Gate order i, f, g, o (PyTorch's); rows 0..C-1 of w
    multiply x, rows C.. multiply h_prev. Called as `k(x, h_prev, c_prev, w, b) -> (c, h)`."""
    sizes = {"N": integer_arg("N", N), "C": integer_arg("C", C), "K": integer_arg("K", K)}
    ctype, suffix = _dtype(dtype)
    one = _literal(1.0, suffix)
    exp, tanh = _math("expf", ctype), _math("tanhf", ctype)

    def gate(g: int) -> str:
        return f"(gates[{g}][n][k] + b[{g}][k])"

    def sigmoid(g: int) -> str:
        return f"{one} / ({one} + {exp}(-{gate(g)}))"

    arrays = [
        declaration(ctype, "c", ["N", "K"], False),
        declaration(ctype, "h", ["N", "K"], False),
        declaration(ctype, "xh", ["N", "C + K"], False),
        declaration(ctype, "gates", [str(LSTM_GATES), "N", "K"], False),
        declaration(ctype, "x", ["N", "C"], True),
        declaration(ctype, "h_prev", ["N", "K"], True),
        declaration(ctype, "c_prev", ["N", "K"], True),
        declaration(ctype, "w", [str(LSTM_GATES), "C + K", "K"], True),
        declaration(ctype, "b", [str(LSTM_GATES), "K"], True),
    ]
    cell = (f"c[n][k] = ({sigmoid(1)}) * c_prev[n][k] + ({sigmoid(0)}) * {tanh}{gate(2)};")
    nests = [
        nest(zero_based(("n", "N"), ("j", "C")), "xh[n][j] = x[n][j];"),
        nest(zero_based(("n", "N"), ("j", "K")), "xh[n][C + j] = h_prev[n][j];"),
        nest(zero_based(("g", LSTM_GATES), ("n", "N"), ("k", "K"), ("j", "C + K")),
             "gates[g][n][k] += xh[n][j] * w[g][j][k];"),
        nest(zero_based(("n", "N"), ("k", "K")), cell),
        nest(zero_based(("n", "N"), ("k", "K")), f"h[n][k] = ({sigmoid(3)}) * {tanh}(c[n][k]);"),
    ]
    text = function_text("lstm_cell", list(sizes), arrays, nests)
    return parse_built("lstm_cell", text, sizes, local=("xh", "gates"))
