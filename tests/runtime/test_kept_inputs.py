"""Inputs kept between calls (`constant=`): a packed copy made at the first call, read by the
next ones, made again where the caller says the input changed or passes another array."""

from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np
import pytest

import polydl
from polydl import api
from polydl.driver import pipeline
from polydl.errors import ArgumentError
from polydl.frontends import builders, layers
from polydl.ir import fingerprint
from polydl.target.cpu import CpuTarget
from polydl.tuning.records import problem_key

# a classifier's shape: few rows, B rows a page apart; packing pays only when it is kept
M, N, K = 2, 1000, 2048


def _inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((M, K)).astype(np.float32),
            rng.standard_normal((K, N)).astype(np.float32))


def _close(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> bool:
    return np.allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def _kept_kernel() -> polydl.Kernel:
    """The matmul with B kept, in a schedule that packs B (the one ranked first for two AVX2
    cores, whatever this machine would rank first)."""
    nest, params = builders.matmul(M, N, K)
    kept = nest.keeping(["B"])
    schedule = pipeline.lower(kept, params, CpuTarget(isa="avx2", cores=2)).schedule
    k = api.build_kernel(kept, params, schedule=schedule)
    assert k.code.kept == ("B",), k.schedule.describe()
    return k


@pytest.fixture(scope="module")
def kernel() -> polydl.Kernel:
    return _kept_kernel()


def test_the_copy_is_made_at_the_first_call_and_read_by_the_next(kernel: polydl.Kernel) -> None:
    a, b = _inputs()
    assert _close(kernel(a, b), a, b)
    before = b.copy()
    b[:] = 0.0  # changed in place, unannounced: the kept copy still holds the old values
    assert _close(kernel(a, b), a, before)
    kernel.constants_changed()
    assert np.all(kernel(a, b) == 0.0)


def test_another_array_is_packed_anew(kernel: polydl.Kernel) -> None:
    a, b1 = _inputs(1)
    _, b2 = _inputs(2)
    for b in (b1, b2, b1):
        assert _close(kernel(a, b), a, b)


def test_another_array_at_an_address_seen_before_is_packed_anew(kernel: polydl.Kernel) -> None:
    a, b = _inputs(3)
    assert _close(kernel(a, b), a, b)
    # a second owner of the same memory, as a new array where a freed one was: new values
    other = np.ctypeslib.as_array((ctypes.c_float * b.size).from_address(b.ctypes.data))
    other = other.reshape(b.shape)
    assert other.ctypes.data == b.ctypes.data
    fresh = _inputs(4)[1]
    other[:] = fresh
    assert _close(kernel(a, other), a, fresh)


def test_kernels_of_one_library_keep_their_own_weights() -> None:
    first, second = _kept_kernel(), _kept_kernel()
    assert first.library_path == second.library_path
    a, b1 = _inputs(5)
    b2 = _inputs(6)[1]
    for _ in range(3):
        assert _close(first(a, b1), a, b1) and _close(second(a, b2), a, b2)


def test_calls_from_several_threads_read_whole_copies(kernel: polydl.Kernel) -> None:
    a = _inputs(7)[0]
    weights = [_inputs(8 + i)[1] for i in range(6)]  # more than the library's slots
    wrong: list[int] = []

    def work(index: int) -> None:
        for round_ in range(6):
            b = weights[(index + round_) % len(weights)]
            if not _close(kernel(a, b), a, b):
                wrong.append(index)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_the_copy_runs_before_the_nest_only_when_it_must_be_filled() -> None:
    nest, params = builders.matmul(M, N, K)
    target = CpuTarget(isa="avx2", cores=4)
    kept = pipeline.lower(nest.keeping(["B"]), params, target).code
    assert kept.kept == ("B",)
    source = kept.source
    take = source.index("pd_kept_take(")
    guard = source.index("if (_pd_fill_pd_packed_B)")
    assert take < guard < source.index("pd_kept_give(_pd_slot_pd_packed_B")
    assert "void matmul_constants_changed(void)" in kept.header
    plain = pipeline.lower(nest, params, target).code
    assert plain.kept == () and "pd_kept" not in plain.source
    assert "constants_changed" not in plain.header


def test_keeping_nothing_leaves_the_nests_identity() -> None:
    """Stored lowerings key a nest by its fingerprint, tuning records by the repr of its
    arrays: a nest that keeps nothing keeps both (records stored before stay found)."""
    nest, params = builders.matmul(8, 8, 8)
    assert nest.keeping(()) is nest
    assert "kept" not in fingerprint(nest) and "kept" not in repr(nest.arrays)
    kept = nest.keeping(["B"])
    assert fingerprint(kept) != fingerprint(nest)
    assert problem_key(kept, params) != problem_key(nest, params)


@pytest.mark.parametrize("name, expected", [("C", "not an input"), ("W", "not an input")])
def test_a_name_that_is_no_input_is_an_argument_error(name: str, expected: str) -> None:
    nest, _ = builders.matmul(8, 8, 8)
    with pytest.raises(ArgumentError, match=f"'{name}' is {expected}.*inputs: A, B"):
        nest.keeping([name])


def test_a_kept_weight_makes_packing_pay_for_a_few_rows() -> None:
    target = CpuTarget(isa="avx512", cores=16)
    nest, params = builders.matmul(M, 1000, 2048)
    assert pipeline.lower(nest, params, target).schedule.microkernel.pack_b is False
    assert pipeline.lower(nest.keeping(["B"]), params, target).schedule.microkernel.pack_b is True


def test_the_linear_layer_takes_its_weights_as_kept() -> None:
    nest, params = layers.linear(2, 64, 48, "float32", ())
    k = api.build_kernel(nest, params, constant=("w",))
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w = rng.standard_normal((48, 64)).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(k(x, w), x @ w.T, rtol=1e-4, atol=1e-4)


class _Interface:
    """An object that lends its memory through `__array_interface__` and, having slots and
    no `__weakref__`, takes no weak reference."""

    __slots__ = ("__array_interface__", "memory")

    def __init__(self, memory: np.ndarray) -> None:
        self.memory = memory
        self.__array_interface__ = memory.__array_interface__


def test_an_array_whose_owner_takes_no_weak_reference_is_packed_at_every_call(
        kernel: polydl.Kernel) -> None:
    """Such an owner cannot be told from a later one at the same address: every call takes
    the array for a new one, so a change in place, unannounced, is still read."""
    a, b = _inputs(5)
    lent = _Interface(b.copy())
    shared = np.asarray(lent)
    assert shared.base is lent
    with pytest.raises(TypeError):
        weakref.ref(lent)
    assert _close(kernel(a, shared), a, b)
    shared[:] = 2.0 * b
    assert _close(kernel(a, shared), a, 2.0 * b)
