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
- backward-data of an NCHW 1 x 1 layer without padding: one GEMM over the positions.
- backward-weights: the GEMM over the output positions of the zero-padded input `x` and `dy`;
  in NCHW (a block of input channels or more) of `x` copied channels-last, so that the calls
  run along the channels.
"""

from __future__ import annotations

from collections.abc import Sequence

from polydl.dtypes import DTYPES
from polydl.frontends.builders import (
    FLOAT_DTYPES,
    LAYOUTS,
    check_window,
    group_sizes,
    lane_channel,
    output_size,
    padding_arg,
    plain_1x1,
    positions_merged,
)
from polydl.frontends.spec_writing import (
    Built,
    choice_arg,
    declaration,
    float_literal,
    function_text,
    integer_arg,
    nest,
    parse_built,
    zero_based,
)
from polydl.layouts import BLOCK, grouped_form


class ConvSizes:
    """Validated sizes of a convolution and the numbers every pass derives from them.

    The channel helpers serve the forms that are a GEMM per group ("dense", "grouped" in
    NCHW, "block_diagonal" and "in_block" blocked): their loops run over the channels of one
    group `g` (absent when groups is 1), `whole=True` over all of them."""

    def __init__(
        self, N: int, C: int, K: int, H: int, W: int, R: int, S: int, stride: int,
        padding: int | Sequence[int], dtype: str, layout: str, groups: int = 1,
    ) -> None:
        self.sizes = {
            name: integer_arg(name, value)
            for name, value in (("N", N), ("C", C), ("K", K), ("H", H), ("W", W), ("R", R), ("S", S))
        }
        self.stride = integer_arg("stride", stride)
        self.pads = padding_arg(padding)
        self.top, self.left, self.bottom, self.right = self.pads
        self.ctype = DTYPES[choice_arg("dtype", dtype, FLOAT_DTYPES)].c_type
        self.layout = choice_arg("layout", layout, LAYOUTS)
        s = self.sizes
        self.groups, self.Cg, self.Kg = group_sizes(s["C"], s["K"], groups)
        check_window(s, self.pads)
        self.P = output_size(s["H"], s["R"], self.stride, self.top + self.bottom)
        self.Q = output_size(s["W"], s["S"], self.stride, self.left + self.right)
        self.blocked = self.layout == "nchw16c"
        # a 7 x 7 1 x 1 layer's positions as one loop m (`builders.SHORT_ROW`)
        self.merged = self.blocked and positions_merged(s, self.stride, self.pads, self.groups)
        self.CB = -(-s["C"] // BLOCK)
        self.KB = -(-s["K"] // BLOCK)
        if self.blocked:
            self.form = grouped_form(s["C"], s["K"], self.groups)
        else:
            self.form = "dense" if self.groups == 1 else "grouped"
        # the groups of the GEMM forms: in_block's are its blocks, one block of each side
        self.gemm_groups = self.KB if self.form == "in_block" else self.groups
        self.per_group = {"c": self.Cg, "k": self.Kg}
        if self.blocked:
            self.per_group = {"c": self.CB // self.gemm_groups, "k": self.KB // self.gemm_groups}

    @property
    def padded(self) -> bool:
        return any(self.pads)

    def padded_extent(self, size: str) -> str:
        pads = self.top + self.bottom if size == "H" else self.left + self.right
        return f"{size} + {pads}" if pads else size

    def group_loops(self) -> list[tuple[str, int, int]]:
        return [("g", 0, self.gemm_groups)] if self.gemm_groups > 1 else []

    def activation(self, channels: str, rows: int | str, cols: int | str) -> list[str]:
        """Shape of an activation with `channels` "C" or "K" in this layout."""
        if self.blocked:
            return ["N", f"({channels} + {BLOCK - 1}) / {BLOCK}", str(rows), str(cols), str(BLOCK)]
        return ["N", channels, str(rows), str(cols)]

    def weights(self) -> list[str]:
        kb, cb = f"(K + {BLOCK - 1}) / {BLOCK}", f"(C + {BLOCK - 1}) / {BLOCK}"
        b = str(BLOCK)
        if self.form == "depthwise":
            return [kb, "R", "S", b]
        if self.form == "lanes":
            return [kb, str(self.Cg), "R", "S", b]
        if self.form == "in_block":
            return [kb, "R", "S", b, b]
        if self.blocked:
            return [kb, cb if self.groups == 1 else str(self.per_group["c"]), "R", "S", b, b]
        return ["K", "C" if self.groups == 1 else str(self.Cg), "R", "S"]

    def channel_loops(self, channels: str, whole: bool = False) -> tuple[tuple[str, int], ...]:
        """(block loop, lane loop) of channel `c` or `k`; the lane loop is absent when plain."""
        count = self.sizes["C" if channels == "c" else "K"]
        if self.blocked:
            blocks = -(-count // BLOCK) if whole else self.per_group[channels]
            return ((f"{channels}b", blocks), (channels, BLOCK))
        return ((channels, count if whole else self.per_group[channels]),)

    def channel(self, channels: str, whole: bool = False) -> str:
        """The activation's channel (block) subscript of loop `c` or `k` (`cb`, `kb`)."""
        var = f"{channels}b" if self.blocked else channels
        if whole or self.gemm_groups == 1:
            return var
        per = self.per_group[channels]
        return "g" if per == 1 else f"g * {per} + {var}"

    def at(self, channels: str, rows: str, cols: str, whole: bool = False) -> str:
        """Subscript of an activation element at channel `channels` (c or k)."""
        if self.blocked:
            return f"[n][{self.channel(channels, whole)}][{rows}][{cols}][{channels}]"
        return f"[n][{self.channel(channels, whole)}][{rows}][{cols}]"

    def weight(self, r: str, s: str) -> str:
        if self.form == "in_block":
            return f"[{self.channel('k')}][{r}][{s}][c][k]"
        if self.blocked:
            return f"[{self.channel('k')}][cb][{r}][{s}][c][k]"
        return f"[{self.channel('k')}][c][{r}][{s}]"

    def transposed_weight(self, r: str = "r", s: str = "s") -> str:
        """Subscript of the weights with C and K swapped: `wt[cb][kb][r][s][k][c]`."""
        if self.blocked:
            return f"[{self.channel('c')}][kb][{r}][{s}][k][c]"
        return f"[{self.channel('c')}][k][{r}][{s}]"

    def position(self) -> tuple[str, str]:
        """(row, column) subscripts of output position m where the positions are one loop."""
        w = self.sizes["W"]
        return f"m / {w}", f"m % {w}"

    def transposed_shape(self) -> list[str]:
        if self.blocked:
            return [str(self.CB), str(self.per_group["k"]), "R", "S", str(BLOCK), str(BLOCK)]
        return ["C", "K" if self.groups == 1 else str(self.Kg), "R", "S"]


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
    padding: int | Sequence[int] = 0,
    dtype: str = "float32",
    layout: str = "nchw",
    groups: int = 1,
) -> Built:
    """The gradient of a convolution's input: `k(dy, w) -> dx`, with dy[N][K][P][Q] (nchw16c:
    dy[N][KB][P][Q][16]), w as the forward weights (of `groups`), dx shaped like the forward
    input. `padding` is an int or (top, left, bottom, right)."""
    cs = ConvSizes(N, C, K, H, W, R, S, stride, padding, dtype, layout, groups)
    s, ct = cs.sizes, cs.ctype
    if cs.form in ("depthwise", "lanes"):
        return _scattered_backward_data(cs)
    if not cs.blocked and cs.groups == 1 and plain_1x1(cs.sizes, cs.pads):
        return _positions_backward_data(cs)
    weight_loops = zero_based(*cs.channel_loops("c")[:1], *cs.channel_loops("k")[:1],
                              ("r", "R"), ("s", "S"),
                              *cs.channel_loops("k")[1:], *cs.channel_loops("c")[1:])
    weight_loops = cs.group_loops() + weight_loops
    image_loop = [("n", 0, "N")] + cs.group_loops()
    c_loops = zero_based(*cs.channel_loops("c"))
    k_loops = zero_based(*cs.channel_loops("k"))
    arrays = [declaration(ct, "dx", cs.activation("C", "H", "W"), False)]
    nests: list[str] = []
    local = ["wt"]
    stride = cs.stride
    if stride == 1:
        # dx[h][w] = sum dy[h + top - r][w + left - s] w[r][s]: pad dy, flip w.
        off_h, off_w = s["R"] - 1 - cs.top, s["S"] - 1 - cs.left
        rows, cols = s["H"] + s["R"] - 1, s["W"] + s["S"] - 1
        flipped = cs.weight("R - 1 - r", "S - 1 - s")
        nests.append(nest(weight_loops, f"wt{cs.transposed_weight()} = w{flipped};"))
        flat = not cs.blocked and cs.groups == 1 and s["W"] < BLOCK and s["K"] >= BLOCK
        if flat:
            # the padded dy's rows as one loop m over its flat cells, as the forward
            # (`builders.short_rows`): each call runs along whole images, not rows of W
            span = (s["H"] - 1) * cols + s["W"]
            local += ["dyf", "dxw"]
            arrays += [declaration(ct, "dyf", ["N", "K", str(rows * cols)], False),
                       declaration(ct, "dxw", ["N", "C", str(span)], False)]
            copy = zero_based(("n", "N"), ("k", "K")) + [
                ("p", max(0, -off_h), min(cs.P, rows - off_h)),
                ("q", max(0, -off_w), min(cs.Q, cols - off_w))]
            nests.append(nest(copy, f"dyf[n][k][(p + {off_h}) * {cols} + q + {off_w}] = dy[n][k][p][q];"))
            wide = zero_based(("n", "N"), ("c", "C"), ("m", span))
            nests.append(nest(wide, f"dxw[n][c][m] = {float_literal(0.0, ct)};"))
            nests.append(nest(wide + zero_based(("k", "K"), ("r", "R"), ("s", "S")),
                              f"dxw[n][c][m] += dyf[n][k][m + r * {cols} + s] * wt[c][k][r][s];"))
            main_nest = nest(zero_based(("n", "N"), ("c", "C"), ("ih", "H"), ("iw", "W")),
                             f"dx[n][c][ih][iw] += dxw[n][c][ih * {cols} + iw];")
        elif (off_h, off_w, rows, cols) == (0, 0, cs.P, cs.Q):
            source = "dy"
        else:
            source = "dyp"
            local.append("dyp")
            arrays.append(declaration(ct, "dyp", cs.activation("K", rows, cols), False))
            all_k = zero_based(*cs.channel_loops("k", whole=True))
            copy = [("n", 0, "N")] + all_k[:1] + [
                ("p", max(0, -off_h), min(cs.P, rows - off_h)),
                ("q", max(0, -off_w), min(cs.Q, cols - off_w)),
            ] + all_k[1:]
            target = cs.at("k", f"p + {off_h}", f"q + {off_w}", whole=True)
            nests.append(nest(copy, f"dyp{target} = dy{cs.at('k', 'p', 'q', whole=True)};"))
        if not flat:
            main = (image_loop + c_loops[:1] + [("ih", 0, "H"), ("iw", 0, "W")] + k_loops[:1]
                    + [("r", 0, "R"), ("s", 0, "S")] + k_loops[1:] + c_loops[1:])
            body = (f"dx{cs.at('c', 'ih', 'iw')} += {source}{cs.at('k', 'ih + r', 'iw + s')} * "
                    f"wt{cs.transposed_weight()};")
            if cs.merged:
                position = cs.position()
                main = image_loop + c_loops[:1] + [("m", 0, s["H"] * s["W"])] + k_loops + c_loops[1:]
                body = (f"dx{cs.at('c', *position)} += dy{cs.at('k', *position)} * "
                        f"wt{cs.transposed_weight('0', '0')};")
            main_nest = nest(main, body)
    else:
        target = "dx" if not cs.padded else "dxp"
        if cs.padded:
            local.append("dxp")
            rows, cols = s["H"] + cs.top + cs.bottom, s["W"] + cs.left + cs.right
            arrays.append(declaration(ct, "dxp", cs.activation("C", rows, cols), False))
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
            # weights as a [K][C/groups*R*S] matrix gives every window's contribution (col),
            # which is then scattered onto dx (col2im).
            local[local.index("wt")] = "wf"
            local += ["dyt", "col"]
            taps = s["C"] * s["R"] * s["S"]
            group_taps = cs.Cg * s["R"] * s["S"]
            tap = f"c * {s['R'] * s['S']} + r * {s['S']} + s"
            arrays += [
                declaration(ct, "dyt", ["N", str(cs.P), str(cs.Q), "K"], False),
                declaration(ct, "col", ["N", str(cs.P), str(cs.Q), str(taps)], False),
            ]
            c_extent = "C" if cs.groups == 1 else cs.Cg
            nests.append(nest(zero_based(("k", "K"), ("c", c_extent), ("r", "R"), ("s", "S")),
                              f"wf[k][{tap}] = w[k][c][r][s];"))
            nests.append(nest(zero_based(("n", "N"), ("p", cs.P), ("q", cs.Q), ("k", "K")),
                              "dyt[n][p][q][k] = dy[n][k][p][q];"))
            if cs.groups == 1:
                main = zero_based(("n", "N"), ("p", cs.P), ("q", cs.Q), ("j", taps), ("k", "K"))
                main_nest = nest(main, "col[n][p][q][j] += dyt[n][p][q][k] * wf[k][j];")
            else:
                main = zero_based(("n", "N"), ("p", cs.P), ("q", cs.Q), ("g", cs.groups),
                                  ("j", group_taps), ("k", cs.Kg))
                k_at = f"g * {cs.Kg} + k"
                main_nest = nest(main, f"col[n][p][q][g * {group_taps} + j] += "
                                       f"dyt[n][p][q][{k_at}] * wf[{k_at}][j];")
            scatter = zero_based(("n", "N"), ("c", "C"), ("p", cs.P), ("r", "R"), ("q", cs.Q),
                                 ("s", "S"))
            into = f"[n][c][{_scaled('p', stride, 'r')}][{_scaled('q', stride, 's')}]"
            main_nest += "\n" + nest(scatter, f"{target}{into} += col[n][p][q][{tap}];")
    nests.append(main_nest)
    if stride > 1 and cs.padded:
        nests.append(_crop(cs))
    if "wt" in local:
        arrays.append(declaration(ct, "wt", cs.transposed_shape(), False))
    else:
        arrays.append(declaration(ct, "wf", ["K", str(cs.Cg * s["R"] * s["S"])], False))
    arrays += [
        declaration(ct, "dy", cs.activation("K", cs.P, cs.Q), True),
        declaration(ct, "w", cs.weights(), True),
    ]
    text = function_text("conv2d_backward_data", list(s), arrays, nests)
    return parse_built("conv2d_backward_data", text, s, local=tuple(local))


def _crop(cs: ConvSizes) -> str:
    """The nest that copies dx out of the padded dxp."""
    c_loops = zero_based(*cs.channel_loops("c", whole=True))
    crop = [("n", 0, "N")] + c_loops[:1] + [("ih", 0, "H"), ("iw", 0, "W")] + c_loops[1:]
    inner = cs.at("c", f"ih + {cs.top}" if cs.top else "ih",
                  f"iw + {cs.left}" if cs.left else "iw", whole=True)
    return nest(crop, f"dx{cs.at('c', 'ih', 'iw', whole=True)} = dxp{inner};")


def _lanes(cs: ConvSizes, rows: str, cols: str) -> tuple[str, str, str]:
    """(guard, input subscript at `rows`, `cols`, weight subscript) of the blocked forms with
    the output lanes innermost: depthwise and lanes (`builders.lane_channel`)."""
    if cs.form == "depthwise":
        return "", f"[n][kb][{rows}][{cols}][k]", "[kb][r][s][k]"
    s = cs.sizes
    block, lane, guard = lane_channel(s["C"], s["K"], cs.Cg, cs.Kg)
    c_in = "c" if cs.Cg > 1 else "0"
    return guard, f"[n][{block}][{rows}][{cols}][{lane}]", f"[kb][{c_in}][r][s][k]"


def _lane_loops(cs: ConvSizes, outer: list[tuple[str, int | str]],
                inner: list[tuple[str, int | str]]) -> list[tuple[str, int | str]]:
    """kb, the input channel c of the lanes form (absent where it has one iteration), `outer`,
    r, s, `inner`, then the output lane k."""
    c_loop: list[tuple[str, int | str]] = [("c", cs.Cg)] if cs.form == "lanes" and cs.Cg > 1 else []
    return [("kb", cs.KB), *c_loop, *outer, ("r", "R"), ("s", "S"), *inner, ("k", BLOCK)]


def _scattered_backward_data(cs: ConvSizes) -> Built:
    """Backward-data of the depthwise and lanes forms: every output position scatters its
    contribution into a padded dx (the padding cropped off afterwards), output lanes innermost."""
    s, ct = cs.sizes, cs.ctype
    target = "dxp" if cs.padded else "dx"
    arrays = [declaration(ct, "dx", cs.activation("C", "H", "W"), False)]
    if cs.padded:
        rows, cols = s["H"] + cs.top + cs.bottom, s["W"] + cs.left + cs.right
        arrays.append(declaration(ct, "dxp", cs.activation("C", rows, cols), False))
    guard, into, weight = _lanes(cs, _scaled("p", cs.stride, "r"), _scaled("q", cs.stride, "s"))
    loops = zero_based(("n", "N"), *_lane_loops(cs, [("p", cs.P)], [("q", cs.Q)]))
    nests = [nest(loops, f"{guard}{target}{into} += dy[n][kb][p][q][k] * w{weight};")]
    if cs.padded:
        nests.append(_crop(cs))
    arrays += [
        declaration(ct, "dy", cs.activation("K", cs.P, cs.Q), True),
        declaration(ct, "w", cs.weights(), True),
    ]
    text = function_text("conv2d_backward_data", list(s), arrays, nests)
    return parse_built("conv2d_backward_data", text, s, local=("dxp",))


def _positions_backward_data(cs: ConvSizes) -> Built:
    """Backward-data of an NCHW 1 x 1 layer without padding: the gradients of the positions
    read as one GEMM per image, the weights transposed by their subscripts, along dy's
    positions at unit stride. At a stride they go to `dxs[n][c][p * Q + q]` first and are then
    added into dx at the stride. Read as rows, each call reduced one output channel a batch
    step over a row. See decisions: NCHW 1 x 1 layers as GEMMs over the positions."""
    s, ct, stride = cs.sizes, cs.ctype, cs.stride
    positions = cs.P * cs.Q
    arrays = [declaration(ct, "dx", cs.activation("C", "H", "W"), False)]
    into = f"dx[n][c][m / {cs.Q}][m % {cs.Q}]"
    if stride > 1:
        into = "dxs[n][c][m]"
        arrays.append(declaration(ct, "dxs", ["N", "C", str(positions)], False))
    nests = [nest(zero_based(("n", "N"), ("c", "C"), ("m", positions), ("k", "K")),
                  f"{into} += w[k][c][0][0] * dy[n][k][m / {cs.Q}][m % {cs.Q}];")]
    if stride > 1:
        nests.append(nest(zero_based(("n", "N"), ("c", "C"), ("p", cs.P), ("q", cs.Q)),
                          f"dx[n][c][p * {stride}][q * {stride}] += dxs[n][c][p * {cs.Q} + q];"))
    arrays += [
        declaration(ct, "dy", cs.activation("K", cs.P, cs.Q), True),
        declaration(ct, "w", cs.weights(), True),
    ]
    text = function_text("conv2d_backward_data", list(s), arrays, nests)
    return parse_built("conv2d_backward_data", text, s, local=("dxs",))


def conv2d_backward_weights(
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
    groups: int = 1,
) -> Built:
    """The gradient of a convolution's weights: `k(x, dy) -> dw`, with x the forward input,
    dy[N][K][P][Q] (nchw16c: dy[N][KB][P][Q][16]) and dw shaped like the forward weights (of
    `groups`). `padding` is an int or (top, left, bottom, right)."""
    cs = ConvSizes(N, C, K, H, W, R, S, stride, padding, dtype, layout, groups)
    if not cs.blocked and cs.groups == 1 and cs.sizes["C"] >= BLOCK:
        return _channels_last_backward_weights(cs)
    s, ct, stride = cs.sizes, cs.ctype, cs.stride
    arrays = [declaration(ct, "dw", cs.weights(), False)]
    nests: list[str] = []
    source = "x"
    if cs.padded:
        source = "xp"
        arrays.append(declaration(ct, "xp", cs.activation("C", cs.padded_extent("H"),
                                                           cs.padded_extent("W")), False))
        all_c = zero_based(*cs.channel_loops("c", whole=True))
        copy = [("n", 0, "N")] + all_c[:1] + [("ih", 0, "H"), ("iw", 0, "W")] + all_c[1:]
        at = cs.at("c", f"ih + {cs.top}" if cs.top else "ih",
                   f"iw + {cs.left}" if cs.left else "iw", whole=True)
        nests.append(nest(copy, f"xp{at} = x{cs.at('c', 'ih', 'iw', whole=True)};"))
    rows, cols = _scaled("p", stride, "r"), _scaled("q", stride, "s")
    if cs.form in ("depthwise", "lanes"):
        guard, read, weight = _lanes(cs, rows, cols)
        # the weight cells outside (parallel), the sum over images and positions inside
        main = zero_based(*_lane_loops(cs, [], [("n", "N"), ("p", cs.P), ("q", cs.Q)]))
        nests.append(nest(main, f"{guard}dw{weight} += {source}{read} * dy[n][kb][p][q][k];"))
    else:
        c_loops = zero_based(*cs.channel_loops("c"))
        k_loops = zero_based(*cs.channel_loops("k"))
        # Outside: the weight cells (parallel); the call: c (m) x k (n) over q, batched over
        # n, p.
        main = (cs.group_loops() + k_loops[:1] + c_loops[:1]
                + [("r", 0, "R"), ("s", 0, "S"), ("n", 0, "N"), ("p", 0, cs.P), ("q", 0, cs.Q)]
                + c_loops[1:] + k_loops[1:])
        if not cs.blocked:
            k_extent, c_extent = ("K", "C") if cs.groups == 1 else (cs.Kg, cs.Cg)
            main = cs.group_loops() + zero_based(("k", k_extent), ("c", c_extent), ("r", "R"),
                                                 ("s", "S"), ("n", "N"), ("p", cs.P),
                                                 ("q", cs.Q))
        read, out, cell = cs.at("c", rows, cols), cs.at("k", "p", "q"), cs.weight("r", "s")
        if cs.merged:
            # the call's k runs over an image's positions (49, not a row of 7), batched over n
            main = (k_loops[:1] + c_loops[:1] + [("n", 0, "N"), ("m", 0, s["H"] * s["W"])]
                    + c_loops[1:] + k_loops[1:])
            position = cs.position()
            read, out, cell = cs.at("c", *position), cs.at("k", *position), cs.weight("0", "0")
        nests.append(nest(main, f"dw{cell} += {source}{read} * dy{out};"))
        if cs.form == "in_block":
            # the product of a block is dense: its cells between groups are no weights
            cells = zero_based(("kb", cs.KB), ("r", "R"), ("s", "S"), ("c", BLOCK), ("k", BLOCK))
            nests.append(nest(cells, f"if (c / {cs.Cg} != k / {cs.Cg}) dw[kb][r][s][c][k] = "
                                     f"{float_literal(0.0, ct)};"))
    arrays += [
        declaration(ct, "x", cs.activation("C", "H", "W"), True),
        declaration(ct, "dy", cs.activation("K", cs.P, cs.Q), True),
    ]
    text = function_text("conv2d_backward_weights", list(s), arrays, nests)
    return parse_built("conv2d_backward_weights", text, s, local=("xp",))


def _channels_last_backward_weights(cs: ConvSizes) -> Built:
    """Backward-weights of a dense NCHW convolution of at least a block of input channels: x
    copied channels-last first (`xt[n][h][w][c]`, padded; a 1 x 1 window without padding takes
    only the positions it reads), so that the calls run over the channels c at unit stride in
    both xt and the weights' cells, `dwt[k][r][s][c]`, which are then added into dw[k][c][r][s]
    (a 1 x 1 window without padding sums into dw itself). Read in place, a 1 x 1 layer had no
    vector loop (c and k strided by the positions) and a 3 x 3 one at stride 2 reduced along a
    row read at the stride. See decisions: NCHW backward weights over a channels-last copy."""
    s, ct, stride = cs.sizes, cs.ctype, cs.stride
    # a 1 x 1 window without padding reads only the positions at the stride, and its cells
    # are dw's own
    positions = s["R"] == s["S"] == 1 and not cs.padded
    arrays = [declaration(ct, "dw", cs.weights(), False)]
    local = ["xt"]
    rows: int | str
    cols: int | str
    if positions:
        rows, cols, read = cs.P, cs.Q, "xt[n][p][q][c]"
        copy = nest(zero_based(("n", "N"), ("p", cs.P), ("q", cs.Q), ("c", "C")),
                    f"xt[n][p][q][c] = x[n][c][p * {stride}][q * {stride}];" if stride > 1
                    else "xt[n][p][q][c] = x[n][c][p][q];")
    else:
        rows, cols = cs.padded_extent("H"), cs.padded_extent("W")
        read = f"xt[n][{_scaled('p', stride, 'r')}][{_scaled('q', stride, 's')}][c]"
        ih = f"ih + {cs.top}" if cs.top else "ih"
        iw = f"iw + {cs.left}" if cs.left else "iw"
        copy = nest(zero_based(("n", "N"), ("ih", "H"), ("iw", "W"), ("c", "C")),
                    f"xt[n][{ih}][{iw}][c] = x[n][c][ih][iw];")
    arrays.append(declaration(ct, "xt", ["N", str(rows), str(cols), "C"], False))
    nests = [copy]
    taps: list[tuple[str, int | str]] = [("r", "R"), ("s", "S")]
    sums: list[tuple[str, int | str]] = [("n", "N"), ("p", cs.P), ("q", cs.Q), ("c", "C")]
    if positions:
        nests.append(nest(zero_based(("k", "K"), *sums), f"dw[k][c][0][0] += dy[n][k][p][q] * {read};"))
    else:
        local.append("dwt")
        arrays.append(declaration(ct, "dwt", ["K", "R", "S", "C"], False))
        nests.append(nest(zero_based(("k", "K"), *taps, *sums),
                          f"dwt[k][r][s][c] += dy[n][k][p][q] * {read};"))
        nests.append(nest(zero_based(("k", "K"), ("c", "C"), *taps),
                          "dw[k][c][r][s] += dwt[k][r][s][c];"))
    arrays += [
        declaration(ct, "x", cs.activation("C", "H", "W"), True),
        declaration(ct, "dy", cs.activation("K", cs.P, cs.Q), True),
    ]
    text = function_text("conv2d_backward_weights", list(s), arrays, nests)
    return parse_built("conv2d_backward_weights", text, s, local=tuple(local))
