"""The comparison with the reference: relative error over the finite cells, infinities and
NaNs only where the reference has the same."""

from __future__ import annotations

import numpy as np

from polydl.runtime.verify import compare, relative_error


def test_the_same_infinities_compare_equal() -> None:
    ref = np.array([-np.inf, 1.0, np.inf, 2.0])
    out = np.array([-np.inf, 1.0, np.inf, 2.0 + 1e-9], dtype=np.float32)
    ok, error = compare(out, ref, "float32")
    assert ok and error < 1e-6


def test_an_infinity_of_the_other_sign_or_in_a_finite_cell_is_wrong() -> None:
    ref = np.array([-np.inf, 1.0])
    assert relative_error(np.array([np.inf, 1.0]), ref, "float32") == float("inf")
    assert relative_error(np.array([-np.inf, np.inf]), ref, "float32") == float("inf")
    assert relative_error(np.array([-3.0e38, 1.0]), ref, "float32") == float("inf")


def test_nans_must_sit_where_the_reference_has_them() -> None:
    ref = np.array([np.nan, 1.0])
    assert compare(np.array([np.nan, 1.0]), ref, "float32")[0]
    assert relative_error(np.array([0.0, 1.0]), ref, "float32") == float("inf")
