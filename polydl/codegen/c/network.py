"""The C of a whole network: one function that calls the layers' kernels in order.

Takes a `NetworkPlan` whose kernel steps name their generated functions, and the generated
code of each function; returns the source and header of the network's translation unit. The
layers' kernels stay separate translation units (each has its own static helpers); the network
function only declares and calls them, over pointers into the caller's inputs and outputs, the
weights blob and the activation arena.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from polydl.codegen.artifact import GeneratedCode
from polydl.codegen.templating import render
from polydl.network import ALIGNMENT, CopyStep, KernelStep, NetworkPlan, aligned
from polydl.version import __version__


@dataclass(frozen=True)
class NetworkSource:
    function: str
    source: str
    header: str


def _pointer(plan: NetworkPlan, name: str, writable: bool, stride: int = 0) -> str:
    """The C expression of buffer `name`'s address (plus `stride` floats per repetition `i`)."""
    root = plan.root(name)
    ctype = "float *" if writable else "const float *"
    if root.kind == "input":
        base = f"in{root.index}" if not writable else f"(float *)in{root.index}"
    elif root.kind == "output":
        base = f"out{root.index}"
    elif root.kind == "constant":
        base = f"({ctype})(weights + {root.offset})"
    elif root.name in plan.carried:  # a pass's room each (`NetworkPlan.tail`)
        base = f"({ctype})(arena + {root.offset} + pass * {aligned(root.nbytes)}L)"
    else:
        base = f"({ctype})(arena + {root.offset})"
    return f"{base} + i * {stride}L" if stride else base


def _prototype(code: GeneratedCode) -> str:
    parameters = []
    for arg in code.arguments:
        const = "const " if arg.is_input else ""
        parameters.append(f"{const}{arg.c_type} *restrict {arg.name}" if arg.shape
                          else f"{arg.c_type} {arg.name}")
    return f"int {code.function}({', '.join(parameters)})"


def network_source(plan: NetworkPlan, codes: Mapping[str, GeneratedCode], target_description: str,
                   embedded_weights: str = "") -> NetworkSource:
    """`embedded_weights`: the path of the weights file to assemble into the library (else the
    library reads NAME.weights beside itself, or takes `NAME_set_weights`)."""
    steps = []
    for step in plan.steps:
        if isinstance(step, KernelStep):
            code = codes[step.function]
            args = []
            for arg in code.arguments:
                buffer = step.arguments[arg.spelling]
                stride = step.strides.get(buffer, 0) if step.repeat > 1 else 0
                args.append(_pointer(plan, buffer, not arg.is_input, stride))
            zero = [{"pointer": _pointer(plan, name, True), "nbytes": plan.buffers[name].nbytes}
                    for name in step.zero]
            steps.append({"label": step.label.replace("*/", "* /"), "zero": zero,
                          "call": f"{code.function}({', '.join(args)})", "repeat": step.repeat})
        else:
            assert isinstance(step, CopyStep)
            steps.append({"label": step.label.replace("*/", "* /"), "zero": [], "call": "", "repeat": 1,
                          "source": _pointer(plan, step.source, False),
                          "destination": _pointer(plan, step.destination, True),
                          "nbytes": plan.buffers[step.destination].nbytes})
    # several passes: the steps read `in0`, `out0`, .. as one pass's part of the caller's arrays
    suffix = "_all" if plan.passes > 1 else ""
    parameters = [f"const float *in{plan.buffers[n].index}{suffix}" for n in plan.inputs]
    parameters += [f"float *out{plan.buffers[n].index}{suffix}" for n in plan.outputs]
    pass_pointers = []
    if plan.passes > 1:
        for prefix, names, const in (("in", plan.inputs, "const "), ("out", plan.outputs, "")):
            for n in names:
                index, count = plan.buffers[n].index, plan.buffers[n].nbytes // 4
                pass_pointers.append(f"{const}float *{prefix}{index} = {prefix}{index}_all + "
                                     f"pass * {count}L;")
    doc = [f"in{plan.buffers[n].index}: float32{list(plan.whole_shape(n))}" for n in plan.inputs]
    doc += [f"out{plan.buffers[n].index}: float32{list(plan.whole_shape(n))}" for n in plan.outputs]
    used = sorted({s.function for s in plan.steps if isinstance(s, KernelStep)})
    values = {
        "name": plan.name, "version": __version__, "target": target_description, "steps": steps,
        "functions": used, "prototypes": [_prototype(codes[f]) for f in used],
        "kept_functions": [f for f in used if codes[f].kept],
        "alignment": ALIGNMENT, "arena_bytes": plan.arena_bytes,
        "arena_alloc": max(ALIGNMENT, aligned(plan.arena_bytes)),
        "weights_bytes": plan.weights_bytes,
        "weights_alloc": max(ALIGNMENT, aligned(plan.weights_bytes)),
        "embedded": bool(embedded_weights), "weights_file": embedded_weights,
        "parameters": parameters, "signature_doc": doc, "passes": plan.passes,
        "tail": plan.tail if plan.tail is not None else len(steps),
        "pass_pointers": pass_pointers,
    }
    return NetworkSource(plan.name, render("c/network.c.j2", **values),
                         render("c/network.h.j2", **values))
