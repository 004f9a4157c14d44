"""The `polydl` command line: compile, run, explain, tune, db, model, machine, bench, cache.

Every failure exits non-zero with one line on stderr; a spec error adds its source line and a
caret, as `SpecError` shows them (`--debug` shows the traceback). Exit status: 0 success, 1 a
polydl error, 2 a usage error, 3 an internal error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import codecs
import math
import os
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from polydl.bench import SUITE_FILES
from polydl.errors import CompileError, PolyDLError, ShapeError, SpecError, UsageError
from polydl.names import respell
from polydl.target.presets import PRESET_NAMES
from polydl.tuner.cli import add_model_command, add_tune_options, network_only_flags, positive_int
from polydl.tuner.db_cli import add_db_command
from polydl.version import __version__

USAGE_STATUS = 2  # argparse's own status for a malformed command line


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (usage stays available with --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"polydl: error: {message} (see '{self.prog} --help')\n")


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).strip().splitlines()
    print(f"polydl: warning: {text[0] if text else category.__name__}", file=file or sys.stderr)


def _params(values: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise UsageError(f"-p expects NAME=VALUE, got '{item}'")
        try:
            out[name] = int(value)
        except ValueError:
            raise UsageError(f"-p {name}: '{value}' is not an integer") from None
    return out


def _load(args: argparse.Namespace, kind: str = "c"):
    from polydl.frontends import load_spec

    onnx_only = network_only_flags(args)
    if onnx_only:
        raise PolyDLError(f"{', '.join(onnx_only)}: for ONNX networks, not for the loop nest "
                          f"{args.spec} (its sizes are -p NAME=VALUE)")
    # always a path: a file name with '=' or '{' is not the text of a spec
    nest, params = load_spec(Path(args.spec), _params(args.param) or None, args.function,
                             args.define, args.include_dir, target_kind=kind)
    return (nest.keeping(getattr(args, "constant", None) or ())
            .with_exact_math(getattr(args, "exact_math", False)), params)


def _target(args: argparse.Namespace, kind: str = "c"):
    from polydl.target import resolve_target

    return resolve_target(kind, args.machine)


def _lower(args: argparse.Namespace, kind: str = "c"):
    from polydl.driver.pipeline import lower

    target = _target(args, kind)
    nest, params = _load(args, kind)
    return lower(nest, params, target, getattr(args, "schedule", "auto"))


def _timed_calls(call: Callable[[], object], repeat: int) -> list[float]:
    """Seconds of `repeat` calls (argparse has made it at least one)."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return samples


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # a system without these names
        return None


def _bytes(n: int) -> str:
    return f"{n:,} bytes ({n / 2**30:,.1f} GiB)"


def check_memory(arrays: Sequence[tuple[str, str, tuple[int, ...], int]],
                 memory: int | None = None) -> None:
    """Refuse, before any is allocated, arrays (name, type, shape, bytes per element) that
    together exceed this machine's memory (`memory` bytes; default: its physical memory): a
    `ShapeError` naming the largest array and the bytes, not numpy's MemoryError."""
    memory = _physical_memory_bytes() if memory is None else memory
    sizes = [(math.prod(shape) * itemsize, name, kind, shape) for name, kind, shape, itemsize in arrays]
    total = sum(size for size, *_ in sizes)
    if memory is None or not sizes or total <= memory:
        return
    size, name, kind, shape = max(sizes, key=lambda s: s[0])
    raise ShapeError(name, f"{kind}{list(shape)} is {_bytes(size)}; the arrays together need "
                     "more than this machine's memory: give smaller sizes",
                     expected=f"at most {_bytes(memory)}", given=_bytes(total))


def _is_network(args: argparse.Namespace) -> bool:
    """An ONNX model: named .onnx, or a file of another name whose content is not text (a spec
    is C or TOML text, always)."""
    path = Path(args.spec)
    if path.suffix.lower() == ".onnx":
        return True
    if path.suffix.lower() in (".c", ".h", ".toml") or not path.is_file():
        return False
    try:
        with open(path, "rb") as file:
            head = file.read(4096)
    except OSError:
        return False
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head)
    except UnicodeDecodeError:
        return True
    return any(ch < " " and ch not in "\t\n\r\f\v" for ch in text)


# polydl.onnx's keywords as the command line spells them, for the errors it raises
_NETWORK_OPTIONS = {"batch": "--batch", "images_per_pass": "--images-per-pass", "name": "--name",
                    "schedule": "--schedule"}
_KEYWORD = re.compile(rf"\b({'|'.join(_NETWORK_OPTIONS)})=(\S*?)(?=[\s;,)]|$)")


def _as_command_line(exc: ShapeError) -> ShapeError:
    """A network's `ShapeError` in the command line's words: `--batch N`, not `batch=`."""
    def option(match: re.Match[str]) -> str:
        return f"{_NETWORK_OPTIONS[match.group(1)]} {match.group(2) or 'N'}"

    def spelled(value: object) -> object:
        return _KEYWORD.sub(option, value) if isinstance(value, str) else value

    array = _NETWORK_OPTIONS.get(exc.array, exc.array)
    return ShapeError(array, _KEYWORD.sub(option, exc.message), spelled(exc.expected),
                      spelled(exc.given))


def _network(args: argparse.Namespace) -> Any:
    """The compiled network the command names, its errors in the command line's words."""
    import polydl.onnx

    options = _network_options(args)
    try:
        return polydl.onnx.compile(Path(args.spec), **options)  # type: ignore[arg-type]
    except ShapeError as exc:
        raise _as_command_line(exc) from exc


def _network_options(args: argparse.Namespace) -> dict[str, object]:
    if args.param or args.define or args.include_dir or args.function:
        raise PolyDLError("-p, -D, -I and --function apply to loop-nest specs, not to an ONNX "
                          "network (its shapes are in the model; --batch fixes a symbolic batch)")
    options: dict[str, object] = {"machine": args.machine, "batch": args.batch,
                                  "winograd": not args.no_winograd,
                                  "images_per_pass": args.images_per_pass}
    if args.command != "tune":
        options.update(name=args.name, schedule=args.schedule)
    return options


def cmd_compile_network(args: argparse.Namespace) -> int:
    import polydl.onnx

    options = _network_options(args)
    if args.target != "c":
        raise PolyDLError(f"ONNX networks compile for the target 'c', not '{args.target}'")
    if args.output is None:
        print(_network(args).explain())
        return 0
    try:
        paths = polydl.onnx.write_library(Path(args.spec), Path(args.output),
                                          embed_weights=args.embed_weights, **options)  # type: ignore[arg-type]
    except ShapeError as exc:
        raise _as_command_line(exc) from exc
    for kind, path in paths.items():
        print(f"{kind:8s} {path}")
    return 0


def cmd_run_network(args: argparse.Namespace) -> int:
    network = _network(args)
    check_memory([(name, "float32", tuple(shape), 4) for name, shape in (*network.inputs, *network.outputs)])
    rng = np.random.default_rng(args.seed)
    inputs = [rng.standard_normal(shape).astype(np.float32) for _, shape in network.inputs]
    outputs = network(*inputs)
    samples = _timed_calls(lambda: network(*inputs), args.repeat)
    print(f"network  {network.function}: {', '.join(f'{n}{list(s)}' for n, s in network.inputs)}"
          f" -> {', '.join(f'{n}{list(s)}' for n, s in network.outputs)}")
    print(f"time     {float(np.median(samples)) * 1e3:.3f} ms (median of {len(samples)})")
    try:
        import onnxruntime
    except ImportError:
        print("verify   skipped: onnxruntime is not installed (pip install onnxruntime)")
        return 0
    session = onnxruntime.InferenceSession(Path(args.spec).read_bytes(),
                                           providers=["CPUExecutionProvider"])
    expected = session.run(None, {n: x for (n, _), x in zip(network.inputs, inputs, strict=True)})
    results = outputs if isinstance(outputs, tuple) else (outputs,)
    worst = max(float(np.max(np.abs(r - e)) / max(float(np.max(np.abs(e))), 1e-30))
                for r, e in zip(results, expected, strict=True))
    ok = worst <= 1e-4
    print(f"verify   {'ok' if ok else 'FAILED'} (max error {worst:.2e} relative to the largest "
          "output, vs onnxruntime)")
    if not ok:
        raise PolyDLError(f"result differs from onnxruntime (max relative error {worst:.2e})")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    if _is_network(args):
        return cmd_compile_network(args)
    compilation = _lower(args, args.target)
    if args.output is None:
        sys.stdout.write(compilation.code.source)
        return 0
    from polydl.driver.aot import write_artifacts

    paths = write_artifacts(compilation.code, Path(args.output))
    for kind, path in paths.items():
        print(f"{kind:8s} {path}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if _is_network(args):
        return cmd_run_network(args)
    from polydl.driver.pipeline import build_kernel
    from polydl.driver.verification import verification_sizes
    from polydl.runtime.inputs import random_inputs
    from polydl.runtime.kernel import NUMPY_DTYPES
    from polydl.runtime.verify import compare
    from polydl.target.host import cannot_run_here

    target = _target(args)
    reason = cannot_run_here(target)
    if reason:
        raise PolyDLError(f"cannot run here: {reason}; `polydl compile --machine "
                          f"{args.machine} -o DIR` builds it for that machine")
    nest, params = _load(args)
    kernel = build_kernel(nest, params, target, args.schedule)
    check_memory([(a.spelling, a.dtype, a.shape, NUMPY_DTYPES[a.dtype].itemsize)
                  for a in kernel.arguments])
    inputs = random_inputs(kernel.arguments, seed=args.seed, index_checks=kernel.code.index_checks)
    outputs = kernel(*inputs)
    samples = _timed_calls(lambda: kernel(*inputs), args.repeat)
    seconds = float(np.median(samples))
    checked = verification_sizes(nest, params)
    if checked != dict(params):
        kernel_checked = build_kernel(nest, checked, target)
        inputs = random_inputs(kernel_checked.arguments, seed=args.seed,
                               index_checks=kernel_checked.code.index_checks)
        outputs = kernel_checked(*inputs)
        expected = kernel_checked.reference(*inputs)
    else:
        expected = kernel.reference(*inputs)
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    refs = expected if isinstance(expected, tuple) else (expected,)
    worst_ok, worst_err = True, 0.0
    for arg, out, ref in zip((a for a in kernel.arguments if not a.is_input), outs, refs, strict=True):
        ok, err = compare(out, ref, arg.dtype)
        worst_ok &= ok
        worst_err = max(worst_err, err)
    print(respell(f"kernel   {kernel.name} ({', '.join(f'{k}={v}' for k, v in kernel.params.items())})"))
    print(f"target   {target.describe()}")
    print(respell(f"schedule {kernel.schedule.describe()}"))
    where = ("" if checked == dict(params) else " at the reduced sizes "
             + respell(", ".join(f"{k}={v}" for k, v in checked.items()))
             + ": the reference's loops at full size would take minutes")
    print(f"verify   {'ok' if worst_ok else 'FAILED'} (max relative error {worst_err:.2e} vs numpy "
          f"reference{where})")
    print(f"time     {seconds * 1e3:.3f} ms (median of {len(samples)})")
    print(f"perf     {_speed(kernel, nest, seconds)}")
    if not worst_ok:
        raise PolyDLError(f"result differs from the reference (max relative error {worst_err:.2e})")
    return 0


def moved_bytes(kernel: Any, nest: Any) -> int:
    """The bytes a call moves at the least: each input read once, each output written once
    (and read once more where the nest reads it)."""
    from polydl.runtime.kernel import NUMPY_DTYPES

    read = {access.array for statement in nest.statements() for access in statement.reads}
    total = 0
    for arg in kernel.arguments:
        size = math.prod(arg.shape) * NUMPY_DTYPES[arg.dtype].itemsize
        total += size * (1 if arg.is_input or arg.identifier not in read else 2)
    return total


def _speed(kernel: Any, nest: Any, seconds: float) -> str:
    """GFLOP/s; for a kernel without arithmetic (a transpose, a copy), the bytes it moves per
    second instead."""
    if kernel.flops:
        rate = kernel.flops / seconds / 1e9 if seconds > 0 else float("inf")
        return f"{rate:.2f} GFLOP/s ({kernel.flops} flops per call)"
    moved = moved_bytes(kernel, nest)
    rate = moved / seconds / 1e9 if seconds > 0 else float("inf")
    return f"{rate:.2f} GB/s ({moved} bytes read and written per call; no flops)"


def cmd_explain(args: argparse.Namespace) -> int:
    from polydl.driver.explain import explain

    if _is_network(args):
        print(_network(args).explain())
        return 0
    print(explain(_lower(args), ranking=args.top))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from polydl.tuner.cli import cmd_tune as tune

    target = _target(args)
    if args.spec and _is_network(args):
        import polydl.onnx

        def problems() -> list[tuple[str, Any, dict[str, int]]]:
            options = {k: v for k, v in _network_options(args).items() if k != "machine"}
            return polydl.onnx.network_problems(Path(args.spec), target=target, **options)  # type: ignore[arg-type]

        return tune(args, target, problems, network=True)

    def one() -> list[tuple[str, Any, dict[str, int]]]:
        nest, params = _load(args)
        return [(nest.name, nest, dict(params))]

    return tune(args, target, one)


def cmd_machine(args: argparse.Namespace) -> int:
    import json

    from polydl.target import CpuTarget, resolve_target

    name = args.name or "native"
    kind = "c" if name not in ("hopper", "cdna") else ("cuda" if name == "hopper" else "hip")
    target = resolve_target(kind, name)
    if args.json:
        print(json.dumps(target.to_dict(), indent=2))
    else:
        print(target.describe())
        if isinstance(target, CpuTarget):
            print(target.describe_costs())
            print(f"compiler flags: {' '.join(target.compile_flags()) or '(none)'}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from polydl import bench

    return bench.main(args.suite, args.json, args.case or None, args.repeat,
                      batch=args.batch, threads=args.threads, schedule=args.schedule,
                      kept_weights=args.kept_weights)


def cmd_cache(args: argparse.Namespace) -> int:
    from polydl import settings

    root = settings.cache_dir()
    if args.action == "clear":
        if root.exists():
            shutil.rmtree(root)
        print(f"cleared {root}")
        return 0
    files = [p for p in root.rglob("*") if p.is_file()] if root.exists() else []
    size = sum(p.stat().st_size for p in files)
    print(f"cache    {root}")
    print(f"entries  {len(files)} files, {size / 1e6:.1f} MB")
    return 0


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="polydl", description="polyhedral compiler for DL loop nests")
    sub = p.add_subparsers(dest="command", required=True)

    def spec_command(name: str, help: str, optional: bool = False) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help)
        c.add_argument("spec", nargs="?" if optional else None,
                       help="a .c loop nest, a .toml primitive spec or an .onnx network")
        c.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                       help="the value of a size parameter of the spec, e.g. -p N=1024 "
                            "(repeatable; one for each size)")
        c.add_argument("--function", default=None, metavar="NAME",
                       help="the function of a C file that defines several")
        c.add_argument("-D", "--define", action="append", default=[], metavar="NAME[=VALUE]",
                       help="define a macro for the C preprocessor")
        c.add_argument("-I", "--include-dir", action="append", default=[], metavar="DIR",
                       help="a folder of headers the spec includes")
        if name != "tune":
            c.add_argument("--schedule", default="auto", choices=("auto", "tuned"),
                           help="auto: the analytic ranking; tuned: the performance database, "
                           "else the cost model's pick, else the analytic ranking")
            c.add_argument("--constant", action="append", default=[], metavar="ARRAY",
                           help="an input the caller keeps unchanged between calls (weights "
                                "at inference): a packed copy of it is made at the first call "
                                "and kept; the library exports FUNCTION_constants_changed() "
                                "(repeatable; ONNX weights are kept without it)")
            c.add_argument("--exact-math", action="store_true",
                           help="C: call the C library's scalar math functions, each result "
                                "exactly libm's, instead of their vector forms (within the "
                                "error bounds of docs/contract.md)")
        c.add_argument("--machine", default=None, metavar="NAME|FILE.json",
                       help="the machine to build for: native (default), a preset "
                            f"({', '.join(PRESET_NAMES[1:])}) or a `polydl machine --json` file")
        return c

    def network_options(c: argparse.ArgumentParser, tuning: bool = False) -> None:
        # tune checks its --batch itself: a suite's minibatch or a network's
        c.add_argument("--batch", type=int if tuning else positive_int, default=None, metavar="N",
                       help="ONNX: fix a symbolic batch size" + (
                           "; --suite: a convolution suite's minibatch, as `polydl bench "
                           "--batch` runs it" if tuning else ""))
        if not tuning:
            c.add_argument("--name", default=None,
                           help="ONNX: the C name of the network's function (default: the graph's)")
        c.add_argument("--images-per-pass", type=positive_int, default=None, metavar="N",
                       help="ONNX: run every layer on N images, then on the next N (a divisor "
                            "of the batch; default: chosen from the cache and the weights' size)")
        c.add_argument("--no-winograd", action="store_true",
                       help="ONNX: direct 3x3 convolutions only (Winograd's algorithm does 2.25-4x "
                            "fewer multiplications and rounds differently: errors near 1e-5 "
                            "relative instead of 1e-6)")

    c = spec_command("compile", "generate source, header and (for C) a shared library")
    c.add_argument("--target", default="c", choices=["c", "hip", "cuda"],
                   help="the code to generate: c (CPU, OpenMP; the default), cuda or hip (GPU "
                        "kernels and a host launcher)")
    c.add_argument("-o", "--output", metavar="DIR", help="write files here (default: source to stdout)")
    c.add_argument("--embed-weights", action="store_true",
                   help="ONNX: put the weights inside the library instead of NAME.weights beside it")
    network_options(c)
    c.set_defaults(func=cmd_compile)
    c = spec_command("run", "run on random inputs, verify against numpy (an ONNX network: "
                     "onnxruntime), print the speed")
    c.add_argument("--repeat", type=positive_int, default=10, metavar="N",
                   help="timed calls after the first (at least 1; the median is printed; "
                        "default 10)")
    c.add_argument("--seed", type=int, default=0,
                   help="seed of the random inputs (default 0: the same inputs every run)")
    network_options(c)
    c.set_defaults(func=cmd_run)
    c = spec_command("explain", "domains, accesses, dependences, working sets, ranking (an "
                     "ONNX network: its steps and each one's kernel)")
    c.add_argument("--top", type=int, default=5, help="ranked candidates to show")
    network_options(c)
    c.set_defaults(func=cmd_explain)
    c = spec_command("tune", "search the schedule space, measure candidates, store every "
                     "trial in the performance database", optional=True)
    add_tune_options(c)
    network_options(c, tuning=True)
    c.set_defaults(func=cmd_tune)
    c = sub.add_parser("machine", help="describe this machine (or a preset) as a target")
    c.add_argument("name", nargs="?", help="a preset instead of this machine")
    c.add_argument("--json", action="store_true",
                   help="the description as JSON, to give to --machine / machine= elsewhere")
    c.set_defaults(func=cmd_machine)
    c = sub.add_parser("bench", help="benchmark suites against reference libraries")
    c.add_argument("--suite", default="gemm", choices=sorted(SUITE_FILES),
                   help="the suite of cases to run (default gemm)")
    c.add_argument("--json", metavar="FILE", help="also write the results to FILE as JSON")
    c.add_argument("--case", action="append", default=[], help="only these cases (repeatable)")
    c.add_argument("--repeat", type=positive_int, default=10, metavar="N",
                   help="timing rounds per case, at most (at least 1; default 10)")
    c.add_argument("--batch", type=int, metavar="N", help="minibatch of a convolution suite")
    c.add_argument("--threads", type=int, metavar="T",
                   help="threads for every side, pinned to the first T cores")
    c.add_argument("--schedule", default="auto", choices=("auto", "tuned"),
                   help="polydl's schedules: the analytic ranking's, or the performance "
                        "database's (`polydl tune --suite`) where it has them")
    c.add_argument("--kept-weights", action="store_true",
                   help="time inference: the weights stay the same between calls (polydl "
                        "builds with constant=, oneDNN's weights are reordered beforehand)")
    c.set_defaults(func=cmd_bench)
    c = sub.add_parser("cache", help="show or clear the compile cache")
    c.add_argument("action", choices=["info", "clear"],
                   help="info: where the cache is and its size; clear: delete it")
    c.set_defaults(func=cmd_cache)
    add_db_command(sub)
    add_model_command(sub)
    for each in list(all_parsers(p)):  # before or after the subcommand: `polydl run x.c --debug`
        top = each is p
        each.add_argument("--debug", action="store_true",
                          default=False if top else argparse.SUPPRESS,
                          help="show the traceback of an error")
        each.add_argument("--version", action="version", version=f"polydl {__version__}",
                          help="print polydl's version and exit")
    return p


def all_parsers(p: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """`p` and the parsers of its subcommands, theirs, and so on."""
    yield p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases share a parser
                yield from all_parsers(child)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # usage errors (one line, status 2), --help and --version (0)
        return exc.code if isinstance(exc.code, int) else USAGE_STATUS
    shown = warnings.showwarning
    if not args.debug:
        warnings.showwarning = _one_line_warning
    try:
        return _run(args)
    finally:
        warnings.showwarning = shown


def _error_text(exc: PolyDLError) -> str:
    """What the command line prints: a spec's errors as `SpecError` shows them (each with its
    source line and caret), any other error in one line."""
    if isinstance(exc, SpecError):
        return exc.render(prefix="polydl: ")
    return f"polydl: {_first_line(exc)}"


def _first_line(exc: PolyDLError) -> str:
    if isinstance(exc, CompileError):  # the compiler's own first error says most
        lines = [ln.strip() for ln in exc.output.strip().splitlines() if ln.strip()]
        said = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
        return f"{exc.compiler} failed: {said} (--debug shows the command)"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("polydl: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # files the user named: unreadable, unwritable, a directory, ...
        if args.debug:
            raise
        print(f"polydl: {exc}", file=sys.stderr)
        return 1
    except PolyDLError as exc:
        if args.debug:
            raise
        print(_error_text(exc), file=sys.stderr)
        return USAGE_STATUS if isinstance(exc, UsageError) else 1
    except Exception as exc:  # a bug in polydl: still one line, with the way to see more
        if args.debug:
            raise
        print(f"polydl: internal error: {type(exc).__name__}: {exc} (run with --debug)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
