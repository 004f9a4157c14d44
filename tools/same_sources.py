"""Does a change leave the generated code alone? Lowers every case of the benchmark suites and
the examples, for CPU presets and both GPU kinds, and writes each case's generated text
(source, header, launcher, flags) to a folder; `compare` reports the cases whose text differs.

    python tools/same_sources.py write DIR [--jobs 2] [--only SUBSTRING]
    python tools/same_sources.py compare BEFORE AFTER [--renamed OLD=NEW ...]

Run `write` on the tree before a refactoring and after it, then `compare`. Nothing is compiled
or timed: kernels go through `polydl`'s public builders, with the native build replaced by
the lowering alone, in an empty cache (no stored lowering, no tuning database).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CPU_PRESETS = ("x86-64-v3", "x86-64-v4", "sapphirerapids", "generic")
BLOCKED_PRESETS = ("x86-64-v3", "sapphirerapids")  # the backward and variant suites

Case = tuple[str, Callable[[], Any]]


def _isolate() -> None:
    """An empty cache and no tuning databases, so every case is lowered afresh."""
    scratch = tempfile.mkdtemp(prefix="polydl-same-sources-")
    os.environ["POLYDL_CACHE_DIR"] = scratch
    os.environ["POLYDL_TUNING_DB"] = str(Path(scratch) / "tuning.sqlite")
    os.environ["POLYDL_SYSTEM_DB"] = ""
    os.environ["POLYDL_COST_MODEL"] = str(Path(scratch) / "costmodel.txt")
    os.environ["POLYDL_GPU_TILES"] = "1"


def _lowering_only() -> None:
    """`pipeline.build_kernel` (what every public builder ends in) returns the lowering."""
    from polydl.driver import pipeline

    def lower(nest: Any, params: Any, target: Any, schedule: Any = "auto", **_: Any) -> Any:
        return pipeline.lower(nest, params, target, schedule)

    pipeline.build_kernel = lower  # type: ignore[assignment]


def _text(code: Any) -> str:
    parts = {name: getattr(code, name, None) for name in (
        "function", "source", "header", "launcher", "compile_flags", "target_flags",
        "fallback_flags", "kept")}
    return json.dumps(parts, indent=1, default=repr, sort_keys=True)


# ------------------------------------------------------------------------------ the cases
def _suite(name: str) -> dict[str, Any]:
    from polydl.bench.cases import SUITES_DIR

    return json.loads((SUITES_DIR / name).read_text())


def _conv_sizes(layer: dict[str, Any]) -> dict[str, int]:
    return {k: layer[k] for k in ("C", "K", "H", "W", "R", "S", "stride", "padding")}


def cpu_cases() -> list[Case]:
    import polydl

    cases: list[Case] = []
    conv = _suite("resnet50_conv.json")["layers"]
    for preset in CPU_PRESETS:
        for shape in [*_suite("gemm.json")["shapes"], *_suite("gemm_reductions.json")["shapes"]]:
            m, n, k = shape["M"], shape["N"], shape["K"]
            cases.append((f"c/{preset}/gemm/{shape['name']}",
                          lambda m=m, n=n, k=k, p=preset: polydl.matmul(m, n, k, machine=p)))
            cases.append((f"c/{preset}/gemm_kept/{shape['name']}",
                          lambda m=m, n=n, k=k, p=preset: polydl.matmul(
                              m, n, k, machine=p, constant=("B",))))
        for layer in conv:
            sizes = _conv_sizes(layer)
            layouts = ["nchw16c", "nchw"] + (["nchw-nchw16c"] if layer["C"] < 16 else [])
            for layout in layouts:
                x_layout, _, y_layout = layout.partition("-")
                for batch in (2, 32):
                    cases.append((f"c/{preset}/conv/{layout}/n{batch}/{layer['name']}",
                                  lambda s=sizes, x=x_layout, y=y_layout, b=batch, p=preset:
                                  polydl.conv2d(N=b, **s, layout=x, out_layout=y or None,
                                                machine=p)))
                cases.append((f"c/{preset}/conv_kept/{layout}/{layer['name']}",
                              lambda s=sizes, x=x_layout, y=y_layout, p=preset: polydl.conv2d(
                                  N=2, **s, layout=x, out_layout=y or None, machine=p,
                                  constant=("w",))))
    for preset in BLOCKED_PRESETS:
        for layer in conv:
            sizes = _conv_sizes(layer)
            for layout in ("nchw16c", "nchw"):
                for build in ("conv2d_backward_data", "conv2d_backward_weights"):
                    cases.append((f"c/{preset}/{build}/{layout}/{layer['name']}",
                                  lambda s=sizes, lay=layout, f=build, p=preset: getattr(
                                      polydl, f)(N=2, **s, layout=lay, machine=p)))
                cases.append((f"c/{preset}/fused/{layout}/{layer['name']}",
                              lambda s=sizes, lay=layout, p=preset: polydl.conv2d(
                                  N=2, **s, layout=lay, fuse=("bias", "relu"), machine=p)))
                cases.append((f"c/{preset}/fused_kept/{layout}/{layer['name']}",
                              lambda s=sizes, lay=layout, p=preset: polydl.conv2d(
                                  N=2, **s, layout=lay, fuse=("bias", "scale_shift", "residual",
                                                              "relu"),
                                  machine=p, constant=("w",))))
            cases.append((f"c/{preset}/bf16/nchw16c/{layer['name']}",
                          lambda s=sizes, p=preset: polydl.conv2d(
                              N=2, **s, layout="nchw16c", dtype="bfloat16", machine=p)))
            cases.append((f"c/{preset}/bf16_kept/nchw16c/{layer['name']}",
                          lambda s=sizes, p=preset: polydl.conv2d(
                              N=2, **s, layout="nchw16c", dtype="bfloat16", machine=p,
                              constant=("w",))))
    return cases


def general_cases() -> list[Case]:
    import polydl
    from polydl.bench.general import SIZES, kernel_path

    cases: list[Case] = []
    for preset in CPU_PRESETS:
        for name, (big, small) in SIZES.items():
            path = str(kernel_path(name))
            for label, sizes in (("bench", big), ("small", small)):
                cases.append((f"c/{preset}/general/{label}/{name}",
                              lambda path=path, s=sizes, p=preset: polydl.compile(
                                  path, s, machine=p)))
    return cases


EXAMPLE_SIZES = {
    "matmul.c": {"M": 512, "N": 512, "K": 512},
    "batched_matmul.c": {"B": 8, "M": 128, "N": 96, "K": 64},
    "gemm_blas.c": {"M": 256, "N": 192, "K": 128},
    "wavefront.c": {"N": 500},
}


def example_cases() -> list[Case]:
    import polydl

    cases: list[Case] = []
    for preset in CPU_PRESETS:
        for name, sizes in EXAMPLE_SIZES.items():
            path = str(ROOT / "examples" / name)
            cases.append((f"c/{preset}/examples/{name}",
                          lambda path=path, s=sizes, p=preset: polydl.compile(
                              path, s, machine=p)))
        for name in ("conv2d.toml", "conv2d_bias_relu.toml"):
            path = str(ROOT / "examples" / name)
            cases.append((f"c/{preset}/examples/{name}",
                          lambda path=path, p=preset: polydl.compile(path, machine=p)))
        widths = (784, 512, 256, 10)
        for i, (c, k) in enumerate(zip(widths, widths[1:], strict=False)):
            fuse = ("bias",) if i == 2 else ("bias", "relu")
            cases.append((f"c/{preset}/examples/mlp/linear{i}",
                          lambda c=c, k=k, f=fuse, p=preset: polydl.linear(
                              N=64, C=c, K=k, fuse=f, machine=p)))
            cases.append((f"c/{preset}/examples/mlp/linear_bwd_data{i}",
                          lambda c=c, k=k, p=preset: polydl.linear_backward_data(
                              N=64, C=c, K=k, machine=p)))
            cases.append((f"c/{preset}/examples/mlp/linear_bwd_weights{i}",
                          lambda c=c, k=k, p=preset: polydl.linear_backward_weights(
                              N=64, C=c, K=k, machine=p)))
    return cases


def gpu_cases() -> list[Case]:
    import importlib.util

    from polydl.api import build_kernel

    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "benchmarks" / "gpu.py")
    assert spec is not None and spec.loader is not None
    gpu_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_bench)

    cases: list[Case] = []
    for case in gpu_bench.all_cases():
        target = gpu_bench.TF32 if case.get("tf32") else "cuda"
        cases.append((f"cuda/{case['set']}/{case['name']}",
                      lambda c=case, t=target: build_kernel(c["nest"], c["params"], target=t)))
        if not case.get("tf32") and case["dtype"] == "float32" and case["set"] in (
                "gemm", "conv2", "fused32"):
            cases.append((f"hip/{case['set']}/{case['name']}",
                          lambda c=case: build_kernel(c["nest"], c["params"], target="hip")))
    return cases


def onnx_cases() -> list[Case]:
    cases: list[Case] = []
    for preset in ("x86-64-v3", "sapphirerapids"):
        for model, options in (("resnet18", {"width": 0.25, "image_size": 64}),
                               ("mobilenet_v2", {"width": 0.5, "image_size": 64}),
                               ("resnext50_32x4d", {"width": 0.25, "image_size": 64})):
            cases.append((f"onnx/{preset}/{model}",
                          lambda m=model, o=options, p=preset: _network(m, o, p)))
    return cases


def _network(model: str, options: dict[str, Any], preset: str) -> str:
    from polydl import onnx as pd_onnx
    from polydl.codegen.c.network import network_source
    from polydl.onnx import zoo
    from polydl.target import resolve_target

    target = resolve_target("c", preset)
    proto = zoo.MODELS[model](batch=2, **options)
    plan, codes, _, _, _ = pd_onnx._lowered(proto, None, None, target, 1)
    kernels = "\n".join(_text(codes[name]) for name in sorted(codes))
    network = network_source(plan, codes, target.describe())
    return "\n".join((network.function, network.source, network.header, kernels))


GROUPS: dict[str, Callable[[], list[Case]]] = {
    "cpu": cpu_cases, "general": general_cases, "examples": example_cases, "gpu": gpu_cases,
    "onnx": onnx_cases,
}


# ------------------------------------------------------------------------------ running them
def _all_cases() -> dict[str, Callable[[], Any]]:
    cases: dict[str, Callable[[], Any]] = {}
    for group in GROUPS.values():
        for name, make in group():
            assert name not in cases, name
            cases[name] = make
    return cases


_CASES: dict[str, Callable[[], Any]] = {}


def _init() -> None:
    _isolate()
    _lowering_only()
    _CASES.update(_all_cases())


def _run(name: str) -> tuple[str, str, float]:
    t0 = time.perf_counter()
    try:
        result = _CASES[name]()
        text = result if isinstance(result, str) else _text(result.code)
    except Exception as exc:  # a refused case is part of the record too
        text = f"error: {type(exc).__name__}: {exc}"
    # a spec's path is named in its kernel's comments: the same file in another checkout
    return name, text.replace(str(ROOT), "<ROOT>"), time.perf_counter() - t0


def _file_name(case: str) -> str:
    return case.replace("/", "__")


def write(folder: Path, jobs: int, only: list[str]) -> int:
    _init()
    names = [n for n in _CASES if not only or any(o in n for o in only)]
    folder.mkdir(parents=True, exist_ok=True)
    index: dict[str, str] = {}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs, initializer=_init) as pool:
        for done, (name, text, seconds) in enumerate(pool.map(_run, names), 1):
            (folder / _file_name(name)).write_text(text)
            index[name] = hashlib.sha256(text.encode()).hexdigest()
            flag = " (error)" if text.startswith("error:") else ""
            print(f"[{done}/{len(names)}] {name} {seconds:.1f} s{flag}", flush=True)
    (folder / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
    print(f"{len(names)} cases in {time.perf_counter() - t0:.0f} s -> {folder}")
    return 0


def compare(before: Path, after: Path, renamed: list[str]) -> int:
    """`renamed`: OLD=NEW texts replaced in the before side first (a module file that moved,
    named in a comment the generated code carries)."""
    old = json.loads((before / "index.json").read_text())
    new = json.loads((after / "index.json").read_text())
    missing = sorted(set(old) - set(new))
    added = sorted(set(new) - set(old))
    pairs = [tuple(r.split("=", 1)) for r in renamed]

    def same(name: str) -> bool:
        if old[name] == new[name]:
            return True
        text = (before / _file_name(name)).read_text()
        for was, now in pairs:
            text = text.replace(was, now)
        return text == (after / _file_name(name)).read_text()

    changed = sorted(n for n in set(old) & set(new) if not same(n))
    through_renames = sum(old[n] != new[n] for n in set(old) & set(new)) - len(changed)
    errors = sum((after / _file_name(n)).read_text().startswith("error:") for n in new)
    for name in changed:
        print(f"differs: {name}")
    for name in missing:
        print(f"missing after: {name}")
    for name in added:
        print(f"new after: {name}")
    same_count = len(set(old) & set(new)) - len(changed)
    renames = f" ({through_renames} through the renamed paths)" if pairs else ""
    print(f"{same_count} of {len(old)} cases byte-identical{renames}; {len(changed)} differ, "
          f"{len(missing)} missing, {len(added)} new ({errors} record a refusal, identically on "
          f"both sides)" if not changed else
          f"{same_count} of {len(old)} cases byte-identical{renames}; {len(changed)} differ")
    return 1 if changed or missing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="lower every case and write its generated text to DIR")
    w.add_argument("dir", type=Path)
    w.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    w.add_argument("--only", action="append", default=[], help="cases whose name has this")
    c = sub.add_parser("compare", help="the cases whose text differs between two folders")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--renamed", action="append", default=[], metavar="OLD=NEW",
                   help="a path that moved, named in generated comments: OLD in BEFORE reads NEW")
    args = parser.parse_args()
    if args.command == "write":
        return write(args.dir, args.jobs, args.only)
    return compare(args.before, args.after, args.renamed)


if __name__ == "__main__":
    sys.exit(main())
