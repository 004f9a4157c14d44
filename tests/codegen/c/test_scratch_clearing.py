"""Scratch arrays start at zero on every call: only the cells read before any write are
cleared (a padded input's border), all of it where every cell is, none where none is."""

import re

import islpy as isl
import numpy as np

import polydl
from polydl.codegen.c.scratch_clearing import cells_read_unwritten, clearing
from polydl.codegen.c_expr import ArrayLayout
from polydl.frontends import builders
from polydl.poly.counting import count_points
from polydl.poly.model import build_model
from tests.kernels import run_and_check

LOCAL_SCALAR = """
void row_sums(int N, int M, const float a[N][M], float y[N]) {
  for (int i = 0; i < N; i++) {
    float s = 0.0f;
    for (int j = 0; j < M; j++)
      s += a[i][j];
    y[i] = s;
  }
}
"""


def _layout(nest, params, name):  # type: ignore[no-untyped-def]
    (array,) = [a for a in nest.arrays if a.name == name]
    return ArrayLayout(name, array.dtype, array.concrete_shape(params))


def test_a_padded_input_clears_only_its_border() -> None:
    nest, params = builders.conv2d(N=2, C=20, K=16, H=6, W=5, R=3, S=3, padding=(1, 2, 0, 1),
                                   layout="nchw16c")
    model = build_model(nest, params)
    cells = cells_read_unwritten(model, "xp")
    assert cells is not None
    # xp[2][2][7][8][16]: its interior of 6 x 5 positions comes from x
    assert count_points(cells) == 2 * 2 * (7 * 8 - 6 * 5) * 16
    interior = isl.Set("{ xp[n, cb, h, v, c] : 0 <= n < 2 and 0 <= cb < 2 and 1 <= h <= 6 "
                       "and 2 <= v <= 6 and 0 <= c < 16 }")
    assert cells.intersect(interior).is_empty()
    zeroed, lines = clearing(model, _layout(nest, params, "xp"), filled=False)
    assert not zeroed and lines[0].startswith("#define _pd_zero_xp(")
    kernel = polydl.conv2d(N=2, C=20, K=16, H=6, W=5, R=3, S=3, padding=(1, 2, 0, 1),
                           layout="nchw16c")
    # not cleared whole (the last argument): the whole copy, or one image a thread where the
    # copy runs inside the image loop (`codegen.c.thread_scratch`)
    assert re.search(r"pd_scratch\((3584|_pd_slices\(2\) \* 1792L) \* sizeof\(float\), 0\)",
                     kernel.source)
    run_and_check(kernel)


def test_a_scratch_read_whole_before_any_write_is_cleared_whole() -> None:
    """Without its copy nest the padded input's every cell is read unwritten: cleared whole."""
    from dataclasses import replace

    nest, params = builders.conv2d(N=1, C=16, K=16, H=5, W=5, R=3, S=3, padding=1,
                                   layout="nchw16c")
    uncopied = replace(nest, body=nest.body[1:])
    assert clearing(build_model(uncopied, params), _layout(nest, params, "xp"), False) == (True, [])


def test_scratch_written_before_it_is_read_is_not_cleared() -> None:
    """A spec's local scalar (one cell per row, set first) and a strided layer's copy of the
    positions it reads (declared written in full, and found so)."""
    nest, params = _nest(LOCAL_SCALAR, {"N": 8, "M": 5})
    (local,) = [a.name for a in nest.arrays if a.local]
    assert clearing(build_model(nest, params), _layout(nest, params, local), False) == (False, [])
    strided, sizes = builders.conv2d(N=1, C=16, K=16, H=13, W=13, R=1, S=1, stride=2,
                                     layout="nchw16c")
    cells = cells_read_unwritten(build_model(strided, sizes), "xs")
    assert cells is not None and cells.is_empty()
    kernel = polydl.compile(LOCAL_SCALAR, {"N": 8, "M": 5})
    a = np.random.default_rng(1).uniform(-1, 1, (8, 5)).astype(np.float32)
    np.testing.assert_allclose(kernel(a), a.sum(axis=1), rtol=1e-5)


def _nest(spec: str, params: dict[str, int]):  # type: ignore[no-untyped-def]
    from polydl.frontends import load_spec

    return load_spec(spec, params, None, None, None)
