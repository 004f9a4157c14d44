"""Built-in primitives as loop nests: `matmul` and `conv2d` (plain or blocked, fused epilogues).

Takes sizes and options; returns `(LoopNest, params)`. Every argument is validated first
(`ArgumentError` naming it); the C spec of the primitive is then written from the validated
numbers and parsed by `parse_c`, so a builder and the same hand-written spec give the same IR.
Scratch arrays (the zero-padded input of a convolution) are marked `local`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from polydl.errors import ArgumentError
from polydl.frontends.spec_writing import (
    Built,
    choice_arg,
    declaration,
    epilogue_names,
    epilogue_nests,
    function_text,
    integer_arg,
    parse_built,
    zero_based_nest,
)
from polydl.layouts import BLOCK

# The other layers (backward passes, linear, pooling, ...) are float32 or float64 for now.
FLOAT_DTYPES = ("float32", "float64")
# C element types of a primitive's (inputs, outputs) per dtype: bfloat16 inputs are multiplied
# with fp32 accumulation into an fp32 output (and fp32 epilogue operands), as the bf16 dot
# products of the hardware do; rounding the output back to bf16 is the caller's choice.
ELEMENT_CTYPES = {
    "float32": ("float", "float"),
    "float64": ("double", "double"),
    "bfloat16": ("bfloat16", "float"),
}
SUPPORTED_DTYPES = tuple(ELEMENT_CTYPES)  # the primitives compute in floating point
LAYOUTS = ("nchw", "nchw16c")


def matmul(M: int, N: int, K: int, dtype: str = "float32") -> Built:
    """`C[M][N] += A[M][K] * B[K][N]`; called as `k(A, B) -> C`. With dtype "bfloat16", A and
    B are bfloat16 and C is float32."""
    sizes = {"M": integer_arg("M", M), "N": integer_arg("N", N), "K": integer_arg("K", K)}
    in_type, out_type = ELEMENT_CTYPES[choice_arg("dtype", dtype, SUPPORTED_DTYPES)]
    text = function_text(
        "matmul",
        list(sizes),
        [
            declaration(out_type, "C", ["M", "N"], False),
            declaration(in_type, "A", ["M", "K"], True),
            declaration(in_type, "B", ["K", "N"], True),
        ],
        [zero_based_nest([("i", "M"), ("j", "N"), ("k", "K")], "C[i][j] += A[i][k] * B[k][j];")],
    )
    return parse_built("matmul", text, sizes)


def _output_extent(size: str, window: str, stride: int, padding: int) -> str:
    if stride == 1:
        return f"{size} - {window} + {2 * padding + 1}"
    span = f"{size} - {window}" + (f" + {2 * padding}" if padding else "")
    return f"({span}) / {stride} + 1"


def conv2d(
    N: int,
    C: int,
    K: int,
    H: int,
    W: int,
    R: int,
    S: int,
    stride: int = 1,
    padding: int = 0,
    dtype: str = "float32",
    layout: str = "nchw",
    fuse: Sequence[str] = (),
) -> Built:
    """Forward convolution `y[n][k][p][q] += x[n][c][p*stride + r - pad][q*stride + s - pad] *
    w[k][c][r][s]`, then the `fuse` epilogues in order; called as `k(x, w, *fused) -> y`.

    layout "nchw16c": x[N][CB][H][W][16], w[KB][CB][R][S][16c][16k], y[N][KB][P][Q][16] with
    CB, KB the channel counts rounded up to blocks (inputs padded with zeros, `polydl.layouts`);
    dtype "bfloat16": x and w bfloat16, y and the epilogue operands float32;
    a fused bias is then b[KB*16] and a residual is shaped like y. "scale_shift" (batch-norm in
    inference) adds scale[K] and shift[K] (KB*16 when blocked): y = y * scale[k] + shift[k]."""
    sizes = {
        name: integer_arg(name, value)
        for name, value in (("N", N), ("C", C), ("K", K), ("H", H), ("W", W), ("R", R), ("S", S))
    }
    stride = integer_arg("stride", stride)
    padding = integer_arg("padding", padding, minimum=0)
    in_type, ctype = ELEMENT_CTYPES[choice_arg("dtype", dtype, SUPPORTED_DTYPES)]
    layout = choice_arg("layout", layout, LAYOUTS)
    epilogues = epilogue_names(fuse)
    for size, window, axis in (("H", "R", "height"), ("W", "S", "width")):
        if sizes[size] + 2 * padding < sizes[window]:
            raise ArgumentError(
                window,
                f"the filter {axis} {window}={sizes[window]} exceeds the padded input {axis} "
                f"{size} + 2*padding = {sizes[size] + 2 * padding}: the output would be empty",
            )

    P = _output_extent("H", "R", stride, padding)
    Q = _output_extent("W", "S", stride, padding)
    row = f"p * {stride} + r" if stride > 1 else "p + r"
    col = f"q * {stride} + s" if stride > 1 else "q + s"
    padded = ("H", "W") if not padding else (f"H + {2 * padding}", f"W + {2 * padding}")
    if layout == "nchw16c":
        cb, kb = f"(C + {BLOCK - 1}) / {BLOCK}", f"(K + {BLOCK - 1}) / {BLOCK}"
        out_shape = ["N", kb, P, Q, str(BLOCK)]
        out_loops = [("n", "N"), ("kb", kb), ("p", P), ("q", Q), ("k", str(BLOCK))]
        out = "[n][kb][p][q][k]"
        bias_shape, bias = [f"{kb} * {BLOCK}"], f"[kb * {BLOCK} + k]"
        x_shape = ["N", cb, "H", "W", str(BLOCK)]
        xp_shape = ["N", cb, *padded, str(BLOCK)]
        w_shape = [kb, cb, "R", "S", str(BLOCK), str(BLOCK)]
        copy_loops = [("n", "N"), ("cb", cb), ("ih", "H"), ("iw", "W"), ("c", str(BLOCK))]
        copy = f"xp[n][cb][ih + {padding}][iw + {padding}][c] = x[n][cb][ih][iw][c];"
        conv_loops = out_loops[:4] + [("cb", cb), ("r", "R"), ("s", "S"), ("c", str(BLOCK))]
        conv_loops += [out_loops[4]]
        source, weight = f"[n][cb][{row}][{col}][c]", "w[kb][cb][r][s][c][k]"
    else:
        out_shape = ["N", "K", P, Q]
        out_loops = [("n", "N"), ("k", "K"), ("p", P), ("q", Q)]
        out = "[n][k][p][q]"
        bias_shape, bias = ["K"], "[k]"
        x_shape = ["N", "C", "H", "W"]
        xp_shape = ["N", "C", *padded]
        w_shape = ["K", "C", "R", "S"]
        copy_loops = [("n", "N"), ("c", "C"), ("ih", "H"), ("iw", "W")]
        copy = f"xp[n][c][ih + {padding}][iw + {padding}] = x[n][c][ih][iw];"
        conv_loops = out_loops + [("c", "C"), ("r", "R"), ("s", "S")]
        source, weight = f"[n][c][{row}][{col}]", "w[k][c][r][s]"

    arrays = [declaration(ctype, "y", out_shape, False)]
    nests = []
    if padding:
        arrays.append(declaration(in_type, "xp", xp_shape, False))
        nests.append(zero_based_nest(copy_loops, copy))
    arrays += [declaration(in_type, "x", x_shape, True), declaration(in_type, "w", w_shape, True)]
    nests.append(zero_based_nest(conv_loops, f"y{out} += {'xp' if padding else 'x'}{source} * {weight};"))
    fused_arrays, fused_nests = epilogue_nests(
        epilogues, ctype, out_loops, (out, out_shape), (bias, bias_shape)
    )
    arrays += fused_arrays
    nests += fused_nests
    text = function_text("conv2d", list(sizes), arrays, nests)
    return parse_built("conv2d", text, sizes, local=("xp",))


PRIMITIVES: dict[str, Callable[..., Built]] = {"matmul": matmul, "conv2d": conv2d}
