"""Every corpus kernel of the general suite at its test sizes: polydl's build equals polydl's
float64 numpy reference and gcc -O0 of the same C, and the DL operators' PyTorch references
(run in float64) compute what the C computes.

Tolerances are relative to the reference's largest magnitude: 1e-5 for float32 kernels without
transcendental functions (rounding and reassociated sums), 2e-5 where they call exp, log, tanh,
erf, sin, cos or pow (float32 libm and polydl's vector forms are within a few ulp, and an error
in an exponent grows with the value's magnitude: softplus of 30, a sum of exponentials rescaled
at every step; every kernel was within 3e-7 at the test sizes when this was written), 1e-9 for
double kernels. A kernel polydl refuses is an
expected failure naming the missing feature: once polydl accepts it, the test fails and the
entry goes.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import polydl
from polydl.bench import general, torch_ops
from polydl.bench.general_corpus import CORPUS, DATASETS, KERNEL_DIR, kernels_of
from polydl.bench.general_inputs import make_inputs
from polydl.bench.general_signature import read_signature
from polydl.errors import PolyDLError

# kernel -> the words of polydl's refusal, naming what it does not support yet
REFUSED: dict[str, str] = {}
# kernel -> the construct polydl computes differently from C (a wrong result, reported)
WRONG: dict[str, str] = {}
# the README's test command checks one kernel per feature of the general path (a local under
# if/else, a ternary, passes over a row, vector math, a gather, a scatter, an arg-max, an
# optimiser step); CI's second stage checks them all
QUICK = {"bias_leaky_relu", "softmax_ternary", "layernorm_fused", "gelu_erf", "cross_entropy",
         "embedding_backward", "maxpool_argmax", "adam"}
# isl needs minutes for these even at test sizes (the time limit then keeps the written order)
SLOW_TO_SCHEDULE = {"heat_3d", "adi"}
_TRANSCENDENTAL = re.compile(r"\b(exp|log|tanh|erf|sin|cos|pow)f?\s*\(")


def bound(name: str, dtype: np.dtype) -> float:
    """The relative error accepted against a float64 reference (module docstring)."""
    if dtype == np.float64:
        return 1e-9
    return 2e-5 if _TRANSCENDENTAL.search(CORPUS[name].path.read_text()) else 1e-5


def _params(names: list[str]) -> list[object]:
    out: list[object] = []
    for name in names:
        marks: list[pytest.MarkDecorator] = []
        if name in REFUSED:
            marks.append(pytest.mark.xfail(raises=PolyDLError, strict=True,
                                           reason=f"polydl refuses: {REFUSED[name]}"))
        if name in WRONG:
            marks.append(pytest.mark.xfail(raises=AssertionError, strict=True,
                                           reason=f"polydl computes: {WRONG[name]}"))
        if name not in QUICK:
            marks.append(pytest.mark.slow)
        out.append(pytest.param(name, marks=marks))
    return out


def _gcc_O0(name: str, workdir: Path) -> dict[str, np.ndarray]:
    """The kernel's test inputs and gcc -O0's outputs on them, by argument name."""
    kernel = CORPUS[name]
    signature = read_signature(kernel.path)
    sizes = kernel.sizes("test")
    args = signature.arguments(sizes)
    values = make_inputs(name, args, sizes)
    lib = general.build_reference("gcc_O0", kernel.path, signature.function, sizes, workdir)
    general.reference_caller(lib, signature.function, args)(values)
    return values


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    return tmp_path_factory.mktemp("general-corpus")


@pytest.mark.parametrize("name", _params([n for n in CORPUS if n not in SLOW_TO_SCHEDULE]))
def test_polydl_equals_its_reference_and_gcc_O0(name: str, workdir: Path) -> None:
    kernel = CORPUS[name]
    sizes = kernel.sizes("test")
    args = read_signature(kernel.path).arguments(sizes)
    try:
        built = polydl.compile(kernel.path, sizes)
    except PolyDLError as exc:
        assert REFUSED.get(name, "\0") in str(exc), str(exc)
        raise
    pristine = make_inputs(name, args, sizes)
    inputs = [pristine[a.name] if a.shape else float(pristine[a.name]) for a in args if a.is_input]
    outputs = [a for a in args if not a.is_input]
    got = {a.name: pristine[a.name].copy() for a in outputs}
    built(*inputs, **got)
    reference = built.reference(*inputs, **{a.name: pristine[a.name] for a in outputs})
    reference = reference if isinstance(reference, tuple) else (reference,)
    want = dict(zip([a.name for a in outputs], reference, strict=True))
    c_semantics = _gcc_O0(name, workdir)
    for a in outputs:
        limit = bound(name, a.dtype)
        assert general.relative_error(got[a.name], want[a.name]) <= limit, f"{a.name} vs reference"
        assert general.relative_error(c_semantics[a.name], want[a.name]) <= limit, \
            f"{a.name}: gcc -O0 vs reference"
        assert general.relative_error(got[a.name], c_semantics[a.name]) <= limit, \
            f"{a.name} vs gcc -O0"


@pytest.mark.parametrize("name", kernels_of("dl"))
def test_torch_operator_computes_what_the_c_computes(name: str, workdir: Path) -> None:
    pytest.importorskip("torch")
    kernel = CORPUS[name]
    sizes = kernel.sizes("test")
    args = read_signature(kernel.path).arguments(sizes)
    c_semantics = _gcc_O0(name, workdir)
    values = {n: (v.astype(np.float64) if v.dtype.kind == "f" else v.copy())
              for n, v in make_inputs(name, args, sizes).items()}
    defined = torch_ops.call(name, values, sizes, values)
    outputs = [a for a in args if not a.is_input]
    assert set(defined) == {a.name for a in outputs}  # PyTorch defines every output
    for a in outputs:
        error = general.relative_error(c_semantics[a.name], values[a.name])
        assert error <= bound(name, a.dtype), f"{a.name}: relative error {error:.2e}"


def test_every_kernel_has_a_file_and_every_file_a_kernel() -> None:
    files = {p.stem for p in KERNEL_DIR.glob("*.c")}
    here = {name for name, k in CORPUS.items() if k.example is None}
    assert files == here
    assert all(k.path.is_file() for k in CORPUS.values())
    assert len(kernels_of("polybench")) == 30 and len(kernels_of("dl")) >= 40
    if _has_torch():
        assert torch_ops.operator_names() == set(kernels_of("dl"))


def test_every_dataset_gives_every_size_parameter() -> None:
    for name, kernel in CORPUS.items():
        wanted = set(read_signature(kernel.path).size_names)
        for dataset in DATASETS:
            assert set(kernel.sizes(dataset)) == wanted, (name, dataset)
    assert CORPUS["gemm"].sizes("small") == {"NI": 60, "NJ": 70, "NK": 80}  # PolyBench's SMALL
    assert CORPUS["softmax"].sizes("small") == CORPUS["softmax"].sizes("test")
    assert CORPUS["softmax"].sizes("large") == CORPUS["softmax"].sizes("bench")
    with pytest.raises(PolyDLError, match="unknown dataset 'huge'"):
        CORPUS["gemm"].sizes("huge")


def test_inputs_are_conditioned() -> None:
    def inputs(name: str) -> dict[str, np.ndarray]:
        sizes = CORPUS[name].sizes("test")
        return make_inputs(name, read_signature(CORPUS[name].path).arguments(sizes), sizes)

    a = inputs("cholesky")["A"]
    np.testing.assert_allclose(a, a.T)
    assert np.linalg.eigvalsh(a).min() > 0.5
    assert inputs("cross_entropy")["label"].max() < CORPUS["cross_entropy"].test["V"]
    tok = inputs("embedding")["tok"]
    assert tok.dtype == np.int32 and 0 <= tok.min() and tok.max() < CORPUS["embedding"].test["V"]
    assert inputs("adam")["v"].min() >= 0
    saved = inputs("layernorm_backward")
    np.testing.assert_allclose(saved["mean"], saved["x"].mean(axis=1), rtol=1e-5, atol=1e-6)


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
