"""Kernels that gather and scatter through index arrays, each checked against the numpy
reference and an independent numpy expression; a value outside the dimension it selects is an
`IndexRangeError` naming the index array, its position and value, from the kernel and from the
reference alike, with nothing outside an array touched."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl import Schedule
from polydl.cli import main
from polydl.codegen.artifact import code_from_dict, code_to_dict
from polydl.errors import IndexRangeError, ScheduleError, SpecError
from polydl.runtime.verify import compare

RNG = np.random.default_rng(11)


def _check(kernel, want, *inputs):  # type: ignore[no-untyped-def]
    """The kernel's outputs against `want` (a tuple of float64 arrays) and the reference."""
    got = kernel(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    ref = kernel.reference(*inputs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    outputs = [a for a in kernel.arguments if not a.is_input]
    for arg, g, r, w in zip(outputs, got, ref, want, strict=True):
        for other, what in ((r, "reference"), (np.asarray(w), "numpy")):
            ok, err = compare(g, other, arg.dtype)
            assert ok, f"{arg.name}: kernel differs from {what}, relative error {err:.3e}"
    return got


def _raises(call, index_array: str, position: tuple[int, ...], value: int, array: str,  # type: ignore[no-untyped-def]
            dimension: int, extent: int) -> IndexRangeError:
    with pytest.raises(IndexRangeError) as info:
        call()
    err = info.value
    assert (err.index_array, err.position, err.value) == (index_array, position, value), str(err)
    assert (err.array, err.dimension, err.extent) == (array, dimension, extent), str(err)
    assert isinstance(err, IndexError)
    return err


EMBEDDING = """void emb(int N, int D, int V, const {t} tok[N], const float E[V][D], float y[N][D]) {{
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++)
      y[i][j] = E[tok[i]][j];
}}
"""


@pytest.mark.parametrize("ctype, dtype", [("int", np.int32), ("long", np.int64)])
@pytest.mark.parametrize("n, d, v", [(1, 1, 1), (7, 13, 5), (64, 48, 100)])
def test_embedding_lookup(ctype: str, dtype: type, n: int, d: int, v: int) -> None:
    k = polydl.compile(EMBEDDING.format(t=ctype), {"N": n, "D": d, "V": v})
    tok = RNG.integers(0, v, n).astype(dtype)
    table = RNG.standard_normal((v, d)).astype(np.float32)
    _check(k, (table[tok],), tok, table)
    (check,) = k.code.index_checks
    assert check.before_loops and (check.index_array, check.array, check.extent) == ("tok", "E", v)
    assert k.schedule.microkernel is None
    assert "emb_index_fault" in k.header


@pytest.mark.parametrize("bad, at", [(-1, 0), (9, 3), (9, 4), (-(2**31), 2)])
def test_gather_outside_raises_before_writing(bad: int, at: int) -> None:
    k = polydl.compile(EMBEDDING.format(t="int"), {"N": 5, "D": 3, "V": 9})
    tok = np.array([1, 2, 3, 4, 5], np.int32)
    tok[at] = bad
    table = np.ones((9, 3), np.float32)
    y = np.full((5, 3), 7.0, np.float32)
    err = _raises(lambda: k(tok, table, y=y), "tok", (at,), bad, "E", 0, 9)
    assert str(err) == f"tok[{at}] = {bad} is outside E's first dimension (0..8)"
    assert (y == 7.0).all()  # checked before the loops: nothing written
    _raises(lambda: k.reference(tok, table), "tok", (at,), bad, "E", 0, 9)


CROSS_ENTROPY = """#include <math.h>
void xent(int N, int C, const float lp[N][C], const int label[N], float loss[N]) {
  for (int n = 0; n < N; n++) {
    float m = -INFINITY;
    for (int c = 0; c < C; c++)
      m = fmaxf(m, lp[n][c]);
    float s = 0.0f;
    for (int c = 0; c < C; c++)
      s += expf(lp[n][c] - m);
    loss[n] = m + logf(s) - lp[n][label[n]];
  }
}
"""


@pytest.mark.parametrize("n, c", [(1, 1), (6, 10), (33, 17)])
def test_cross_entropy_with_labels(n: int, c: int) -> None:
    k = polydl.compile(CROSS_ENTROPY, {"N": n, "C": c})
    lp = (3 * RNG.standard_normal((n, c))).astype(np.float32)
    label = RNG.integers(0, c, n).astype(np.int32)
    x = lp.astype(np.float64)
    m = x.max(axis=1)
    want = m + np.log(np.exp(x - m[:, None]).sum(axis=1)) - x[np.arange(n), label]
    _check(k, (want,), lp, label)
    label[n - 1] = c
    _raises(lambda: k(lp, label), "label", (n - 1,), c, "lp", 1, c)


ONE_D = """void g(int K, int V, const long idx[K], const float x[V], float y[K]) {
  for (int k = 0; k < K; k++)
    y[k] = x[idx[k] + 1] - x[idx[k]];
}
"""


def test_one_dimensional_gather_with_an_offset() -> None:
    k = polydl.compile(ONE_D, {"K": 40, "V": 12})
    idx = RNG.integers(0, 11, 40).astype(np.int64)
    x = RNG.standard_normal(12).astype(np.float32)
    _check(k, (x[idx + 1].astype(np.float64) - x[idx],), idx, x)
    # two checks of one index array: 0..10 for x[idx[k] + 1], 0..11 for x[idx[k]]
    assert sorted(c.offset for c in k.code.index_checks) == [0, 1]
    idx[5] = 11  # x[idx[k]] accepts it; x[idx[k] + 1] does not
    err = _raises(lambda: k(idx, x), "idx", (5,), 11, "x", 0, 12)
    assert err.offset == 1 and "(+ 1 = 12)" in str(err)


REDUCTION = """void dot(int K, int V, const int idx[K], const float w[V], const float v[K], float s[1]) {
  for (int k = 0; k < K; k++)
    s[0] += w[idx[k]] * v[k];
}
"""


@pytest.mark.parametrize("kk, vv", [(1, 1), (100, 7), (1000, 300)])
def test_gather_in_a_reduction(kk: int, vv: int) -> None:
    k = polydl.compile(REDUCTION, {"K": kk, "V": vv})
    idx = RNG.integers(0, vv, kk).astype(np.int32)
    w, v = RNG.standard_normal(vv).astype(np.float32), RNG.standard_normal(kk).astype(np.float32)
    _check(k, ((w[idx].astype(np.float64) * v).sum(keepdims=True),), idx, w, v)


SCATTER_ADD = """void scat(int N, int D, int V, const {t} tok[N], const float g[N][D], float dx[V][D]) {{
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++)
      dx[tok[i]][j] += g[i][j];
}}
"""


@pytest.mark.parametrize("ctype, dtype", [("int", np.int32), ("long", np.int64)])
@pytest.mark.parametrize("n, d, v", [(1, 1, 1), (50, 16, 7), (300, 33, 4)])
def test_scatter_add_sums_repeated_indices(ctype: str, dtype: type, n: int, d: int, v: int) -> None:
    k = polydl.compile(SCATTER_ADD.format(t=ctype), {"N": n, "D": d, "V": v})
    tok = RNG.integers(0, v, n).astype(dtype)
    g = RNG.standard_normal((n, d)).astype(np.float32)
    dx = RNG.standard_normal((v, d)).astype(np.float32)
    want = dx.astype(np.float64)
    np.add.at(want, tok, g.astype(np.float64))
    got = dx.copy()
    k(tok, g, dx=got)
    ok, err = compare(got, want, "float32")
    assert ok, err
    ref = k.reference(tok, g, dx=dx.copy())  # an output given starts from its values
    assert compare(got, ref, "float32")[0]
    # legal: the loop the index varies with never runs in parallel (one iteration aside)
    assert n == 1 or "i" not in k.schedule.parallel


@pytest.mark.parametrize("bad", [-3, 7])
def test_scatter_outside_raises_before_writing(bad: int) -> None:
    k = polydl.compile(SCATTER_ADD.format(t="long"), {"N": 6, "D": 4, "V": 7})
    tok = np.array([0, 6, 6, 1, 2, 3], np.int64)
    tok[4] = bad
    g = np.ones((6, 4), np.float32)
    dx = np.zeros((7, 4), np.float32)
    _raises(lambda: k(tok, g, dx=dx), "tok", (4,), bad, "dx", 0, 7)
    assert not dx.any()
    _raises(lambda: k.reference(tok, g), "tok", (4,), bad, "dx", 0, 7)


HISTOGRAM = """void hist(int N, int V, const int idx[N], const float w[N], float h[V]) {
  for (int k = 0; k < N; k++)
    h[idx[k]] += w[k];
}
"""


def test_histogram_matches_add_at() -> None:
    k = polydl.compile(HISTOGRAM, {"N": 5000, "V": 10})
    idx = RNG.integers(0, 10, 5000).astype(np.int32)
    w = RNG.standard_normal(5000).astype(np.float32)
    want = np.zeros(10)
    np.add.at(want, idx, w.astype(np.float64))
    _check(k, (want,), idx, w)


SCATTER_ASSIGN = """void put(int K, int V, const int idx[K], const float x[K], float y[V]) {
  for (int k = 0; k < K; k++)
    y[idx[k]] = x[k];
}
"""


def test_scatter_assignment_keeps_the_last_write() -> None:
    k = polydl.compile(SCATTER_ASSIGN, {"K": 64, "V": 9})
    idx = RNG.integers(0, 9, 64).astype(np.int32)
    x = RNG.standard_normal(64).astype(np.float32)
    y = np.full(9, -5.0, np.float32)
    want = y.astype(np.float64)
    for position, cell in enumerate(idx):  # in order: the last write to a cell stays
        want[cell] = x[position]
    got = y.copy()
    k(idx, x, y=got)
    assert np.array_equal(got, want.astype(np.float32))
    assert np.array_equal(k.reference(idx, x, y=y.copy()), got)


TOKENS_2D = """void emb2(int B, int T, int D, int V, const int tok[B][T], const float E[V][D],
          float y[B][T][D]) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int j = 0; j < D; j++)
        y[b][t][j] = E[tok[b][t]][j];
}
"""


def test_index_array_of_another_shape() -> None:
    k = polydl.compile(TOKENS_2D, {"B": 3, "T": 5, "D": 8, "V": 20})
    tok = RNG.integers(0, 20, (3, 5)).astype(np.int32)
    table = RNG.standard_normal((20, 8)).astype(np.float32)
    _check(k, (table[tok],), tok, table)
    tok[2, 1] = 20
    _raises(lambda: k(tok, table), "tok", (2, 1), 20, "E", 0, 20)


COLUMNS = """void cols(int N, int K, int M, const int idx[K], const float x[N][M], float y[N][K]) {
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++)
      y[n][k] = 2.0f * x[n][idx[k]];
}
"""


def test_gather_in_the_last_dimension() -> None:
    k = polydl.compile(COLUMNS, {"N": 6, "K": 4, "M": 9})
    idx = np.array([8, 0, 8, 3], np.int32)
    x = RNG.standard_normal((6, 9)).astype(np.float32)
    _check(k, (2.0 * x[:, idx].astype(np.float64),), idx, x)
    idx[3] = -1
    err = _raises(lambda: k(idx, x), "idx", (3,), -1, "x", 1, 9)
    assert "x's second dimension (0..8)" in str(err)


COMPUTED = """void perm(int N, int V, const int a[N], const float x[V], int t[N], float y[N]) {
  for (int i = 0; i < N; i++)
    t[i] = a[i] + 1;
  for (int i = 0; i < N; i++)
    y[i] = x[t[i]];
}
"""


def test_index_array_the_nest_writes_is_checked_where_read() -> None:
    k = polydl.compile(COMPUTED, {"N": 10, "V": 6})
    (check,) = k.code.index_checks
    assert not check.before_loops and "pd_checked(" in k.source
    a = RNG.integers(-1, 5, 10).astype(np.int32)
    x = RNG.standard_normal(6).astype(np.float32)
    _check(k, (a + 1, x[a + 1]), a, x)
    a[7] = 5
    _raises(lambda: k(a, x), "t", (7,), 6, "x", 0, 6)
    _raises(lambda: k.reference(a, x), "t", (7,), 6, "x", 0, 6)


PART = """void every_other(int M, int V, const int idx[2 * M], const float x[V], float y[M]) {
  for (int k = 0; k < M; k++)
    y[k] = x[idx[2 * k]];
}
"""


def test_index_array_read_in_part_checks_only_what_it_reads() -> None:
    k = polydl.compile(PART, {"M": 8, "V": 5})
    assert not k.code.index_checks[0].before_loops
    idx = RNG.integers(0, 5, 16).astype(np.int32)
    idx[1::2] = 1000  # never read: no error, as in C
    x = RNG.standard_normal(5).astype(np.float32)
    _check(k, (x[idx[::2]],), idx, x)
    idx[6] = 5
    _raises(lambda: k(idx, x), "idx", (6,), 5, "x", 0, 5)


def test_size_zero_is_refused_clearly() -> None:
    with pytest.raises(SpecError, match="'N' must be >= 1, not 0"):
        polydl.compile(EMBEDDING.format(t="int"), {"N": 0, "D": 3, "V": 4})


def test_gpu_target_refuses_gathers_at_their_statement() -> None:
    with pytest.raises(SpecError, match="index array.*C target") as info:
        polydl.compile(SCATTER_ADD.format(t="int"), {"N": 4, "D": 8, "V": 3}, target="cuda")
    assert info.value.line == 4


def test_generated_code_keeps_its_checks_through_the_cache_record() -> None:
    k = polydl.compile(ONE_D, {"K": 4, "V": 3})
    assert code_from_dict(code_to_dict(k.code)) == k.code


# a C caller of the ahead-of-time library: the status names the check, _index_fault the place
AOT_CALLER = r"""#include <stdio.h>
#include "emb.h"
int main(void) {
  int tok[3] = {1, 9, 2};
  float table[9 * 2] = {0}, y[3 * 2];
  long position = -1, value = 0;
  if (emb(tok, table, y) != 0) return 1;
  tok[2] = 9 + 4;
  int status = emb(tok, table, y);
  emb_index_fault(&position, &value);
  printf("%d %ld %ld\n", status, position, value);
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_ahead_of_time_callers_read_the_status_and_the_fault(tmp_path: Path) -> None:
    spec = tmp_path / "emb.c"
    spec.write_text(EMBEDDING.format(t="int").replace("tok[i]][j]", "tok[i] - 1][j]"))
    out = tmp_path / "out"
    assert main(["compile", str(spec), "-p", "N=3", "-p", "D=2", "-p", "V=9",
                 "--machine", "generic", "-o", str(out)]) == 0
    header = (out / "emb.h").read_text()
    assert "1: a value of tok - 1 outside 0..8 (dimension 0 of E)" in header
    assert "void emb_index_fault(long *position, long *value);" in header
    (tmp_path / "caller.c").write_text(AOT_CALLER)
    program = tmp_path / "caller"
    built = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", str(tmp_path / "caller.c"),
                            f"-I{out}", f"-L{out}", "-lemb", f"-Wl,-rpath,{out}", "-o",
                            str(program)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.split() == ["1", "2", "13"], (ran.returncode, ran.stdout)


def test_scatter_add_schedules_legal_and_not() -> None:
    spec, sizes = SCATTER_ADD.format(t="long"), {"N": 200, "D": 16, "V": 7}
    with pytest.raises(ScheduleError, match="'i' carries a dependence"):
        polydl.compile(spec, sizes, schedule=Schedule(order=("i", "j"), parallel=("i",)))
    # a private copy of dx per thread makes i parallel: OpenMP adds the copies
    k = polydl.compile(spec, sizes, schedule=Schedule(order=("i", "j"), parallel=("i",),
                                                      private_sums=True))
    tok = RNG.integers(0, 7, 200).astype(np.int64)
    g = RNG.standard_normal((200, 16)).astype(np.float32)
    want = np.zeros((7, 16))
    np.add.at(want, tok, g.astype(np.float64))
    _check(k, (want,), tok, g)
