"""polydl: a polyhedral compiler from loop-nest specs of deep-learning primitives to native kernels.

    import polydl
    k = polydl.matmul(M=512, N=512, K=512)
    c = k(a, b)

Entry points: `compile` (a C loop nest or TOML spec), the builders (`matmul`, `conv2d`, ...) and
`onnx.compile` (a network); each returns a callable (`Kernel`, `onnx.Network`), and `help()` of each
lists its arguments and errors (all derive from `PolyDLError`). docs/contract.md is the contract.
"""

from polydl.api import (
    batchnorm_inference,
    batchnorm_statistics,
    compile,
    conv2d,
    conv2d_backward_data,
    conv2d_backward_weights,
    eltwise,
    linear,
    linear_backward_data,
    linear_backward_weights,
    lstm_cell,
    matmul,
    pool2d,
)
from polydl.errors import (
    CacheWarning,
    CompileError,
    IndexRangeError,
    PolyDLError,
    PolyDLWarning,
    ScheduleError,
    ShapeError,
    SpecError,
    TargetError,
    ToolchainWarning,
    UnsupportedOperator,
)
from polydl.runtime.c.kernel import Kernel
from polydl.runtime.kernel import aligned
from polydl.schedules.schedule import MicrokernelBinding, Schedule
from polydl.target import CpuTarget, GpuTarget, Target
from polydl.version import __version__

__all__ = [
    "CacheWarning",
    "CompileError",
    "IndexRangeError",
    "Kernel",
    "MicrokernelBinding",
    "PolyDLError",
    "PolyDLWarning",
    "Schedule",
    "ScheduleError",
    "ShapeError",
    "SpecError",
    "TargetError",
    "ToolchainWarning",
    "UnsupportedOperator",
    "CpuTarget",
    "GpuTarget",
    "Target",
    "__version__",
    "aligned",
    "batchnorm_inference",
    "batchnorm_statistics",
    "compile",
    "conv2d",
    "conv2d_backward_data",
    "conv2d_backward_weights",
    "eltwise",
    "linear",
    "linear_backward_data",
    "linear_backward_weights",
    "lstm_cell",
    "matmul",
    "onnx",
    "pool2d",
]

from polydl import onnx  # noqa: E402 - the network frontend builds on everything above
