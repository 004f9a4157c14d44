"""Convolution training passes as loop nests: backward-data and backward-weights.

Takes the sizes of the forward convolution (`builders.conv2d`'s arguments); returns
`(LoopNest, params)`. Each pass is one multiply-accumulate nest that the schedule binds to a
batch-reduce GEMM, plus copy nests into local (scratch) arrays that keep its accesses affine
and its operands in the microkernel's order:

- backward-data, stride 1: a forward convolution of `dy`, zero-padded by `R-1-padding`, with
  the weights transposed (C and K swapped) and flipped in R and S.
- backward-data, stride > 1: every output position scatters its contribution into a padded
  `dx` (`dxp[p*stride + r][q*stride + s] += ...`), the padding cropped off afterwards; no
  multiplication by the zeros a dilated `dy` would hold. In NCHW the contributions come from
  one GEMM (channels-last `dy` times the weights as a [K][C*R*S] matrix) and are then
  scattered (col2im).
- backward-weights: the GEMM over the output positions of the zero-padded input `x` and `dy`.
"""

from __future__ import annotations

from polydl.dtypes import DTYPES
from polydl.errors import ArgumentError
from polydl.frontends.builders import FLOAT_DTYPES, LAYOUTS
from polydl.frontends.spec_writing import (
    Built,
    choice_arg,
    declaration,
    function_text,
    integer_arg,
    nest,
    parse_built,
    zero_based,
)
from polydl.layouts import BLOCK


class ConvSizes:
    """Validated sizes of a convolution and the numbers every pass derives from them."""

    def __init__(
        self, N: int, C: int, K: int, H: int, W: int, R: int, S: int, stride: int, padding: int,
        dtype: str, layout: str,
    ) -> None:
        self.sizes = {
            name: integer_arg(name, value)
            for name, value in (("N", N), ("C", C), ("K", K), ("H", H), ("W", W), ("R", R), ("S", S))
        }
        self.stride = integer_arg("stride", stride)
        self.padding = integer_arg("padding", padding, minimum=0)
        self.ctype = DTYPES[choice_arg("dtype", dtype, FLOAT_DTYPES)].c_type
        self.layout = choice_arg("layout", layout, LAYOUTS)
        for size, window, axis in (("H", "R", "height"), ("W", "S", "width")):
            if self.sizes[size] + 2 * self.padding < self.sizes[window]:
                raise ArgumentError(
                    window,
                    f"the filter {axis} {window}={self.sizes[window]} exceeds the padded input "
                    f"{axis} {size} + 2*padding = {self.sizes[size] + 2 * self.padding}: "
                    "the output would be empty",
                )
        s = self.sizes
        self.P = (s["H"] + 2 * self.padding - s["R"]) // self.stride + 1
        self.Q = (s["W"] + 2 * self.padding - s["S"]) // self.stride + 1
        self.blocked = self.layout == "nchw16c"
        self.CB = -(-s["C"] // BLOCK)
        self.KB = -(-s["K"] // BLOCK)

    def activation(self, channels: str, rows: int | str, cols: int | str) -> list[str]:
        """Shape of an activation with `channels` "C" or "K" in this layout."""
        if self.blocked:
            return ["N", f"({channels} + {BLOCK - 1}) / {BLOCK}", str(rows), str(cols), str(BLOCK)]
        return ["N", channels, str(rows), str(cols)]

    def weights(self) -> list[str]:
        if self.blocked:
            kb, cb = f"(K + {BLOCK - 1}) / {BLOCK}", f"(C + {BLOCK - 1}) / {BLOCK}"
            return [kb, cb, "R", "S", str(BLOCK), str(BLOCK)]
        return ["K", "C", "R", "S"]

    def channel_loops(self, channels: str) -> tuple[tuple[str, int], ...]:
        """(block loop, lane loop) of channel `c` or `k`; the lane loop is absent when plain."""
        count = self.sizes["C" if channels == "c" else "K"]
        if self.blocked:
            return ((f"{channels}b", -(-count // BLOCK)), (channels, BLOCK))
        return ((channels, count),)

    def at(self, channels: str, rows: str, cols: str) -> str:
        """Subscript of an activation element at channel `channels` (c or k)."""
        if self.blocked:
            return f"[n][{channels}b][{rows}][{cols}][{channels}]"
        return f"[n][{channels}][{rows}][{cols}]"

    def weight(self, r: str, s: str) -> str:
        if self.blocked:
            return f"[kb][cb][{r}][{s}][c][k]"
        return f"[k][c][{r}][{s}]"

    def transposed_weight(self) -> str:
        """Subscript of the weights with C and K swapped: `wt[cb][kb][r][s][k][c]`."""
        if self.blocked:
            return "[cb][kb][r][s][k][c]"
        return "[c][k][r][s]"

    def transposed_shape(self) -> list[str]:
        if self.blocked:
            return [str(self.CB), str(self.KB), "R", "S", str(BLOCK), str(BLOCK)]
        return ["C", "K", "R", "S"]


def _scaled(var: str, stride: int, offset: str) -> str:
    base = f"{var} * {stride}" if stride > 1 else var
    return f"{base} + {offset}"


def conv2d_backward_data(
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
) -> Built:
    """The gradient of a convolution's input: `k(dy, w) -> dx`, with dy[N][K][P][Q] (nchw16c:
    dy[N][KB][P][Q][16]), w as the forward weights, dx shaped like the forward input."""
    cs = ConvSizes(N, C, K, H, W, R, S, stride, padding, dtype, layout)
    s, ct = cs.sizes, cs.ctype
    weight_loops = zero_based(*cs.channel_loops("c")[:1], *cs.channel_loops("k")[:1],
                              ("r", "R"), ("s", "S"),
                              *cs.channel_loops("k")[1:], *cs.channel_loops("c")[1:])
    image_loop = [("n", 0, "N")]
    c_loops = zero_based(*cs.channel_loops("c"))
    k_loops = zero_based(*cs.channel_loops("k"))
    arrays = [declaration(ct, "dx", cs.activation("C", "H", "W"), False)]
    nests: list[str] = []
    local = ["wt"]
    stride = cs.stride
    if stride == 1:
        # dx[h][w] = sum dy[h + pad - r][w + pad - s] w[r][s]: pad dy by R-1-pad, flip w.
        off_h, off_w = s["R"] - 1 - cs.padding, s["S"] - 1 - cs.padding
        rows, cols = s["H"] + s["R"] - 1, s["W"] + s["S"] - 1
        flipped = cs.weight("R - 1 - r", "S - 1 - s")
        nests.append(nest(weight_loops, f"wt{cs.transposed_weight()} = w{flipped};"))
        if (off_h, off_w, rows, cols) == (0, 0, cs.P, cs.Q):
            source = "dy"
        else:
            source = "dyp"
            local.append("dyp")
            arrays.append(declaration(ct, "dyp", cs.activation("K", rows, cols), False))
            copy = image_loop + k_loops[:1] + [
                ("p", max(0, -off_h), min(cs.P, rows - off_h)),
                ("q", max(0, -off_w), min(cs.Q, cols - off_w)),
            ] + k_loops[1:]
            target = cs.at("k", f"p + {off_h}", f"q + {off_w}")
            nests.append(nest(copy, f"dyp{target} = dy{cs.at('k', 'p', 'q')};"))
        main = (image_loop + c_loops[:1] + [("ih", 0, "H"), ("iw", 0, "W")] + k_loops[:1]
                + [("r", 0, "R"), ("s", 0, "S")] + k_loops[1:] + c_loops[1:])
        body = (f"dx{cs.at('c', 'ih', 'iw')} += {source}{cs.at('k', 'ih + r', 'iw + s')} * "
                f"wt{cs.transposed_weight()};")
        main_nest = nest(main, body)
    else:
        target = "dx" if cs.padding == 0 else "dxp"
        if cs.padding:
            local.append("dxp")
            padded = cs.activation("C", s["H"] + 2 * cs.padding, s["W"] + 2 * cs.padding)
            arrays.append(declaration(ct, "dxp", padded, False))
        into = cs.at("c", _scaled("p", stride, "r"), _scaled("q", stride, "s"))
        if cs.blocked:
            nests.append(nest(weight_loops,
                              f"wt{cs.transposed_weight()} = w{cs.weight('r', 's')};"))
            # The call: q (m) x c (n) over k, batched over the k blocks; r, s stay outside.
            main = (image_loop + c_loops[:1] + [("p", 0, cs.P), ("r", 0, "R"), ("s", 0, "S"),
                                           ("q", 0, cs.Q)] + k_loops + c_loops[1:])
            body = f"{target}{into} += dy{cs.at('k', 'p', 'q')} * wt{cs.transposed_weight()};"
            main_nest = nest(main, body)
        else:
            # NCHW has no unit stride along c or k: one GEMM of channels-last dy with the
            # weights as a [K][C*R*S] matrix gives every window's contribution (col), which is
            # then scattered onto dx (col2im).
            local[local.index("wt")] = "wf"
            local += ["dyt", "col"]
            taps = s["C"] * s["R"] * s["S"]
            tap = f"c * {s['R'] * s['S']} + r * {s['S']} + s"
            arrays += [
                declaration(ct, "dyt", ["N", str(cs.P), str(cs.Q), "K"], False),
                declaration(ct, "col", ["N", str(cs.P), str(cs.Q), str(taps)], False),
            ]
            nests.append(nest(zero_based(("k", "K"), ("c", "C"), ("r", "R"), ("s", "S")),
                              f"wf[k][{tap}] = w[k][c][r][s];"))
            nests.append(nest(zero_based(("n", "N"), ("p", cs.P), ("q", cs.Q), ("k", "K")),
                              "dyt[n][p][q][k] = dy[n][k][p][q];"))
            main = zero_based(("n", "N"), ("p", cs.P), ("q", cs.Q), ("j", taps), ("k", "K"))
            main_nest = nest(main, "col[n][p][q][j] += dyt[n][p][q][k] * wf[k][j];")
            scatter = zero_based(("n", "N"), ("c", "C"), ("p", cs.P), ("r", "R"), ("q", cs.Q),
                                 ("s", "S"))
            main_nest += "\n" + nest(scatter, f"{target}{into} += col[n][p][q][{tap}];")
    nests.append(main_nest)
    if stride > 1 and cs.padding:
        crop = image_loop + c_loops[:1] + [("ih", 0, "H"), ("iw", 0, "W")] + c_loops[1:]
        pad = cs.padding
        nests.append(nest(crop, f"dx{cs.at('c', 'ih', 'iw')} = "
                                f"dxp{cs.at('c', f'ih + {pad}', f'iw + {pad}')};"))
    if "wt" in local:
        arrays.append(declaration(ct, "wt", cs.transposed_shape(), False))
    else:
        taps = s["C"] * s["R"] * s["S"]
        arrays.append(declaration(ct, "wf", ["K", str(taps)], False))
    arrays += [
        declaration(ct, "dy", cs.activation("K", cs.P, cs.Q), True),
        declaration(ct, "w", cs.weights(), True),
    ]
    text = function_text("conv2d_backward_data", list(s), arrays, nests)
    return parse_built("conv2d_backward_data", text, s, local=tuple(local))


def conv2d_backward_weights(
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
) -> Built:
    """The gradient of a convolution's weights: `k(x, dy) -> dw`, with x the forward input,
    dy[N][K][P][Q] (nchw16c: dy[N][KB][P][Q][16]) and dw shaped like the forward weights."""
    cs = ConvSizes(N, C, K, H, W, R, S, stride, padding, dtype, layout)
    s, ct, pad, stride = cs.sizes, cs.ctype, cs.padding, cs.stride
    arrays = [declaration(ct, "dw", cs.weights(), False)]
    nests: list[str] = []
    source = "x"
    c_loops = zero_based(*cs.channel_loops("c"))
    k_loops = zero_based(*cs.channel_loops("k"))
    if pad:
        source = "xp"
        arrays.append(declaration(ct, "xp", cs.activation("C", f"H + {2 * pad}",
                                                           f"W + {2 * pad}"), False))
        copy = [("n", 0, "N")] + c_loops[:1] + [("ih", 0, "H"), ("iw", 0, "W")] + c_loops[1:]
        nests.append(nest(copy, f"xp{cs.at('c', f'ih + {pad}', f'iw + {pad}')} = "
                                f"x{cs.at('c', 'ih', 'iw')};"))
    # Outside: the weight cells (parallel); the call: c (m) x k (n) over q, batched over n, p.
    main = (k_loops[:1] + c_loops[:1] + [("r", 0, "R"), ("s", 0, "S"), ("n", 0, "N"),
                                         ("p", 0, cs.P), ("q", 0, cs.Q)]
            + c_loops[1:] + k_loops[1:])
    if not cs.blocked:
        main = zero_based(("k", "K"), ("c", "C"), ("r", "R"), ("s", "S"), ("n", "N"),
                          ("p", cs.P), ("q", cs.Q))
    read = cs.at("c", _scaled("p", stride, "r"), _scaled("q", stride, "s"))
    nests.append(nest(main, f"dw{cs.weight('r', 's')} += {source}{read} * "
                            f"dy{cs.at('k', 'p', 'q')};"))
    arrays += [
        declaration(ct, "x", cs.activation("C", "H", "W"), True),
        declaration(ct, "dy", cs.activation("K", cs.P, cs.Q), True),
    ]
    text = function_text("conv2d_backward_weights", list(s), arrays, nests)
    return parse_built("conv2d_backward_weights", text, s, local=("xp",))
