"""Element strides: a loop that runs over two subscripts `[e / Q][e % Q]` at once (an image's
positions as one row) has the constant stride of e, so a microkernel call can span it."""

import numpy as np

import polydl
from polydl.frontends.c_loopnest import parse_c
from polydl.poly.model import build_model
from polydl.schedules.strides import element_stride
from tests.kernels import run_and_check

CONV = """
void pos(int N, float y[N][3][7][7][16], const float x[N][2][7][7][16], const float w[3][2][16][16]) {
  for (int n = 0; n < N; n++)
    for (int kb = 0; kb < 3; kb++)
      for (int m = 0; m < 49; m++)
        for (int cb = 0; cb < 2; cb++)
          for (int c = 0; c < 16; c++)
            for (int k = 0; k < 16; k++)
              y[n][kb][m / 7][m % 7][k] += x[n][cb][m / 7][m % 7][c] * w[kb][cb][c][k];
}
"""
# m / 7 over rows of 5: the divisor is not the inner extent
FILL = """
void fill(int N, float z[N][7][5][16]) {
  for (int n = 0; n < N; n++)
    for (int m = 0; m < 35; m++)
      for (int k = 0; k < 16; k++)
        z[n][m / 7][m % 5][k] = 1.0f;
}
"""


def test_a_loop_over_a_row_and_its_columns_has_their_flat_stride() -> None:
    model = build_model(parse_c(CONV), {"N": 2})
    conv = model.statements[0].statement
    y, x = conv.target, conv.value.left.access  # type: ignore[attr-defined]
    assert element_stride(model, y, "m") == 16 and element_stride(model, x, "m") == 16
    assert element_stride(model, y, "kb") == 49 * 16 and element_stride(model, x, "c") == 1
    fill = build_model(parse_c(FILL), {"N": 2})
    assert element_stride(fill, fill.statements[0].statement.target, "m") is None


def test_a_call_spans_the_merged_positions() -> None:
    kern = polydl.compile(CONV, {"N": 2})
    binding = kern.schedule.microkernel
    assert binding is not None and binding.m == "m", kern.schedule.describe()

    def expected(x, w):  # type: ignore[no-untyped-def]
        return np.einsum("ncpqi,kcio->nkpqo", x.astype(np.float64), w)
    run_and_check(kern, expected)
