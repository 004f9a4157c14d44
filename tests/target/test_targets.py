"""Targets as values: presets, JSON descriptions, and code built for a machine other than this one.

The same bf16 GEMM is built for three presets; the disassembly of each library shows the
instruction set of its target whatever this machine has, and each library this CPU can run is
run against numpy.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import polydl
from polydl.cli import main
from polydl.errors import TargetError
from polydl.frontends import builders
from polydl.poly.model import build_model
from polydl.schedules.cpu.cost import evaluate
from polydl.schedules.cpu.rank import rank
from polydl.target import (
    CPU_PRESETS,
    CpuTarget,
    GpuTarget,
    host_target,
    load_target,
    resolve_target,
    target_from_dict,
)
from polydl.target.cpu import COST_FIELDS
from polydl.target.host import cannot_run_here

ROOT = Path(__file__).resolve().parents[2]
MATMUL = ROOT / "examples" / "matmul.c"


def _disassembly(library: Path) -> str:
    done = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)],
                          capture_output=True, text=True, check=True)
    return done.stdout


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump (binutils)")
@pytest.mark.parametrize(
    "preset, present, absent",
    [
        ("x86-64-v3", "ymm", ("zmm", "tdpbf16ps")),
        ("x86-64-v4", "zmm", ("tdpbf16ps",)),
        ("sapphirerapids", "tdpbf16ps", ()),
    ],
)
@pytest.mark.slow
def test_a_preset_decides_the_instruction_set_not_this_machine(
    preset: str, present: str, absent: tuple[str, ...]
) -> None:
    kernel = polydl.matmul(M=32, N=64, K=64, dtype="bfloat16", machine=preset)
    text = _disassembly(kernel.library_path)
    assert present in text
    for mnemonic in absent:
        assert mnemonic not in text
    a = np.random.default_rng(0).standard_normal((32, 64)).astype(ml_dtypes.bfloat16)
    b = np.random.default_rng(1).standard_normal((64, 64)).astype(ml_dtypes.bfloat16)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    if cannot_run_here(CPU_PRESETS[preset]):
        with pytest.raises(TargetError, match="cannot run on this CPU"):
            kernel(a, b)
    else:
        np.testing.assert_allclose(kernel(a, b), expected, rtol=2e-2, atol=1e-2)


def test_the_compiler_command_follows_the_target() -> None:
    kernel = polydl.compile(MATMUL, {"M": 16, "N": 16, "K": 16}, machine="x86-64-v3")
    command = (kernel.library_path.parent / "command.txt").read_text()
    assert "-march=x86-64-v3" in command and "-march=native" not in command
    assert "target: x86-64-v3" in kernel.source
    generic = polydl.compile(MATMUL, {"M": 16, "N": 16, "K": 16}, machine="generic")
    assert "-march" not in (generic.library_path.parent / "command.txt").read_text()
    assert "_mm" not in generic.source  # portable C, no intrinsics
    np.testing.assert_allclose(generic(np.ones((16, 16), np.float32), np.ones((16, 16), np.float32)),
                               np.full((16, 16), 16.0))


def test_sapphire_rapids_code_is_tuned_for_the_core_before_it() -> None:
    """gcc 13 scheduled a generated kernel for Sapphire Rapids in 10x the time it takes for
    Ice Lake; the instructions stay those of -march, and a target's own -mtune comes last."""
    spr = CPU_PRESETS["sapphirerapids"]
    assert spr.compile_flags()[:2] == ("-march=sapphirerapids", "-mtune=icelake-server")
    assert "-mamx-tile" in spr.compile_flags()
    assert not any(f.startswith("-mtune") for f in CPU_PRESETS["znver4"].compile_flags())
    assert not any(f.startswith("-mtune") for f in spr.portable_flags())
    assert replace(spr, cflags=("-mtune=generic",)).compile_flags()[-1] == "-mtune=generic"


def test_a_cpu_polydl_cannot_check_is_a_tune_not_a_march() -> None:
    """A CPU whose name the compiler knows but whose features polydl cannot check builds for the
    ISA's x86-64 level tuned for that CPU (generic tuning ran short loops 1.5x slower); the
    portable fallback drops the tune too, and the key and the description carry it."""
    odd = CpuTarget(name="vm", isa="avx512", tune="rocketlake")
    assert odd.compile_flags()[:2] == ("-march=x86-64-v4", "-mtune=rocketlake")
    assert not any(f.startswith("-mtune") for f in odd.portable_flags())
    assert odd.key() != replace(odd, tune="").key()
    assert "-mtune=rocketlake" in odd.describe()
    assert CpuTarget.from_dict(odd.to_dict()) == odd
    assert CpuTarget(tune="graniterapids").compile_flags()[1] == "-mtune=icelake-server"
    for bad in ("native", "-O0", "x; rm"):
        with pytest.raises(polydl.TargetError):
            CpuTarget(tune=bad)
    made_up = replace(odd, tune="zen99")
    with pytest.warns(polydl.ToolchainWarning, match="does not know -mtune=zen99"):
        kernel = polydl.matmul(M=8, N=8, K=8, machine=made_up)
    np.testing.assert_allclose(kernel(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32)),
                               np.full((8, 8), 8.0))


def test_cache_keys_include_the_target() -> None:
    v3 = polydl.matmul(M=24, N=24, K=24, machine="x86-64-v3")
    v4 = polydl.matmul(M=24, N=24, K=24, machine="x86-64-v4")
    assert v3.library_path != v4.library_path
    assert polydl.matmul(M=24, N=24, K=24, machine="x86-64-v3").library_path == v3.library_path


def test_the_ranking_follows_the_cache_sizes_of_the_target() -> None:
    """Same ISA and cores, other caches: a blocking moves more bytes from memory with the
    smaller caches, and the ranking picks another schedule for them."""
    model = build_model(*builders.matmul(512, 2048, 2048))
    small = CpuTarget(isa="avx2", cores=2, l1_bytes=16 * 1024, l2_bytes=128 * 1024,
                      l3_bytes=2 * 1024 * 1024)
    large = replace(small, l1_bytes=64 * 1024, l2_bytes=4 * 1024 * 1024, l3_bytes=64 * 1024 * 1024)
    best_small, best_large = rank(model, small)[0], rank(model, large)[0]
    assert best_small.schedule != best_large.schedule
    same = evaluate(model, small, best_large.schedule)
    assert same is not None
    assert same.traffic_bytes["l3"] > best_large.traffic_bytes["l3"]


def test_a_description_round_trips_through_json(tmp_path: Path) -> None:
    for preset in (*CPU_PRESETS.values(), resolve_target("cuda"), resolve_target("hip")):
        assert target_from_dict(json.loads(json.dumps(preset.to_dict()))) == preset
    path = tmp_path / "prod.json"
    path.write_text(json.dumps(host_target().to_dict()))
    loaded = load_target(path)
    assert loaded.name == "prod"  # a saved native description is named after its file
    assert replace(loaded, name="native") == host_target()


def test_polydl_machine_prints_a_description_that_compile_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["machine", "--json"]) == 0
    path = tmp_path / "server.json"
    path.write_text(capsys.readouterr().out)
    assert isinstance(load_target(path), CpuTarget)
    out = tmp_path / "out"
    assert main(["compile", str(MATMUL), "-p", "M=8", "-p", "N=8", "-p", "K=8",
                 "--machine", str(path), "-o", str(out)]) == 0
    assert "target: server" in (out / "matmul.c").read_text()
    assert main(["machine", "x86-64-v4"]) == 0
    assert "-march=x86-64-v4" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change, message",
    [
        ({"march": "native"}, "names whatever machine compiles"),
        ({"cflags": ["-fplugin=evil.so"]}, "not a machine option"),
        ({"cflags": ["-o/tmp/x"]}, "not a machine option"),
        ({"march": "x86-64 -o x"}, "not a -march name"),
        ({"isa": "neon"}, "unknown ISA"),
        ({"cores": 0}, "positive integer"),
        ({"l2_bytes": "1M"}, "positive integer"),
        ({"fork_join_cycles": 0}, "positive number"),
        ({"memory_bytes_per_cycle": "fast"}, "positive number"),
        ({"l1_bytes_per_cycle": True}, "positive number"),
        ({"colour": "red"}, "unknown field"),
        ({"kind": "tpu"}, "unknown target kind"),
    ],
)
def test_a_bad_description_is_a_clear_error(change: dict, message: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**CPU_PRESETS["x86-64-v3"].to_dict(), **change}))
    with pytest.raises(TargetError, match=message) as info:
        load_target(path)
    assert info.value.source == str(path)


def test_names_that_are_no_target_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="unknown machine 'skylake'"):
        resolve_target("c", "skylake")
    with pytest.raises(TargetError, match="describes a cuda target"):
        resolve_target("c", "hopper")
    with pytest.raises(TargetError, match="cannot read"):
        resolve_target("c", tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(TargetError, match="not JSON"):
        resolve_target("c", tmp_path / "bad.json")
    assert isinstance(resolve_target("cuda", "hopper"), GpuTarget)


def test_a_target_this_cpu_lacks_is_refused_by_run_not_executed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    foreign = next((p for p in CPU_PRESETS.values() if cannot_run_here(p)), None)
    if foreign is None:
        pytest.skip("this CPU runs every preset")
    status = main(["run", str(MATMUL), "-p", "M=8", "-p", "N=8", "-p", "K=8",
                   "--machine", foreign.name])
    err = capsys.readouterr().err
    assert status == 1 and "cannot run on this CPU" in err and len(err.strip().splitlines()) == 1


def test_an_unknown_march_falls_back_to_the_isa_level() -> None:
    """A compiler that does not know the target's -march builds for its x86-64 level."""
    odd = CpuTarget(name="future", isa="avx2", march="x86-64-v3", cflags=("-mtune=generic",))
    assert odd.portable_flags()[0] == "-march=x86-64-v3"
    made_up = replace(odd, march="znver99")
    with pytest.warns(polydl.ToolchainWarning, match="does not know -march=znver99"):
        kernel = polydl.matmul(M=8, N=8, K=8, machine=made_up)
    np.testing.assert_allclose(kernel(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32)),
                               np.full((8, 8), 8.0))


@pytest.mark.slow
def test_nothing_below_the_api_asks_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lowering for a given target never detects the running machine: the ranking, the
    microkernels and the code generator read the target value alone."""
    from polydl.api import lower
    from polydl.target import host

    def asked(*args: object) -> object:
        raise AssertionError("the running machine was asked for")

    monkeypatch.setattr(host, "host_target", asked)
    monkeypatch.setattr(host, "host_cpu_flags", asked)
    monkeypatch.setattr(host, "_detected", asked)
    for preset in ("x86-64-v3", "sapphirerapids"):
        nest, params = builders.conv2d(N=1, C=16, K=16, H=6, W=6, R=3, S=3, padding=1,
                                       fuse=("bias", "relu"), dtype="bfloat16")
        c = lower(nest, params, machine=CPU_PRESETS[preset])
        assert c.target is CPU_PRESETS[preset]
        assert f"target: {preset}" in c.code.source


def test_a_description_may_set_the_cost_figures(tmp_path: Path) -> None:
    """Bandwidths and fork and join come from the description, checked like the other fields;
    at their defaults they stay out of the key, so the presets' and the host's keys (caches,
    tuning databases) are those they had before the fields existed."""
    preset = CPU_PRESETS["x86-64-v3"]
    path = tmp_path / "slow.json"
    path.write_text(json.dumps({**preset.to_dict(), "memory_bytes_per_cycle": 4,
                                "fork_join_cycles": 26000}))
    slow = load_target(path)
    assert isinstance(slow, CpuTarget)
    assert (slow.memory_bytes_per_cycle, slow.fork_join_cycles) == (4.0, 26000.0)
    assert slow == replace(preset, memory_bytes_per_cycle=4.0, fork_join_cycles=26000.0)
    assert all(f not in json.loads(t.key()) for t in (preset, host_target()) for f in COST_FIELDS)
    assert json.loads(slow.key())["fork_join_cycles"] == 26000.0
    assert slow.key() != preset.key() and slow.describe() == preset.describe()
