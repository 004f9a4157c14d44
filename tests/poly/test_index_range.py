"""Sizes whose index arithmetic would overflow 64-bit integers are refused, at the construct."""

from __future__ import annotations

import pytest

import polydl
from polydl.errors import SpecError
from polydl.frontends import load_spec
from polydl.poly.index_range import INDEX_LIMIT
from polydl.poly.model import build_model

MATMUL = """void matmul(int M, int N, int K, float C[M][N],
            const float A[M][K], const float B[K][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
}
"""


def _refused(text: str, params: dict[str, int]) -> SpecError:
    nest, bound = load_spec(text, params)
    with pytest.raises(SpecError) as info:
        build_model(nest, bound)
    return info.value


def test_array_too_large_to_address_points_at_the_array() -> None:
    err = _refused(MATMUL, {"M": 2**40, "N": 2**40, "K": 1})
    assert (err.line, err.column) == (1, 40) and "'C'" in err.message and "overflow" in err.message


def test_builder_sizes_are_checked_too() -> None:
    with pytest.raises(SpecError, match="overflow"):
        polydl.matmul(M=2**31, N=2**31, K=2**31)


def test_loop_bound_beyond_the_limit() -> None:
    text = "void f(int N, float v[1]) {\n  for (int i = 0; i < N + N; i++)\n    v[0] += 1.0f;\n}\n"
    err = _refused(text, {"N": 2**62})
    assert err.line == 2 and "loop 'i'" in err.message


def test_intermediate_subscript_value_overflows() -> None:
    # the subscript is always 0, but 1000000000 * i leaves 64 bits on the way
    text = ("void f(int N, float v[1]) {\n  for (int i = 0; i < N; i++)\n"
            "    v[1000000000 * i - 1000000000 * i] = 1.0f;\n}\n")
    assert build_model(*load_spec(text, {"N": 1000}))  # small sizes: fine
    err = _refused(text, {"N": 2**40})
    assert (err.line, err.column) == (3, 5) and "subscript of 'v'" in err.message


def test_sizes_just_below_the_limit_are_accepted() -> None:
    text = "void f(int N, float v[1]) {\n  for (int i = 0; i < N; i++)\n    v[0] += 1.0f;\n}\n"
    model = build_model(*load_spec(text, {"N": INDEX_LIMIT}))
    assert model.statements
