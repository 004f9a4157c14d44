"""The package's import graph is a DAG, and its layers import only downwards.

Every import counts: at module level, inside a function (an import moved into a function to
dodge a cycle is still a cycle) and under `if TYPE_CHECKING:` (a type-only circle is still a
circle: the shared types belong in a module of their own).

Cycles are counted twice: between modules, and between packages. In the package graph a module
stands for the folder that holds it (`polydl.schedules.cpu.rank` for `polydl.schedules.cpu`), a
package's `__init__` for the package, and a module at polydl's top (`polydl.api`, `polydl.cli`,
`polydl.network`) for itself; the root `polydl` stands for its `__init__` alone. So a package's
`__init__` importing its own modules adds no edge, while a folder inside a package is a node of
its own: a stage's shared modules importing its backend folders, which import them back, is a
cycle.

Run as a program (`python tests/test_import_graph.py`) it prints the package graph and the
counts of module and package cycles.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path

# found, not imported: the graph is read from the source, so it can be drawn while a module is
# broken
_SPEC = importlib.util.find_spec("polydl")
assert _SPEC is not None and _SPEC.origin is not None
PACKAGE = Path(_SPEC.origin).resolve().parent
# Pipeline stages, in order: a module of one stage imports nothing of a later one.
STAGES = ("frontends", "poly", "schedules", "codegen", "runtime")
# Above the pipeline: no stage reaches up into these (the target package sits beside it: every
# stage may read a target value).
ABOVE_PIPELINE = ("polydl.api", "polydl.cli", "polydl.driver", "polydl.bench", "polydl.onnx",
                  "polydl.tuning", "polydl.tuner")
# Stages with one folder per backend: a backend's folder imports nothing of another's (what
# both use lives at the stage's top).
BACKENDS = {"schedules": ("cpu", "gpu"), "codegen": ("c", "gpu"), "runtime": ("c", "gpu")}
# Layers above the pipeline, each importing nothing of those listed for it: the tuner's stored
# knowledge sits below the driver, and the driver below the API, the network frontend, the
# benchmarks and the tuner's measuring, search and CLI.
ABOVE_DRIVER = ("polydl.api", "polydl.cli", "polydl.bench", "polydl.onnx", "polydl.tuner")
BELOW = {"polydl.tuning": ("polydl.driver", *ABOVE_DRIVER), "polydl.driver": ABOVE_DRIVER}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _existing(name: str) -> str:
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def _imports_in(tree: ast.AST, package: str) -> set[str]:
    """Every polydl module `tree` imports, wherever the import stands; `package` anchors
    relative imports."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in MODULES else base)
    return {_existing(name) for name in found if name.split(".")[0] == "polydl"}


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return _imports_in(ast.parse(path.read_text(), str(path)), package) - {module}


GRAPH = {module: _imports(module) for module in MODULES}


def _package(module: str) -> str:
    """The node standing for `module` in the package graph."""
    if MODULES[module].name == "__init__.py" or module.count(".") == 1:
        return module
    return module.rpartition(".")[0]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, imported in GRAPH.items():
        graph.setdefault(_package(module), set()).update(_package(other) for other in imported)
    return {package: edges - {package} for package, edges in graph.items()}


PACKAGE_GRAPH = _package_graph()


def _cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one node (Tarjan's algorithm),
    each sorted: none means the graph is a DAG."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(found)


def _describe(component: list[str], graph: Mapping[str, Iterable[str]] = GRAPH) -> str:
    """A cycle's members and each edge between them; in the package graph, with the module
    imports that make the edge."""
    members = set(component)
    lines = [", ".join(component)]
    for source in component:
        for target in sorted(set(graph.get(source, ())) & members):
            line = f"    {source} -> {target}"
            if graph is not GRAPH:
                why = sorted(f"{module} -> {other}"
                             for module, imported in GRAPH.items() if _package(module) == source
                             for other in imported if _package(other) == target)
                more = f", {len(why) - 2} more" if len(why) > 2 else ""
                line += f"  ({'; '.join(why[:2])}{more})"
            lines.append(line)
    return "\n".join(lines)


def test_the_modules_have_no_import_cycle() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "\n".join(_describe(c) for c in cycles)


def test_the_packages_have_no_import_cycle() -> None:
    cycles = _cycles(PACKAGE_GRAPH)
    assert not cycles, "\n".join(_describe(c, PACKAGE_GRAPH) for c in cycles)


def _stage(module: str) -> int | None:
    parts = module.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else None


def test_stages_import_only_earlier_stages() -> None:
    wrong = []
    for module, imported in GRAPH.items():
        stage = _stage(module)
        if stage is None:
            continue
        for other in imported:
            later = _stage(other)
            above = any(_within(other, a) for a in ABOVE_PIPELINE)
            if (later is not None and later > stage) or above:
                wrong.append(f"{module} -> {other}")
    assert not wrong, "\n".join(sorted(wrong))


def test_backends_never_import_each_other() -> None:
    wrong = []
    for stage, kinds in BACKENDS.items():
        folders = [f"polydl.{stage}.{kind}" for kind in kinds]
        for folder in folders:
            others = [f for f in folders if f != folder]
            wrong += [
                f"{module} -> {other}"
                for module, imported in GRAPH.items() if _within(module, folder)
                for other in imported if any(_within(other, o) for o in others)
            ]
    assert not wrong, "\n".join(sorted(wrong))


def test_lower_layers_never_import_higher_ones() -> None:
    wrong = [
        f"{module} -> {other}"
        for layer, above in BELOW.items()
        for module, imported in GRAPH.items() if _within(module, layer)
        for other in imported if any(_within(other, a) for a in above)
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_the_graph_sees_function_level_and_type_checking_imports() -> None:
    """The walk counts an import inside a function and one under `if TYPE_CHECKING:` (the
    checks above would be toothless otherwise); the CLI imports the driver only inside its
    commands."""
    assert "polydl.driver.pipeline" in GRAPH["polydl.cli"]
    assert "polydl.driver.explain" in GRAPH["polydl.cli"]
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from polydl.ir import LoopNest\n"
        "def lower() -> None:\n"
        "    from ..driver import pipeline\n"
    )
    found = _imports_in(ast.parse(source), "polydl.onnx")
    assert found == {"polydl.ir", "polydl.driver.pipeline"}


def summary() -> str:
    """The package graph and the cycles counted, as the program prints them."""
    module_cycles = _cycles(GRAPH)
    package_cycles = _cycles(PACKAGE_GRAPH)
    lines = ["package -> packages it imports:"]
    lines += [f"  {package} -> {', '.join(sorted(PACKAGE_GRAPH[package])) or '-'}"
              for package in sorted(PACKAGE_GRAPH)]
    lines.append(f"{len(GRAPH)} modules, {len(module_cycles)} module cycles")
    lines += [f"  {_describe(c)}" for c in module_cycles]
    lines.append(f"{len(PACKAGE_GRAPH)} packages, {len(package_cycles)} package cycles")
    lines += [f"  {_describe(c, PACKAGE_GRAPH)}" for c in package_cycles]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary())
