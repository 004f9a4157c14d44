"""The calling convention and its argument checks (docs/contract.md)."""

from __future__ import annotations

import numpy as np
import pytest

import polydl
from polydl.codegen.artifact import KernelArgument
from polydl.errors import PolyDLError, ShapeError
from polydl.runtime.kernel import bind_host
from tests.kernels import TWO_OUTPUTS, run_and_check


@pytest.fixture(scope="module")
def mm() -> polydl.Kernel:
    return polydl.matmul(M=5, N=7, K=3)


def test_inputs_positional_or_by_name(mm: polydl.Kernel) -> None:
    a = np.arange(15, dtype=np.float32).reshape(5, 3)
    b = np.ones((3, 7), dtype=np.float32)
    np.testing.assert_allclose(mm(a, b), a @ b)
    np.testing.assert_allclose(mm(A=a, B=b), a @ b)
    np.testing.assert_allclose(mm(a, B=b), a @ b)


class _Tagged(np.ndarray):
    """An ndarray subclass: calls with one take the full checks, not the quick ones."""


def test_array_subclasses_and_read_only_inputs(mm: polydl.Kernel) -> None:
    a = np.arange(15, dtype=np.float32).reshape(5, 3)
    b = np.linspace(-1, 1, 21, dtype=np.float32).reshape(3, 7)
    c = np.full((5, 7), 2, dtype=np.float32).view(_Tagged)
    frozen = b.copy()
    frozen.flags.writeable = False
    result = mm(a.view(_Tagged), frozen, C=c)
    assert result is c
    np.testing.assert_allclose(np.asarray(c), 2 + a @ b, rtol=1e-6)
    # the same arrays again: the same answer
    np.testing.assert_allclose(np.asarray(mm(a, frozen, C=c)), 2 + 2 * (a @ b), rtol=1e-6)


def test_outputs_it_allocates_start_on_a_cache_line(mm: polydl.Kernel) -> None:
    a = np.ones((5, 3), dtype=np.float32)
    b = np.ones((3, 7), dtype=np.float32)
    for _ in range(4):
        c = mm(a, b)
        assert c.ctypes.data % 64 == 0
        assert c.flags.c_contiguous and c.flags.writeable and c.shape == (5, 7)
        np.testing.assert_allclose(c, 3.0)


def test_output_passed_by_name_accumulates_in_place(mm: polydl.Kernel) -> None:
    a = np.ones((5, 3), dtype=np.float32)
    b = np.ones((3, 7), dtype=np.float32)
    c = np.full((5, 7), 10.0, dtype=np.float32)
    out = mm(a, b, C=c)
    assert out is c
    np.testing.assert_allclose(c, 13.0)
    ref = mm.reference(a, b, C=c)
    np.testing.assert_allclose(ref, 16.0)
    np.testing.assert_allclose(c, 13.0)  # the reference copies outputs


def test_several_outputs_come_back_as_a_tuple_in_declaration_order() -> None:
    k = polydl.compile(TWO_OUTPUTS, {"N": 11})
    x = np.linspace(-1, 1, 11, dtype=np.float32)
    lo, hi = k(x)
    np.testing.assert_array_equal(lo, np.minimum(x, 0))
    np.testing.assert_array_equal(hi, np.maximum(x, 0))
    run_and_check(k, lambda x: (np.minimum(x, 0), np.maximum(x, 0)))


def _err(kernel: polydl.Kernel, *args: object, **kw: object) -> ShapeError:
    with pytest.raises(ShapeError) as info:
        kernel(*args, **kw)
    return info.value


def test_wrong_shape_names_the_array_and_both_shapes(mm: polydl.Kernel) -> None:
    e = _err(mm, np.zeros((5, 4), np.float32), np.zeros((3, 7), np.float32))
    assert (e.array, e.expected, e.given) == ("A", (5, 3), (5, 4))


def test_wrong_rank(mm: polydl.Kernel) -> None:
    e = _err(mm, np.zeros(15, np.float32), np.zeros((3, 7), np.float32))
    assert (e.array, e.expected, e.given) == ("A", (5, 3), (15,))


def test_wrong_dtype(mm: polydl.Kernel) -> None:
    e = _err(mm, np.zeros((5, 3), np.float64), np.zeros((3, 7), np.float32))
    assert (e.array, e.expected, e.given) == ("A", "float32", "float64")


def test_not_an_array(mm: polydl.Kernel) -> None:
    e = _err(mm, [[0.0] * 3] * 5, np.zeros((3, 7), np.float32))
    assert e.array == "A" and e.given == "list"


def test_non_contiguous(mm: polydl.Kernel) -> None:
    a = np.zeros((3, 5), np.float32).T
    e = _err(mm, a, np.zeros((3, 7), np.float32))
    assert e.array == "A" and e.expected == "C-contiguous"


def test_missing_and_extra_and_unknown_arguments(mm: polydl.Kernel) -> None:
    a, b = np.zeros((5, 3), np.float32), np.zeros((3, 7), np.float32)
    assert _err(mm, a).array == "B"
    assert _err(mm, a, b, np.zeros((5, 7), np.float32)).given == 3
    assert _err(mm, a, b, D=a).array == "D"
    assert _err(mm, a, b, A=a).array == "A"


def test_read_only_output(mm: polydl.Kernel) -> None:
    c = np.zeros((5, 7), np.float32)
    c.flags.writeable = False
    e = _err(mm, np.zeros((5, 3), np.float32), np.zeros((3, 7), np.float32), C=c)
    assert e.array == "C" and e.given == "read-only"


def test_output_aliasing_an_input_is_refused() -> None:
    k = polydl.compile(TWO_OUTPUTS, {"N": 4})
    x = np.zeros(4, np.float32)
    e = _err(k, x, lo=x)
    assert e.array == "lo"


def test_errors_share_one_root() -> None:
    assert issubclass(ShapeError, PolyDLError)


def test_kernel_reports_what_it_is(mm: polydl.Kernel) -> None:
    assert mm.name == "matmul"
    assert mm.flops == 2 * 5 * 7 * 3
    assert "int matmul(" in mm.source
    assert [a.name for a in mm.arguments] == ["C", "A", "B"]
    assert mm.params == {"M": 5, "N": 7, "K": 3}
    assert mm.schedule.order  # an explicit, resolved schedule


def test_an_output_too_large_to_allocate_is_a_shape_error() -> None:
    huge = KernelArgument("C", "float32", (2**31, 2**31), False, "float")
    with pytest.raises(ShapeError, match="cannot allocate the output"):
        bind_host((huge,), {})
