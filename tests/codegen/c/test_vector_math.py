"""Math functions in vector form (`codegen/c/vector_math.py`): what the generated C declares
for each target, what gcc makes of it (the inner loop's instructions), and each form's error
in ulp over the whole input range against float64, within docs/contract.md's bounds."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

import polydl
from polydl.api import lower
from polydl.frontends import load_spec
from polydl.target.cpu import CpuTarget
from tests.codegen.c.math_accuracy import erf64, inputs, ulp_errors

AVX2, AVX512 = "x86-64-v3", "x86-64-v4"
ONE = "void k(int N, {t} y[N], const {t} x[N]) {{ for (int i = 0; i < N; i++) y[i] = {e}; }}"


def _c_pow(power: float) -> Callable[[np.ndarray], np.ndarray]:
    """C's pow in float64 (numpy's power gives NaN at -inf for a power that is no integer)."""
    def pow_(x: np.ndarray) -> np.ndarray:
        out = np.power(x, power)
        if not float(power).is_integer():
            out = np.where(x == -np.inf, np.inf if power > 0 else 0.0, out)
        return out
    return pow_


# expression -> (float64 reference, error bound in ulp: docs/contract.md's table)
FORMS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float]] = {
    "expf(x[i])": (np.exp, 3.0),
    "logf(x[i])": (np.log, 4.0),
    "tanhf(x[i])": (np.tanh, 2.0),
    "erff(x[i])": (erf64, 4.0),
    "sinf(x[i])": (np.sin, 3.0),
    "cosf(x[i])": (np.cos, 3.0),
    "sqrtf(x[i])": (np.sqrt, 0.5),
    "1.0f / sqrtf(x[i])": (lambda x: 1.0 / np.sqrt(x), 2.0),
    "powf(x[i], 1.7f)": (_c_pow(float(np.float32(1.7))), 1.0),
    "powf(x[i], 2.0f)": (_c_pow(2.0), 0.5),
    "powf(x[i], 3.0f)": (_c_pow(3.0), 2.0),
    "powf(x[i], 4.0f)": (_c_pow(4.0), 3.0),
    "powf(x[i], -1.0f)": (_c_pow(-1.0), 0.5),
    "powf(x[i], -2.0f)": (_c_pow(-2.0), 3.0),
    "powf(x[i], 0.5f)": (_c_pow(0.5), 0.5),
    "powf(x[i], -0.5f)": (_c_pow(-0.5), 2.0),
    "fmaxf(x[i], 0.25f)": (lambda x: np.fmax(x, 0.25), 0.0),
    "fminf(x[i], 0.25f)": (lambda x: np.fmin(x, 0.25), 0.0),
    "fabsf(x[i])": (np.abs, 0.0),
}

# What the vectorised inner loop must contain, by expression: a vector variant's name
# ("{isa}" is d for AVX2, e for AVX-512; "{n}" the float lanes) or packed instructions.
_VECTOR = {
    "expf(x[i])": r"_ZGV{isa}N{n}v_expf", "logf(x[i])": r"_ZGV{isa}N{n}v_logf",
    "tanhf(x[i])": r"_ZGV{isa}N{n}v_tanhf", "erff(x[i])": r"_ZGV{isa}N{n}v_erff",
    "sinf(x[i])": r"_ZGV{isa}N{n}v_sinf", "cosf(x[i])": r"_ZGV{isa}N{n}v_cosf",
    "powf(x[i], 1.7f)": r"_ZGV{isa}N{n}vv_powf",
    "sqrtf(x[i])": r"vsqrtps .*%{reg}", "1.0f / sqrtf(x[i])": r"vdivps .*%{reg}",
    "powf(x[i], 2.0f)": r"vmulps .*%{reg}", "powf(x[i], 3.0f)": r"vmulps .*%{reg}",
    "powf(x[i], -1.0f)": r"vdivps .*%{reg}", "powf(x[i], -2.0f)": r"vdivps .*%{reg}",
    "powf(x[i], 0.5f)": r"vsqrtps .*%{reg}", "powf(x[i], -0.5f)": r"vsqrtps .*%{reg}",
    "fmaxf(x[i], 0.25f)": r"(vblendv|vblendm|vmax)ps .*%{reg}",
    "fminf(x[i], 0.25f)": r"(vblendv|vblendm|vmin)ps .*%{reg}",
    "fabsf(x[i])": r"vandps .*%{reg}",
}
_ISA = {AVX2: {"isa": "d", "n": "8", "reg": "ymm"}, AVX512: {"isa": "e", "n": "16", "reg": "zmm"}}

needs_objdump = pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump")


def _disassembly(kernel: polydl.runtime.c.kernel.Kernel) -> str:  # type: ignore[name-defined]
    return subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(kernel.library_path)],
                          capture_output=True, text=True, check=True).stdout


def _source(expression: str, target: CpuTarget, exact: bool = False, dtype: str = "float") -> str:
    nest, params = load_spec(ONE.format(t=dtype, e=expression), {"N": 64})
    return lower(nest, params, target, exact_math=exact).code.source


# ------------------------------------------------------------------ the generated C


def test_a_vector_target_declares_the_libmvec_variants_it_calls() -> None:
    source = _source("expf(x[i]) + tanhf(x[i])", CpuTarget(isa="avx512"))
    assert "#pragma omp declare simd notinbranch\nfloat expf(float);" in source
    assert "#pragma omp declare simd notinbranch\nfloat tanhf(float);" in source
    assert "#if defined(__x86_64__) && defined(__GLIBC__)" in source
    assert "logf(float)" not in source  # only what the nest calls


def test_double_kernels_declare_the_double_forms() -> None:
    source = _source("exp(x[i]) + pow(x[i], 0.5)", CpuTarget(isa="avx2"), dtype="double")
    assert "#pragma omp declare simd notinbranch\ndouble exp(double);" in source
    assert "_pd_sqrt_pow(x[i])" in source and "static inline double _pd_sqrt_pow(double x)" in source


@pytest.mark.parametrize("target", [CpuTarget(isa="scalar"), CpuTarget(isa="avx512", libmvec="")])
def test_no_declarations_without_a_vector_isa_or_libmvec(target: CpuTarget) -> None:
    source = _source("expf(x[i])", target)
    assert "declare simd" not in source and "expf(x[i])" in source


def test_an_older_libmvec_declares_only_what_it_has() -> None:
    source = _source("expf(x[i]) + tanhf(x[i])", CpuTarget(isa="avx2", libmvec="2.22"))
    assert "float expf(float);" in source and "float tanhf(float);" not in source


def test_exact_math_is_the_c_librarys_calls_and_another_key() -> None:
    target = CpuTarget(isa="avx512")
    nest, params = load_spec(ONE.format(t="float", e="powf(fmaxf(x[i], 0.0f), 3.0f)"), {"N": 64})
    vector, exact = lower(nest, params, target).code, lower(nest, params, target, exact_math=True).code
    assert "y[i] = powf(fmaxf(x[i], 0.0f), 3.0f);" in exact.source
    # errno stays on: gcc's vectoriser would otherwise rewrite pow(x, 0.5) with other results
    assert "declare simd" not in exact.source and "-fno-math-errno" not in exact.compile_flags
    assert "_pd_pow_3f(_pd_fmaxf(x[i], 0.0f))" in vector.source
    assert vector.compile_flags == ("-fno-math-errno", "-fno-trapping-math")


def test_code_without_math_calls_keeps_errno() -> None:
    nest, params = load_spec(ONE.format(t="float", e="x[i] * 2.0f"), {"N": 64})
    assert lower(nest, params, CpuTarget(isa="avx512")).code.compile_flags == ("-fno-trapping-math",)


def test_the_target_records_its_libmvec_and_refuses_unknown_releases() -> None:
    assert CpuTarget.from_dict({"isa": "avx2", "libmvec": "2.22"}).libmvec == "2.22"
    assert CpuTarget(isa="avx2").key() == CpuTarget(isa="avx2", libmvec="2.35").key()
    assert CpuTarget(isa="avx2").key() != CpuTarget(isa="avx2", libmvec="").key()
    with pytest.raises(polydl.errors.TargetError, match="libmvec"):
        CpuTarget(libmvec="2.30")


# ------------------------------------------------------------------ the built code


@needs_objdump
@pytest.mark.parametrize("machine", [AVX2, AVX512])
@pytest.mark.parametrize("expression", list(_VECTOR))
def test_the_inner_loop_runs_each_function_in_vector_form(expression: str, machine: str) -> None:
    kernel = polydl.compile(ONE.format(t="float", e=expression), {"N": 4096}, machine=machine)
    text = _disassembly(kernel)
    assert re.search(_VECTOR[expression].format(**_ISA[machine]), text), (
        f"{expression} on {machine}: no vector form in\n{kernel.source}")
    function = expression.split("(")[0]
    if function in ("fmaxf", "fminf", "fabsf"):
        assert f"<{function}@plt>" not in text  # no scalar call left, even in the remainder


@needs_objdump
@pytest.mark.parametrize("machine, variant", [(AVX2, "_ZGVdN4v_exp"), (AVX512, "_ZGVeN8v_exp")])
def test_double_forms_call_the_double_variants(machine: str, variant: str) -> None:
    kernel = polydl.compile(ONE.format(t="double", e="exp(x[i])"), {"N": 4096}, machine=machine)
    assert variant in _disassembly(kernel)


@needs_objdump
def test_exact_math_calls_libm_one_element_at_a_time() -> None:
    kernel = polydl.compile(ONE.format(t="float", e="expf(x[i])"), {"N": 4096}, machine=AVX512,
                            exact_math=True)
    text = _disassembly(kernel)
    assert "<expf@plt>" in text and "_ZGV" not in text


# ------------------------------------------------------------------ accuracy

_POINTS = inputs()


@pytest.mark.parametrize("machine", [AVX2, AVX512])
@pytest.mark.parametrize("expression", list(FORMS))
def test_error_in_ulp_over_the_whole_range(expression: str, machine: str) -> None:
    """~180,000 float32 inputs (every exponent and sign, dense [-110, 110], sweeps of 600
    neighbours at each regime's edge, +-0, +-inf, NaN, subnormals) against float64."""
    reference, bound = FORMS[expression]
    kernel = polydl.compile(ONE.format(t="float", e=expression), {"N": _POINTS.size},
                            machine=machine)
    got = kernel(_POINTS)
    with np.errstate(all="ignore"):
        errors = ulp_errors(got, reference(_POINTS.astype(np.float64)))
    worst = int(np.argmax(errors))
    assert errors[worst] <= bound + 1e-9, (
        f"{expression} on {machine}: {errors[worst]:.3f} ulp at x={_POINTS[worst]!r} "
        f"(got {got[worst]!r}), bound {bound}")


@pytest.mark.parametrize("expression, reference", [
    ("exp(x[i])", np.exp), ("log(x[i])", np.log), ("tanh(x[i])", np.tanh), ("erf(x[i])", erf64),
    ("sin(x[i])", np.sin), ("cos(x[i])", np.cos), ("pow(x[i], 1.7)", _c_pow(1.7)),
])
def test_double_forms_agree_with_libms_doubles(expression: str, reference: Callable) -> None:
    """The double forms against numpy's float64 functions (libm's, within 1 ulp themselves):
    within 4 ulp of a double on the target of this machine."""
    x = np.concatenate([_POINTS[np.isfinite(_POINTS)].astype(np.float64) * (1 + 2.0**-30),
                        _POINTS[~np.isfinite(_POINTS)].astype(np.float64)])
    kernel = polydl.compile(ONE.format(t="double", e=expression), {"N": x.size},
                            machine=AVX512)
    got = kernel(x)
    with np.errstate(all="ignore"):
        want = reference(x)
        spacing = np.spacing(np.maximum(np.abs(want), np.finfo(np.float64).tiny))
        same = (np.isnan(got) & np.isnan(want)) | (got == want)
        errors = np.where(same, 0.0, np.abs(got - want) / spacing)
    worst = int(np.argmax(errors))
    assert errors[worst] <= 4.0, f"{expression}: {errors[worst]:.3f} ulp at x={x[worst]!r}"


def test_a_target_without_libmvec_calls_libm() -> None:
    target = replace(polydl.target.host.host_target(), libmvec="")
    kernel = polydl.compile(ONE.format(t="float", e="expf(x[i])"), {"N": _POINTS.size},
                            target=target)
    with np.errstate(all="ignore"):
        errors = ulp_errors(kernel(_POINTS), np.exp(_POINTS.astype(np.float64)))
    assert errors.max() <= 0.51  # libm's expf: correctly rounded but in rare cases
    assert "_ZGV" not in _disassembly(kernel)
