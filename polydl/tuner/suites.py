"""The problems of a suite: every layer of a benchmark suite (or of a suite file in the same
JSON format) as a loop nest at its sizes, for `polydl tune --suite`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from polydl.bench.cases import SUITE_FILES, load_suite
from polydl.errors import PolyDLError
from polydl.frontends import builders, conv_backward
from polydl.ir import LoopNest

BLOCK = 16
_CONV: dict[str, Callable[..., tuple[LoopNest, dict[str, int]]]] = {
    "conv2d": builders.conv2d,
    "conv2d_backward_data": conv_backward.conv2d_backward_data,
    "conv2d_backward_weights": conv_backward.conv2d_backward_weights,
}


@dataclass(frozen=True)
class SuiteProblem:
    name: str
    nest: LoopNest
    params: dict[str, int]


def suite_problems(name: str, batch: int | None = None) -> list[SuiteProblem]:
    """`name`: a suite of `polydl bench` (gemm, resnet50, resnet50_bwd_data, ...) or a JSON file
    with `shapes` (GEMMs: M, N, K) or `layers` (convolutions: C, K, H, W, R, S, stride, padding,
    with N and an optional `primitive` at the top). `batch` replaces a convolution suite's N, as
    `polydl bench --batch` does, so that `bench --schedule tuned` finds what was tuned."""
    if name in SUITE_FILES:
        cases = load_suite(name, batch)
        return [_problem(c.name, c.primitive, c.size, c.dtype) for c in cases]
    path = Path(name)
    if not path.is_file():
        raise PolyDLError(f"unknown suite '{name}': neither a suite ({', '.join(SUITE_FILES)}) "
                          "nor a suite file")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PolyDLError(f"{path}: not a suite file ({exc})") from None
    if not isinstance(data, dict) or not ({"shapes", "layers"} & set(data)):
        raise PolyDLError(f"{path}: a suite file is a JSON object with 'shapes' or 'layers'")
    if batch is not None and "shapes" in data:
        raise PolyDLError(f"{path}: a suite of GEMM shapes has no minibatch; --batch is for "
                          "convolution suites")
    if batch is not None and batch < 1:
        raise PolyDLError(f"batch must be a positive minibatch, got {batch}")
    try:
        if "shapes" in data:
            return [_problem(s["name"], "matmul", {k: s[k] for k in "MNK"}, s.get("dtype", "float32"))
                    for s in data["shapes"]]
        keys = ("C", "K", "H", "W", "R", "S", "stride", "padding")
        primitive = data.get("primitive", "conv2d")
        n = data["N"] if batch is None else batch
        return [_problem(layer["name"], primitive, {"N": n, **{k: layer[k] for k in keys}},
                         data.get("dtype", "float32"))
                for layer in data["layers"]]
    except (KeyError, TypeError) as exc:
        raise PolyDLError(f"{path}: a shape or layer lacks {exc}") from None
    except PolyDLError as exc:  # an unknown primitive or a size a builder refuses
        raise PolyDLError(f"{path}: {exc}") from None


def suite_layout(primitive: str, sizes: dict[str, int]) -> str:
    """The layout a suite layer is tuned in: blocked where the channels allow it, as the
    networks and the benchmarks run them ("" for a GEMM)."""
    if primitive == "matmul":
        return ""
    return "nchw16c" if sizes["C"] % BLOCK == 0 and sizes["K"] % BLOCK == 0 else "nchw"


def _problem(name: str, primitive: str, sizes: dict[str, int], dtype: str) -> SuiteProblem:
    if primitive == "matmul":
        nest, params = builders.matmul(sizes["M"], sizes["N"], sizes["K"], dtype=dtype)
        return SuiteProblem(name, nest, dict(params))
    if primitive not in _CONV:
        raise PolyDLError(f"suite layer {name}: unknown primitive '{primitive}'; known: "
                          f"matmul, {', '.join(_CONV)}")
    layout = suite_layout(primitive, sizes)
    # the C target's forms (a stem's column phases), as `polydl.conv2d` builds them there
    options = builders.target_options(primitive, "c")
    nest, params = _CONV[primitive](**sizes, dtype=dtype, layout=layout, **options)
    return SuiteProblem(name, nest, dict(params))
