"""Exact counting of integer points with barvinok (`card()`), for concrete (parameter-free) sets."""

from __future__ import annotations

import islpy as isl


def count_points(s: isl.Set | isl.UnionSet) -> int:
    """Number of integer points of a bounded set without parameters."""
    if s.is_empty():
        return 0
    card = s.card()
    if isinstance(card, isl.UnionPwQPolynomial):
        total = 0
        pieces: list[isl.PwQPolynomial] = []
        card.foreach_pw_qpolynomial(pieces.append)
        for piece in pieces:
            total += _constant(piece)
        return total
    return _constant(card)


def _constant(pwqp: isl.PwQPolynomial) -> int:
    point = isl.Point.zero(pwqp.get_domain_space())
    return int(pwqp.eval(point).to_python())
