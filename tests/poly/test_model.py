import pytest

from polydl.errors import SpecError
from polydl.frontends.c_loopnest import parse_c
from polydl.poly.counting import count_points
from polydl.poly.dependences import Dependences
from polydl.poly.model import build_model

MATMUL = """
void mm(int M, int N, int K, float C[M][N], const float A[M][K], const float B[K][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
}
"""

TRIANGLE = """
void tri(int N, float L[N][N], const float A[N][N]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j <= i; j += 2)
      L[i][j] = A[i][j] * 2.0f;
}
"""

OUT_OF_BOUNDS = """
void shift(int N, float B[N], const float A[N]) {
  for (int i = 0; i < N; i++)
    B[i] = A[i + 1];
}
"""

WAVEFRONT = """
void wave(int N, float A[N][N]) {
  for (int i = 1; i < N; i++)
    for (int j = 1; j < N; j++)
      A[i][j] = A[i - 1][j] + A[i][j - 1];
}
"""


def model(text: str, **params: int):
    return build_model(parse_c(text, "spec.c"), params)


def test_matmul_domain_and_accesses() -> None:
    m = model(MATMUL, M=3, N=4, K=5)
    (s,) = m.statements
    assert s.iterators == ("i", "j", "k")
    assert count_points(s.domain) == 60
    arrays = [a.access.array for a in s.accesses]
    assert arrays == ["C", "C", "A", "B"]  # write, the += read, then the loads
    assert [a.is_write for a in s.accesses] == [True, False, False, False]


@pytest.mark.parametrize("n, expected", [(1, 1), (4, 1 + 1 + 2 + 2), (7, 1 + 1 + 2 + 2 + 3 + 3 + 4)])
def test_non_rectangular_domain_with_step(n: int, expected: int) -> None:
    (s,) = model(TRIANGLE, N=n).statements
    assert count_points(s.domain) == expected


def test_out_of_bounds_access_is_proven_and_reported() -> None:
    with pytest.raises(SpecError) as info:
        model(OUT_OF_BOUNDS, N=8)
    err = info.value
    assert (err.file, err.line) == ("spec.c", 4)
    assert err.column > 0
    assert "i=7" in err.message and "A" in err.message


def test_matmul_dependences_are_carried_by_k_only() -> None:
    m = model(MATMUL, M=3, N=4, K=5)
    deps = Dependences(m)
    sched = m.original_schedule  # [0, i, 0, j, 0, k, 0]
    assert not deps.carried_at(sched, 1)
    assert not deps.carried_at(sched, 3)
    assert deps.carried_at(sched, 5)


def test_wavefront_dependences_are_carried_by_both_loops() -> None:
    m = model(WAVEFRONT, N=6)
    deps = Dependences(m)
    assert deps.carried_at(m.original_schedule, 1)
    assert not deps.flow.is_empty()
    # j is carried too: within one i, A[i][j] reads A[i][j-1]
    assert deps.carried_at(m.original_schedule, 3)
