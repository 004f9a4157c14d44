"""The general-loop-nest benchmark's pieces: constant-size sources, one kernel's row (built,
refused), the distributions of the report and the driver's command line. Speed is the
benchmark's business, not asserted here; correctness per kernel is test_general_corpus."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import math
import os
import shutil
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from polydl.bench import general, general_report
from polydl.bench.general_corpus import CORPUS, kernels_of
from polydl.bench.general_signature import read_signature
from polydl.errors import PolyDLError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "general.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("general_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_constant_size_source_drops_the_size_parameters() -> None:
    source = "void f(int N, int M, double A[N][M], double s) { A[0][0] = s; }"
    out = general.constant_size_source(source, "f", {"N": 4, "M": 5})
    assert out == "void f(double A[N][M], double s) { A[0][0] = s; }"
    with pytest.raises(PolyDLError, match="size parameter 'int K,' not found in f's signature"):
        general.constant_size_source(source, "f", {"K": 4})
    with pytest.raises(PolyDLError, match="function g not found"):
        general.constant_size_source(source, "g", {"N": 4})


def test_a_kernel_row_is_built_checked_and_timed(tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    result = general.run_kernel("bias_leaky_relu", CORPUS["bias_leaky_relu"].sizes("test"),
                                ("polydl", "gcc", "gcc_fastmath"), 2, tmp_path, threads=1)
    assert result.status == "ok"
    assert set(result.ms) == {"polydl", "gcc", "gcc_fastmath"}
    assert result.errors["polydl"] <= 1e-6 and result.errors["gcc"] == 0.0


def test_a_refused_kernel_is_a_row_with_the_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    # a corpus kernel as a user might write it beyond what polydl accepts: a while loop
    spec = tmp_path / "gelu_tanh.c"
    spec.write_text(CORPUS["gelu_tanh"].path.read_text().replace(
        "  #pragma omp parallel for\n", "  int k = 0;\n  while (k < N) k++;\n  #pragma omp parallel for\n", 1))
    monkeypatch.setattr(general, "kernel_path", lambda name: spec)
    result = general.run_kernel("gelu_tanh", CORPUS["gelu_tanh"].sizes("test"),
                                ("polydl", "gcc"), 1, tmp_path)
    assert result.status.startswith(f"refused: {spec}:")
    assert "while and do loops are not allowed" in result.status
    assert set(result.ms) == {"gcc"}  # the reference is still timed


def _row(kernel: str, status: str = "ok", threads: int = 2, **ms: float) -> dict:
    return {"kernel": kernel, "suite": CORPUS[kernel].suite, "threads": threads,
            "status": status, "ms": ms, "notes": []}


def test_distribution_geomean_p10_lowest_and_slowest() -> None:
    rows = [_row(name, polydl=1.0, gcc=float(i + 1)) for i, name in enumerate(kernels_of("dl")[:12])]
    rows.append(_row("gemm", polydl=1.0, gcc=0.5))  # another suite: its own group
    rows.append(_row("embedding", "refused: x", gcc=1.0))
    rows.append(_row("softmax", "wrong: x", polydl=1.0, gcc=100.0))  # not a correct row
    d = general_report.distribution(rows[:12], "gcc")
    assert d is not None and d["count"] == 12
    assert d["geomean"] == pytest.approx(math.exp(sum(math.log(i) for i in range(1, 13)) / 12))
    assert d["p10"] == pytest.approx(1 + 0.1 * 11)  # linear between order statistics
    assert d["lowest"] == [rows[0]["kernel"], 1.0]
    assert [v for _, v in d["slowest"]] == [float(i) for i in range(1, 11)]
    assert general_report.distribution(rows, "polly") is None
    summary = general_report.summarise(rows)
    dl = summary["2 threads, dl"]
    assert (dl["kernels"], dl["ok"], dl["refused"], dl["wrong"]) == (14, 12, 1, 1)
    assert dl["distributions"]["gcc"]["count"] == 12
    assert summary["2 threads, polybench"]["distributions"]["gcc"]["geomean"] == 0.5
    text = "\n".join(general_report.summary_lines(summary))
    assert "ten slowest: " + rows[0]["kernel"] + " 1.00" in text


def test_table_row_shows_every_side_and_the_status() -> None:
    line = general_report.table_row(_row("softmax", polydl=2.0, gcc=4.0, torch=1.0))
    assert line.split()[:3] == ["softmax", "2", "2.000"]
    assert "2.00" in line and "0.50" in line and line.endswith("ok")


def test_thread_counts_parse_a_list() -> None:
    module = _script()
    assert module.thread_counts("1,2,16") == [1, 2, 16]
    for bad in ("", "0", "a,b"):
        with pytest.raises(Exception, match="expected thread counts"):
            module.thread_counts(bad)


def test_more_threads_than_cores_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(SystemExit) as exit_info:
        _script().main(["--kernels", "leaky_relu", "--threads", f"1,{cores + 1}"])
    assert exit_info.value.code == 2
    assert f"--threads {cores + 1}: this process may use {cores} cores" in capsys.readouterr().err


@pytest.mark.slow
def test_the_driver_writes_every_row_to_json(tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("runs 2 threads pinned to 2 cores")
    out = tmp_path / "general.json"
    code = _script().main(["--kernels", "leaky_relu,embedding", "--sizes", "test", "--rounds",
                           "1", "--threads", "1,2", "--json", str(out)])
    data = json.loads(out.read_text())
    assert code == 0
    assert [(r["kernel"], r["threads"]) for r in data["results"]] == [
        ("leaky_relu", 1), ("leaky_relu", 2), ("embedding", 1), ("embedding", 2)]
    assert data["machine"]["cpu"] and "gcc" in data["machine"]["versions"]
    summary = data["summary"]["1 threads, dl"]
    assert (summary["ok"], summary["refused"], summary["wrong"], summary["error"]) == (2, 0, 0, 0)


def test_loading_the_fast_math_build_keeps_subnormals_in_this_process(tmp_path: Path) -> None:
    """A library linked with -ffast-math by gcc before 13 flushes subnormals to zero in every
    process that loads it: the reference is linked without it."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    kernel = CORPUS["gelu_tanh"]
    signature = read_signature(kernel.path)
    lib = general.build_reference("gcc_fastmath", kernel.path, signature.function,
                                  kernel.sizes("test"), tmp_path)
    ctypes.CDLL(str(lib))
    assert np.float32(1e-40) * np.float32(1.0) != 0  # a subnormal float32 is not flushed
