"""ResNet's stem and its like on the C target: an NCHW convolution of a few input channels at
a stride reads its input's columns split by phase (`builders.phased_columns`); on CUDA the
form it had."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import polydl
from polydl import api
from polydl.target.host import host_target
from tests.frontends.test_builders import conv2d_numpy_padded
from tests.kernels import run_and_check


def stem(**changes: Any) -> polydl.runtime.c.kernel.Kernel:  # type: ignore[name-defined]
    sizes = dict(N=2, C=3, K=24, H=30, W=34, R=7, S=7, stride=2, padding=3)
    return polydl.conv2d(**{**sizes, **changes}, machine=host_target())


def test_the_c_target_takes_the_phase_form_and_matches_numpy() -> None:
    k = stem(fuse=("bias", "relu"), accumulate=False)
    assert {"xd", "wd"} <= {a.name for a in k.nest.arrays}
    # the unit-stride window makes a GEMM of it whose B rows are read in place, not packed
    mk = k.schedule.microkernel
    assert mk is not None and (mk.m, mk.n, mk.k) == ("k", "q", "t") and not mk.pack_b

    def expected(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        y = conv2d_numpy_padded(x, w, 2, (3, 3, 3, 3)) + b[None, :, None, None]
        return np.maximum(y, 0)

    run_and_check(k, expected)


def test_cells_no_copy_writes_are_zero_on_every_call() -> None:
    """xd's border and wd's taps past S are read and never written: cleared on each call, also
    after another kernel left its own data in the scratch memory."""
    k = stem(padding=(1, 2, 3, 0), stride=3, S=5)
    other = polydl.conv2d(N=2, C=32, K=16, H=20, W=20, R=3, S=3, padding=1, machine=host_target())
    rng = np.random.default_rng(4)
    for _ in range(2):
        x = rng.uniform(-1, 1, (2, 3, 30, 34)).astype(np.float32)
        w = rng.uniform(-1, 1, (24, 3, 7, 5)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(k(x, w)), conv2d_numpy_padded(x, w, 3, (1, 2, 3, 0)),
                                   rtol=1e-4, atol=1e-4)
        other(rng.uniform(1, 2, (2, 32, 20, 20)).astype(np.float32),
              rng.uniform(1, 2, (16, 32, 3, 3)).astype(np.float32))


def test_bf16_stem() -> None:
    k = stem(dtype="bfloat16")
    assert "xd" in {a.name for a in k.nest.arrays}
    rng = np.random.default_rng(6)
    x = rng.uniform(-1, 1, (2, 3, 30, 34)).astype(ml_dtypes.bfloat16)
    w = rng.uniform(-1, 1, (24, 3, 7, 7)).astype(ml_dtypes.bfloat16)
    want = conv2d_numpy_padded(x.astype(np.float32), w.astype(np.float32), 2, (3, 3, 3, 3))
    np.testing.assert_allclose(np.asarray(k(x, w)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target, phased", [("c", True), ("cuda", False)])
def test_the_form_follows_the_target(monkeypatch: pytest.MonkeyPatch, target: str, phased: bool) -> None:
    """CUDA's kernels ran the phase form at 0.83-0.95x of reading x in place: it keeps that."""
    built = []
    monkeypatch.setattr(api, "build_kernel", lambda nest, params, *a, **k: built.append(nest))
    polydl.conv2d(N=1, C=3, K=16, H=32, W=32, R=7, S=7, stride=2, padding=3, target=target)
    assert ("xd" in {a.name for a in built[0].arrays}) == phased


STEM_TOML = """primitive = "conv2d"
N = 1
C = 3
K = 16
H = 32
W = 32
R = 7
S = 7
stride = 2
padding = 3
"""


def test_a_toml_stem_takes_the_form_of_its_target(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A TOML spec compiled for the C target gets the phase form as `polydl.conv2d` does
    (`builders.target_options`), unless it sets `column_phases`; loaded without a target it
    is the builder's default."""
    from polydl.frontends import load_spec

    spec = tmp_path / "stem.toml"
    spec.write_text(STEM_TOML)
    k = polydl.compile(str(spec), machine=host_target())
    assert "xd" in {a.name for a in k.nest.arrays}
    run_and_check(k, lambda x, w: conv2d_numpy_padded(x, w, 2, (3, 3, 3, 3)))
    spec.write_text(STEM_TOML + "column_phases = false\n")
    assert "xd" not in {a.name for a in polydl.compile(str(spec), machine=host_target()).nest.arrays}
    spec.write_text(STEM_TOML)
    assert "xd" not in {a.name for a in load_spec(spec)[0].arrays}
    assert "xd" in {a.name for a in load_spec(spec, target_kind="c")[0].arrays}
    assert "xd" not in {a.name for a in load_spec(spec, target_kind="cuda")[0].arrays}
