"""Every built-in primitive by its name: the table TOML specs (`primitive = "..."`) look up.

Takes nothing; `PRIMITIVES` maps a name to its builder (sizes and options in, `(LoopNest,
params)` out).
"""

from __future__ import annotations

from collections.abc import Callable

from polydl.frontends import builders, conv_backward, layers
from polydl.frontends.builders import Built

PRIMITIVES: dict[str, Callable[..., Built]] = {
    **builders.PRIMITIVES,
    "conv2d_backward_data": conv_backward.conv2d_backward_data,
    "conv2d_backward_weights": conv_backward.conv2d_backward_weights,
    "linear": layers.linear,
    "linear_backward_data": layers.linear_backward_data,
    "linear_backward_weights": layers.linear_backward_weights,
    "pool2d": layers.pool2d,
    "eltwise": layers.eltwise,
    "batchnorm_inference": layers.batchnorm_inference,
    "batchnorm_statistics": layers.batchnorm_statistics,
    "lstm_cell": layers.lstm_cell,
}
