"""Winograd's minimal filtering F(m x m, 3 x 3): the transform matrices, exact.

A 3 x 3 convolution of stride 1 computes each m x m tile of outputs from an (m+2) x (m+2) tile
of inputs with (m+2)^2 multiplications per input/output channel pair instead of 9 m^2
(Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks"): F(2x2) does 2.25 times
fewer, F(4x4) 4 times fewer. For weights g, an input tile d and the matrices (B^T, G, A^T):
`Y = A^T [(G g G^T) * (B^T d B)] A`, the product element by element, summed over the input
channels before A^T . A. Its rounding error: see decisions: Winograd's rounding error.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from polydl.ir import Binary, Const, Expr, Unary

F = Fraction

# The interpolation points 0, 1, -1 (F(2)) and 0, 1, -1, 2, -2 (F(4)), with the point at
# infinity last: (B^T, G, A^T) for each m.
MATRICES: dict[int, tuple[list[list[Fraction]], list[list[Fraction]], list[list[Fraction]]]] = {
    2: (
        [[F(1), F(0), F(-1), F(0)], [F(0), F(1), F(1), F(0)], [F(0), F(-1), F(1), F(0)],
         [F(0), F(1), F(0), F(-1)]],
        [[F(1), F(0), F(0)], [F(1, 2), F(1, 2), F(1, 2)], [F(1, 2), F(-1, 2), F(1, 2)],
         [F(0), F(0), F(1)]],
        [[F(1), F(1), F(1), F(0)], [F(0), F(1), F(-1), F(-1)]],
    ),
    4: (
        [[F(4), F(0), F(-5), F(0), F(1), F(0)], [F(0), F(-4), F(-4), F(1), F(1), F(0)],
         [F(0), F(4), F(-4), F(-1), F(1), F(0)], [F(0), F(-2), F(-1), F(2), F(1), F(0)],
         [F(0), F(2), F(-1), F(-2), F(1), F(0)], [F(0), F(4), F(0), F(-5), F(0), F(1)]],
        [[F(1, 4), F(0), F(0)], [F(-1, 6), F(-1, 6), F(-1, 6)], [F(-1, 6), F(1, 6), F(-1, 6)],
         [F(1, 24), F(1, 12), F(1, 6)], [F(1, 24), F(-1, 12), F(1, 6)], [F(0), F(0), F(1)]],
        [[F(1), F(1), F(1), F(1), F(1), F(0)], [F(0), F(1), F(-1), F(2), F(-2), F(0)],
         [F(0), F(1), F(1), F(4), F(4), F(0)], [F(0), F(1), F(-1), F(8), F(-8), F(1)]],
    ),
}
TILES = tuple(MATRICES)


def combination(coefficients: Sequence[Fraction], terms: Sequence[Expr]) -> Expr:
    """`sum coefficient * term` as an expression: zero coefficients left out, +-1 as a sign,
    the others as float constants."""
    out: Expr | None = None
    for coefficient, term in zip(coefficients, terms, strict=True):
        if coefficient == 0:
            continue
        magnitude = abs(coefficient)
        scaled = term if magnitude == 1 else Binary("*", Const(float(magnitude)), term)
        if out is None:
            out = Unary("-", scaled) if coefficient < 0 else scaled
        else:
            out = Binary("-" if coefficient < 0 else "+", out, scaled)
    return out if out is not None else Const(0.0)
