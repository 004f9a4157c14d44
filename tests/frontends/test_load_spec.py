"""`load_spec`: paths or text, C or TOML, and the binding of size parameters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from polydl.errors import SourcePosition, SpecError
from polydl.frontends import builders, load_spec, parse_c

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SPEC = """\
void shift(int N, int M, float y[N - 2][M], const float x[N][M]) {
  for (int i = 0; i < N - 2; i++)
    for (int j = 0; j < M; j++)
      y[i][j] = x[i + 2][j];
}
"""


def column(text: str) -> int:
    """1-based column of `text` in the first line of SPEC."""
    return SPEC.splitlines()[0].index(text) + 1


def test_text_spec_binds_sizes_in_declaration_order() -> None:
    nest, params = load_spec(SPEC, {"M": 3, "N": np.int64(5)})
    assert list(params) == ["N", "M"] and params == {"N": 5, "M": 3}
    assert type(params["N"]) is int
    assert nest == parse_c(SPEC)
    assert nest.source == SPEC and nest.filename == "<spec>"


def test_path_spec_keeps_the_path_and_text(tmp_path: Path) -> None:
    path = tmp_path / "shift.c"
    path.write_text(SPEC)
    for spec in (path, str(path)):
        nest, params = load_spec(spec, {"N": 3, "M": 1})
        assert nest.filename == str(path) and nest.source == SPEC
        assert nest.array("x").position == SourcePosition(str(path), 1, column("x[N]"))


def test_examples_load() -> None:
    nest, params = load_spec(EXAMPLES / "matmul.c", {"M": 2, "N": 3, "K": 4})
    assert (nest, params) == builders.matmul(M=2, N=3, K=4)
    nest, params = load_spec(str(EXAMPLES / "conv2d_bias_relu.toml"), {"N": 1, "H": 9, "W": 7, "C": 3, "K": 4})
    assert params == {"N": 1, "C": 3, "K": 4, "H": 9, "W": 7, "R": 3, "S": 3}
    assert [a.name for a in nest.inputs] == ["x", "w", "b"]


def test_toml_text_and_files_without_suffix(tmp_path: Path) -> None:
    text = 'primitive = "matmul"\nM = 2\nN = 2\nK = 2\n'
    assert load_spec(text)[1] == {"M": 2, "N": 2, "K": 2}
    assert load_spec(text, {"K": 7})[1] == {"M": 2, "N": 2, "K": 7}
    plain = tmp_path / "spec"
    plain.write_text(text)
    assert load_spec(plain)[1] == {"M": 2, "N": 2, "K": 2}
    c_plain = tmp_path / "kernel"
    c_plain.write_text(SPEC)
    assert load_spec(c_plain, {"N": 3, "M": 1})[0].name == "shift"


def test_missing_size_points_at_its_declaration() -> None:
    with pytest.raises(SpecError) as info:
        load_spec(SPEC, {"N": 4})
    err = info.value
    assert (err.file, err.line, err.column) == ("<spec>", 1, column("M, float"))
    assert "'M'" in err.message


def test_unknown_size_lists_the_known_ones() -> None:
    with pytest.raises(SpecError) as info:
        load_spec(SPEC, {"N": 4, "M": 2, "K": 1})
    assert "'K'" in info.value.message and "N, M" in info.value.message


@pytest.mark.parametrize("value", [0, -3, True, 2.0, "4", None])
def test_size_values_must_be_positive_integers(value: object) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(SPEC, {"N": value, "M": 2})
    err = info.value
    assert (err.line, err.column) == (1, column("N, int"))
    assert "'N'" in err.message


def test_every_extent_must_be_positive() -> None:
    with pytest.raises(SpecError) as info:
        load_spec(SPEC, {"N": 2, "M": 2})
    err = info.value
    assert (err.line, err.column) == (1, column("y[N - 2]"))
    assert "extent" in err.message and "'y'" in err.message


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_spec("no/such/spec.c")
    assert info.value.file == "no/such/spec.c" and "no such file" in info.value.message
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path)
    assert "not a file" in info.value.message
    with pytest.raises(SpecError):
        load_spec(42)  # type: ignore[arg-type]


def test_errors_in_files_carry_the_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.c"
    path.write_text("void f(int N, float A[N]) {\n  for (int i = 0; i < N; i++)\n    A[i * i] = 1.0f;\n}\n")
    with pytest.raises(SpecError) as info:
        load_spec(path, {"N": 4})
    err = info.value
    assert (err.file, err.line, err.column) == (str(path), 3, 7)
    assert str(err).startswith(f"{path}:3:7: error:")
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text('primitive = "matmul"\nM = 1\nN = "x"\nK = 1\n')
    with pytest.raises(SpecError) as info:
        load_spec(bad_toml)
    assert (info.value.file, info.value.line, info.value.column) == (str(bad_toml), 3, 5)
