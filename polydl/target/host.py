"""The machine this process runs on, detected once: the default target and the CPU that runs
kernels.

Only the API boundary asks this module (the default `machine="native"`, the check that a kernel
can run here, `polydl machine`); every stage below it is handed a target value. The detected
-march is the name the C compiler gives this CPU (`-march=native` resolved), so a description
saved here and used on another machine says what it means; a name whose features polydl cannot
check is the -mtune instead (the ISA's x86-64 level is the -march). `POLYDL_ISA` lowers the native
target's ISA (and -march to that ISA's x86-64 level), e.g. `scalar` for the portable fallback.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import replace
from functools import cache
from pathlib import Path

from polydl import settings
from polydl.errors import TargetError
from polydl.target.cpu import COST_FIELDS, ISAS, LIBMVEC_RELEASES, MARCH_FEATURES, MARCH_NAME, CpuTarget


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_flags_of(cpuinfo: str) -> frozenset[str]:
    match = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    return frozenset(match.group(1).split()) if match else frozenset()


@cache
def host_cpu_flags() -> frozenset[str] | None:
    """This CPU's features as /proc/cpuinfo names them; None where the OS does not say."""
    flags = cpu_flags_of(_cpuinfo())
    return flags or None


def isa_from_flags(flags: frozenset[str] | set[str]) -> str:
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


def _cache_line() -> int | None:
    try:
        path = Path("/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size")
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def compiler_march(compiler: str) -> str | None:
    """The name `compiler` gives this CPU (gcc: `-march=native -Q --help=target`); None where
    it does not say or names a CPU polydl cannot check features for."""
    name = compiler_cpu_name(compiler)
    return name if name in MARCH_FEATURES else None


def compiler_tune(compiler: str) -> str:
    """The -mtune for this CPU where its -march is not `compiler_march`'s: the compiler's own
    name for it ("" where the compiler names none, or the name is a -march polydl knows)."""
    name = compiler_cpu_name(compiler)
    return name if name and name not in MARCH_FEATURES else ""


@cache
def compiler_cpu_name(compiler: str) -> str | None:
    """The name `compiler` gives this CPU, whatever it is; None where it says none."""
    path = shutil.which(compiler)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "-march=native", "-Q", "--help=target"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"^\s*-march=\s+(\S+)\s*$", out.stdout, re.MULTILINE)
    name = match.group(1) if match else None
    return name if name and MARCH_NAME.fullmatch(name) and name != "native" else None


def libmvec_release() -> str:
    """The newest of `LIBMVEC_RELEASES` this host's glibc has ("" for none: another C library,
    or a glibc before the first)."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):  # not glibc, or an OS without confstr
        return ""
    match = re.fullmatch(r"glibc (\d+)\.(\d+).*", text)
    if not match:
        return ""
    have = (int(match.group(1)), int(match.group(2)))
    releases = [r for r in LIBMVEC_RELEASES if tuple(int(p) for p in r.split(".")) <= have]
    return releases[-1] if releases else ""


def usable_cpus() -> int:
    """CPUs this process may run on: the union of its threads' affinities. Once an OpenMP
    runtime (a kernel's, PyTorch's) has run a parallel region under `OMP_PROC_BIND`, the
    main thread is bound to one place, and its own affinity alone says 1."""
    try:
        cpus = set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:  # no /proc
        tasks = []
    for task in tasks:
        try:
            cpus |= os.sched_getaffinity(int(task))
        except (OSError, ValueError):  # a thread that ended meanwhile
            continue
    return len(cpus)


def detect(compiler: str = "cc") -> CpuTarget:
    """The running machine as a target (no environment overrides)."""
    cpuinfo = _cpuinfo()
    isa = isa_from_flags(cpu_flags_of(cpuinfo))
    model_match = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    defaults = CpuTarget()
    cores = usable_cpus()
    march = compiler_march(compiler) if isa != "scalar" else None
    return CpuTarget(
        name="native",
        isa=isa,
        march=march or "",
        tune=compiler_tune(compiler) if isa != "scalar" else "",
        cores=max(cores, 1),
        l1_bytes=_cache_bytes(1, ("Data", "Unified")) or defaults.l1_bytes,
        l2_bytes=_cache_bytes(2, ("Unified", "Data")) or defaults.l2_bytes,
        l3_bytes=_cache_bytes(3, ("Unified", "Data")) or defaults.l3_bytes,
        cache_line_bytes=_cache_line() or defaults.cache_line_bytes,
        model=model_match.group(1).strip() if model_match else "unknown",
        libmvec=libmvec_release(),
        # bandwidths and fork and join are not measured here: the defaults' (a server core's)
        **{f: getattr(defaults, f) for f in COST_FIELDS},
    )


@cache
def _detected(compiler: str) -> CpuTarget:
    return detect(compiler)


def host_target() -> CpuTarget:
    """This machine (detected once per compiler), with `POLYDL_ISA` applied."""
    target = _detected(settings.cc())
    forced = settings.forced_isa()
    if forced and forced != target.isa:
        if forced not in ISAS:  # settings validates its names; they must stay the same
            raise TargetError(f"POLYDL_ISA='{forced}' names no ISA of {', '.join(ISAS)}")
        target = replace(target, isa=forced, march="")
    return target


def cannot_run_here(target: CpuTarget) -> str:
    """Why this CPU cannot run code built for `target` ("" if it can, or cannot tell)."""
    flags = host_cpu_flags()
    if flags is None:
        return ""
    missing = target.missing_features(flags)
    if not missing:
        return ""
    return (f"kernels built for target '{target.name}' ({target.isa}, "
            f"-march={target.effective_march or 'none'}) cannot run on this CPU, which lacks "
            f"{', '.join(missing)}: run them on a machine of that target (or build for "
            f"machine='native')")
