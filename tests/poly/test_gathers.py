"""Gathers and scatters in the model: an access through an index array may touch every cell of
its dimension; a scatter kills no earlier write in the flow analysis; the memory dependences
of a scatter-add order the indexed loop only; the numpy reference gathers, scatters and checks
the index values as the kernels do."""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

from polydl.errors import IndexRangeError
from polydl.frontends import load_spec
from polydl.poly.dependences import dependences_of
from polydl.poly.isl_parts import maps_of
from polydl.poly.model import build_model
from polydl.poly.reference import make_reference

EMBEDDING = """void emb(int N, int D, int V, const int tok[N], const float E[V][D], float y[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++)
      y[i][j] = E[tok[i]][j];
}
"""

SCATTER_ADD = """void scat(int N, int D, int V, const long tok[N], const float g[N][D], float dx[V][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++)
      dx[tok[i]][j] += g[i][j];
}
"""

# a scatter between a write and a read of the same cells: the first write still reaches the
# read wherever the scatter leaves a cell alone
NO_KILL = """void f(int N, int K, const int idx[K], const float x[K], float y[N], float z[N]) {
  for (int i = 0; i < N; i++)
    y[i] = 1.0f;
  for (int k = 0; k < K; k++)
    y[idx[k]] = x[k];
  for (int i = 0; i < N; i++)
    z[i] = y[i];
}
"""


def test_gather_is_a_may_read_of_the_whole_dimension() -> None:
    nest, params = load_spec(EMBEDDING, {"N": 3, "D": 4, "V": 5})
    s = build_model(nest, params).statements[0]
    by_array = {a.access.array: a for a in s.accesses}
    assert set(by_array) == {"y", "tok", "E"}
    gather = by_array["E"]
    assert gather.is_may and not gather.is_write
    assert not by_array["tok"].is_may and not by_array["y"].is_may
    # each instance may read any row of E, in its own column
    instance = isl.Set("{ S0[1, 2] }")
    cells = gather.relation.intersect_domain(instance).range()
    assert cells.is_equal(isl.Set("{ E[r, 2] : 0 <= r < 5 }"))
    assert by_array["tok"].relation.intersect_domain(instance).range().is_equal(isl.Set("{ tok[1] }"))


def test_scatter_is_a_may_source_of_the_flow() -> None:
    nest, params = load_spec(NO_KILL, {"N": 6, "K": 3})
    model = build_model(nest, params)
    assert model.may_writes.range().is_equal(isl.UnionSet("{ y[c] : 0 <= c < 6 }"))
    flow = dependences_of(model).flow
    pairs = {(m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out))
             for m in maps_of(flow)}
    # S2 may read what S1 scattered, and what S0 wrote where S1 wrote nothing
    assert ("S0", "S2") in pairs and ("S1", "S2") in pairs


def test_scatter_add_orders_the_indexed_loop_only() -> None:
    nest, params = load_spec(SCATTER_ADD, {"N": 5, "D": 4, "V": 3})
    model = build_model(nest, params)
    deps = dependences_of(model)
    schedule = model.original_schedule  # [0, i, 0, j, 0]
    assert deps.carried_at(schedule, 1)  # i: two tokens may name one row
    assert not deps.carried_at(schedule, 3)  # j: each column is its own cell


def _reference(spec: str, params: dict[str, int], arrays: dict[str, np.ndarray]) -> None:
    nest, bound = load_spec(spec, params)
    make_reference(build_model(nest, bound))(arrays)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reference_gathers(dtype: type) -> None:
    rng = np.random.default_rng(3)
    tok = rng.integers(0, 7, 9).astype(dtype)
    table = rng.standard_normal((7, 5)).astype(np.float32)
    y = np.zeros((9, 5), np.float32)
    _reference(EMBEDDING.replace("const int tok", "const long tok") if dtype == np.int64 else EMBEDDING,
               {"N": 9, "D": 5, "V": 7}, {"tok": tok, "E": table, "y": y})
    assert np.array_equal(y, table[tok])


def test_reference_scatter_add_sums_repeated_indices() -> None:
    rng = np.random.default_rng(4)
    tok = np.array([2, 0, 2, 2, 1, 0, 2], np.int64)
    g = rng.standard_normal((7, 3)).astype(np.float32)
    dx = rng.standard_normal((4, 3)).astype(np.float32)
    want = dx.astype(np.float64)
    np.add.at(want, tok, g.astype(np.float64))
    _reference(SCATTER_ADD, {"N": 7, "D": 3, "V": 4}, {"tok": tok, "g": g, "dx": dx})
    np.testing.assert_allclose(dx, want, rtol=1e-6)


@pytest.mark.parametrize("bad", [-1, 5, 1 << 40])
@pytest.mark.parametrize("spec", [EMBEDDING, SCATTER_ADD])
def test_reference_refuses_an_index_outside(spec: str, bad: int) -> None:
    tok = np.array([0, 4, bad, 1], np.int64)
    gather = spec is EMBEDDING
    arrays = ({"tok": tok.astype(np.int32) if abs(bad) < 2**31 else tok, "E": np.ones((5, 2), np.float32),
               "y": np.zeros((4, 2), np.float32)} if gather else
              {"tok": tok, "g": np.ones((4, 2), np.float32), "dx": np.zeros((5, 2), np.float32)})
    if gather and abs(bad) >= 2**31:
        spec = spec.replace("const int tok", "const long tok")
    with pytest.raises(IndexRangeError) as info:
        _reference(spec, {"N": 4, "D": 2, "V": 5}, arrays)
    err = info.value
    assert (err.index_array, err.position, err.value) == ("tok", (2,), bad)
    assert (err.array, err.dimension, err.extent) == ("E" if gather else "dx", 0, 5)
    assert f"tok[2] = {bad} is outside" in str(err) and "first dimension (0..4)" in str(err)
