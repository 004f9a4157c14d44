"""A copy into a scratch array that the main nest reads (a convolution's zero-padded input)
fused into the main band: each thread copies the image it is about to read inside the parallel
loop, instead of a pass of its own over the whole input. Checked against the reference of the
same nest, and refused where a copied cell is read in several iterations of the outer loops."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polydl.api import build_kernel, lower
from polydl.driver.explain import explain
from polydl.frontends import builders
from polydl.frontends.spec_writing import parse_built
from polydl.schedules.schedule import Schedule
from polydl.target import resolve_target

CONV = dict(N=4, C=32, K=32, H=9, W=7, R=3, S=3, stride=1, padding=1)


def _cores(n: int):  # type: ignore[no-untyped-def]
    return replace(resolve_target("c", None), cores=n)


def _check(kernel, seed: int = 0) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    given = {a.name: rng.uniform(-1, 1, a.shape).astype(np.float32) for a in kernel.inputs}
    np.testing.assert_allclose(kernel(**given), kernel.reference(**given), rtol=1e-4, atol=1e-4)


def _body(kernel) -> str:  # type: ignore[no-untyped-def]
    return kernel.source[kernel.source.index(f"int {kernel.code.function}("):]


def _copies(kernel) -> list[str]:  # type: ignore[no-untyped-def]
    return [p.describe() for p in kernel.code.placements if p.describe().startswith("copy ")]


@pytest.mark.parametrize("fuse", [(), ("bias", "relu")])
def test_a_padded_input_is_copied_image_by_image_inside_the_parallel_loop(
        fuse: tuple[str, ...]) -> None:
    nest, params = builders.conv2d(**CONV, layout="nchw16c", fuse=fuse)
    kernel = build_kernel(nest, params, _cores(2))
    assert kernel.schedule.parallel == ("n",) and kernel.schedule.microkernel is not None
    (copy,) = _copies(kernel)
    assert "inside loop n" in copy, copy
    body = _body(kernel)
    # two parallel loops: the threads' borders, and then the images, each copied and convolved
    # by one thread
    assert body.count("#pragma omp parallel for") == 2
    parallel = body.rindex("#pragma omp parallel for")
    assert body.index("xp[", parallel) < body.index("_pd_brgemm", parallel)
    text = explain(lower(nest, params, _cores(2)), ranking=0)
    assert "S0 copied inside loop n, before the loops that read it" in text
    # each thread holds one padded image, its own, and clears its border
    assert "xp is held one slice of its first index per thread" in copy
    assert "pd_scratch(_pd_slices(4) * " in body and "xp[(_pd_thread()) * " in body
    _check(kernel)
    _check(kernel, seed=1)  # the slices of a scratch block taken again, their borders cleared


def test_a_first_loop_that_splits_evenly_is_parallel_alone_and_takes_the_copy() -> None:
    nest, params = builders.conv2d(**{**CONV, "N": 32}, layout="nchw16c")
    even = lower(nest, params, _cores(16))
    assert even.schedule.parallel == ("n",)
    assert [s.name for s in even.scheduled.main.feeds] == ["S0"]
    # 20 images on 16 cores: collapsed with the next loop for balance, the copy a pass of its own
    nest, params = builders.conv2d(**{**CONV, "N": 20}, layout="nchw16c")
    uneven = lower(nest, params, _cores(16))
    assert len(uneven.schedule.parallel) == 2
    assert not uneven.scheduled.main.feeds
    assert len(uneven.scheduled.groups) == 2


COPIED_B = """
void copied(const float A[24][16], const float B[16][20], float t[20][16], float C[24][20]) {
  for (int j = 0; j < 20; j++)
    for (int k = 0; k < 16; k++)
      t[j][k] = B[k][j];
  for (int i = 0; i < 24; i++)
    for (int j = 0; j < 20; j++)
      for (int k = 0; k < 16; k++)
        C[i][j] += A[i][k] * t[j][k];
}
"""


def test_a_copy_read_by_every_iteration_of_the_parallel_loop_stays_a_pass_of_its_own() -> None:
    # t[j][k] is read at every i: inside loop i each thread would copy all of it again
    nest, params = parse_built("copied", COPIED_B, {}, local=("t",), filled=("t",))
    schedule = Schedule(order=("i", "j", "k"), parallel=("i",))
    kernel = build_kernel(nest, params, _cores(2), schedule)
    assert not _copies(kernel)
    # the GEMM's loop; the copy's pass (320 cells) is worth no fork (`cost._evaluate`)
    assert _body(kernel).count("#pragma omp parallel for") == 1
    _check(kernel)
    # with j outermost each cell is read in one iteration of j: fused there
    by_j = Schedule(order=("j", "i", "k"), parallel=("j",))
    kernel = build_kernel(nest, params, _cores(2), by_j)
    (copy,) = _copies(kernel)
    assert "inside loop j" in copy and "t is held one slice of its first index per thread" in copy
    _check(kernel)
    # the same copy with j its second index: fused, but not a slice per thread
    columns = COPIED_B.replace("float t[20][16]", "float t[16][20]").replace("t[j][k]", "t[k][j]")
    nest, params = parse_built("copied", columns, {}, local=("t",), filled=("t",))
    kernel = build_kernel(nest, params, _cores(2), by_j)
    (copy,) = _copies(kernel)
    assert "inside loop j" in copy and "per thread" not in copy and "_pd_thread" not in kernel.source
    _check(kernel)


TRIANGLE = """
void upper_rows(const float A[8][8], const float B[8][8], float t[8][8], float C[8][8]) {
  for (int i = 0; i < 8; i++)
    for (int j = i; j < 8; j++)
      t[i][j] = A[i][j];
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 8; j++)
      for (int k = 0; k < 8; k++)
        C[i][j] += t[i][k] * B[k][j];
}
"""


def test_a_copy_whose_zeroes_move_between_slices_keeps_the_whole_array() -> None:
    # row i of t is read whole but written from column i on: a slice reused for row i + 1
    # would hold row i's value where row i + 1 reads a zero
    nest, params = parse_built("upper_rows", TRIANGLE, {}, local=("t",))
    kernel = build_kernel(nest, params, _cores(2), Schedule(order=("i", "j", "k"), parallel=("i",)))
    (copy,) = _copies(kernel)
    assert "inside loop i" in copy and "per thread" not in copy
    _check(kernel)
