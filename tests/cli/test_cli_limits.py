"""The command line's limits and flags: errors shown as `SpecError` shows them, sizes beyond the
machine's memory, --debug and --version anywhere, explain on an ONNX model, --repeat at least 1,
GB/s for a kernel without flops, help on every option, and the exit status of each outcome."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import polydl.cli
from polydl.cli import all_parsers, check_memory, main, parser
from polydl.codegen.artifact import KernelArgument
from polydl.errors import ShapeError, SpecError
from polydl.frontends import load_spec
from polydl.runtime.kernel import bind_host
from polydl.version import __version__

ROOT = Path(__file__).resolve().parents[2]
MATMUL = str(ROOT / "examples" / "matmul.c")
SIZES = ["-p", "M=4", "-p", "N=4", "-p", "K=4"]
TRANSPOSE = """void transpose(int M, int N, float B[N][M], const float A[M][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      B[j][i] = A[i][j];
}
"""
FOR_WITHOUT_PAREN = """void f(int N, float y[N], const float x[N]) {
  for (int i = 0; i < N; i++ {
    y[i] = x[i];
  }
}
"""


@pytest.fixture
def transpose(tmp_path: Path) -> str:
    path = tmp_path / "transpose.c"
    path.write_text(TRANSPOSE)
    return str(path)


def test_a_spec_error_prints_as_spec_error_shows_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "loop.c"
    path.write_text(FOR_WITHOUT_PAREN)
    assert main(["run", str(path), "-p", "N=8"]) == 1
    printed = capsys.readouterr().err.rstrip("\n")
    with pytest.raises(SpecError) as info:
        load_spec(path, {"N": 8})
    assert printed == info.value.render(prefix="polydl: ") == f"polydl: {info.value}"
    assert printed.splitlines() == [
        f"polydl: {path}:2:7: error: syntax error: '(' is never closed (expected ')' before '{{' at 2:30)",
        "  " + FOR_WITHOUT_PAREN.splitlines()[1],
        "  " + " " * 6 + "^",
    ]


def test_sizes_beyond_the_machines_memory_are_a_shape_error(
    transpose: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", transpose, "-p", "M=10000000", "-p", "N=10000000"]) == 1
    err = capsys.readouterr().err
    assert "internal error" not in err and "MemoryError" not in err
    assert "argument 'B': float32[10000000, 10000000] is 400,000,000,000,000 bytes" in err


def test_the_memory_check_names_the_largest_array_and_the_bytes() -> None:
    arrays = [("x", "float32", (10,), 4), ("W", "float64", (20, 30), 8)]
    check_memory(arrays, memory=4840)  # exactly enough
    with pytest.raises(ShapeError) as info:
        check_memory(arrays, memory=4839)
    assert info.value.array == "W"
    assert info.value.given == "4,840 bytes (0.0 GiB)"
    assert "float64[20, 30] is 4,800 bytes" in info.value.message


def test_an_output_too_large_to_allocate_names_its_bytes() -> None:
    huge = KernelArgument("C", "float32", (10_000_000, 10_000_000), False, "float")
    with pytest.raises(ShapeError) as info:
        bind_host((huge,), {})
    assert info.value.array == "C"
    assert "float32[10000000, 10000000] is 400,000,000,000,000 bytes" in info.value.message


@pytest.mark.parametrize("argv", [
    ["--debug", "compile", MATMUL, "-p", "M=0", "-p", "N=4", "-p", "K=4"],
    ["compile", MATMUL, "--debug", "-p", "M=0", "-p", "N=4", "-p", "K=4"],
    ["compile", MATMUL, "-p", "M=0", "-p", "N=4", "-p", "K=4", "--debug"],
])
def test_debug_before_or_after_the_subcommand_raises(argv: list[str]) -> None:
    with pytest.raises(SpecError):
        main(argv)


def test_without_debug_nothing_raises() -> None:
    assert parser().parse_args(["compile", MATMUL]).debug is False
    assert parser().parse_args(["db", "list", "--debug"]).debug is True


@pytest.mark.parametrize("argv", [["--version"], ["run", "--version"], ["db", "list", "--version"],
                                  ["explain", MATMUL, "--version"]])
def test_version_anywhere(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 0
    assert capsys.readouterr().out == f"polydl {__version__}\n"


@pytest.mark.parametrize("argv", [
    ["run", MATMUL, *SIZES, "--repeat", "0"],
    ["run", MATMUL, *SIZES, "--repeat", "-2"],
    ["bench", "--repeat", "0"],
    ["run", "model.onnx", "--batch", "0"],
    ["compile", "model.onnx", "--images-per-pass", "-1"],
])
def test_counts_below_one_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "must be at least 1" in capsys.readouterr().err


def test_a_kernel_without_flops_reports_bandwidth(transpose: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", transpose, "-p", "M=48", "-p", "N=40", "--repeat", "2"]) == 0
    perf = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("perf"))
    assert "GFLOP/s" not in perf
    assert perf.endswith(f" GB/s ({2 * 48 * 40 * 4} bytes read and written per call; no flops)")


def test_every_option_and_subcommand_has_help() -> None:
    missing = []
    for each in all_parsers(parser()):
        for action in each._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {choice.dest for choice in action._choices_actions if choice.help}
                missing += [f"{each.prog} {name}" for name in action.choices if name not in helped]
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{each.prog} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def _internal_error(args: argparse.Namespace) -> int:
    raise RuntimeError("a bug")


def _interrupted(args: argparse.Namespace) -> int:
    raise KeyboardInterrupt


@pytest.mark.parametrize("argv, status", [
    (["machine"], 0),
    (["compile", MATMUL, "-p", "M=0", "-p", "N=4", "-p", "K=4"], 1),  # a spec error
    (["compile", "no/such.c"], 1),
    (["frobnicate"], 2),  # argparse's
    (["run", MATMUL, "-p", "M"], 2),  # a malformed -p
    (["run", MATMUL, *SIZES, "-p", "Z=2"], 1),  # a size the spec does not have
    (["run", MATMUL, *SIZES, "--batch", "2"], 1),  # an option for networks, given a loop nest
    (["tune", MATMUL, *SIZES, "--trials", "0"], 2),  # a usage error, before anything is measured
    (["tune", MATMUL, *SIZES, "--workers", "0"], 2),
])
def test_exit_status(argv: list[str], status: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == status
    err = capsys.readouterr().err
    assert (err == "") == (status == 0)


@pytest.mark.parametrize("command, status, said", [(_internal_error, 3, "internal error: RuntimeError"),
                                                   (_interrupted, 130, "interrupted")])
def test_exit_status_of_a_bug_and_an_interrupt(
    command: object, status: int, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(polydl.cli, "cmd_machine", command)
    assert main(["machine"]) == status
    assert said in capsys.readouterr().err


def _symbolic_batch_model(path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def test_explain_an_onnx_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.onnx"
    _symbolic_batch_model(path)
    assert main(["explain", str(path)]) == 1
    err = capsys.readouterr().err
    assert "--batch N" in err and "batch=" not in err
    assert main(["explain", str(path), "--batch", "2"]) == 0
    assert capsys.readouterr().out.startswith("network tiny: 2 steps, 1 distinct kernels")
    unnamed = tmp_path / "tiny.model"  # not named .onnx: its content is not text
    unnamed.write_bytes(path.read_bytes())
    assert main(["explain", str(unnamed), "--batch", "2"]) == 0
    assert capsys.readouterr().out.startswith("network tiny:")


def test_network_errors_name_the_command_lines_options() -> None:
    said = polydl.cli._as_command_line(ShapeError("images_per_pass", "must divide the batch of 6"))
    assert str(said) == "argument '--images-per-pass': must divide the batch of 6"
    said = polydl.cli._as_command_line(ShapeError("x", "batch=4 given, but the model fixes it at 1",
                                                  expected=1, given=4))
    assert said.message == "--batch 4 given, but the model fixes it at 1" and said.given == 4
