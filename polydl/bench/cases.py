"""The suites: which shapes each one runs, read from the JSON files in `suites/`.

The files ship as package data, so a suite runs anywhere polydl is installed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from polydl.errors import PolyDLError

SUITES_DIR = Path(__file__).resolve().parent / "suites"
SUITE_FILES = {
    "gemm": "gemm.json",
    "gemm_reductions": "gemm_reductions.json",
    "resnet50": "resnet50_conv.json",
    "resnet50_bwd_data": "resnet50_conv.json",
    "resnet50_bwd_weights": "resnet50_conv.json",
    # A/B suites on the same layers (polydl.bench.variants)
    "resnet50_fused": "resnet50_conv.json",
    "resnet50_bf16": "resnet50_conv.json",
}
# The primitive each convolution suite runs on the layers of its file.
CONV_PRIMITIVES = {
    "resnet50": "conv2d",
    "resnet50_bwd_data": "conv2d_backward_data",
    "resnet50_bwd_weights": "conv2d_backward_weights",
    "resnet50_fused": "conv2d",
    "resnet50_bf16": "conv2d",
}
# Seconds of timing per case (references and polydl together), not counting compilation.
DEFAULT_BUDGET_S = {"gemm": 10.0, "gemm_reductions": 10.0, "resnet50": 12.0, "resnet50_bwd_data": 8.0,
                    "resnet50_bwd_weights": 8.0, "resnet50_fused": 12.0, "resnet50_bf16": 12.0}


class BenchError(PolyDLError):
    """A benchmark that cannot start: unknown suite or case."""


@dataclass(frozen=True)
class Case:
    """One shape of a suite: `primitive` is `matmul` or `conv2d` (or a conv backward pass);
    `sizes` its builder's sizes."""

    name: str
    primitive: str
    sizes: tuple[tuple[str, int], ...]
    dtype: str = "float32"

    @property
    def size(self) -> dict[str, int]:
        return dict(self.sizes)

    @property
    def output_hw(self) -> tuple[int, int]:
        s = self.size
        p = (s["H"] + 2 * s["padding"] - s["R"]) // s["stride"] + 1
        q = (s["W"] + 2 * s["padding"] - s["S"]) // s["stride"] + 1
        return p, q

    @property
    def flops(self) -> int:
        """Useful floating-point operations (a multiply-add is two), the same for every side."""
        s = self.size
        if self.primitive == "matmul":
            return 2 * s["M"] * s["N"] * s["K"]
        p, q = self.output_hw
        return 2 * s["N"] * s["K"] * s["C"] * s["R"] * s["S"] * p * q

    @property
    def shape(self) -> str:
        s = self.size
        if self.primitive == "matmul":
            return f"{s['M']}x{s['N']}x{s['K']}"
        return (f"N{s['N']} C{s['C']} K{s['K']} {s['H']}x{s['W']} "
                f"{s['R']}x{s['S']}/{s['stride']}")


def load_suite(name: str, batch: int | None = None) -> list[Case]:
    """The cases of suite `name`, read from the package data; `batch` replaces a convolution
    suite's minibatch N (the file's N when None)."""
    if name not in SUITE_FILES:
        raise BenchError(f"unknown suite '{name}'; known: {', '.join(SUITE_FILES)}")
    data = json.loads((SUITES_DIR / SUITE_FILES[name]).read_text())
    if "shapes" in data:
        if batch is not None:
            raise BenchError(f"the {name} suite has no minibatch; --batch is for convolution suites")
        return [
            Case(s["name"], "matmul", (("M", s["M"]), ("N", s["N"]), ("K", s["K"])),
                 s.get("dtype", "float32"))
            for s in data["shapes"]
        ]
    if batch is not None and batch < 1:
        raise BenchError(f"batch must be a positive minibatch, got {batch}")
    n = data["N"] if batch is None else batch
    keys = ("C", "K", "H", "W", "R", "S", "stride", "padding")
    return [
        Case(layer["name"], CONV_PRIMITIVES[name], (("N", n), *((k, layer[k]) for k in keys)),
             data.get("dtype", "float32"))
        for layer in data["layers"]
    ]


def select_cases(cases: Sequence[Case], names: Sequence[str] | None) -> list[Case]:
    """`names` of `cases` in the order given (all of them when `names` is empty)."""
    if not names:
        return list(cases)
    known = {c.name: c for c in cases}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BenchError(f"unknown case '{unknown[0]}'; this suite has: {', '.join(known)}")
    return [known[n] for n in names]
