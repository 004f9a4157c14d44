"""The machine description: ISA, vector width, cache sizes and core count, read once from the OS.

Every stage that makes a hardware-dependent decision asks a `Machine`; tests build one by hand
(`Machine(isa="avx512", l1_bytes=32 * 1024, ...)`) to pin those decisions. `POLYDL_ISA`
overrides the detected instruction set (for example `scalar` to test the portable fallback).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

# ISAs polydl generates code for, best first. "avx512bf16" is AVX-512 plus the BF16 dot products;
# "avx512amx" adds the AMX tile unit (bf16 tile dot products, Sapphire Rapids and later).
ISAS = ("avx512amx", "avx512bf16", "avx512", "avx2", "scalar")

_VECTOR_BYTES = {"avx512amx": 64, "avx512bf16": 64, "avx512": 64, "avx2": 32, "scalar": 4}
_ELEMENT_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2}


@dataclass(frozen=True)
class Machine:
    isa: str = "avx2"
    cores: int = 1
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    l3_bytes: int = 16 * 1024 * 1024
    cache_line_bytes: int = 64
    model: str = "unknown"

    def __post_init__(self) -> None:
        if self.isa not in ISAS:
            raise ValueError(f"unknown ISA '{self.isa}'; known: {', '.join(ISAS)}")

    @property
    def vector_bytes(self) -> int:
        return _VECTOR_BYTES[self.isa]

    def vector_lanes(self, dtype: str) -> int:
        """Elements of `dtype` in one vector register (1 without SIMD)."""
        if self.isa == "scalar":
            return 1
        return self.vector_bytes // _ELEMENT_BYTES[dtype]

    @property
    def has_avx512(self) -> bool:
        return self.isa.startswith("avx512")

    @property
    def has_bf16_dot(self) -> bool:
        return self.isa in ("avx512amx", "avx512bf16")

    @property
    def has_amx(self) -> bool:
        return self.isa == "avx512amx"

    def key(self) -> str:
        """Identity for the tuning database: what makes a tuned schedule transferable."""
        return (
            f"{self.model}|{self.isa}|{self.cores}c|"
            f"L1={self.l1_bytes}|L2={self.l2_bytes}|L3={self.l3_bytes}"
        )


def _cpu_flags(cpuinfo: str) -> set[str]:
    match = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    return set(match.group(1).split()) if match else set()


def isa_from_flags(flags: set[str]) -> str:
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        if "avx512_bf16" not in flags:
            return "avx512"
        return "avx512amx" if {"amx_tile", "amx_bf16"} <= flags else "avx512bf16"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "scalar"


def _cache_bytes(level: int, kind: tuple[str, ...]) -> int | None:
    """Size of one instance of the cache at `level` from sysfs (per core for L1/L2)."""
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(root.glob("index*")):
        try:
            if int((index / "level").read_text()) != level:
                continue
            if (index / "type").read_text().strip() not in kind:
                continue
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 1024, "M": 1024 * 1024, "G": 1024**3}
        if text[-1] in units:
            return int(text[:-1]) * units[text[-1]]
        return int(text)
    return None


def detect() -> Machine:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    isa = isa_from_flags(_cpu_flags(cpuinfo))
    model_match = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    defaults = Machine()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    line = _cache_line()
    return Machine(
        isa=isa,
        cores=max(cores, 1),
        l1_bytes=_cache_bytes(1, ("Data", "Unified")) or defaults.l1_bytes,
        l2_bytes=_cache_bytes(2, ("Unified", "Data")) or defaults.l2_bytes,
        l3_bytes=_cache_bytes(3, ("Unified", "Data")) or defaults.l3_bytes,
        cache_line_bytes=line or defaults.cache_line_bytes,
        model=model_match.group(1).strip() if model_match else "unknown",
    )


def _cache_line() -> int | None:
    try:
        path = Path("/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size")
        return int(path.read_text())
    except (OSError, ValueError):
        return None


@cache
def current_machine() -> Machine:
    """The machine polydl runs on (detected once); `POLYDL_ISA` overrides the ISA."""
    machine = detect()
    forced = os.environ.get("POLYDL_ISA")
    if forced:
        if forced not in ISAS:
            from polydl.errors import PolyDLError

            raise PolyDLError(f"POLYDL_ISA='{forced}' is not one of {', '.join(ISAS)}")
        machine = replace(machine, isa=forced)
    return machine
