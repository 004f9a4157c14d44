"""Loading a compiled library for the rest of the process."""

from __future__ import annotations

import os
from typing import Any

import cffi


def load_for_life(ffi: cffi.FFI, path: str | os.PathLike[str]) -> Any:
    """`ffi.dlopen(path)`, never unmapped: with RTLD_NODELETE the library, and the OpenMP
    runtime it brought in, stay mapped when the interpreter's exit frees the handle. OpenMP's
    idle worker threads run that runtime's code, and under OMP_WAIT_POLICY=active they spin
    in it: unmapped under them, the process died at exit with SIGSEGV."""
    return ffi.dlopen(str(path), ffi.RTLD_NOW | ffi.RTLD_NODELETE)
