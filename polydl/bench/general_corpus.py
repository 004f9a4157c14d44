"""The general suite's kernels: where each C file is, which suite it belongs to, and its sizes.

Two suites: `polybench`, PolyBench 4.2's 30 kernels with PolyBench's parameter names (the time
loops' `TSTEPS` is `T` in heat-3d, jacobi-1d, jacobi-2d and seidel-2d), and `dl`, deep-learning
operators written as people write them (several in more than one style). Every kernel has
`bench` sizes (gcc -O3 takes roughly 5-200 ms) and `test` sizes (a correctness check in well
under a second, odd extents included). The PolyBench kernels also have PolyBench 4.2's own
datasets `mini`, `small`, `medium` and `large`; a DL operator has none, and runs its `test`
sizes for `mini` and `small` and its `bench` sizes for `medium` and `large`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from polydl.errors import PolyDLError

ROOT = Path(__file__).resolve().parents[2]
KERNEL_DIR = ROOT / "benchmarks" / "general"
EXAMPLE_DIR = ROOT / "examples"

DATASETS = ("test", "mini", "small", "medium", "large", "bench")
POLYBENCH_DATASETS = ("mini", "small", "medium", "large")
SUITES = ("dl", "polybench")
# what a DL operator runs for each PolyBench dataset
_DL_DATASET = {"test": "test", "mini": "test", "small": "test", "medium": "bench",
               "large": "bench", "bench": "bench"}

Sizes = Mapping[str, int]


@dataclass(frozen=True)
class CorpusKernel:
    """One kernel of the general suite.

    Attributes:
        name: the kernel's name (its file's stem in `benchmarks/general/`).
        suite: "polybench" or "dl".
        bench: the sizes the benchmark times by default.
        test: the small sizes the correctness tests run.
        polybench: PolyBench 4.2's datasets (mini, small, medium, large), PolyBench kernels only.
        example: the file of `examples/` that holds the kernel, if it lives there.
    """

    name: str
    suite: str
    bench: Sizes
    test: Sizes
    polybench: Mapping[str, Sizes] = field(default_factory=dict)
    example: str | None = None

    @property
    def path(self) -> Path:
        """The C file."""
        return EXAMPLE_DIR / self.example if self.example else KERNEL_DIR / f"{self.name}.c"

    def sizes(self, dataset: str) -> dict[str, int]:
        """The sizes of `dataset` (one of `DATASETS`).

        Args:
            dataset: "test", "mini", "small", "medium", "large" or "bench".

        Returns:
            The size parameters by name.

        Raises:
            PolyDLError: an unknown dataset.
        """
        if dataset not in DATASETS:
            raise PolyDLError(f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}")
        if dataset in POLYBENCH_DATASETS and self.polybench:
            return dict(self.polybench[dataset])
        chosen = _DL_DATASET[dataset] if self.suite == "dl" else dataset
        return dict(self.bench if chosen == "bench" else self.test)


def _pb(mini: Sizes, small: Sizes, medium: Sizes, large: Sizes) -> dict[str, Sizes]:
    return {"mini": mini, "small": small, "medium": medium, "large": large}


def _polybench(name: str, bench: Sizes, test: Sizes, datasets: dict[str, Sizes],
               example: str | None = None) -> CorpusKernel:
    return CorpusKernel(name, "polybench", bench, test, datasets, example)


def _dl(name: str, bench: Sizes, test: Sizes, example: str | None = None) -> CorpusKernel:
    return CorpusKernel(name, "dl", bench, test, {}, example)


# PolyBench/C 4.2.1's dataset sizes, as its headers define them
_POLYBENCH = [
    _polybench("gemm", {"NI": 800, "NJ": 900, "NK": 1000}, {"NI": 30, "NJ": 34, "NK": 38},
               _pb({"NI": 20, "NJ": 25, "NK": 30}, {"NI": 60, "NJ": 70, "NK": 80},
                   {"NI": 200, "NJ": 220, "NK": 240}, {"NI": 1000, "NJ": 1100, "NK": 1200})),
    _polybench("2mm", {"NI": 600, "NJ": 700, "NK": 800, "NL": 900},
               {"NI": 20, "NJ": 24, "NK": 28, "NL": 32},
               _pb({"NI": 16, "NJ": 18, "NK": 22, "NL": 24}, {"NI": 40, "NJ": 50, "NK": 70, "NL": 80},
                   {"NI": 180, "NJ": 190, "NK": 210, "NL": 220},
                   {"NI": 800, "NJ": 900, "NK": 1100, "NL": 1200})),
    _polybench("3mm", {"NI": 500, "NJ": 600, "NK": 700, "NL": 800, "NM": 900},
               {"NI": 20, "NJ": 22, "NK": 24, "NL": 26, "NM": 28},
               _pb({"NI": 16, "NJ": 18, "NK": 20, "NL": 22, "NM": 24},
                   {"NI": 40, "NJ": 50, "NK": 60, "NL": 70, "NM": 80},
                   {"NI": 180, "NJ": 190, "NK": 200, "NL": 210, "NM": 220},
                   {"NI": 800, "NJ": 900, "NK": 1000, "NL": 1100, "NM": 1200})),
    _polybench("gemver", {"N": 2000}, {"N": 40},
               _pb({"N": 40}, {"N": 120}, {"N": 400}, {"N": 2000})),
    _polybench("gesummv", {"N": 2500}, {"N": 40},
               _pb({"N": 30}, {"N": 90}, {"N": 250}, {"N": 1300})),
    _polybench("symm", {"M": 800, "N": 1000}, {"M": 30, "N": 34},
               _pb({"M": 20, "N": 30}, {"M": 60, "N": 80}, {"M": 200, "N": 240},
                   {"M": 1000, "N": 1200})),
    _polybench("syr2k", {"N": 800, "M": 1000}, {"N": 30, "M": 34},
               _pb({"M": 20, "N": 30}, {"M": 60, "N": 80}, {"M": 200, "N": 240},
                   {"M": 1000, "N": 1200})),
    _polybench("syrk", {"N": 800, "M": 1000}, {"N": 30, "M": 34},
               _pb({"M": 20, "N": 30}, {"M": 60, "N": 80}, {"M": 200, "N": 240},
                   {"M": 1000, "N": 1200})),
    _polybench("trmm", {"M": 800, "N": 1000}, {"M": 30, "N": 34},
               _pb({"M": 20, "N": 30}, {"M": 60, "N": 80}, {"M": 200, "N": 240},
                   {"M": 1000, "N": 1200})),
    _polybench("atax", {"M": 1900, "N": 2100}, {"M": 38, "N": 42},
               _pb({"M": 38, "N": 42}, {"M": 116, "N": 124}, {"M": 390, "N": 410},
                   {"M": 1900, "N": 2100})),
    _polybench("bicg", {"M": 1900, "N": 2100}, {"M": 38, "N": 42},
               _pb({"M": 38, "N": 42}, {"M": 116, "N": 124}, {"M": 390, "N": 410},
                   {"M": 1900, "N": 2100})),
    _polybench("doitgen", {"NR": 100, "NQ": 120, "NP": 140}, {"NR": 6, "NQ": 7, "NP": 8},
               _pb({"NQ": 8, "NR": 10, "NP": 12}, {"NQ": 20, "NR": 25, "NP": 30},
                   {"NQ": 40, "NR": 50, "NP": 60}, {"NQ": 140, "NR": 150, "NP": 160})),
    _polybench("mvt", {"N": 2000}, {"N": 40},
               _pb({"N": 40}, {"N": 120}, {"N": 400}, {"N": 2000})),
    _polybench("cholesky", {"N": 1000}, {"N": 30},
               _pb({"N": 40}, {"N": 120}, {"N": 400}, {"N": 2000})),
    _polybench("durbin", {"N": 2000}, {"N": 40},
               _pb({"N": 40}, {"N": 120}, {"N": 400}, {"N": 2000})),
    # PolyBench's datasets have M < N: A is rank-deficient and R's last rows divide by rounding
    # noise there (as in PolyBench itself); the bench and test sizes keep N <= M
    _polybench("gramschmidt", {"M": 1000, "N": 800}, {"M": 30, "N": 24},
               _pb({"M": 20, "N": 30}, {"M": 60, "N": 80}, {"M": 200, "N": 240},
                   {"M": 1000, "N": 1200})),
    _polybench("lu", {"N": 1000}, {"N": 30},
               _pb({"N": 40}, {"N": 120}, {"N": 400}, {"N": 2000})),
    _polybench("ludcmp", {"N": 1000}, {"N": 30},
               _pb({"N": 40}, {"N": 120}, {"N": 400}, {"N": 2000})),
    _polybench("trisolv", {"N": 2000}, {"N": 40},
               _pb({"N": 40}, {"N": 120}, {"N": 400}, {"N": 2000})),
    _polybench("correlation", {"M": 1000, "N": 1200}, {"M": 30, "N": 34},
               _pb({"M": 28, "N": 32}, {"M": 80, "N": 100}, {"M": 240, "N": 260},
                   {"M": 1200, "N": 1400})),
    _polybench("covariance", {"M": 1000, "N": 1200}, {"M": 30, "N": 34},
               _pb({"M": 28, "N": 32}, {"M": 80, "N": 100}, {"M": 240, "N": 260},
                   {"M": 1200, "N": 1400})),
    _polybench("nussinov", {"N": 1000}, {"N": 30},
               _pb({"N": 60}, {"N": 180}, {"N": 500}, {"N": 2500})),
    _polybench("floyd_warshall", {"N": 700}, {"N": 30},
               _pb({"N": 60}, {"N": 180}, {"N": 500}, {"N": 2800})),
    _polybench("adi", {"TSTEPS": 50, "N": 800}, {"TSTEPS": 3, "N": 20},
               _pb({"TSTEPS": 20, "N": 20}, {"TSTEPS": 40, "N": 60},
                   {"TSTEPS": 100, "N": 200}, {"TSTEPS": 500, "N": 1000})),
    _polybench("fdtd_2d", {"TMAX": 100, "NX": 1000, "NY": 1200}, {"TMAX": 3, "NX": 20, "NY": 24},
               _pb({"TMAX": 20, "NX": 20, "NY": 30}, {"TMAX": 40, "NX": 60, "NY": 80},
                   {"TMAX": 100, "NX": 200, "NY": 240}, {"TMAX": 500, "NX": 1000, "NY": 1200})),
    _polybench("heat_3d", {"T": 50, "N": 120}, {"T": 3, "N": 12},
               _pb({"T": 20, "N": 10}, {"T": 40, "N": 20}, {"T": 100, "N": 40},
                   {"T": 500, "N": 120})),
    _polybench("jacobi_1d", {"T": 1000, "N": 20000}, {"T": 3, "N": 50},
               _pb({"T": 20, "N": 30}, {"T": 40, "N": 120}, {"T": 100, "N": 400},
                   {"T": 500, "N": 2000})),
    _polybench("jacobi_2d", {"T": 50, "N": 1000}, {"T": 3, "N": 30},
               _pb({"T": 20, "N": 30}, {"T": 40, "N": 90}, {"T": 100, "N": 250},
                   {"T": 500, "N": 1300}), example="jacobi2d.c"),
    _polybench("seidel_2d", {"T": 20, "N": 1000}, {"T": 3, "N": 30},
               _pb({"T": 20, "N": 40}, {"T": 40, "N": 120}, {"T": 100, "N": 400},
                   {"T": 500, "N": 2000})),
    _polybench("deriche", {"W": 2048, "H": 1536}, {"W": 30, "H": 24},
               _pb({"W": 64, "H": 64}, {"W": 192, "H": 128}, {"W": 720, "H": 480},
                   {"W": 4096, "H": 2160})),
]

_ROWS = {"N": 4096, "D": 1024}  # a batch of token rows, a wide hidden size
_ROWS_FEW = {"N": 1024, "D": 1024}  # several transcendental calls an element
_ROWS_MANY = {"N": 16384, "D": 1024}  # one load and store an element: 16 sequences of 1024
_ROWS_TEST = {"N": 6, "D": 40}
_NORM = {"N": 4096, "D": 768}
_IMAGES = {"N": 32, "C": 64, "H": 56, "W": 56}  # a ResNet stage's activations
_IMAGES_TEST = {"N": 2, "C": 3, "H": 5, "W": 6}
_ATTENTION = {"S": 512, "D": 64}
_ATTENTION_TEST = {"S": 16, "D": 8}
_ROPE = {"S": 4096, "NH": 32, "D": 128}
_ROPE_TEST = {"S": 5, "NH": 2, "D": 8}
_TOKENS = {"T": 16384, "V": 8192, "D": 768}
_TOKENS_TEST = {"T": 9, "V": 5, "D": 8}

_DL = [
    # activations, element by element
    _dl("gelu_erf", _ROWS, _ROWS_TEST),
    _dl("gelu_tanh", {"N": 2048, "D": 1024}, _ROWS_TEST),
    _dl("silu", _ROWS, _ROWS_TEST),
    _dl("swiglu", _ROWS, {"N": 6, "D": 20}),
    _dl("mish", _ROWS_FEW, _ROWS_TEST),
    _dl("elu", _ROWS, _ROWS_TEST),
    _dl("hardswish", _ROWS_MANY, _ROWS_TEST),
    _dl("hardswish_ifelse", _ROWS_MANY, _ROWS_TEST),
    _dl("sigmoid", _ROWS, _ROWS_TEST),
    _dl("softplus", _ROWS, _ROWS_TEST),
    _dl("leaky_relu", _ROWS_MANY, _ROWS_TEST),
    _dl("bias_leaky_relu", _ROWS_MANY, _ROWS_TEST),
    # normalisations
    _dl("layernorm", _NORM, _ROWS_TEST, example="layernorm.c"),
    _dl("layernorm_fused", _NORM, _ROWS_TEST),
    _dl("rmsnorm", {"N": 16384, "D": 768}, _ROWS_TEST),
    _dl("groupnorm", {"N": 32, "G": 32, "CG": 2, "H": 56, "W": 56},
        {"N": 2, "G": 3, "CG": 2, "H": 5, "W": 6}),
    _dl("instancenorm", _IMAGES, _IMAGES_TEST),
    _dl("batchnorm_stats", {"N": 32, "C": 64, "H": 56, "W": 56}, {"N": 3, "C": 4, "H": 5, "W": 6}),
    _dl("layernorm_backward", _NORM, _ROWS_TEST),
    _dl("batchnorm_backward", _IMAGES, {"N": 3, "C": 4, "H": 5, "W": 6}),
    # softmax and what is built on it
    _dl("softmax", _ROWS, _ROWS_TEST, example="softmax.c"),
    _dl("softmax_fmaxf", _ROWS, _ROWS_TEST),
    _dl("softmax_ternary", _ROWS, _ROWS_TEST),
    _dl("softmax_online", _ROWS, _ROWS_TEST),
    _dl("log_softmax", _ROWS, _ROWS_TEST),
    _dl("cross_entropy", {"N": 128, "V": 32000}, {"N": 6, "V": 40}),
    _dl("attention", _ATTENTION, _ATTENTION_TEST),
    _dl("attention_causal", _ATTENTION, _ATTENTION_TEST),
    _dl("rope_tables", _ROPE, _ROPE_TEST),
    _dl("rope_computed", _ROPE, _ROPE_TEST),
    # gathers and scatters, pooling with its positions
    _dl("embedding", _TOKENS, _TOKENS_TEST),
    _dl("embedding_backward", _TOKENS, _TOKENS_TEST),
    _dl("maxpool_argmax", {"N": 128, "C": 64, "P": 28, "Q": 28}, {"N": 2, "C": 3, "P": 3, "Q": 4}),
    # optimiser steps
    _dl("sgd_momentum", {"N": 1 << 24}, {"N": 50}),
    _dl("adam", {"N": 1 << 21, "t": 10}, {"N": 50, "t": 3}),
    _dl("adamw", {"N": 1 << 21, "t": 10}, {"N": 50, "t": 3}),
    # data movement
    _dl("transpose_2d", {"N": 3072, "M": 768}, {"N": 7, "M": 9}),
    _dl("nchw_to_nhwc", _IMAGES, _IMAGES_TEST),
    _dl("im2col", {"C": 256, "H": 56, "W": 56}, {"C": 2, "H": 5, "W": 6}),
    _dl("cumsum_rows", _ROWS_MANY, _ROWS_TEST),
    _dl("cumsum_local", _ROWS_MANY, _ROWS_TEST),
    # convolutions and products
    _dl("depthwise_conv3x3", _IMAGES, _IMAGES_TEST),
    _dl("batched_gemm", {"B": 16, "M": 256, "N": 256, "K": 256}, {"B": 2, "M": 5, "N": 6, "K": 7}),
    _dl("linear_bias_relu", {"N": 64, "C": 768, "K": 768}, {"N": 6, "C": 20, "K": 12},
        example="linear_bias_relu.c"),
]

CORPUS: dict[str, CorpusKernel] = {k.name: k for k in (*_POLYBENCH, *_DL)}


def kernels_of(suite: str) -> list[str]:
    """The kernels of a suite, in the table's order.

    Args:
        suite: "dl", "polybench" or "all".

    Returns:
        The kernels' names.

    Raises:
        PolyDLError: an unknown suite.
    """
    if suite == "all":
        return list(CORPUS)
    if suite not in SUITES:
        raise PolyDLError(f"unknown suite {suite!r}; known: all, {', '.join(SUITES)}")
    return [name for name, k in CORPUS.items() if k.suite == suite]
