"""The package's import graph: no cycles, and the pipeline's stages import only earlier stages.

Every import counts, at module level or inside a function (an import moved into a function to
dodge a cycle is still a cycle); only `if TYPE_CHECKING:` imports are left out, since they never
run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import polydl

PACKAGE = Path(polydl.__file__).resolve().parent
# Pipeline stages, in order: a module of one stage imports nothing of a later one.
STAGES = ("frontends", "poly", "schedules", "codegen", "runtime")
# Below the API: the pipeline never reaches up into these (the target package sits beside it:
# every stage may read a target value).
ABOVE_PIPELINE = ("polydl.api", "polydl.cli", "polydl.driver", "polydl.bench", "polydl.onnx",
                  "polydl.tuning")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str) -> set[str]:
    """The polydl modules `module` imports, resolved to modules that exist."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    visit(stmt)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    submodule = f"{base}.{alias.name}"
                    found.add(submodule if submodule in MODULES else base)
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {_existing(name) for name in found if name.split(".")[0] == "polydl"} - {module}


def _existing(name: str) -> str:
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


GRAPH = {module: _imports(module) for module in MODULES}


def _cycle_from(start: str) -> list[str] | None:
    path: list[str] = []
    on_path: set[str] = set()
    done: set[str] = set()

    def walk(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(GRAPH.get(node, ())):
            if nxt in on_path:
                return [*path[path.index(nxt):], nxt]
            if nxt not in done:
                found = walk(nxt)
                if found:
                    return found
        on_path.discard(path.pop())
        done.add(node)
        return None

    return walk(start)


def test_the_package_has_no_import_cycle() -> None:
    for module in sorted(GRAPH):
        # a package's __init__ importing its own submodules is how packages are made; the cycle
        # would be a submodule importing the package back, which the graph shows as such
        cycle = _cycle_from(module)
        assert cycle is None, " -> ".join(cycle)


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
            above = any(other == a or other.startswith(a + ".") for a in ABOVE_PIPELINE)
            if (later is not None and later > stage) or above:
                wrong.append(f"{module} -> {other}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_graph_sees_function_level_imports() -> None:
    """The walk counts an import inside a function (the checks above would be toothless
    otherwise): the CLI imports the driver only inside its commands."""
    assert "polydl.driver.pipeline" in GRAPH["polydl.cli"]
    assert "polydl.driver.explain" in GRAPH["polydl.cli"]
