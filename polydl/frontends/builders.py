"""Built-in primitives as loop nests: `matmul` and `conv2d` (plain or blocked, fused epilogues).

Takes sizes and options; returns `(LoopNest, params)`. Every argument is validated first
(`ArgumentError` naming it); the C spec of the primitive is then written from the validated
numbers and parsed by `parse_c`, so a builder and the same hand-written spec give the same IR.
Scratch arrays (the zero-padded input of a convolution) are marked `local`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypedDict

from polydl.errors import ArgumentError
from polydl.frontends.spec_writing import (
    Built,
    choice_arg,
    declaration,
    epilogue_names,
    epilogue_nests,
    float_literal,
    function_text,
    integer_arg,
    parse_built,
    zero_based_nest,
)
from polydl.layouts import BLOCK, grouped_form

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
# the forward convolution also takes channels-last tensors (the GPU tensor-core layout)
CONV_LAYOUTS = (*LAYOUTS, "nhwc")
# A blocked 1 x 1 stride-1 convolution over rows of fewer outputs than this runs an image's
# positions as one loop (`[m / W][m % W]`): its calls then span the image, not one 7-wide row
# (7 rows of C: 7 of 16 AMX tile rows, or 7 accumulators behind two FMA pipes). See decisions:
# An image's positions as one loop for 7 x 7 layers.
SHORT_ROW = 8


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


Padding = tuple[int, int, int, int]  # (top, left, bottom, right), ONNX's 2-D pads order


def padding_arg(value: object) -> Padding:
    """`padding` as (top, left, bottom, right): an int pads every side alike."""
    if isinstance(value, (tuple, list)):
        if len(value) != 4:
            raise ArgumentError(
                "padding", f"must be an int or 4 ints (top, left, bottom, right); got {value!r}"
            )
        top, left, bottom, right = (integer_arg("padding", v, minimum=0) for v in value)
        return top, left, bottom, right
    pad = integer_arg("padding", value, minimum=0)
    return pad, pad, pad, pad


def group_sizes(C: int, K: int, groups: object) -> tuple[int, int, int]:
    """(groups, C/groups, K/groups), or an `ArgumentError` of `groups`."""
    groups = integer_arg("groups", groups)
    for name, count in (("C", C), ("K", K)):
        if count % groups:
            raise ArgumentError("groups", f"groups={groups} does not divide {name}={count}")
    return groups, C // groups, K // groups


def check_window(sizes: dict[str, int], padding: Padding, dilation: int = 1) -> None:
    """An `ArgumentError` of R or S where the (dilated) filter exceeds the padded input."""
    top, left, bottom, right = padding
    for size, window, axis, pads in (("H", "R", "height", (top, bottom)),
                                     ("W", "S", "width", (left, right))):
        span = dilation * (sizes[window] - 1) + 1
        padded = sizes[size] + sum(pads)
        if padded < span:
            dilated = f" (dilated: {span})" if dilation > 1 else ""
            raise ArgumentError(
                window,
                f"the filter {axis} {window}={sizes[window]}{dilated} exceeds the padded input "
                f"{axis} {size} + padding = {padded}: the output would be empty",
            )


def output_size(size: int, window: int, stride: int, pads: int, dilation: int = 1) -> int:
    return (size + pads - dilation * (window - 1) - 1) // stride + 1


def _output_extent(size: str, window: str, stride: int, pads: int, dilation: int = 1) -> str:
    """The output extent as text; `pads` is the padding of both sides together."""
    if dilation > 1:
        span = f"{size} - {dilation} * {window} + {pads + dilation - 1}"
        return f"{span} + 1" if stride == 1 else f"({span}) / {stride} + 1"
    if stride == 1:
        return f"{size} - {window} + {pads + 1}"
    span = f"{size} - {window}" + (f" + {pads}" if pads else "")
    return f"({span}) / {stride} + 1"


def _shifted(var: str, offset: int) -> str:
    return f"{var} + {offset}" if offset else var


def _tap(out: str, stride: int, window: str, dilation: int) -> str:
    """The input row (or column) of output `out` and filter tap `window`, before padding."""
    base = f"{out} * {stride}" if stride > 1 else out
    return f"{base} + {window} * {dilation}" if dilation > 1 else f"{base} + {window}"


def _unpadded_taps(row: str, col: str, padding: Padding) -> tuple[str, str, str]:
    """(row, column, guard) of a tap read from x itself rather than its padded copy: shifted
    back by the padding, and an `if` that keeps the taps inside x (only the sides padded)."""
    top, left, bottom, right = padding
    conditions = []
    if top:
        row = f"{row} - {top}"
        conditions.append(f"{row} >= 0")
    if bottom:
        conditions.append(f"{row} < H")
    if left:
        col = f"{col} - {left}"
        conditions.append(f"{col} >= 0")
    if right:
        conditions.append(f"{col} < W")
    return row, col, f"if ({' && '.join(conditions)}) "


HALF = BLOCK // 2  # the lanes of an AVX2 vector: half a block


def _kept(loops: Sequence[tuple[str, int | str]]) -> list[tuple[str, int | str]]:
    """The loops without those of one iteration."""
    return [(var, extent) for var, extent in loops if extent != 1]


def _offset(group: str, size: int, var: str) -> str:
    """`group * size + var`, or `group` where size is 1 (the loop of `var` is then gone)."""
    return group if size == 1 else f"{group} * {size} + {var}"


def conv2d(
    N: int,
    C: int,
    K: int,
    H: int,
    W: int,
    R: int,
    S: int,
    stride: int = 1,
    padding: int | Sequence[int] = 0,
    dtype: str = "float32",
    layout: str = "nchw",
    fuse: Sequence[str] = (),
    groups: int = 1,
    dilation: int = 1,
    accumulate: bool = True,
    out_dtype: str | None = None,
    column_phases: bool = False,
    half_block_groups: bool = False,
    merged_positions: bool = False,
    out_layout: str | None = None,
) -> Built:
    """Forward convolution `y[n][k][p][q] += x[n][c][p*stride + r*dilation - top][q*stride +
    s*dilation - left] * w[k][c][r][s]`, then the `fuse` epilogues in order; called as
    `k(x, w, *fused) -> y`. `padding` is an int or (top, left, bottom, right).

    With `groups` (dividing C and K), output channel k reads the C/groups input channels of its
    group, k // (K/groups), as PyTorch's conv2d: nchw weights are w[K][C/groups][R][S].

    layout "nhwc" (groups=1): x[N][H][W][C], w[K][R][S][C], y[N][P][Q][K], the reduction
    (r, s, c) with c innermost, contiguous in both x and w.
    layout "nchw16c": x[N][CB][H][W][16], y[N][KB][P][Q][16] with CB, KB the channel counts
    rounded up to blocks (inputs padded with zeros, `polydl.layouts`); the weights are
    w[KB][CB][R][S][16c][16k], and with groups in the form `layouts.grouped_form` names
    (`layouts.to_conv_weights` converts PyTorch's): w[KB][C/groups/16][R][S][16c][16k]
    (block-diagonal), w[KB][R][S][16] (depthwise, groups == C == K) or w[KB][C/groups][R][S][16]
    (any other grouping).
    dtype "bfloat16": x and w bfloat16, y and the epilogue operands float32;
    a fused bias is then b[KB*16] and a residual is shaped like y. "scale_shift" (batch-norm in
    inference) adds scale[K] and shift[K] (KB*16 when blocked): y = y * scale[k] + shift[k];
    "clip(LO,HI)" clamps y to [LO, HI] (ReLU6 is "clip(0,6)").
    `out_dtype="bfloat16"` (with dtype "bfloat16"): y and the epilogue operands are bfloat16
    too (accumulated in float32 where the kernel fuses them, rounded once).
    `accumulate=False`: the nest sets y to zero first (`y = conv`, cuDNN's beta = 0), so a
    kernel that fuses that start never reads y; by default the convolution adds into y.
    `column_phases`: an NCHW stem (`phased_columns`) reads its input's columns split by their
    phase modulo the stride, so that its window moves along a row of outputs at unit stride;
    `polydl.conv2d` and TOML specs ask for it on the C target (`target_options`).
    `half_block_groups`: blocked float32 groups of at most 8 channels (`in_block`, such as
    ResNeXt's 4 and 8) run as the two 8 x 8 products of a block's halves, its zero quadrants
    left out (the same weights); `polydl.conv2d` and the ONNX networks ask for it where the
    target's float32 vectors hold fewer than 16 lanes (`target_options`).
    `merged_positions`: an NCHW 1 x 1 layer without padding (`plain_1x1`) runs its output
    positions as one loop m (`y[n][k][m / Q][m % Q]`), a GEMM per image; at a stride it
    copies the input positions it reads together first (`xs[n][c][p * Q + q]`). An NCHW
    layer at stride 1 over rows shorter than a block (`short_rows`) sums along its padded
    input's flat cells (`yw[n][k][m] += xf[n][c][m + r * width + s] * w[k][c][r][s]`) and
    copies the rows into y after; `polydl.conv2d` and TOML specs ask for it on the C target.
    `out_layout` (default: `layout`): "nchw16c" with layout "nchw" (groups=1) reads an NCHW x
    and gives a blocked y, w[KB][C][R][S][16], a bias of KB*16 and a blocked residual: each
    tap of x a broadcast against a vector of 16 output channels, as oneDNN runs a network's
    first layer (3 colours in, blocks out)."""
    sizes = {
        name: integer_arg(name, value)
        for name, value in (("N", N), ("C", C), ("K", K), ("H", H), ("W", W), ("R", R), ("S", S))
    }
    stride = integer_arg("stride", stride)
    top, left, bottom, right = padding_arg(padding)
    in_type, ctype = ELEMENT_CTYPES[choice_arg("dtype", dtype, SUPPORTED_DTYPES)]
    if out_dtype is not None:
        allowed = (("float32", "bfloat16") if dtype == "bfloat16" else (dtype,))
        ctype = {"float32": "float", "bfloat16": "bfloat16", "float64": "double"}[
            choice_arg("out_dtype", out_dtype, allowed)]
    layout = choice_arg("layout", layout, CONV_LAYOUTS)
    into_blocks = out_layout is not None and out_layout != layout
    if into_blocks:
        if choice_arg("out_layout", out_layout, CONV_LAYOUTS) != "nchw16c" or layout != "nchw":
            raise ArgumentError("out_layout", f"out_layout {out_layout!r} takes layout 'nchw' "
                                f"and out_layout 'nchw16c' only, not layout {layout!r}")
        if groups != 1:
            raise ArgumentError("groups", f"out_layout 'nchw16c' takes groups=1 only, not {groups}")
    epilogues = epilogue_names(fuse)
    groups, Cg, Kg = group_sizes(sizes["C"], sizes["K"], groups)
    if layout == "nhwc" and groups != 1:
        raise ArgumentError("groups", f"layout 'nhwc' takes groups=1 only, not {groups}")
    dilation = integer_arg("dilation", dilation)
    check_window(sizes, (top, left, bottom, right), dilation)
    if not isinstance(accumulate, bool):
        raise ArgumentError("accumulate", f"must be True or False, not {accumulate!r}")
    for name, flag in (("column_phases", column_phases), ("half_block_groups", half_block_groups),
                       ("merged_positions", merged_positions)):
        if not isinstance(flag, bool):
            raise ArgumentError(name, f"must be True or False, not {flag!r}")

    P = _output_extent("H", "R", stride, top + bottom, dilation)
    Q = _output_extent("W", "S", stride, left + right, dilation)
    row = _tap("p", stride, "r", dilation)
    col = _tap("q", stride, "s", dilation)
    padded = ("H" if not top + bottom else f"H + {top + bottom}",
              "W" if not left + right else f"W + {left + right}")
    ih, iw = _shifted("ih", top), _shifted("iw", left)
    source = "xp" if top or left or bottom or right else "x"
    guard = ""
    if (source == "xp" and layout == "nchw16c"
            and grouped_form(sizes["C"], sizes["K"], groups) == "depthwise"):
        # A depthwise nest is a stream through memory (9 multiply-adds per output for 3 x 3):
        # the zero-padded copy of x costs as much as the convolution. The blocked one reads x
        # itself and leaves the taps in the padding out of its domain; in NCHW the bounds this
        # puts on the row loop (the innermost) cost more than the copy, so it keeps the copy.
        # See decisions: Depthwise convolutions read their input unpadded.
        source = "x"
        row, col, guard = _unpadded_taps(row, col, (top, left, bottom, right))
    if layout == "nchw16c":
        cb = f"(C + {BLOCK - 1}) / {BLOCK}"
        kb, out_shape, out_loops, out, bias_shape, bias = _blocked_output(P, Q)
        x_shape = ["N", cb, "H", "W", str(BLOCK)]
        xp_shape = ["N", cb, *padded, str(BLOCK)]
        copy = zero_based_nest([("n", "N"), ("cb", cb), ("ih", "H"), ("iw", "W"), ("c", str(BLOCK))],
                               f"xp[n][cb][{ih}][{iw}][c] = x[n][cb][ih][iw][c];")
        conv_loops, body, w_shape = _blocked_conv(
            sizes, groups, Cg, Kg, out_loops, source, row, col,
            halves=half_block_groups and dtype == "float32",
        )
        body = guard + body
        strided = subsampled_positions(sizes, stride, (top, left, bottom, right), groups)
        if strided or positions_merged(sizes, stride, (top, left, bottom, right), groups):
            # the output position as one loop m; no padding, so no padded copy. At a stride,
            # the input positions read are copied together first (xs, one cache line each),
            # so that m walks them at one stride as well
            rows, W = sizes["H"], sizes["W"]
            if strided:
                rows, W = (sizes["H"] - 1) // stride + 1, (sizes["W"] - 1) // stride + 1
                source = "xs"
                xp_shape = ["N", cb, str(rows), str(W), str(BLOCK)]
                copy = zero_based_nest(
                    [("n", "N"), ("cb", cb), ("p", rows), ("q", W), ("c", str(BLOCK))],
                    f"xs[n][cb][p][q][c] = x[n][cb][p * {stride}][q * {stride}][c];")
            out_loops = [("n", "N"), ("kb", kb), ("m", str(rows * W)), ("k", str(BLOCK))]
            out = f"[n][kb][m / {W}][m % {W}][k]"
            conv_loops = out_loops[:3] + [("cb", cb), ("c", str(BLOCK)), out_loops[3]]
            body = f"y{out} += {source}[n][cb][m / {W}][m % {W}][c] * w[kb][cb][0][0][c][k];"
    elif layout == "nhwc":
        out_shape = ["N", P, Q, "K"]
        out_loops = [("n", "N"), ("p", P), ("q", Q), ("k", "K")]
        out = "[n][p][q][k]"
        bias_shape, bias = ["K"], "[k]"
        x_shape = ["N", "H", "W", "C"]
        xp_shape = ["N", *padded, "C"]
        copy = zero_based_nest([("n", "N"), ("ih", "H"), ("iw", "W"), ("c", "C")],
                               f"xp[n][{ih}][{iw}][c] = x[n][ih][iw][c];")
        conv_loops = out_loops + [("r", "R"), ("s", "S"), ("c", "C")]
        body = f"y{out} += {source}[n][{row}][{col}][c] * w[k][r][s][c];"
        w_shape = ["K", "R", "S", "C"]
    else:
        out_shape = ["N", "K", P, Q]
        out_loops = [("n", "N"), ("k", "K"), ("p", P), ("q", Q)]
        out = "[n][k][p][q]"
        bias_shape, bias = ["K"], "[k]"
        x_shape = ["N", "C", "H", "W"]
        xp_shape = ["N", "C", *padded]
        copy_loops: list[tuple[str, int | str]] = [("n", "N"), ("c", "C"), ("ih", "H"), ("iw", "W")]
        copy = zero_based_nest(copy_loops, f"xp[n][c][{ih}][{iw}] = x[n][c][ih][iw];")
        if into_blocks:
            # the output lanes (16 channels of a block) a vector, each tap of x a broadcast;
            # a call runs along a row of outputs, its taps s the reduction, (c, r) the batch
            kb, out_shape, out_loops, out, bias_shape, bias = _blocked_output(P, Q)
            conv_loops = out_loops[:3] + [("c", "C"), ("r", "R"), ("q", Q), ("s", "S"), out_loops[4]]
            body = f"y{out} += {source}[n][c][{row}][{col}] * w[kb][c][r][s][k];"
            w_shape = [kb, "C", "R", "S", str(BLOCK)]
        elif column_phases and phased_columns(sizes, stride, dilation, groups):
            # column iw + left of the padded input goes to phase (iw + left) % stride, place
            # (iw + left) / stride; tap s to phase s % stride, place s / stride, its weights
            # padded with zeros to `taps` a phase (the cells no copy writes are cleared)
            taps = -(-sizes["S"] // stride)
            columns = (sizes["W"] - sizes["S"] + left + right) // stride + 1
            places = max(columns + taps - 1, (sizes["W"] - 1 + left) // stride + 1)
            source = "xd"
            xp_shape = ["N", "C", padded[0], str(stride), str(places)]
            copy = zero_based_nest(
                copy_loops, f"xd[n][c][{ih}][({iw}) % {stride}][({iw}) / {stride}] = x[n][c][ih][iw];")
            weight_copy = zero_based_nest(
                [("k", "K"), ("c", "C"), ("r", "R"), ("s", "S")],
                f"wd[k][c][r][s % {stride}][s / {stride}] = w[k][c][r][s];")
            conv_loops = out_loops + [("c", "C"), ("r", "R"), ("h", str(stride)), ("t", str(taps))]
            body = f"y{out} += wd[k][c][r][h][t] * xd[n][c][{row}][h][q + t];"
            w_shape = ["K", "C", "R", "S"]
            wd_shape = ["K", "C", "R", str(stride), str(taps)]
        elif groups == 1 and merged_positions and plain_1x1(sizes, (top, left, bottom, right)):
            # the output positions one loop m: a GEMM of w by x per image, its columns an
            # image's positions (49 at 7 x 7). Read as rows, each call at stride 1 reduced one
            # channel a batch step over a row, and at a stride one tap over a row read at the
            # stride (see decisions: NCHW 1 x 1 layers as GEMMs over the positions)
            rows, cols = (sizes["H"] - 1) // stride + 1, (sizes["W"] - 1) // stride + 1
            read = f"x[n][c][m / {cols}][m % {cols}]"
            if stride > 1:
                source, read = "xs", "xs[n][c][m]"
                xp_shape = ["N", "C", str(rows * cols)]
                copy = zero_based_nest(
                    [("n", "N"), ("c", "C"), ("p", rows), ("q", cols)],
                    f"xs[n][c][p * {cols} + q] = x[n][c][p * {stride}][q * {stride}];")
            out_loops = [("n", "N"), ("k", "K"), ("m", str(rows * cols))]
            out = f"[n][k][m / {cols}][m % {cols}]"
            conv_loops = out_loops + [("c", "C")]
            body = f"y{out} += {read} * w[k][c][0][0];"
            w_shape = ["K", "C", "R", "S"]
        elif groups == 1 and merged_positions and short_rows(sizes, stride, dilation, (top, left, bottom, right)):
            # the padded input's rows as one loop m over its flat cells: tap (r, s) of output
            # m reads cell m + r * width + s, so each call runs along whole images, not rows
            # of Q; the S - 1 cells at the end of each padded row make sums no output takes
            # (yw[n][k][m], copied into y by row after)
            width = sizes["W"] + left + right
            span = ((output_size(sizes["H"], sizes["R"], 1, top + bottom) - 1) * width
                    + output_size(sizes["W"], sizes["S"], 1, left + right))
            source = "xf"
            xp_shape = ["N", "C", str((sizes["H"] + top + bottom) * width)]
            copy = zero_based_nest(copy_loops, f"xf[n][c][({ih}) * {width} + {iw}] = x[n][c][ih][iw];")
            wide_shape = ["N", "K", str(span)]
            wide_loops: list[tuple[str, int | str]] = [("n", "N"), ("k", "K"), ("m", str(span))]
            conv_loops = wide_loops + [("c", "C"), ("r", "R"), ("s", "S")]
            body = f"yw[n][k][m] += xf[n][c][m + r * {width} + s] * w[k][c][r][s];"
            out_copy = zero_based_nest(
                out_loops, f"y{out} {'+=' if accumulate else '='} yw[n][k][p * {width} + q];")
            w_shape = ["K", "C", "R", "S"]
        elif groups == 1:
            conv_loops = out_loops + [("c", "C"), ("r", "R"), ("s", "S")]
            body = f"y{out} += {source}[n][c][{row}][{col}] * w[k][c][r][s];"
            w_shape = ["K", "C", "R", "S"]
        else:
            # k and c within the group g; loops of one iteration left out (depthwise: k, c)
            conv_loops = _kept([("n", "N"), ("g", groups), ("k", Kg), ("p", P), ("q", Q),
                                ("c", Cg), ("r", "R"), ("s", "S")])
            if Cg == 1:
                # depthwise: no sum over channels to make a GEMM of; the row of outputs
                # innermost (unit stride in y, and in x at stride 1), the taps around it
                conv_loops = _kept([("n", "N"), ("g", groups), ("k", Kg), ("p", P),
                                    ("r", "R"), ("s", "S"), ("q", Q)])
            k_at, c_at = _offset("g", Kg, "k"), _offset("g", Cg, "c")
            c_in = "c" if Cg > 1 else "0"
            body = (f"{guard}y[n][{k_at}][p][q] += {source}[n][{c_at}][{row}][{col}] * "
                    f"w[{k_at}][{c_in}][r][s];")
            w_shape = ["K", str(Cg), "R", "S"]

    arrays = [declaration(ctype, "y", out_shape, False)]
    nests = []
    if source in ("xp", "xs", "xd", "xf"):
        arrays.append(declaration(in_type, source, xp_shape, False))
        nests.append(copy)
    if source == "xd":
        arrays.append(declaration(in_type, "wd", wd_shape, False))
        nests.append(weight_copy)
    arrays += [declaration(in_type, "x", x_shape, True), declaration(in_type, "w", w_shape, True)]
    zero = float_literal(0.0, ctype)
    if source == "xf":
        # the wide sums start at zero (a loop: the copy out in the calls' nest keeps the start
        # out of the microkernel, `schedules/postops.py`), then set or add into y
        arrays.append(declaration(ctype, "yw", wide_shape, False))
        nests += [zero_based_nest(wide_loops, f"yw[n][k][m] = {zero};"),
                  zero_based_nest(conv_loops, body), out_copy]
    else:
        if not accumulate:
            nests.append(zero_based_nest(out_loops, f"y{out} = {zero};"))
        nests.append(zero_based_nest(conv_loops, body))
    fused_arrays, fused_nests = epilogue_nests(
        epilogues, ctype, out_loops, (out, out_shape), (bias, bias_shape)
    )
    arrays += fused_arrays
    nests += fused_nests
    text = function_text("conv2d", list(sizes), arrays, nests)
    return parse_built("conv2d", text, sizes, local=("xp", "xs", "xd", "wd", "xf", "yw"), filled=("xs",))


class ConvOptions(TypedDict, total=False):
    """The forms `conv2d` takes per target (`target_options`)."""

    column_phases: bool
    merged_positions: bool
    half_block_groups: bool


def target_options(primitive: str, kind: str | None, lanes: int | None = None) -> ConvOptions:
    """The builder options the kernels of a target kind ("c", "cuda", "hip"; None: not known)
    take unless a caller sets them: the C target's NCHW stems read their input's columns by
    phase (not CUDA's: see decisions: The NCHW stem's input columns split by phase), and
    1 x 1 layers without padding run their positions as one loop (`merged_positions`); where
    the C target's float32 vectors hold `lanes` < 16 (AVX2), narrow groups sum by half blocks
    (a 16-lane vector's FMA costs what an 8-lane one does elsewhere; see decisions: Narrow
    groups by half blocks on 8-lane vectors)."""
    if primitive != "conv2d" or kind != "c":
        return {}
    options = ConvOptions(column_phases=True, merged_positions=True)
    if lanes and lanes < BLOCK:
        options["half_block_groups"] = True
    return options


def short_rows(sizes: dict[str, int], stride: int, dilation: int, padding: Padding) -> bool:
    """Whether an NCHW convolution at stride 1 runs its padded input's rows as one loop: rows
    of fewer than a block's outputs (ResNet's 14 x 14 and 7 x 7 3 x 3 layers), which as rows
    leave a 16-lane vector part empty, over at least a block of input channels. Its start and
    epilogues run as loops after the calls, not as their post-ops. See decisions: NCHW short
    rows summed along the flat padded input."""
    return (stride == 1 and dilation == 1 and sizes["C"] >= BLOCK
            and output_size(sizes["W"], sizes["S"], 1, padding[1] + padding[3]) < BLOCK)


def phased_columns(sizes: dict[str, int], stride: int, dilation: int, groups: int) -> bool:
    """Whether an NCHW convolution's input columns are copied split by phase: a dense strided
    window over fewer input channels than a block (a network's stem: 3 x 224 x 224, 7 x 7 at
    stride 2). Read in place, its calls pack the strided inputs of each row of outputs first,
    which with so few channels costs a large share of the row's multiply-adds; split by
    phase, the window moves at unit stride through one copy per call (S rounded up to a
    multiple of the stride: 8 taps for 7). See decisions: The NCHW stem's input columns split
    by phase."""
    return (stride > 1 and dilation == 1 and groups == 1 and sizes["C"] < BLOCK
            and sizes["S"] > 1)


def plain_1x1(sizes: dict[str, int], padding: Padding) -> bool:
    """Whether an NCHW convolution runs its output positions as one loop: a 1 x 1 window
    without padding (at a stride, ResNet's downsampling layers, it reads a copy of the
    positions it takes)."""
    return sizes["R"] == sizes["S"] == 1 and not any(padding)


def subsampled_positions(sizes: dict[str, int], stride: int, padding: Padding, groups: int) -> bool:
    """Whether a blocked forward convolution copies the input positions it reads together and
    runs its output positions as one loop: as `positions_merged`, at a stride > 1 (ResNet's
    14 x 14 -> 7 x 7 ones)."""
    return stride > 1 and _short_dense_1x1(sizes, stride, padding, groups)


def positions_merged(sizes: dict[str, int], stride: int, padding: Padding, groups: int) -> bool:
    """Whether a blocked convolution (and its backward passes) runs its output positions as one
    loop: a dense 1 x 1 window at stride 1 without padding (output position = input position),
    rows shorter than SHORT_ROW."""
    return stride == 1 and _short_dense_1x1(sizes, stride, padding, groups)


def _short_dense_1x1(sizes: dict[str, int], stride: int, padding: Padding, groups: int) -> bool:
    """A dense 1 x 1 window without padding, output rows shorter than SHORT_ROW, more than one
    row."""
    return (sizes["R"] == sizes["S"] == 1 and not any(padding)
            and (sizes["W"] - 1) // stride + 1 < SHORT_ROW and (sizes["H"] - 1) // stride > 0
            and grouped_form(sizes["C"], sizes["K"], groups) == "dense")


def _blocked_output(P: str, Q: str) -> tuple[
        str, list[str], list[tuple[str, int | str]], str, list[str], str]:
    """The blocked output y[N][KB][P][Q][16] of a convolution: (the block count KB, y's shape,
    its loops, its subscript, the bias's shape and subscript: KB*16 values)."""
    kb = f"(K + {BLOCK - 1}) / {BLOCK}"
    loops: list[tuple[str, int | str]] = [("n", "N"), ("kb", kb), ("p", P), ("q", Q), ("k", str(BLOCK))]
    return (kb, ["N", kb, P, Q, str(BLOCK)], loops, "[n][kb][p][q][k]",
            [f"{kb} * {BLOCK}"], f"[kb * {BLOCK} + k]")


def _blocked_conv(
    sizes: dict[str, int], groups: int, Cg: int, Kg: int,
    out_loops: list[tuple[str, int | str]], source: str, row: str, col: str,
    halves: bool = False,
) -> tuple[list[tuple[str, int | str]], str, list[str]]:
    """(loops, statement, weight shape) of the blocked convolution in the form
    `layouts.grouped_form` names; the channel lanes (c, then k) innermost. `halves`: an
    `in_block` grouping whose groups fit in half a block sums each half separately."""
    kb = out_loops[1][1]
    b = str(BLOCK)
    form = grouped_form(sizes["C"], sizes["K"], groups)
    y = "y[n][kb][p][q][k]"
    if form == "dense":
        cb = f"(C + {BLOCK - 1}) / {BLOCK}"
        # fewer input channels than a block (a stem's 3): the zero lanes past C are not
        # summed (16 of them were 5.3 times the multiply-adds for 3 channels)
        lanes = str(sizes["C"]) if sizes["C"] < BLOCK else b
        loops = out_loops[:4] + [("cb", cb), ("r", "R"), ("s", "S"), ("c", lanes), out_loops[4]]
        body = f"{y} += {source}[n][cb][{row}][{col}][c] * w[kb][cb][r][s][c][k];"
        return loops, body, [str(kb), cb, "R", "S", b, b]
    if form == "depthwise":
        # one input lane per output lane: the 16 lanes of a block are independent, a vector;
        # the taps outside a row of outputs, so a tap's weights stay in registers along it
        loops = out_loops[:3] + [("r", "R"), ("s", "S"), out_loops[3], out_loops[4]]
        body = f"{y} += {source}[n][kb][{row}][{col}][k] * w[kb][r][s][k];"
        return loops, body, [str(kb), "R", "S", b]
    if form == "block_diagonal":
        # output block kb of group g reads the group's input blocks only
        cbg, kbg = Cg // BLOCK, Kg // BLOCK
        loops = _kept([("n", "N"), ("g", groups), ("kb", kbg), ("p", out_loops[2][1]),
                       ("q", out_loops[3][1]), ("cb", cbg), ("r", "R"), ("s", "S"), ("c", b),
                       ("k", b)])
        k_at, c_at = _offset("g", kbg, "kb"), _offset("g", cbg, "cb")
        c_in = "cb" if cbg > 1 else "0"
        body = (f"y[n][{k_at}][p][q][k] += {source}[n][{c_at}][{row}][{col}][c] * "
                f"w[{k_at}][{c_in}][r][s][c][k];")
        return loops, body, [str(kb), str(cbg), "R", "S", b, b]
    if form == "in_block" and halves and HALF % Cg == 0:
        # each half of a block's outputs reads that half of its inputs: two 8 x 8 products,
        # one vector of 8 lanes wide each (see decisions: Narrow groups by half blocks on
        # 8-lane vectors)
        loops = out_loops[:2] + [("h", 2)] + out_loops[2:4] + [
            ("r", "R"), ("s", "S"), ("c", str(HALF)), ("k", str(HALF))]
        body = (f"y[n][kb][p][q][h * {HALF} + k] += {source}[n][kb][{row}][{col}][h * {HALF} + c] * "
                f"w[kb][r][s][h * {HALF} + c][h * {HALF} + k];")
        return loops, body, [str(kb), "R", "S", b, b]
    if form == "in_block":
        # the groups of a block of outputs read that block of inputs: a dense 16 x 16 product
        # per block, zero between the groups (ResNeXt's 4 x 4 groups: 4 times the work, but
        # the microkernel's)
        loops = out_loops[:4] + [("r", "R"), ("s", "S"), ("c", b), out_loops[4]]
        body = f"{y} += {source}[n][kb][{row}][{col}][c] * w[kb][r][s][c][k];"
        return loops, body, [str(kb), "R", "S", b, b]
    loops = _kept(out_loops[:4] + [("c", Cg), ("r", "R"), ("s", "S")]) + [out_loops[4]]
    block, lane, guard = lane_channel(sizes["C"], sizes["K"], Cg, Kg)
    c_in = "c" if Cg > 1 else "0"
    body = f"{guard}{y} += {source}[n][{block}][{row}][{col}][{lane}] * w[kb][{c_in}][r][s][k];"
    return loops, body, [str(kb), str(Cg), "R", "S", b]


def lane_channel(C: int, K: int, Cg: int, Kg: int) -> tuple[str, str, str]:
    """(block, lane, guard) of the input channel that output lane `k` of block `kb` reads at
    `c` (absent where C/groups is 1) in the "lanes" form: output channel o = kb*16 + k is of
    group o / Kg and reads input channel (o / Kg) * Cg + c. The guard (an `if`, or "") leaves
    out the zero lanes past K where they would read past the input's blocks."""
    channel = f"(kb * {BLOCK} + k) / {Kg}" if Kg > 1 else f"kb * {BLOCK} + k"
    channel = f"{channel} * {Cg} + c" if Cg > 1 else channel
    last = (-(-K // BLOCK) * BLOCK - 1) // Kg * Cg + Cg - 1
    guard = f"if (kb * {BLOCK} + k < K) " if last >= -(-C // BLOCK) * BLOCK else ""
    return f"({channel}) / {BLOCK}", f"({channel}) % {BLOCK}", guard


PRIMITIVES: dict[str, Callable[..., Built]] = {"matmul": matmul, "conv2d": conv2d}
