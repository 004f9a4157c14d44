"""A CPU target: the instruction set, caches and cores that code is generated and ranked for.

A `CpuTarget` is a value: the ranking sizes tiles against its caches and cores, the microkernel
choice follows its ISA, and the C compiler gets its `-march` and ISA flags, whatever machine the
compiler runs on. It round-trips through JSON (`polydl machine --json` writes one) and is
checked there, since its flags reach the compiler's command line. Tests build one by hand to pin
a decision (`CpuTarget(isa="avx512", l1_bytes=32 * 1024)`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from polydl.dtypes import DTYPES
from polydl.errors import TargetError

KIND = "c"
# ISAs polydl generates microkernels for, best first. "avx512bf16" is AVX-512 plus the BF16 dot
# products; "avx512amx" adds the AMX tile unit (bf16 tile dot products, Sapphire Rapids on).
ISAS = ("avx512amx", "avx512bf16", "avx512", "avx2", "scalar")

_VECTOR_BYTES = {"avx512amx": 64, "avx512bf16": 64, "avx512": 64, "avx2": 32, "scalar": 4}

# The x86-64 micro-architecture level each ISA needs; the scalar ISA names no -march at all, so
# portable C builds with any compiler for any CPU.
ISA_MARCH: dict[str, str] = {
    "avx512amx": "x86-64-v4", "avx512bf16": "x86-64-v4", "avx512": "x86-64-v4",
    "avx2": "x86-64-v3", "scalar": "",
}
_AVX2_FLAGS = ("-mavx2", "-mfma")
_AVX512_FLAGS = (*_AVX2_FLAGS, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512cd")
# Compiler flags that enable each ISA whatever -march says (redundant where -march implies them).
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "scalar": (),
    "avx2": _AVX2_FLAGS,
    "avx512": _AVX512_FLAGS,
    "avx512bf16": (*_AVX512_FLAGS, "-mavx512bf16"),
    "avx512amx": (*_AVX512_FLAGS, "-mavx512bf16", "-mamx-tile", "-mamx-bf16"),
}

# CPU features (as /proc/cpuinfo names them) that code built for each -march may use.
_V3 = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "abm", "xsave"})
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_ICELAKE = _V4 | {"avx512_vnni", "avx512vbmi", "avx512_vbmi2", "avx512ifma", "avx512_bitalg",
                  "avx512_vpopcntdq", "gfni", "vaes", "vpclmulqdq"}
# CPUs whose own instruction-scheduling model makes gcc 13's second scheduling pass over the
# unrolled calls of a generated kernel many times slower are tuned for the core before them;
# the instructions are those of -march and the code runs as fast
# (see decisions: Sapphire Rapids and later tuned as Ice Lake servers).
MARCH_TUNE = {"sapphirerapids": "icelake-server", "emeraldrapids": "icelake-server",
              "graniterapids": "icelake-server", "graniterapids-d": "icelake-server"}
MARCH_FEATURES: dict[str, frozenset[str]] = {
    "": frozenset(),
    "x86-64": frozenset(),
    "x86-64-v2": frozenset({"sse4_2", "popcnt", "ssse3"}),
    "x86-64-v3": _V3,
    "x86-64-v4": _V4,
    "haswell": _V3, "broadwell": _V3, "skylake": _V3, "znver1": _V3, "znver2": _V3,
    "znver3": _V3 | {"vaes", "vpclmulqdq"},
    "skylake-avx512": _V4,
    "cascadelake": _V4 | {"avx512_vnni"},
    "icelake-server": _ICELAKE,
    "cooperlake": _V4 | {"avx512_vnni", "avx512_bf16"},
    "znver4": _ICELAKE | {"avx512_bf16"},
    "sapphirerapids": _ICELAKE | {"avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"},
}
ISA_FEATURES: dict[str, frozenset[str]] = {
    "scalar": frozenset(),
    "avx2": frozenset({"avx2", "fma"}),
    "avx512": frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    "avx512bf16": frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                             "avx512_bf16"}),
    "avx512amx": frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                            "avx512_bf16", "amx_tile", "amx_bf16"}),
}

# Releases of glibc whose x86-64 libmvec (the vector math library) a target may name: each
# added vector variants of functions generated code calls (`codegen/c/vector_math.py`).
LIBMVEC_RELEASES = ("2.22", "2.35")

# What may reach the compiler's command line from a description file: a -march name and
# machine options (-m...), nothing that names files, plugins or linker input.
MARCH_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,39}")
_MACHINE_FLAG = re.compile(r"-m[a-z0-9][a-z0-9._,=-]{0,63}")
# Fields the cost models read (bandwidths, fork and join); a description may override them.
COST_FIELDS = ("l1_bytes_per_cycle", "l2_bytes_per_cycle", "memory_bytes_per_cycle",
               "socket_copy_bytes_per_s", "fork_join_cycles", "barrier_cycles",
               "core_transfer_bytes_per_cycle")


@dataclass(frozen=True)
class CpuTarget:
    name: str = "custom"
    isa: str = "avx2"
    march: str = ""  # the -march value; "" means the ISA's x86-64 level (ISA_MARCH)
    # The -mtune value: the compiler's own name for the CPU where polydl cannot check that
    # name's features (so it is no -march); "" means the -march's own tuning. Tuning picks
    # instruction order, unrolling and vector width, never instructions (benchmarks/README.md:
    # Data that moves between cores; tuning and vector width).
    tune: str = ""
    cores: int = 1
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    l3_bytes: int = 16 * 1024 * 1024
    cache_line_bytes: int = 64
    model: str = "unknown"
    cflags: tuple[str, ...] = ()  # further machine options (-m...) for the C compiler
    # The glibc release whose libmvec the hosts that run the kernels have, the newest of
    # LIBMVEC_RELEASES not after theirs ("" for none: another C library, or glibc before 2.22):
    # generated code calls only the vector math functions it has. 2.35 (2022) is what current
    # Linux distributions ship; `polydl machine --json` records the host's.
    libmvec: str = "2.35"
    # Bytes per cycle one core moves into L1 from L2, into L2 from L3, and into its share of L3
    # from memory: the ranking's bandwidths (a typical x86 server core; not measured per host).
    l1_bytes_per_cycle: float = 64.0
    l2_bytes_per_cycle: float = 32.0
    memory_bytes_per_cycle: float = 8.0
    # Bytes per second the socket copies an input onto a cache line before a kernel, all threads
    # together, the kernel's threads then reading the copy from the cores that wrote it
    # (`codegen/c/line_copies.py`; see decisions: A socket's copy rate of 8 GB/s).
    socket_copy_bytes_per_s: float = 8e9
    # Cycles of one fork and join of a parallel region's OpenMP threads, barrier included (~5 us
    # at 2.6 GHz).
    fork_join_cycles: float = 13000.0
    # Cycles of one barrier of a parallel region's awake threads (the end of an `omp for`
    # inside a region that forked once): a fraction of a fork and join (see benchmarks/README.md:
    # Fork and barrier costs).
    barrier_cycles: float = 6500.0
    # Bytes per cycle that move between two cores' caches where one core reads or writes lines
    # another core's thread touched last (a parallel loop beside sequential code over the same
    # arrays; see benchmarks/README.md: Data that moves between cores; tuning and vector width).
    core_transfer_bytes_per_cycle: float = 4.0

    def __post_init__(self) -> None:
        if self.isa not in ISAS:
            raise TargetError(f"unknown ISA '{self.isa}'; known: {', '.join(ISAS)}", self.name)
        if self.march and not MARCH_NAME.fullmatch(self.march):
            raise TargetError(f"'{self.march}' is not a -march name", self.name)
        if self.tune and not MARCH_NAME.fullmatch(self.tune):
            raise TargetError(f"'{self.tune}' is not a -mtune name", self.name)
        if self.march == "native" or self.tune == "native":
            raise TargetError("march 'native' names whatever machine compiles, not a target: "
                              "save `polydl machine --json` on the target host instead", self.name)
        if self.libmvec not in ("", *LIBMVEC_RELEASES):
            raise TargetError(f"libmvec '{self.libmvec}' is none of {', '.join(LIBMVEC_RELEASES)} "
                              f"(or \"\" for none)", self.name)
        for flag in self.cflags:
            if not isinstance(flag, str) or not _MACHINE_FLAG.fullmatch(flag):
                raise TargetError(f"compiler flag {flag!r} is not a machine option (-m...)",
                                  self.name)
        for f in ("cores", "l1_bytes", "l2_bytes", "l3_bytes", "cache_line_bytes"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TargetError(f"'{f}' must be a positive integer, not {value!r}", self.name)
        for f in COST_FIELDS:
            value = getattr(self, f)
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or value <= 0):
                raise TargetError(f"'{f}' must be a positive number, not {value!r}", self.name)
            object.__setattr__(self, f, float(value))  # 64 and 64.0: one target, one key

    kind = KIND

    # ------------------------------------------------------------------ what decisions ask
    @property
    def vector_bytes(self) -> int:
        return _VECTOR_BYTES[self.isa]

    def vector_lanes(self, dtype: str) -> int:
        """Elements of `dtype` in one vector register (1 without SIMD)."""
        if self.isa == "scalar":
            return 1
        return self.vector_bytes // DTYPES[dtype].bytes

    @property
    def has_avx512(self) -> bool:
        return self.isa.startswith("avx512")

    @property
    def has_bf16_dot(self) -> bool:
        return self.isa in ("avx512amx", "avx512bf16")

    @property
    def has_amx(self) -> bool:
        return self.isa == "avx512amx"

    # ------------------------------------------------------------------ the compiler's view
    @property
    def effective_march(self) -> str:
        return self.march or ISA_MARCH[self.isa]

    def compile_flags(self) -> tuple[str, ...]:
        """Flags that make the compiler generate code for this target (never -march=native)."""
        march = self.effective_march
        cpu = self.tune or march
        tune = (f"-mtune={MARCH_TUNE.get(cpu, cpu)}",) if cpu in MARCH_TUNE or self.tune else ()
        return ((f"-march={march}",) if march else ()) + tune + ISA_FLAGS[self.isa] + self.cflags

    def portable_flags(self) -> tuple[str, ...]:
        """The same ISA by its x86-64 level, for a compiler that does not know `march` or
        `tune`."""
        return replace(self, march="", tune="").compile_flags()

    def required_features(self) -> frozenset[str]:
        """CPU features a kernel built for this target may execute."""
        return ISA_FEATURES[self.isa] | MARCH_FEATURES.get(self.effective_march, frozenset())

    def missing_features(self, cpu_flags: frozenset[str]) -> tuple[str, ...]:
        return tuple(sorted(self.required_features() - cpu_flags))

    # ------------------------------------------------------------------ identity and text
    def key(self) -> str:
        """Identity for caches and the tuning database: every field that changes generated
        code or a measured time (the name is only a label). A cost field, `libmvec` or `tune` at
        its default is left out: keys made before those fields existed (trials in a tuning
        database, cached code) stay those of the targets they were made for, and a target that
        sets one differs."""
        data = self.to_dict()
        del data["name"]
        for f in (*COST_FIELDS, "libmvec", "tune"):
            if data[f] == _DEFAULTS[f]:
                del data[f]
        return json.dumps(data, sort_keys=True)

    def describe(self) -> str:
        kib = 1024
        return (
            f"{self.name}: {self.model}, {self.isa} (-march={self.effective_march or 'none'}"
            f"{f' -mtune={self.tune}' if self.tune else ''}), "
            f"{self.cores} cores, L1 {self.l1_bytes // kib} KiB, L2 {self.l2_bytes // kib} KiB, "
            f"L3 {self.l3_bytes // kib} KiB, {self.cache_line_bytes}-byte lines"
        )

    def describe_costs(self) -> str:
        """The cost models' figures (`describe()` leaves them out: its text is part of
        generated sources)."""
        return (
            f"bandwidth per core: L1 {self.l1_bytes_per_cycle:g}, L2 {self.l2_bytes_per_cycle:g}, "
            f"memory {self.memory_bytes_per_cycle:g} bytes/cycle; line copies "
            f"{self.socket_copy_bytes_per_s / 1e9:g} GB/s per socket; fork and join "
            f"{self.fork_join_cycles:g} cycles, barrier {self.barrier_cycles:g} cycles; "
            f"between cores {self.core_transfer_bytes_per_cycle:g} bytes/cycle"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cflags"] = list(self.cflags)
        return {"kind": KIND, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "") -> CpuTarget:
        if not isinstance(data, dict):
            raise TargetError("a CPU target is a JSON object", source)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - {"kind"})
        if unknown:
            raise TargetError(f"unknown field(s) {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(known))}", source)
        values = dict(data)
        values.pop("kind", None)
        for f in ("name", "isa", "march", "tune", "model", "libmvec"):
            if f in values and not isinstance(values[f], str):
                raise TargetError(f"'{f}' must be a string, not {values[f]!r}", source)
        if "cflags" in values:
            if not isinstance(values["cflags"], list):
                raise TargetError("'cflags' must be a list of strings", source)
            values["cflags"] = tuple(values["cflags"])
        try:
            return cls(**values)
        except TargetError as exc:
            raise TargetError(exc.message, source or exc.source) from None


_DEFAULTS = {f.name: f.default for f in fields(CpuTarget)}
