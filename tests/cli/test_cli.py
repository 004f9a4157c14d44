"""The `polydl` command line end to end, including an ahead-of-time library used from plain C."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from polydl.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_run_verifies_and_prints_gflops(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(EXAMPLES / "matmul.c"), "-p", "M=33", "-p", "N=17", "-p", "K=9", "--repeat", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "verify   ok" in out and "GFLOP/s" in out


def test_python_m_polydl_is_the_command_line() -> None:
    """Where pip put the `polydl` script off PATH (a --target install), `python -m polydl`."""
    done = subprocess.run([sys.executable, "-m", "polydl", "machine"], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert "cores" in done.stdout


@pytest.mark.slow
def test_run_verifies_at_reduced_sizes_where_the_reference_would_take_minutes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "floyd.c"
    spec.write_text("""void floyd(int N, double p[N][N]) {
  for (int k = 0; k < N; k++)
    for (int i = 0; i < N; i++)
      for (int j = 0; j < N; j++)
        p[i][j] = p[i][j] < p[i][k] + p[k][j] ? p[i][j] : p[i][k] + p[k][j];
}""")
    assert main(["run", str(spec), "-p", "N=128", "--repeat", "1"]) == 0
    assert "verify   ok" in (out := capsys.readouterr().out) and "reduced sizes N=32" in out


@pytest.mark.parametrize(
    "example, params",
    [
        ("matmul.c", ["M=64", "N=48", "K=40"]),
        ("linear_bias_relu.c", ["N=4", "C=37", "K=20"]),
        ("wavefront.c", ["N=40"]),
        ("gemm_blas.c", ["M=30", "N=20", "K=12"]),
        ("jacobi2d.c", ["T=3", "N=40"]),
        ("softmax.c", ["N=5", "D=33"]),
        ("conv2d.toml", ["N=1", "H=8", "W=8", "C=5", "K=6"]),
        ("conv2d_bias_relu.toml", ["N=1", "H=9", "W=7", "C=3", "K=4"]),
    ],
)
@pytest.mark.slow
def test_every_example_runs_and_verifies(example: str, params: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", str(EXAMPLES / example), "--repeat", "1"]
    for p in params:
        argv += ["-p", p]
    assert main(argv) == 0
    assert "verify   ok" in capsys.readouterr().out


def test_explain_shows_domains_accesses_dependences_and_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(EXAMPLES / "matmul.c"), "-p", "M=16", "-p", "N=16", "-p", "K=16"]) == 0
    out = capsys.readouterr().out
    for word in ("domain", "read", "write", "dependences", "schedule", "working set"):
        assert word in out


def test_compile_to_stdout_prints_c(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", str(EXAMPLES / "matmul.c"), "-p", "M=4", "-p", "N=4", "-p", "K=4"]) == 0
    assert "int matmul(" in capsys.readouterr().out


def test_aot_library_is_callable_from_plain_c(tmp_path: Path) -> None:
    out = tmp_path / "out"
    m, n, k = 7, 5, 3
    assert main(
        ["compile", str(EXAMPLES / "matmul.c"), "-p", f"M={m}", "-p", f"N={n}", "-p", f"K={k}", "-o", str(out)]
    ) == 0
    assert {p.name for p in out.iterdir()} == {"matmul.c", "matmul.h", "libmatmul.so"}
    program = tmp_path / "main.c"
    program.write_text(
        f"""
#include <stdio.h>
#include "matmul.h"
int main(void) {{
  float A[{m}][{k}], B[{k}][{n}], C[{m}][{n}] = {{{{0}}}};
  for (int i = 0; i < {m}; i++) for (int p = 0; p < {k}; p++) A[i][p] = (float)(i + p);
  for (int p = 0; p < {k}; p++) for (int j = 0; j < {n}; j++) B[p][j] = (float)(p - j);
  if (matmul(&C[0][0], &A[0][0], &B[0][0]) != 0) return 1;
  for (int i = 0; i < {m}; i++) {{ for (int j = 0; j < {n}; j++) printf("%g ", C[i][j]); printf("\\n"); }}
  return 0;
}}
"""
    )
    exe = tmp_path / "main"
    subprocess.run(
        ["cc", str(program), f"-I{out}", f"-L{out}", "-lmatmul", f"-Wl,-rpath,{out}", "-o", str(exe)],
        check=True,
    )
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = np.array([[float(v) for v in line.split()] for line in printed.strip().splitlines()])
    a = np.add.outer(np.arange(m), np.arange(k)).astype(np.float64)
    b = np.subtract.outer(np.arange(k), np.arange(n)).astype(np.float64)
    np.testing.assert_allclose(got, a @ b)


def test_spec_error_shows_position_source_line_and_caret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.c"
    bad.write_text("void f(int N, float A[N]) {\n  for (int i = 0; i < N; i++)\n    A[i * i] = 1.0f;\n}\n")
    assert main(["compile", str(bad), "-p", "N=4"]) == 1
    err = capsys.readouterr().err.rstrip().splitlines()
    assert len(err) == 3 and err[0].startswith(f"polydl: {bad}:3:7: error:")
    assert err[1:] == ["      A[i * i] = 1.0f;", "  " + " " * 6 + "^"]


def test_bad_parameter_syntax(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(EXAMPLES / "matmul.c"), "-p", "M"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err


def test_missing_parameter_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", str(EXAMPLES / "matmul.c"), "-p", "M=4", "-p", "N=4"]) == 1
    assert "K" in capsys.readouterr().err


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "no/such/spec.c"]) == 1
    assert "no/such/spec.c" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_exit_status(tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "polydl.cli", "compile", str(EXAMPLES / "wavefront.c"), "-p", "N=8"],
        capture_output=True, text=True,
    )
    assert ok.returncode == 0 and "int wavefront(" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "polydl.cli", "compile", str(tmp_path / "none.c")],
        capture_output=True, text=True,
    )
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1


def test_aot_library_keeps_a_constant_input_packed_until_told(tmp_path: Path) -> None:
    """`--constant B`: the library packs B at the first call and reads that copy after; a
    change in place shows once the program calls `matmul_constants_changed()`."""
    out = tmp_path / "out"
    m, n, k = 2, 1000, 2048  # a classifier's shape: B is packed only because it is kept
    assert main(["compile", str(EXAMPLES / "matmul.c"), "-p", f"M={m}", "-p", f"N={n}",
                 "-p", f"K={k}", "--machine", "x86-64-v3", "--constant", "B", "-o", str(out)]) == 0
    assert "void matmul_constants_changed(void);" in (out / "matmul.h").read_text()
    program = tmp_path / "main.c"
    program.write_text(f"""
#include <stdio.h>
#include <stdlib.h>
#include "matmul.h"
static float A[{m}][{k}], B[{k}][{n}], C[{m}][{n}];
static double total(void) {{
  double s = 0;
  for (int i = 0; i < {m}; i++) for (int j = 0; j < {n}; j++) {{ s += C[i][j]; C[i][j] = 0; }}
  return s;
}}
int main(void) {{
  for (int i = 0; i < {m}; i++) for (int p = 0; p < {k}; p++) A[i][p] = (float)((i + p) % 7);
  for (int p = 0; p < {k}; p++) for (int j = 0; j < {n}; j++) B[p][j] = (float)((p + 2 * j) % 5);
  if (matmul(&C[0][0], &A[0][0], &B[0][0])) return 1;
  printf("%.1f\\n", total());
  for (int p = 0; p < {k}; p++) for (int j = 0; j < {n}; j++) B[p][j] *= 2;
  if (matmul(&C[0][0], &A[0][0], &B[0][0])) return 1;
  printf("%.1f\\n", total());  /* the kept copy: unchanged */
  matmul_constants_changed();
  if (matmul(&C[0][0], &A[0][0], &B[0][0])) return 1;
  printf("%.1f\\n", total());  /* packed again: doubled */
  return 0;
}}
""")
    exe = tmp_path / "main"
    subprocess.run(["cc", str(program), f"-I{out}", f"-L{out}", "-lmatmul",
                    f"-Wl,-rpath,{out}", "-o", str(exe)], check=True)
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    a = np.add.outer(np.arange(m), np.arange(k)) % 7
    b = (np.arange(k)[:, None] + 2 * np.arange(n)[None, :]) % 5
    first = float((a.astype(np.float64) @ b).sum())
    assert [float(v) for v in printed.split()] == [first, first, 2 * first]


def test_a_constant_that_is_no_input_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", str(EXAMPLES / "matmul.c"), "-p", "M=4", "-p", "N=4", "-p", "K=4",
                 "--constant", "C"]) == 1
    assert "'C' is not an input array of matmul; its inputs: A, B" in capsys.readouterr().err
