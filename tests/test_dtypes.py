"""One table of element types, read by every stage."""

from __future__ import annotations

import numpy as np
import pytest

from polydl.dtypes import C_SPELLINGS, DTYPES, dtype
from polydl.errors import PolyDLError
from polydl.frontends import builders
from polydl.frontends.c_loopnest import ELEMENT_TYPES
from polydl.poly.model import build_model
from polydl.runtime.kernel import NUMPY_DTYPES
from polydl.runtime.verify import TOLERANCE
from polydl.schedules.cpu.rank import rank
from polydl.target import CpuTarget


def test_the_table_is_consistent() -> None:
    for name, d in DTYPES.items():
        assert d.name == name
        assert np.dtype(d.numpy).itemsize == d.bytes
        assert d.dlpack[1] == 8 * d.bytes
        assert d.accumulates_in in DTYPES and DTYPES[d.accumulates_in].bytes >= d.bytes
        assert NUMPY_DTYPES[name] == np.dtype(d.numpy) and TOLERANCE[name] == d.tolerance
    assert set(C_SPELLINGS.values()) == set(DTYPES)
    assert ELEMENT_TYPES is C_SPELLINGS  # the C frontend accepts exactly these spellings
    with pytest.raises(PolyDLError, match="unknown dtype 'complex64'"):
        dtype("complex64")


def test_the_cost_model_counts_each_dtype_by_its_size() -> None:
    """The same GEMM in float64: half the lanes per register (narrower register tiles along n),
    twice the compute cycles and more traffic than in float32."""
    target = CpuTarget(isa="avx512", cores=2)
    single, double = (rank(build_model(*builders.matmul(512, 512, 512, dtype=d)), target)[0]
                      for d in ("float32", "float64"))
    assert dict(double.schedule.tiles)["j"] < dict(single.schedule.tiles)["j"]
    assert double.compute_cycles == 2 * single.compute_cycles
    assert double.traffic_bytes["l3"] > single.traffic_bytes["l3"]
