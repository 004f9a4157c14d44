"""ONNX networks compiled by polydl: `polydl.onnx.compile(model)` returns a callable network.

    net = polydl.onnx.compile("resnet18.onnx", batch=1)
    logits = net(x)                      # numpy float32, inputs in the graph's order
    net.run({"input": x})                # {output name: array}
    print(net.explain())                 # what each step is: fused, folded, layouts

Every node runs as a polydl kernel (a builder's convolution, or a C loop nest written from the
node's static shapes) or, for pure data movement, an explicit copy; the network is one shared
library (`runtime.c.network`), cached by the model's content, so a second compile of the same
model is a cache lookup.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any

from polydl import settings
from polydl.api import MachineArg, TargetArg, target_of
from polydl.codegen.artifact import GeneratedCode
from polydl.codegen.c.network import network_source
from polydl.driver.pipeline import generated_code
from polydl.errors import ShapeError, TargetError, UnsupportedOperator
from polydl.ir import LoopNest, fingerprint
from polydl.network import KernelStep, NetworkPlan, assign_offsets, tail_start, weights_blob
from polydl.onnx import batching
from polydl.onnx.constants import fold_constants
from polydl.onnx.graph import Graph, load_model, read_graph
from polydl.onnx.lowering import SUPPORTED, Lowering
from polydl.poly.model import build_model
from polydl.runtime.c.network import Network, cached_network_library, link_network
from polydl.runtime.c.toolchain import current_toolchain
from polydl.runtime.cache import (
    compiler_revision,
    content_key,
    entry_dir,
    entry_is_complete,
    entry_lock,
    write_atomic,
    write_manifest,
)
from polydl.target import Target
from polydl.tuning.database import PerfDatabase
from polydl.tuning.lookup import ANALYTIC, learned_schedule
from polydl.version import __version__

__all__ = ["SUPPORTED", "Network", "UnsupportedOperator", "compile", "network_problems",
           "write_library"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _c_name(name: str | None, fallback: str) -> str:
    """A C identifier for the network's function: `name` checked, else one from the graph's name."""
    if name is not None:
        if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name) or keyword.iskeyword(name) \
                or len(name) > 64:
            raise ShapeError("name", "must be a C identifier of at most 64 characters",
                             expected="[A-Za-z_][A-Za-z0-9_]*", given=name)
        return name
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", fallback)[:48] or "network"
    return cleaned if _IDENTIFIER.fullmatch(cleaned) else f"net_{cleaned}"


def _kernel_name(nest: LoopNest, params: dict[str, int]) -> str:
    """A name for a layer's kernel function that is the same for the same loop nest."""
    text = fingerprint(replace(nest, name="k")) + json.dumps(params, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"pd_{nest.name}_{digest}"


def _lower_one(nest: LoopNest, params: dict[str, int], target: Target,
               schedule: str) -> tuple[GeneratedCode, str]:
    """A kernel's code and, for `schedule="tuned"`, what decided its schedule."""
    if schedule == "tuned":
        learned = learned_schedule(build_model(nest, params), target)  # type: ignore[arg-type]
        if learned is not None:
            return generated_code(nest, params, target, learned.schedule), learned.decided_by
        return generated_code(nest, params, target), ANALYTIC  # the database has no answer
    return generated_code(nest, params, target), ""


def _kernel_problems(plan: NetworkPlan) -> dict[str, tuple[LoopNest, dict[str, int]]]:
    """The plan's distinct kernels by function name (filled into its steps): the nest, renamed
    to the function, and its sizes."""
    kernels: dict[str, tuple[LoopNest, dict[str, int]]] = {}
    for index, step in enumerate(plan.steps):
        if isinstance(step, KernelStep):
            function = _kernel_name(step.nest, dict(step.params))
            kernels.setdefault(function, (replace(step.nest, name=function), dict(step.params)))
            plan.steps[index] = replace(step, function=function)
    return kernels


def _kernels(plan: NetworkPlan, target: Target, jobs: int, show_progress: bool | None = None,
             schedule: str = "auto") -> tuple[dict[str, GeneratedCode], dict[str, str]]:
    """The generated code of every distinct kernel of the plan, lowered in `jobs` processes,
    and (`schedule="tuned"`) what decided each one's schedule."""
    kernels = _kernel_problems(plan)
    names = list(kernels)
    progress = _Progress(len(names), show_progress)
    lowered: dict[str, tuple[GeneratedCode, str]] = {}
    if jobs > 1 and len(names) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_lower_one, *kernels[n], target, schedule): n for n in names}
            for future in as_completed(futures):
                lowered[futures[future]] = future.result()
                progress.step()
    else:
        for n in names:
            lowered[n] = _lower_one(*kernels[n], target, schedule)
            progress.step()
    progress.close()
    return {n: lowered[n][0] for n in names}, {n: lowered[n][1] for n in names if lowered[n][1]}


class _Progress:
    """A progress bar over the layers' kernels on stderr: tqdm's where installed, else one
    rewritten line; shown when asked, or by default when stderr is a terminal."""

    def __init__(self, total: int, show: bool | None) -> None:
        self.total, self.done = total, 0
        self.show = sys.stderr.isatty() if show is None else show
        self.bar = None
        if self.show:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, desc="polydl: lowering kernels", unit="kernel")

    def step(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.show:
            print(f"\rpolydl: lowered {self.done}/{self.total} kernels", end="", file=sys.stderr,
                  flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.show and self.total:
            print(file=sys.stderr)


def _explain(plan: NetworkPlan, codes: dict[str, GeneratedCode], decided: dict[str, str]) -> str:
    lines = [f"network {plan.name}: {len(plan.steps)} steps, {len(codes)} distinct kernels, "
             f"arena {plan.arena_bytes / 2**20:.1f} MiB, weights {plan.weights_bytes / 2**20:.1f} MiB"]
    images = plan.buffers[plan.inputs[0]].shape[0] if plan.inputs else 0
    if plan.passes > 1 and plan.tail is not None:
        lines.append(f"      steps 0-{plan.tail - 1} in {plan.passes} passes of {images} images (each "
                     f"pass's activations stay in cache), then steps {plan.tail}-{len(plan.steps) - 1} "
                     f"in {plan.passes} passes (their weights stay in cache)")
    elif plan.passes > 1:
        lines.append(f"      every step in {plan.passes} passes of {images} images "
                     "(each pass's activations stay in cache)")
    for index, step in enumerate(plan.steps):
        if isinstance(step, KernelStep):
            schedule = next((line.split("schedule:", 1)[1].strip()
                             for line in codes[step.function].source.splitlines()[:4]
                             if "schedule:" in line), "")
            by = f" (tuned: the {decided[step.function]} decided)" if step.function in decided else ""
            lines.append(f"{index:4d}  {step.label}\n      kernel {step.function}: {schedule}{by}")
        else:
            lines.append(f"{index:4d}  {step.label} (copy)")
    return "\n".join(lines)


def _images(graph: Graph, target: Target, asked: int | None) -> int:
    """The images of one pass: `asked` (checked), or `batching.images_per_pass`."""
    batch = batching.batch_of(graph)
    if asked is None:
        return batching.images_per_pass(graph, target)  # type: ignore[arg-type]
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1 or batch % asked:
        raise ShapeError("images_per_pass", f"must divide the batch of {batch}",
                         expected=f"a divisor of {batch}", given=asked)
    if asked < batch and (reason := batching.images_apart(graph)) is not None:
        raise ShapeError("images_per_pass", f"the network mixes its images: {reason}",
                         expected=f"{batch} (the whole batch)", given=asked)
    return asked


def _part(model: Any, batch: int | None, images: int, graph: Graph, passes: int) -> Graph | None:
    """The graph of one pass over `images` images, or None where its inputs' and outputs'
    shapes are not the whole graph's with axis 0 divided by `passes`."""
    try:
        part = fold_constants(read_graph(model, batch, images=images))
    except ShapeError:
        return None
    ends = [*graph.inputs, *graph.outputs]
    if [part.shapes.get(n) for n in ends] != [(graph.shapes[n][0] // passes, *graph.shapes[n][1:])
                                              if graph.shapes.get(n) else None for n in ends]:
        return None
    return part


def _planned(model: Any, batch: int | None, name: str | None, target: Target, winograd: bool,
             images_per_pass: int | None) -> tuple[NetworkPlan, Graph]:
    """The network's steps (before kernels and offsets) and the graph they run."""
    graph = fold_constants(read_graph(model, batch))
    images = _images(graph, target, images_per_pass)
    passes = batching.batch_of(graph) // images
    if passes > 1:  # the same network over fewer images
        part = _part(model, batch, images, graph, passes)
        if part is None and images_per_pass is not None:
            raise ShapeError("images_per_pass", "the network's shapes do not follow its batch "
                             "(a Reshape to a fixed batch?)",
                             expected=f"{batching.batch_of(graph)} (the whole batch)",
                             given=images)
        graph, passes = (part, passes) if part is not None else (graph, 1)
    plan = Lowering(graph, _c_name(name, graph.name), target, winograd).lower()  # type: ignore[arg-type]
    plan.passes = passes
    plan.tail = tail_start(plan)
    return plan, graph


def _lowered(model: Any, batch: int | None, name: str | None, target: Target,
             jobs: int, progress: bool | None = None, winograd: bool = True,
             images_per_pass: int | None = None, schedule: str = "auto",
             ) -> tuple[NetworkPlan, dict[str, GeneratedCode], list[tuple[str, tuple[int, ...]]],
                        list[tuple[str, tuple[int, ...]]], dict[str, str]]:
    plan, graph = _planned(model, batch, name, target, winograd, images_per_pass)
    codes, decided = _kernels(plan, target, jobs, progress, schedule)
    assign_offsets(plan)
    inputs = [(n, plan.whole_shape(b)) for n, b in zip(graph.inputs, plan.inputs, strict=True)]
    outputs = [(n, plan.whole_shape(b)) for n, b in zip(graph.outputs, plan.outputs, strict=True)]
    return plan, codes, inputs, outputs, decided


def network_problems(model: Any, *, target: TargetArg = "c", machine: MachineArg = None,
                     batch: int | None = None, winograd: bool = True,
                     images_per_pass: int | None = None) -> list[tuple[str, LoopNest, dict[str, int]]]:
    """The distinct kernels a network compiles to, as `polydl tune` measures them.

    Args:
        model: a path to an .onnx file, its bytes or an `onnx.ModelProto`.
        target: "c" (networks run on the CPU) or a CPU target value.
        machine: "native" (None, this machine), a preset name, a `polydl machine --json` file or a target value.
        batch: the value of a symbolic batch dimension.
        winograd: False keeps every 3 x 3 convolution direct.
        images_per_pass: images each layer runs on before the next layer (as `compile`'s).

    Returns:
        A list of (name, nest, sizes), one per distinct kernel: a step's label (its node) names it,
        as `schedule="tuned"` looks it up.

    Raises:
        ShapeError: an unreadable model, a missing or bad batch, or a bad `images_per_pass`.
        UnsupportedOperator: a node polydl cannot compile.
        TargetError: a target other than the CPU's, or an unknown machine.
    """
    resolved = _target(target, machine)
    plan, _ = _planned(load_model(model), batch, None, resolved, winograd, images_per_pass)
    kernels = _kernel_problems(plan)
    labels: dict[str, str] = {}
    for step in plan.steps:
        if isinstance(step, KernelStep):
            labels.setdefault(step.function, step.label)
    return [(labels[f], nest, params) for f, (nest, params) in kernels.items()]


def _tuning_state() -> list[str]:
    """What `schedule="tuned"` reads besides the model: the databases' and the cost model's
    files, by size and modification time (a network is lowered again once they change). The
    user's database is created (or upgraded) first, as the lookup would."""
    PerfDatabase()
    state = []
    for path in (settings.tuning_db(), settings.system_db(), settings.cost_model()):
        try:
            stat = Path(path).stat() if path else None
        except OSError:
            stat = None
        state.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}" if stat else f"{path}:-")
    return state


def _schedule_arg(schedule: object) -> str:
    if schedule not in ("auto", "tuned"):
        raise ShapeError("schedule", "chooses how the layers' schedules are found",
                         expected="'auto' (the analytic ranking) or 'tuned' (the performance "
                         "database, else the cost model, else the analytic ranking)",
                         given=schedule)
    return str(schedule)


def _target(target: TargetArg, machine: MachineArg) -> Target:
    resolved = target_of(target, machine)
    if resolved.kind != "c":
        raise TargetError(f"ONNX networks compile for the CPU target 'c', not '{resolved.kind}'")
    return resolved


def compile(  # noqa: A001 - the public name the contract gives
    model: Any, *, target: TargetArg = "c", machine: MachineArg = None, batch: int | None = None,
    name: str | None = None, jobs: int | None = None, progress: bool | None = None,
    winograd: bool = True, images_per_pass: int | None = None, schedule: str = "auto",
) -> Network:
    """Compile an ONNX model into a callable network.

        net = polydl.onnx.compile("resnet18.onnx", batch=1)
        logits = net(x)                  # numpy float32, inputs in the graph's order

    Args:
        model: a path to an .onnx file, its bytes or an `onnx.ModelProto`.
        target: "c" (networks run on the CPU) or a CPU target value.
        machine: "native" (None, this machine), a preset name, a `polydl machine --json` file or a target value.
        batch: the value of a symbolic batch dimension.
        name: the C name of the network's function (default: from the graph's name).
        jobs: processes that lower the layers' kernels (default: the CPU count).
        progress: show a progress bar (default: when stderr is a terminal).
        winograd: False keeps every 3 x 3 convolution direct (Winograd rounds differently: ~1e-5 relative).
        images_per_pass: run every layer on this many images, then the next ones (a divisor of the
            batch; default: chosen from the caches and the weights' size, `onnx.batching`).
        schedule: "auto" (the analytic ranking) or "tuned" (the performance database where
            `polydl tune` measured the layer, else the cost model's pick, else the ranking's).

    Returns:
        The `Network`: `net(*inputs)` returns the graph's outputs, `net.explain()` says what each step is.

    Raises:
        ShapeError: an unreadable model, a missing or bad batch, name, `images_per_pass` or `schedule`.
        UnsupportedOperator: a node polydl cannot compile.
        TargetError: a target other than the CPU's, or an unknown machine.
        CompileError: the C compiler failed.
    """
    resolved = _target(target, machine)
    schedule = _schedule_arg(schedule)
    proto = load_model(model)
    data = proto.SerializeToString()
    toolchain = current_toolchain()  # the entry points at a library that compiler built
    key = content_key([__version__, compiler_revision(), hashlib.sha256(data).hexdigest(),
                       repr(batch), repr(name), repr(winograd), repr(images_per_pass), resolved.key(),
                       toolchain.identity, " ".join(toolchain.flags), "network",
                       *([schedule, *_tuning_state()] if schedule == "tuned" else [])])
    entry = entry_dir(key)
    meta_path, weights_path = entry / "network.json", entry / "network.weights"
    files = [meta_path, weights_path]
    if not entry_is_complete(entry, files):
        with entry_lock(entry):
            if not entry_is_complete(entry, files):
                plan, codes, inputs, outputs, decided = _lowered(
                    proto, batch, name, resolved, jobs or os.cpu_count() or 1, progress, winograd,
                    images_per_pass, schedule)
                source = network_source(plan, codes, resolved.describe())
                library = cached_network_library(
                    source, [codes[f] for f in sorted(codes)])
                write_atomic(weights_path, weights_blob(plan))
                write_atomic(meta_path, json.dumps({
                    "function": plan.name, "library": str(library), "inputs": inputs,
                    "outputs": outputs, "explain": _explain(plan, codes, decided),
                }).encode())
                write_manifest(entry, files)
    meta = json.loads(meta_path.read_text())
    library = Path(meta["library"])
    if not library.exists():  # the library's own entry was cleared: build the network again
        for path in files:
            path.unlink(missing_ok=True)
        return compile(model, target=target, machine=machine, batch=batch, name=name, jobs=jobs,
                       progress=progress, winograd=winograd, images_per_pass=images_per_pass,
                       schedule=schedule)
    return Network(library, meta["function"], [(n, tuple(s)) for n, s in meta["inputs"]],
                   [(n, tuple(s)) for n, s in meta["outputs"]], weights_path.read_bytes(),
                   meta["explain"])


def write_library(model: Any, directory: str | os.PathLike[str], *, target: TargetArg = "c",
                  machine: MachineArg = None, batch: int | None = None, name: str | None = None,
                  embed_weights: bool = False, jobs: int | None = None,
                  winograd: bool = True, images_per_pass: int | None = None,
                  schedule: str = "auto") -> dict[str, Path]:
    """Write the network as an ahead-of-time library for use from C (or C++) without Python.

    The library exports `int NAME(const float *in0, ..., float *out0, ...)`, declared in NAME.h.

    Args:
        model: a path to an .onnx file, its bytes or an `onnx.ModelProto`.
        directory: the folder to write into (created if missing).
        target: "c" (networks run on the CPU) or a CPU target value.
        machine: "native" (None, this machine), a preset name, a `polydl machine --json` file or a target value.
        batch: the value of a symbolic batch dimension.
        name: the C name of the network's function (default: from the graph's name).
        embed_weights: put the weights inside the library instead of NAME.weights beside it.
        jobs: processes that lower the layers' kernels (default: the CPU count).
        winograd: False keeps every 3 x 3 convolution direct.
        images_per_pass: run every layer on this many images, then the next ones (as `compile`'s).
        schedule: "auto" or "tuned" (as `compile`'s).

    Returns:
        The paths written, by role: "source" (NAME.c), "header" (NAME.h), "library" (libNAME.so) and,
        unless `embed_weights`, "weights" (NAME.weights).

    Raises:
        ShapeError: an unreadable model, a missing or bad batch, name, `images_per_pass` or `schedule`,
            or weights to embed from a path with quotes.
        UnsupportedOperator: a node polydl cannot compile.
        TargetError: a target other than the CPU's, or an unknown machine.
        CompileError: the C compiler failed.
    """
    resolved = _target(target, machine)
    folder = Path(directory)
    plan, codes, _, _, _ = _lowered(load_model(model), batch, name, resolved,
                                    jobs or os.cpu_count() or 1, winograd=winograd,
                                    images_per_pass=images_per_pass,
                                    schedule=_schedule_arg(schedule))
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / f"{plan.name}.weights"
    write_atomic(weights, weights_blob(plan))
    embedded = ""
    if embed_weights:
        embedded = str(weights.resolve())
        if any(ch in embedded for ch in '"\\\n'):
            raise ShapeError("directory", "cannot embed weights from a path with quotes, "
                             "backslashes or newlines", expected="a plain path", given=embedded)
    source = network_source(plan, codes, resolved.describe(), embedded_weights=embedded)
    library = link_network(source, [codes[f] for f in sorted(codes)], folder)
    paths = {"source": folder / f"{plan.name}.c", "header": folder / f"{plan.name}.h",
             "library": library}
    if embed_weights:
        weights.unlink()
    else:
        paths["weights"] = weights
    return paths
