"""Every wrong call is a `ShapeError` naming the argument, what was expected and what came,
before any native code runs; right calls with unusual but valid arrays work."""

from __future__ import annotations

import numpy as np
import pytest

import polydl
from polydl.errors import ShapeError
from tests.kernels import TWO_OUTPUTS


@pytest.fixture(scope="module")
def mm() -> polydl.Kernel:
    return polydl.matmul(M=4, N=6, K=3)


@pytest.fixture(scope="module")
def split() -> polydl.Kernel:
    return polydl.compile(TWO_OUTPUTS, {"N": 8})


A = np.ones((4, 3), np.float32)
B = np.ones((3, 6), np.float32)


def _err(kernel: polydl.Kernel, *args: object, **kw: object) -> ShapeError:
    with pytest.raises(ShapeError) as info:
        kernel(*args, **kw)
    err = info.value
    assert err.array and err.expected is not None and err.given is not None, str(err)
    assert err.array in str(err)
    return err


@pytest.mark.parametrize(
    "bad, given",
    [
        (np.ones((4, 3), np.float64), "float64"),
        (np.ones((4, 3), np.int32), "int32"),
        (np.ones((4, 3), ">f4"), ">f4"),
        (np.ones((3, 4), np.float32), (3, 4)),
        (np.ones((4, 3, 1), np.float32), (4, 3, 1)),
        (np.ones(12, np.float32), (12,)),
        (np.float32(1.0), "float32"),
        (3.0, "float"),
        (None, "NoneType"),
        ([[1.0] * 3] * 4, "list"),
    ],
    ids=["float64", "int32", "big-endian", "shape", "rank-3", "rank-1", "numpy-scalar",
         "python-float", "none", "list"],
)
def test_wrong_input(mm: polydl.Kernel, bad: object, given: object) -> None:
    err = _err(mm, bad, B)
    assert err.array == "A" and (err.given == given or str(given) in str(err.given))


@pytest.mark.parametrize(
    "layout", ["fortran", "transposed", "reversed", "every-other"],
)
def test_strided_inputs_are_refused(mm: polydl.Kernel, layout: str) -> None:
    base = np.ones((8, 6), np.float32)
    a = {
        "fortran": np.asfortranarray(A),
        "transposed": np.ones((3, 4), np.float32).T,
        "reversed": np.ones((4, 3), np.float32)[::-1],
        "every-other": base[::2, ::2],
    }[layout]
    err = _err(mm, a, B)
    assert err.array == "A" and err.expected == "C-contiguous" and "strides" in str(err.given)


def test_wrong_output(mm: polydl.Kernel) -> None:
    assert _err(mm, A, B, C=np.zeros((4, 6), np.float64)).given == "float64"
    assert _err(mm, A, B, C=np.zeros((6, 4), np.float32)).given == (6, 4)
    assert _err(mm, A, B, C=[0.0]).given == "list"
    assert _err(mm, A, B, C=np.zeros((6, 4), np.float32).T).expected == "C-contiguous"
    frozen = np.zeros((4, 6), np.float32)
    frozen.flags.writeable = False
    assert _err(mm, A, B, C=frozen).given == "read-only"


def test_outputs_may_not_alias(split: polydl.Kernel) -> None:
    x = np.zeros(8, np.float32)
    both = np.zeros(8, np.float32)
    assert _err(split, x, lo=both, hi=both).array == "lo"
    assert _err(split, x, lo=x).array == "lo"
    assert _err(split, x, lo=x[:]).array == "lo"  # a view of an array that owns its memory
    assert _err(split, x[:], lo=x).array == "lo"
    buffer = np.zeros(12, np.float32)
    err = _err(split, x, lo=buffer[:8], hi=buffer[4:])  # overlapping views
    assert err.array == "lo" and "hi" in str(err.given)


def test_argument_count_and_names(mm: polydl.Kernel) -> None:
    err = _err(mm)
    assert err.array == "A" and err.expected == "A, B" and err.given == "none"
    err = _err(mm, A, B, A)
    assert (err.expected, err.given) == (2, 3)
    assert _err(mm, A, B, X=A).array == "X"
    assert _err(mm, A, A=A, B=B).array == "A"


def test_valid_unusual_arrays_work(mm: polydl.Kernel) -> None:
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    a.flags.writeable = False  # read-only inputs are fine
    b = np.ascontiguousarray(np.ones((6, 3), np.float32).T)  # made contiguous: fine
    np.testing.assert_allclose(mm(a, b), a @ b)
    np.testing.assert_allclose(mm(a, b), mm.reference(a, b), rtol=1e-6)
