"""The oracle: a program's C built by `gcc -O0` (sizes passed as its int parameters), called
through ctypes, and the comparison of polydl's outputs with it.

Tolerance, element by element (`compare`): integers exactly; floating-point values within
    4 * s_i + eps * (16 + 4 * R) * (|g_i| + floor)
of gcc's value g_i, where eps is the element type's machine epsilon, R the reduction length (the
most instances any accumulating statement runs into one cell, summed over such statements:
polydl may reassociate sums, and each reassociated add may round differently; plus 2 sqrt(n)
for each recurrence of n instances, whose roundings, contracted into FMAs by -O3 and not by
-O0, are carried from value to value), and s_i the
element's measured sensitivity to rounding: the difference between gcc's result and that of
the same C built at the other precision (float programs: double, s_i as measured; double
programs: float, s_i scaled down by the precisions' ratio). `floor` is max(|g|, 1) of the array
over 64 for float, over 1 for double (cancellation against values of the array's magnitude).
Where that finds a difference, the program is built once more with FMA contraction (`gcc -O2
-march=native`, as -O3 builds contract, -O0 ones do not) and the difference between gcc's two
builds is added to s_i: a recurrence can carry one contracted rounding into a large relative
difference (seed 303014: 5e-6 of a double, bit-exact with -ffp-contract=off).
A NaN must be a NaN in both, an infinity the same infinity. An int element whose value differs
between gcc's two builds depends on rounding (a float truncated to int) and is not compared,
nor the doubles of an array whose float build differs from it somewhere by a tenth of the
array's magnitude or more: a chaotic recurrence has made their digits the product of roundings
(seed 810842); NaNs and infinities are still checked.
A skipped iteration or a wrong element moves a value by about one term of its sum, far more
than eps * R for the sizes generated (R below a few thousand).
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.differential.program import NUMPY_TYPES, Program

GCC = ("gcc", "-O0", "-std=gnu11", "-shared", "-fPIC", "-include", "math.h", "-w")
CONTRACTED = ("-O2", "-march=native", "-ffp-contract=fast")
_F_FUNCTIONS = ("tanhf", "sinf", "cosf", "erff", "fabsf", "expf", "logf", "sqrtf", "powf", "fmaxf", "fminf")


class ReferenceError(Exception):
    """gcc refused the program: the generator wrote C it should not have."""


def other_precision(source: str, float_type: str) -> str:
    """The same C with every float made double (or every double float)."""
    if float_type == "float":
        source = re.sub(r"\bfloat\b", "double", source)
        source = re.sub(r"(\d)f\b", r"\1", source)
        return re.sub(r"\b(" + "|".join(_F_FUNCTIONS) + r")\(", lambda m: m.group(1)[:-1] + "(", source)
    source = re.sub(r"\bdouble\b", "float", source)
    source = re.sub(r"(\d+\.\d+(?:e-?\d+)?)(?![\w.])", r"\1f", source)
    names = "|".join(f[:-1] for f in _F_FUNCTIONS)
    return re.sub(r"\b(" + names + r")\(", lambda m: m.group(1) + "f(", source)


def build(source: str, workdir: Path, stem: str, flags: tuple[str, ...] = ()) -> Path:
    src, lib = workdir / f"{stem}.c", workdir / f"lib{stem}.so"
    src.write_text(source)
    proc = subprocess.run([*GCC, *flags, "-o", str(lib), str(src), "-lm"], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise ReferenceError(proc.stderr[-2000:])
    return lib


@dataclass
class Reference:
    """gcc -O0 builds of a program at its own precision and at the other, in one library (one
    compiler run: it is most of the oracle's time)."""

    program: Program
    library: ctypes.CDLL
    workdir: Path
    contracted_library: ctypes.CDLL | None = None

    @classmethod
    def built(cls, program: Program, workdir: Path) -> Reference:
        source = program.c()
        other = other_precision(source, program.float_type).replace(
            f"void {program.name}(", f"void {program.name}_other(", 1)
        return cls(program, ctypes.CDLL(str(build(source + "\n" + other, workdir, "reference"))),
                   workdir)

    def run(self, sizes: Mapping[str, int], values: Mapping[str, np.ndarray], *,
            other: bool = False, contracted: bool = False) -> dict[str, np.ndarray]:
        """The arrays after one call (copies of `values`, converted for the other build), of
        the -O0 build or (`contracted`) of the one with FMA contraction, built on first use."""
        p = self.program
        swap = {"float": "double", "double": "float"}
        if contracted and self.contracted_library is None:
            self.contracted_library = ctypes.CDLL(str(build(p.c(), self.workdir, "contracted", CONTRACTED)))
        library = self.contracted_library if contracted else self.library
        function = getattr(library, p.name + ("_other" if other else ""))
        args: list[object] = [ctypes.c_int(sizes[name]) for name in p.params]
        out: dict[str, np.ndarray] = {}
        for name, ctype in p.scalars:
            t = swap.get(ctype, ctype) if other else ctype
            args.append((ctypes.c_float if t == "float" else ctypes.c_double)(float(values[name])))
        for a in p.arrays:
            t = swap.get(a.ctype, a.ctype) if other else a.ctype
            arr = np.ascontiguousarray(values[a.name], dtype=NUMPY_TYPES[t]).copy()
            out[a.name] = arr
            args.append(ctypes.c_void_p(arr.ctypes.data))
        function(*args)
        return out


def make_inputs(program: Program, sizes: Mapping[str, int], seed: int,
                special: bool = False) -> dict[str, np.ndarray]:
    """Every argument's value (outputs' too: they are read before written): floats in [-1, 1],
    ints in [-100, 100], index arrays within the dimension they subscript. `special` puts a NaN
    or an infinity into one input."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, ctype in program.scalars:
        out[name] = np.asarray(rng.uniform(-1, 1), NUMPY_TYPES[ctype])
    for a in program.arrays:
        shape = a.shape(sizes)
        if a.gathers is not None:
            target, dim = a.gathers
            extent = program.array(target).shape(sizes)[dim]
            out[a.name] = rng.integers(0, max(extent, 1), shape).astype(np.int32)
        elif a.ctype == "int":
            out[a.name] = rng.integers(-100, 101, shape).astype(np.int32)
        else:
            out[a.name] = rng.uniform(-1, 1, shape).astype(NUMPY_TYPES[a.ctype])
    floats = [a for a in program.arrays if a.ctype != "int" and a.is_input and out[a.name].size]
    if special and floats:
        a = floats[int(rng.integers(len(floats)))]
        flat = out[a.name].reshape(-1)
        flat[int(rng.integers(flat.size))] = [np.nan, np.inf, -np.inf][int(rng.integers(3))]
    return out


@dataclass(frozen=True)
class Difference:
    """The first elements of an array where polydl and gcc disagree."""

    array: str
    count: int
    first: list[tuple[tuple[int, ...], float, float]]  # (index, polydl, gcc)

    def describe(self) -> str:
        shown = ", ".join(f"{self.array}{list(i)}: polydl {p!r} gcc {g!r}" for i, p, g in self.first)
        return f"{self.array}: {self.count} elements differ ({shown})"


EPS = {"float": float(np.finfo(np.float32).eps), "double": float(np.finfo(np.float64).eps)}


def compare(program: Program, got: Mapping[str, np.ndarray], own: Mapping[str, np.ndarray],
            other: Mapping[str, np.ndarray], reduction: int,
            contracted: Mapping[str, np.ndarray] | None = None) -> list[Difference]:
    """The arrays of `got` (polydl) that differ from `own` (gcc) beyond the tolerance
    (`contracted`: gcc's build with FMA contraction, whose difference counts as rounding)."""
    out: list[Difference] = []
    for a in program.arrays:
        if a.is_input and a.name not in got:
            continue
        p, g, w = got[a.name], own[a.name], other[a.name]
        if a.ctype == "int":
            bad = (p != g) & (w == g)
        else:
            pf, gf, wf = (np.asarray(x, np.float64) for x in (p, g, w))
            eps = EPS[a.ctype]
            finite = np.isfinite(gf)
            scale = max(float(np.max(np.abs(gf[finite]), initial=0.0)), 1.0)
            floor = scale / 64 if a.ctype == "float" else scale
            with np.errstate(invalid="ignore"):
                diff = np.abs(gf - wf)
            sensitivity = np.where(np.isfinite(diff), diff, 0.0)
            # where the float build's difference has grown anywhere to a tenth of the array's
            # magnitude, a recurrence amplifies roundings past any bound (a chaotic one: seed
            # 810842, where gcc's builds with and without FMA contraction end at 34.2 and
            # 440.1): scaled down it bounds nothing, and the array's doubles are not compared
            chaotic = a.ctype == "double" and bool(np.any(sensitivity > 0.1 * scale))
            if a.ctype == "double":
                sensitivity = sensitivity * (EPS["double"] / EPS["float"])
            if contracted is not None:
                with np.errstate(invalid="ignore"):
                    fused = np.abs(gf - np.asarray(contracted[a.name], np.float64))
                sensitivity = sensitivity + np.where(np.isfinite(fused), fused, 0.0)
            allowed = 4 * sensitivity + eps * (16 + 4 * reduction) * (np.abs(gf) + floor)
            with np.errstate(invalid="ignore"):
                wrong_finite = finite & ~(np.abs(pf - gf) <= allowed) & (not chaotic)
            nan_wrong = np.isnan(pf) != np.isnan(gf)
            inf_wrong = np.isinf(gf) & (pf != gf)
            bad = wrong_finite | nan_wrong | inf_wrong
        if bad.any():
            idx = np.argwhere(bad)[:4]
            first = [(tuple(int(v) for v in i), p[tuple(i)].item(), g[tuple(i)].item()) for i in idx]
            out.append(Difference(a.name, int(bad.sum()), first))
    return out


def differences_from_gcc(text: str, sizes: Mapping[str, int], kernel: object, workdir: Path,
                         calls: int = 1, seed: int = 0) -> list[str]:
    """A reproducer's check: `kernel` (polydl's build of the C `text`) against gcc -O0 of the
    same text, `calls` times on the same random inputs; ints exactly, floats within 1e-5 of
    the array's magnitude (reproducers are small), NaNs in the same places."""
    from polydl.frontends import load_spec

    nest, bound = load_spec(text, dict(sizes))
    lib = ctypes.CDLL(str(build(text, workdir, "reproducer")))
    rng = np.random.default_rng(seed)
    values = {}
    for a in nest.parameters:
        shape = a.concrete_shape(dict(bound))
        if np.dtype(a.dtype).kind == "i":
            values[a.name] = rng.integers(-100, 101, shape).astype(a.dtype)
        else:
            values[a.name] = np.asarray(rng.uniform(-1, 1, shape)).astype(a.dtype)
    want = {k: v.copy() for k, v in values.items()}
    args: list[object] = [ctypes.c_int(bound[p]) for p in nest.params]
    for a in nest.parameters:
        if want[a.name].ndim:
            args.append(ctypes.c_void_p(want[a.name].ctypes.data))
        else:
            args.append((ctypes.c_float if a.dtype == "float32" else ctypes.c_double)(float(want[a.name])))
    getattr(lib, nest.name)(*args)
    problems = []
    for call in range(calls):
        got = {k: v.copy() for k, v in values.items()}
        kernel(**got)  # type: ignore[operator]
        for name, g in got.items():
            w = want[name]
            if g.dtype.kind == "i":
                bad = g != w
            else:
                scale = max(float(np.nanmax(np.abs(w), initial=0.0)), 1.0)
                bad = (np.abs(g.astype(np.float64) - w) > 1e-5 * scale) | (np.isnan(g) != np.isnan(w))
            if np.any(bad):
                i = tuple(int(v) for v in np.argwhere(bad)[0])
                problems.append(f"call {call + 1}: {name}{list(i)}: polydl {g[i]!r}, gcc {w[i]!r} "
                                f"({int(np.sum(bad))} elements differ)")
    return problems
