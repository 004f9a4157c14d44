"""Sanitizer builds: generated kernels compiled with AddressSanitizer and UndefinedBehaviorSanitizer.

`POLYDL_SANITIZE=address,undefined` (or one of them) adds `-fsanitize=...` to every kernel
build, with `-fno-sanitize-recover=all` so that any report aborts the process (a test then
fails). ASan's runtime must be the first library of the process, so Python has to start with
it preloaded; `python -m polydl.runtime.sanitize [pytest arguments]` does that (LD_PRELOAD of
the compiler's libasan.so) and runs pytest under it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from functools import cache

from polydl import settings
from polydl.errors import CompileError, PolyDLError

SANITIZERS = settings.SANITIZERS
DEFAULT = "address,undefined"
# Python's allocator keeps memory alive until exit: leak reports would be noise.
ASAN_OPTIONS = "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1"
UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1"


def requested() -> tuple[str, ...]:
    return settings.sanitizers()


def sanitizer_flags() -> tuple[str, ...]:
    names = requested()
    if not names:
        return ()
    return (f"-fsanitize={','.join(names)}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g")


def asan_runtime_loaded() -> bool:
    try:
        with open("/proc/self/maps") as maps:
            return "libasan" in maps.read()
    except OSError:
        return False


def require_runtime() -> None:
    """Refuse to load an ASan build into a process without ASan's runtime: the runtime would
    otherwise abort the process on load."""
    if "address" in requested() and not asan_runtime_loaded():
        raise PolyDLError(
            "POLYDL_SANITIZE=address needs AddressSanitizer's runtime loaded first: run "
            "`python -m polydl.runtime.sanitize ...` or set LD_PRELOAD=$(cc -print-file-name=libasan.so)"
        )


@cache
def runtime_library(compiler: str = "cc", name: str = "libasan.so") -> str:
    """Path of the compiler's sanitizer runtime, e.g. libasan.so."""
    try:
        out = subprocess.run(
            [compiler, f"-print-file-name={name}"], capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CompileError(compiler, [compiler, f"-print-file-name={name}"], str(exc)) from None
    if not out or not os.path.isabs(out) or not os.path.exists(out):
        raise CompileError(
            compiler, [compiler, f"-print-file-name={name}"],
            f"{compiler} has no {name} (install the compiler's sanitizer runtime, e.g. libasan8)",
        )
    return os.path.realpath(out)


def sanitized_environment(base: dict[str, str] | None = None, sanitizers: str = DEFAULT) -> dict[str, str]:
    """An environment in which a new Python process builds and runs sanitized kernels."""
    env = dict(os.environ if base is None else base)
    env[settings.VARIABLES["sanitize"]] = sanitizers
    compiler = shlex.split(env.get(settings.VARIABLES["cc"]) or "cc")[0]
    if "address" in sanitizers:
        # The C++ runtime right after ASan's: ASan's `__cxa_throw` interceptor binds the real one
        # at start-up, and without it islpy's first exception (an isl error) aborts the process.
        preload = [runtime_library(compiler), runtime_library(compiler, "libstdc++.so.6")]
        if env.get("LD_PRELOAD"):
            preload.append(env["LD_PRELOAD"])
        env["LD_PRELOAD"] = " ".join(preload)
    env.setdefault("ASAN_OPTIONS", ASAN_OPTIONS)
    env.setdefault("UBSAN_OPTIONS", UBSAN_OPTIONS)
    return env


def compiler_environment() -> dict[str, str]:
    """This process's environment without a preloaded sanitizer runtime: a compiler run under
    it (nvcc above all) may crash, and its leak checks would fail the build."""
    env = dict(os.environ)
    kept = [p for p in env.get("LD_PRELOAD", "").split() if "libasan" not in os.path.basename(p)]
    if kept:
        env["LD_PRELOAD"] = " ".join(kept)
    else:
        env.pop("LD_PRELOAD", None)
    return env


def main(argv: list[str] | None = None) -> int:
    """Run pytest with sanitized kernels: `python -m polydl.runtime.sanitize [pytest args]`."""
    args = sys.argv[1:] if argv is None else argv
    env = sanitized_environment(sanitizers=",".join(settings.sanitizers()) or DEFAULT)
    command = [sys.executable, "-m", "pytest", *args]
    return subprocess.run(command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
