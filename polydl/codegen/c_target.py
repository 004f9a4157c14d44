"""The C/OpenMP target: a `ScheduledNest` becomes one C translation unit and its header.

Takes a `ScheduledNest`; returns `GeneratedCode`. The function takes one pointer per array in
declaration order (`const` for inputs); size parameters are compile-time constants.
"""

from __future__ import annotations

from polydl.codegen.artifact import GeneratedCode, KernelArgument
from polydl.codegen.c_expr import C_HELPERS, ArrayLayout, StatementPrinter
from polydl.codegen.loops import LoopPrinter
from polydl.codegen.templating import render
from polydl.ir import DTYPES
from polydl.poly.model import StatementModel
from polydl.schedules.apply import ScheduledNest
from polydl.version import __version__


def kernel_arguments(scheduled: ScheduledNest) -> tuple[KernelArgument, ...]:
    nest, params = scheduled.model.nest, scheduled.model.params
    return tuple(
        KernelArgument(
            name=a.name,
            dtype=a.dtype,
            shape=a.concrete_shape(params),
            is_input=a.is_input,
            c_type=DTYPES[a.dtype],
        )
        for a in nest.arrays
    )


def c_parameters(arguments: tuple[KernelArgument, ...]) -> list[str]:
    return [
        f"{'const ' if a.is_input else ''}{a.c_type} *restrict {a.name}" for a in arguments
    ]


def generate_c(scheduled: ScheduledNest) -> GeneratedCode:
    model = scheduled.model
    arguments = kernel_arguments(scheduled)
    layouts = {a.name: ArrayLayout(a.name, a.dtype, a.shape) for a in arguments}
    printer = StatementPrinter(layouts)

    def instance(s: StatementModel, args: list[str]) -> list[str]:
        binds = [f"const long {var} = {arg};" for var, arg in zip(s.iterators, args, strict=True)]
        return ["{", *("  " + b for b in binds), "  " + printer.statement(s.statement), "}"]

    body: list[str] = []
    for plan in scheduled.groups:
        body += LoopPrinter(plan, instance).lines()

    name = model.nest.name
    parameters = c_parameters(arguments)
    origin = model.nest.filename
    values = dict(name=name, version=__version__, origin=origin, parameters=parameters)
    source = render(
        "c/kernel.c.j2",
        **values,
        schedule=scheduled.schedule.describe(),
        includes=[],
        helpers=C_HELPERS,
        microkernels=[],
        size_params=[{"name": p, "value": v} for p, v in model.params.items()],
        body=body,
    )
    header = render("c/kernel.h.j2", **values, arguments=arguments)
    return GeneratedCode(
        function=name,
        arguments=arguments,
        source=source,
        header=header,
        target="c",
        compile_flags=(),
    )
