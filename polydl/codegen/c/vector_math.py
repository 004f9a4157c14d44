"""Math functions in generated C as the vectoriser can run them.

Takes the `CpuTarget` and whether the nest asks for exact libm results (`LoopNest.exact_math`);
gives a `MathForm`: the text of each call, the declarations and helpers the translation unit
needs, and the compile flags that let the compiler vectorise them.

- `expf`, `logf`, `sinf`, `cosf`, `powf`, `tanhf`, `erff` (and the double forms): declared
  `#pragma omp declare simd notinbranch`, so gcc calls their vector variants of the x86-64
  vector function ABI (`_ZGVdN8v_expf` for AVX2, `_ZGVeN16v_expf` for AVX-512) in vectorised
  loops; glibc's libmvec defines them (libm's linker script links it as needed). Declared only
  on targets with a vector ISA, for the functions the target's `libmvec` release has, and only
  where the compiler builds for x86-64 against glibc (the declarations are under `#if`), so
  another C library or architecture gets the scalar calls. clang reads the declarations
  without using them: its calls stay scalar.
- `sqrtf` is an instruction (`vsqrtps`) once errno need not be set (`-fno-math-errno`); `fabsf`
  always is.
- `fmaxf`, `fminf`: libmvec has none, and gcc keeps the calls (their NaN rules are not those
  of `maxps`): a select that returns what glibc's x86-64 `fmaxf` returns (`maxss` and the
  non-NaN operand), which gcc vectorises as a compare and a blend.
- `powf(x, c)` with a constant `c`: a small integer (-2 to 4) is products (and a quotient),
  0.5 a square root and -0.5 one over it, each with powf's results at -0 and -inf; other
  constants stay `powf` (libmvec's).
- `-fno-trapping-math` lets gcc evaluate both sides of a select in a vector loop (the square
  root of 0.5's -inf case on AVX2, which has no masked square root).

Neither flag changes a value of these forms: errno and floating-point exception flags are not
observable to a kernel's caller (gcc's one rewrite that `-fno-math-errno` allows and that would,
pow(x, 0.5) as a square root, never sees a constant 0.5: `_pd_sqrt_powf` comes first). The
error bounds of each form are in docs/contract.md (Math functions). An exact nest gets the
scalar libm calls of every function, each result libm's, and neither flag.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from string import Template

from polydl.ir import Binary, Call, Const, Expr, IntOp, LoopNest, Select, ToFloat, ToInt, Unary
from polydl.target.cpu import LIBMVEC_RELEASES, CpuTarget

# The float functions generated code calls whose vector variants x86-64 libmvec has, by the
# glibc release that added them (both the float and the double forms).
LIBMVEC_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "2.22": ("expf", "logf", "sinf", "cosf", "powf"),
    "2.35": ("tanhf", "erff"),
}
# Compile flags of code whose math runs in vector form. Code that asks for libm's results gets
# neither: without errno, gcc's vectoriser turns pow(x, 0.5) into a square root, which differs
# from pow at -0 and -inf.
VECTOR_FLAGS = ("-fno-math-errno", "-fno-trapping-math")
# Integer exponents of `powf` written as products: at most three roundings.
PRODUCT_POWERS = range(-2, 5)

_SELECTS = {"fmaxf": ">", "fminf": "<"}


@dataclass(frozen=True)
class MathForm:
    """How one translation unit's math calls are written.

    `vector`: the float functions declared with vector variants; `rewrites`: whether `fmaxf`,
    `fminf` and `powf` by a constant are written as vectorisable C (False: every call is the
    C library's)."""

    vector: frozenset[str] = frozenset()
    rewrites: bool = False

    def call(self, function: str, args: Sequence[Expr], texts: Sequence[str], ctype: str) -> str:
        """The C text of `function(args)` (`texts`: the arguments as C) in `ctype`."""
        name = c_name(function, ctype)
        if self.rewrites:
            helper = _helper(function, args)
            if helper is not None:
                operands = texts[:1] if function == "powf" else texts
                return f"{c_name(helper, ctype)}({', '.join(operands)})"
        return f"{name}({', '.join(texts)})"

    def preamble(self, nest: LoopNest, ctype: str) -> str:
        """The declarations and helpers the calls of `nest` need, as C after <math.h>."""
        calls = [c for s in nest.statements() for c in _calls(s.value)]
        lines: list[str] = []
        declared = sorted({c.function for c in calls
                           if not (self.rewrites and _helper(c.function, c.args))} & self.vector)
        suffix = "f" if ctype == "float" else ""
        if declared:
            lines += ["/* vector variants of these (x86-64 vector function ABI): glibc's libmvec */",
                      "#if defined(__x86_64__) && defined(__GLIBC__)"]
            for function in declared:
                params = ", ".join([ctype] * len(_arity(calls, function)))
                lines += ["#pragma omp declare simd notinbranch",
                          f"{ctype} {function[:-1]}{suffix}({params});"]
            lines.append("#endif")
        if self.rewrites:
            helpers = dict.fromkeys(h for c in calls if (h := _helper(c.function, c.args)))
            lines += [Template(_HELPERS[h]).substitute(real=ctype, name=c_name(h, ctype), f=suffix)
                      for h in helpers]
        return "\n".join(lines) + ("\n" if lines else "")

    def compile_flags(self, nest: LoopNest) -> tuple[str, ...]:
        """The flags the calls of `nest` need (none where it calls no math function)."""
        if not self.rewrites or not any(_calls(s.value) for s in nest.statements()):
            return ()
        return VECTOR_FLAGS


def math_form(target: CpuTarget, exact: bool) -> MathForm:
    """The form of the math calls of a nest built for `target`; libm's scalar calls where
    `exact`."""
    if exact:
        return MathForm()
    if target.isa == "scalar" or not target.libmvec:
        return MathForm(rewrites=True)
    releases = LIBMVEC_RELEASES[:LIBMVEC_RELEASES.index(target.libmvec) + 1]
    return MathForm(frozenset(f for r in releases for f in LIBMVEC_FUNCTIONS[r]), True)


def c_name(function: str, ctype: str) -> str:
    """A float function's name (`expf`, `_pd_fmaxf`) in `ctype`: the double form drops the f."""
    return function if ctype == "float" else function[:-1]


# Helpers by float name, written once for both types ($real; $f: the float suffix of a math
# function or a literal).
_HELPERS = {
    # glibc's x86-64 fmaxf is maxss (the second operand unless the first is greater) and the
    # operand that is not NaN
    "_pd_fmaxf": "static inline $real $name($real a, $real b) { return (a > b || b != b) ? a : b; }",
    "_pd_fminf": "static inline $real $name($real a, $real b) { return (a < b || b != b) ? a : b; }",
    # pow(x, 0.5) and pow(x, -0.5) as square roots: pow gives +0 at -0 (x + 0 is +0) and +inf,
    # +0 at -inf (sqrt gives NaN)
    "_pd_sqrt_powf": ("static inline $real $name($real x) "
                      "{ return sqrt$f((x == -INFINITY ? INFINITY : x) + 0.0$f); }"),
    "_pd_rsqrt_powf": ("static inline $real $name($real x) "
                       "{ return 1.0$f / sqrt$f((x == -INFINITY ? INFINITY : x) + 0.0$f); }"),
    # products: pow(x, n) is x * ... * x at +-0, +-inf and NaN too (pow(NaN, 0) is 1)
    "_pd_pow_m2f": "static inline $real $name($real x) { $real r = 1.0$f / x; return r * r; }",
    "_pd_pow_m1f": "static inline $real $name($real x) { return 1.0$f / x; }",
    "_pd_pow_0f": "static inline $real $name($real x) { (void)x; return 1.0$f; }",
    "_pd_pow_1f": "static inline $real $name($real x) { return x; }",
    "_pd_pow_2f": "static inline $real $name($real x) { return x * x; }",
    "_pd_pow_3f": "static inline $real $name($real x) { return x * x * x; }",
    "_pd_pow_4f": "static inline $real $name($real x) { $real s = x * x; return s * s; }",
}


def _helper(function: str, args: Sequence[Expr]) -> str | None:
    """The helper a call is written as, None for the function itself."""
    if function in _SELECTS:
        return f"_pd_{function}"
    if function != "powf" or not isinstance(args[1], Const):
        return None
    power = args[1].value
    if power == 0.5:
        return "_pd_sqrt_powf"
    if power == -0.5:
        return "_pd_rsqrt_powf"
    if power.is_integer() and int(power) in PRODUCT_POWERS:
        n = int(power)
        return f"_pd_pow_{'m' if n < 0 else ''}{abs(n)}f"
    return None


def _arity(calls: Iterable[Call], function: str) -> tuple[Expr, ...]:
    return next(c.args for c in calls if c.function == function)


def _calls(e: Expr) -> list[Call]:
    """Every math call in `e`, outermost first."""
    if isinstance(e, Call):
        return [e, *(c for a in e.args for c in _calls(a))]
    if isinstance(e, Unary | ToFloat | ToInt):
        return _calls(e.operand)
    if isinstance(e, Binary | IntOp):
        return _calls(e.left) + _calls(e.right)
    if isinstance(e, Select):
        return [c for part in (e.left, e.right, e.if_true, e.if_false) for c in _calls(part)]
    return []
