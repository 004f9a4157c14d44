"""TOML primitive specs: what they build, and every refusal at the key or value it concerns."""

from __future__ import annotations

from pathlib import Path

import pytest

from polydl.errors import SpecError
from polydl.frontends import builders
from polydl.frontends.toml_spec import parse_toml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

MATMUL = 'primitive = "matmul"\nM = 4\nN = 5\nK = 6\n'
CONV = """\
primitive = "conv2d"
dtype = "float64"
layout = "nchw16c"
N = 1
C = 3
K = 5
H = 6
W = 7
R = 3
S = 3
stride = 2
padding = 1
fuse = ["bias", "relu"]
"""


def test_matmul_spec_builds_the_matmul_builder() -> None:
    nest, params = parse_toml(MATMUL, "mm.toml")
    assert (nest, params) == builders.matmul(M=4, N=5, K=6)
    assert params == {"M": 4, "N": 5, "K": 6}


def test_bfloat16_and_scale_shift_specs() -> None:
    text = CONV.replace('"float64"', '"bfloat16"').replace('["bias", "relu"]', '["scale_shift", "relu"]')
    nest, params = parse_toml(text, "conv.toml")
    assert (nest, params) == builders.conv2d(
        N=1, C=3, K=5, H=6, W=7, R=3, S=3, stride=2, padding=1, dtype="bfloat16",
        layout="nchw16c", fuse=("scale_shift", "relu"))
    assert {a.name: a.dtype for a in nest.parameters} == {
        "y": "float32", "x": "bfloat16", "w": "bfloat16", "scale": "float32", "shift": "float32"}


def test_conv2d_spec_passes_every_option() -> None:
    nest, params = parse_toml(CONV, "conv.toml")
    expected = builders.conv2d(
        N=1, C=3, K=5, H=6, W=7, R=3, S=3, stride=2, padding=1, dtype="float64", layout="nchw16c",
        fuse=("bias", "relu"),
    )
    assert (nest, params) == expected
    assert [a.name for a in nest.inputs] == ["x", "w", "b"]
    assert {a.dtype for a in nest.arrays} == {"float64"}


def test_overrides_replace_and_add_sizes() -> None:
    nest, params = parse_toml(MATMUL, "mm.toml", {"M": 2, "K": 9})
    assert params == {"M": 2, "N": 5, "K": 9}
    _, params = parse_toml('primitive = "matmul"\nN = 3\n', "mm.toml", {"M": 1, "K": 2})
    assert params == {"M": 1, "N": 3, "K": 2}


@pytest.mark.parametrize("example", ["conv2d.toml", "conv2d_bias_relu.toml"])
def test_examples_load(example: str) -> None:
    text = (EXAMPLES / example).read_text()
    nest, params = parse_toml(text, example, {"N": 1, "H": 8, "W": 8})
    assert params["N"] == 1 and params["H"] == 8
    assert nest.outputs[0].name == "y"


def located(marked: str) -> tuple[str, int, int]:
    offset = marked.index("$")
    line = marked.count("\n", 0, offset) + 1
    column = offset - (marked.rfind("\n", 0, offset) + 1) + 1
    return marked.replace("$", "", 1), line, column


ERRORS = [
    ("missing-primitive", "$M = 4\nN = 4\nK = 4\n", "primitive"),
    ("primitive-not-a-string", "primitive = $3\n", "primitive"),
    ("unknown-primitive", 'primitive = $"conv3d"\n', "conv3d"),
    ("unknown-key", 'primitive = "matmul"\nM = 1\n$bogus = 2\nN = 1\nK = 1\n', "bogus"),
    ("unknown-indented-key", 'primitive = "matmul"\nM = 1\n  $stride = 2\nN = 1\nK = 1\n', "stride"),
    ("unknown-quoted-key", 'primitive = "matmul"\n$"bad key" = 2\n', "bad key"),
    ("unknown-dotted-key", 'primitive = "matmul"\n$sizes.M = 2\n', "sizes"),
    ("unknown-table", 'primitive = "matmul"\nM = 1\n$[sizes]\nN = 1\n', "sizes"),
    ("string-size", 'primitive = "matmul"\nM = $"4"\nN = 1\nK = 1\n', "integer"),
    ("float-size", 'primitive = "matmul"\nM = 1\nN = $4.0\nK = 1\n', "integer"),
    ("bool-size", 'primitive = "matmul"\nM = 1\nN = 1\nK = $true\n', "integer"),
    ("integer-dtype", 'primitive = "matmul"\ndtype = $32\nM = 1\nN = 1\nK = 1\n', "string"),
    ("string-fuse", 'primitive = "conv2d"\nfuse =   $"relu"\n', "list"),
    ("number-list-fuse", 'primitive = "conv2d"\nfuse = $[1, 2]\n', "list"),
    ("missing-size", '$primitive = "matmul"\nM = 4\nN = 4\n', "K"),
    ("zero-size", 'primitive = "matmul"\nM = $0\nN = 1\nK = 1\n', ">= 1"),
    ("negative-padding", CONV.replace("padding = 1", "padding = $-1"), ">= 0"),
    ("unknown-layout", CONV.replace('layout = "nchw16c"', 'layout = $"nwhc"'), "layout"),
    ("duplicate-epilogue", CONV.replace('fuse = ["bias", "relu"]', 'fuse = $["bias", "bias"]'), "twice"),
    ("unknown-epilogue", CONV.replace('fuse = ["bias", "relu"]', 'fuse = $["gelu"]'), "gelu"),
    ("filter-too-large", CONV.replace("R = 3", "R = $9"), "empty"),
    ("syntax-missing-value", 'primitive = "matmul"\nM = $\nN = 1\n', "syntax"),
    ("syntax-two-values", 'primitive = "matmul"\nM = 1 $2\n', "syntax"),
    ("syntax-duplicate-key", 'primitive = "matmul"\nM = 1\nM = 2$\n', "syntax"),
    ("syntax-at-end", 'primitive = "matmul"\nM = [1,$', "syntax"),
]


@pytest.mark.parametrize("marked, keyword", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors_are_positioned(marked: str, keyword: str) -> None:
    text, line, column = located(marked)
    with pytest.raises(SpecError) as info:
        parse_toml(text, "p.toml")
    err = info.value
    assert (err.file, err.line, err.column) == ("p.toml", line, column), err.message
    assert keyword in err.message
    assert err.source_line == text.splitlines()[line - 1]


@pytest.mark.parametrize(
    "overrides, keyword",
    [
        ({"Q": 3}, "Q"),
        ({"dtype": 3}, "dtype"),
        ({"M": True}, "integer"),
        ({"M": "4"}, "integer"),
        ({"M": 0}, ">= 1"),
    ],
)
def test_bad_overrides_name_the_parameter(overrides: dict, keyword: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_toml(MATMUL, "mm.toml", overrides)
    err = info.value
    assert err.file == "mm.toml" and err.line == 0  # nothing in the file to point at
    assert keyword in err.message


def test_unknown_key_lists_the_known_ones() -> None:
    with pytest.raises(SpecError) as info:
        parse_toml('primitive = "matmul"\nL = 1\n', "p.toml")
    assert all(k in info.value.message for k in ("M", "N", "K", "dtype"))
