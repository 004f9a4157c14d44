"""C loop nests for the operators of a network, written from static shapes.

Each writer returns the text of one C function (`void NAME(T out[...], const T in[...], ...)`)
whose sizes are literal numbers: the network's shapes are fixed when it is compiled. The text
goes through polydl's C frontend like any user spec, so every access is proven in bounds and
every schedule is checked against the dependences. Arrays listed in `Text.local` are scratch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from polydl.frontends.spec_writing import padded_copy

BLOCK = 16
LOWEST = "-3.4028234663852886e+38f"


@dataclass(frozen=True)
class Text:
    name: str
    source: str
    local: tuple[str, ...] = ()
    filled: tuple[str, ...] = ()  # scratch arrays written in full before they are read


def literal(value: float) -> str:
    if math.isinf(value):
        return "3.4028234663852886e+38f" if value > 0 else LOWEST
    text = repr(float(value))
    if "e" not in text and "." not in text:
        text += ".0"
    return text + "f"


def dims(shape: Sequence[int]) -> str:
    return "".join(f"[{d}]" for d in shape)


def array(name: str, shape: Sequence[int], is_input: bool) -> str:
    return ("const " if is_input else "") + f"float {name}{dims(shape) or '[1]'}"


def function(name: str, arrays: Sequence[str], nests: Sequence[str], local: Sequence[str] = (),
             filled: Sequence[str] = ()) -> Text:
    body = "\n".join(nests)
    return Text(name, f"void {name}({', '.join(arrays)}) {{\n{body}\n}}\n", tuple(local),
                tuple(filled))


def loops(extents: Sequence[tuple[str, int]], body: str, guard: str = "") -> str:
    """A perfect nest of zero-based loops around `body` (under `if (guard)` when given)."""
    lines = [" " * (2 * d + 2) + f"for (int {v} = 0; {v} < {n}; {v}++)"
             for d, (v, n) in enumerate(extents)]
    indent = " " * (2 * len(extents) + 2)
    if guard:
        lines.append(indent + f"if ({guard})")
        indent += "  "
    lines.append(indent + body)
    return "\n".join(lines)


def at(name: str, indices: Sequence[str]) -> str:
    return name + "".join(f"[{i}]" for i in indices) if indices else f"{name}[0]"


# ----------------------------------------------------------------------------- element-wise


@dataclass(frozen=True)
class Operand:
    """An input of an element-wise kernel: its array shape, of the output's rank, each
    dimension equal to the output's or 1 (broadcast)."""

    name: str
    shape: tuple[int, ...]


def elementwise(name: str, out_shape: Sequence[int], operands: Sequence[Operand],
                expression: str) -> Text:
    """`y = expression` element by element; `{i}` in `expression` is operand i's element."""
    variables = [f"i{d}" for d in range(len(out_shape))]
    loads = []
    for operand in operands:
        indices = [v if size == out else "0"
                   for v, size, out in zip(variables, operand.shape, out_shape, strict=True)]
        loads.append(at(operand.name, indices))
    body = f"{at('y', variables)} = {expression.format(*loads)};"
    arrays = [array("y", out_shape, False)] + [array(o.name, o.shape, True) for o in operands]
    return function(name, arrays, [loops(list(zip(variables, out_shape, strict=True)), body)])


def copy(name: str, out_shape: Sequence[int], in_shape: Sequence[int], source: Sequence[str]) -> Text:
    """`y[i0][i1]... = x[source]`: a gather whose indices are affine in the output's."""
    variables = [f"i{d}" for d in range(len(out_shape))]
    body = f"{at('y', variables)} = {at('x', source)};"
    return function(name, [array("y", out_shape, False), array("x", in_shape, True)],
                    [loops(list(zip(variables, out_shape, strict=True)), body)])


def to_blocked(name: str, shape: Sequence[int]) -> Text:
    """[N][C][H][W] -> [N][CB][H][W][16], the padding channels zero."""
    n, c, h, w = shape
    cb = -(-c // BLOCK)
    body = "y[n][cb][h][w][c] = x[n][cb * 16 + c][h][w];"
    nests = [loops([("n", n), ("cb", cb), ("h", h), ("w", w), ("c", BLOCK)], body,
                   guard=f"cb * 16 + c < {c}")]
    if c % BLOCK:
        nests.append(loops([("n", n), ("h", h), ("w", w), ("c", BLOCK - c % BLOCK)],
                           f"y[n][{cb - 1}][h][w][c + {c % BLOCK}] = 0.0f;"))
    return function(name, [array("y", (n, cb, h, w, BLOCK), False), array("x", shape, True)], nests)


def from_blocked(name: str, shape: Sequence[int]) -> Text:
    """[N][CB][H][W][16] -> [N][C][H][W]."""
    n, c, h, w = shape
    cb = -(-c // BLOCK)
    body = "y[n][cb * 16 + c][h][w] = x[n][cb][h][w][c];"
    return function(name, [array("y", shape, False), array("x", (n, cb, h, w, BLOCK), True)],
                    [loops([("n", n), ("cb", cb), ("h", h), ("w", w), ("c", BLOCK)], body,
                           guard=f"cb * 16 + c < {c}")])


# ----------------------------------------------------------------------------- pooling


@dataclass(frozen=True)
class Window:
    """A pooling window over the two spatial axes: sizes, strides, pads (top, left, bottom,
    right) and the output extents."""

    size: tuple[int, int]
    stride: tuple[int, int]
    pads: tuple[int, int, int, int]
    out: tuple[int, int]


def pool(name: str, kind: str, in_shape: Sequence[int], out_shape: Sequence[int], window: Window,
         blocked: bool, divisors: tuple[str, str] = ("", "")) -> Text:
    """Max or average pooling; for "avg" the sum is scaled by `rd[p] * cd[q]` (the reciprocal
    window counts, inputs of the kernel named by `divisors`)."""
    (R, S), (sh, sw), (pt, pl, _, _) = window.size, window.stride, window.pads
    P, Q = window.out
    H, W = in_shape[2], in_shape[3]
    row = f"p * {sh} + r - {pt}"
    col = f"q * {sw} + s - {pl}"
    if blocked:
        outer = [("n", out_shape[0]), ("cb", out_shape[1])]
        inner = [("c", BLOCK)]
        y, x = "y[n][cb][p][q][c]", f"x[n][cb][{row}][{col}][c]"
    else:
        outer, inner = [("n", out_shape[0]), ("c", out_shape[1])], []
        y, x = "y[n][c][p][q]", f"x[n][c][{row}][{col}]"
    out_loops = [*outer, ("p", P), ("q", Q), *inner]
    window_loops = [*outer, ("p", P), ("q", Q), ("r", R), ("s", S), *inner]
    inside = f"{row} >= 0 && {row} < {H} && {col} >= 0 && {col} < {W}"
    arrays = [array("y", out_shape, False), array("x", in_shape, True)]
    if kind == "max":
        nests = [loops(out_loops, f"{y} = {LOWEST};"),
                 loops(window_loops, f"{y} = {x} > {y} ? {x} : {y};", guard=inside)]
    else:
        nests = [loops(out_loops, f"{y} = 0.0f;"),
                 loops(window_loops, f"{y} += {x};", guard=inside),
                 loops(out_loops, f"{y} = {y} * ({divisors[0]}[p] * {divisors[1]}[q]);")]
        arrays += [array(divisors[0], (P,), True), array(divisors[1], (Q,), True)]
    return function(name, arrays, nests)


def global_average(name: str, in_shape: Sequence[int], out_shape: Sequence[int], blocked: bool) -> Text:
    """The mean over H and W: y[n][c][0][0] (blocked: y[n][cb][0][0][c])."""
    H, W = in_shape[2], in_shape[3]
    scale = literal(1.0 / (H * W))
    if blocked:
        outer = [("n", in_shape[0]), ("cb", in_shape[1]), ("c", BLOCK)]
        y, x = "y[n][cb][0][0][c]", "x[n][cb][h][w][c]"
        window = [("n", in_shape[0]), ("cb", in_shape[1]), ("h", H), ("w", W), ("c", BLOCK)]
    else:
        outer = [("n", in_shape[0]), ("c", in_shape[1])]
        y, x = "y[n][c][0][0]", "x[n][c][h][w]"
        window = [*outer, ("h", H), ("w", W)]
    nests = [loops(outer, f"{y} = 0.0f;"), loops(window, f"{y} += {x};"),
             loops(outer, f"{y} = {y} * {scale};")]
    return function(name, [array("y", out_shape, False), array("x", in_shape, True)], nests)


# ----------------------------------------------------------------------------- reductions


def reduce_mean(name: str, in_shape: Sequence[int], axes: Sequence[int], out_shape: Sequence[int]) -> Text:
    """The mean over `axes`; `out_shape` keeps them as 1 or drops them (keepdims)."""
    variables = [f"i{d}" for d in range(len(in_shape))]
    kept = [v for d, v in enumerate(variables) if d not in axes]
    if len(out_shape) == len(in_shape):
        out_index = ["0" if d in axes else v for d, v in enumerate(variables)]
    else:
        out_index = kept
    y = at("y", out_index)
    count = math.prod(in_shape[a] for a in axes)
    out_loops = [(v, in_shape[d]) for d, v in enumerate(variables) if d not in axes]
    nests = [loops(out_loops, f"{y} = 0.0f;"),
             loops(list(zip(variables, in_shape, strict=True)), f"{y} += {at('x', variables)};"),
             loops(out_loops, f"{y} = {y} * {literal(1.0 / count)};")]
    return function(name, [array("y", out_shape, False), array("x", in_shape, True)], nests)


def softmax(name: str, outer: int, extent: int, inner: int) -> Text:
    """Softmax along the middle axis of a [outer][extent][inner] view."""
    o, a, i = ("o", outer), ("a", extent), ("i", inner)
    nests = [
        loops([o, i], f"m[o][i] = {LOWEST};"),
        loops([o, a, i], "m[o][i] = x[o][a][i] > m[o][i] ? x[o][a][i] : m[o][i];"),
        loops([o, i], "s[o][i] = 0.0f;"),
        loops([o, a, i], "y[o][a][i] = expf(x[o][a][i] - m[o][i]);"),
        loops([o, a, i], "s[o][i] += y[o][a][i];"),
        loops([o, a, i], "y[o][a][i] = y[o][a][i] / s[o][i];"),
    ]
    shape = (outer, extent, inner)
    arrays = [array("y", shape, False), array("m", (outer, inner), False),
              array("s", (outer, inner), False), array("x", shape, True)]
    return function(name, arrays, nests, local=("m", "s"))


# ----------------------------------------------------------------------------- products


def matmul(name: str, a_shape: Sequence[int], b_shape: Sequence[int], out_shape: Sequence[int],
           a_transposed: bool = False, b_transposed: bool = False, bias: Operand | None = None,
           epilogue: str = "", bias_scale: float = 1.0) -> Text:
    """`y[..][m][n] = sum_k a[..][m][k] * b[..][k][n]` over broadcast batch dimensions (`a`
    and `b` given with the output's rank), then `+ bias` and `y = epilogue` ("{0}" is y)."""
    rank = len(out_shape)
    batch = [f"b{d}" for d in range(rank - 2)]
    M, N = out_shape[-2], out_shape[-1]
    K = a_shape[-2] if a_transposed else a_shape[-1]

    def batch_index(shape: Sequence[int]) -> list[str]:
        return [v if s == o else "0" for v, s, o in zip(batch, shape[:-2], out_shape[:-2], strict=True)]

    a_idx = batch_index(a_shape) + (["k", "m"] if a_transposed else ["m", "k"])
    b_idx = batch_index(b_shape) + (["n", "k"] if b_transposed else ["k", "n"])
    y = at("y", batch + ["m", "n"])
    out_loops = [*zip(batch, out_shape[:-2], strict=True), ("m", M), ("n", N)]
    nests = [loops(out_loops, f"{y} = 0.0f;"),
             loops([*out_loops[:-1], ("k", K), ("n", N)],
                   f"{y} += {at('a', a_idx)} * {at('b', b_idx)};")]
    arrays = [array("y", out_shape, False), array("a", a_shape, True), array("b", b_shape, True)]
    if bias is not None:
        index = [v if s == o else "0" for v, s, o in
                 zip(batch + ["m", "n"], bias.shape, out_shape, strict=True)]
        scaled = at(bias.name, index) if bias_scale == 1.0 else \
            f"{literal(bias_scale)} * {at(bias.name, index)}"
        nests.append(loops(out_loops, f"{y} += {scaled};"))
        arrays.append(array(bias.name, bias.shape, True))
    if epilogue:
        nests.append(loops(out_loops, f"{y} = {epilogue.format(y)};"))
    return function(name, arrays, nests)


def conv_transpose(name: str, x_shape: Sequence[int], w_shape: Sequence[int],
                   out_shape: Sequence[int], full: tuple[int, int], stride: tuple[int, int],
                   dilation: tuple[int, int], crop: tuple[int, int], groups: int,
                   bias: bool) -> Text:
    """A transposed convolution: every input position scatters `x * w` into a full-size
    scratch output, which is then cropped by the pads (and the bias added)."""
    N, C, H, W = x_shape
    K = out_shape[1]
    Cg, Kg = C // groups, K // groups
    R, S = w_shape[2], w_shape[3]
    (sh, sw), (dh, dw), (ct, cl) = stride, dilation, crop
    scatter = (f"yf[n][g * {Kg} + k][h * {sh} + r * {dh}][w * {sw} + s * {dw}] += "
               f"x[n][g * {Cg} + c][h][w] * wt[g * {Cg} + c][k][r][s];")
    full_shape = (N, K, full[0], full[1])
    nests = [loops([("n", N), ("k", K), ("p", full[0]), ("q", full[1])], "yf[n][k][p][q] = 0.0f;"),
             loops([("n", N), ("g", groups), ("k", Kg), ("c", Cg), ("h", H), ("w", W), ("r", R),
                    ("s", S)], scatter)]
    crop_body = f"y[n][k][p][q] = yf[n][k][p + {ct}][q + {cl}]" + (" + b[k];" if bias else ";")
    nests.append(loops([("n", N), ("k", K), ("p", out_shape[2]), ("q", out_shape[3])], crop_body))
    arrays = [array("y", out_shape, False), array("yf", full_shape, False),
              array("x", x_shape, True), array("wt", w_shape, True)]
    if bias:
        arrays.append(array("b", (K,), True))
    return function(name, arrays, nests, local=("yf",))


# ----------------------------------------------------------------------------- data movement


def pad(name: str, in_shape: Sequence[int], out_shape: Sequence[int], begins: Sequence[int],
        value: float) -> Text:
    variables = [f"i{d}" for d in range(len(in_shape))]
    fill = loops([(f"o{d}", n) for d, n in enumerate(out_shape)],
                 f"{at('y', [f'o{d}' for d in range(len(out_shape))])} = {literal(value)};")
    place = loops(list(zip(variables, in_shape, strict=True)),
                  f"{at('y', [f'{v} + {b}' if b else v for v, b in zip(variables, begins, strict=True)])}"
                  f" = {at('x', variables)};")
    return function(name, [array("y", out_shape, False), array("x", in_shape, True)], [fill, place])


def concat(name: str, in_shapes: Sequence[Sequence[int]], out_shape: Sequence[int], axis: int) -> Text:
    variables = [f"i{d}" for d in range(len(out_shape))]
    nests, arrays, offset = [], [array("y", out_shape, False)], 0
    for j, shape in enumerate(in_shapes):
        target = [f"{v} + {offset}" if d == axis and offset else v for d, v in enumerate(variables)]
        nests.append(loops(list(zip(variables, shape, strict=True)),
                           f"{at('y', target)} = {at(f'x{j}', variables)};"))
        arrays.append(array(f"x{j}", shape, True))
        offset += shape[axis]
    return function(name, arrays, nests)


def split(name: str, in_shape: Sequence[int], out_shapes: Sequence[Sequence[int]], axis: int) -> Text:
    variables = [f"i{d}" for d in range(len(in_shape))]
    nests, arrays, offset = [], [], 0
    for j, shape in enumerate(out_shapes):
        source = [f"{v} + {offset}" if d == axis and offset else v for d, v in enumerate(variables)]
        nests.append(loops(list(zip(variables, shape, strict=True)),
                           f"{at(f'y{j}', variables)} = {at('x', source)};"))
        arrays.append(array(f"y{j}", shape, False))
        offset += shape[axis]
    arrays.append(array("x", in_shape, True))
    return function(name, arrays, nests)


def padded_input(x_shape: Sequence[int], pads: Sequence[int]) -> tuple[tuple[int, ...], list[str]]:
    """The zero-padded copy `xp` of `x[N][C][H][W]` under `pads` (top, left, bottom, right): its
    shape, and the nest that writes every cell of it (a scratch array `filled`)."""
    N, C, H, W = x_shape
    pt, pl, pb, pr = pads
    padded = (N, C, H + pt + pb, W + pl + pr)
    return padded, [padded_copy([("n", N), ("c", C), ("h", padded[2]), ("v", padded[3])],
                                "xp[n][c][h][v]", "x[n][c][{h}][{v}]", (("h", pt, H), ("v", pl, W)),
                                "0.0f")]


def conv_direct(name: str, x_shape: Sequence[int], w_shape: Sequence[int], out_shape: Sequence[int],
                stride: tuple[int, int], dilation: tuple[int, int],
                pads: tuple[int, int, int, int], groups: int, activation: str) -> Text:
    """A grouped convolution in NCHW with its own stride and dilation per axis (the forms
    the conv2d builder does not take): the input copied into a zero-padded scratch array,
    then the direct nest, the bias and `activation` ("{0}" is y)."""
    N, C, H, W = x_shape
    K, Cg, R, S = w_shape
    Kg = K // groups
    P, Q = out_shape[2], out_shape[3]
    (sh, sw), (dh, dw) = stride, dilation
    padded, nests = padded_input(x_shape, pads)
    y = f"y[n][g * {Kg} + k][p][q]"
    nests += [
        loops([("n", N), ("g", groups), ("k", Kg), ("p", P), ("q", Q)], f"{y} = b[g * {Kg} + k];"),
        loops([("n", N), ("g", groups), ("k", Kg), ("p", P), ("c", Cg), ("r", R), ("s", S), ("q", Q)],
              f"{y} += xp[n][g * {Cg} + c][p * {sh} + r * {dh}][q * {sw} + s * {dw}] * "
              f"w[g * {Kg} + k][c][r][s];"),
    ]
    if activation:
        nests.append(loops([("n", N), ("g", groups), ("k", Kg), ("p", P), ("q", Q)],
                           f"{y} = {activation.format(y)};"))
    arrays = [array("y", out_shape, False), array("xp", padded, False), array("x", x_shape, True),
              array("w", w_shape, True), array("b", (K,), True)]
    return function(name, arrays, nests, local=("xp",), filled=("xp",))
