"""The public functions document themselves: `help()` lists every parameter, what comes back
and what is raised (Google style: `Args:`, `Returns:`, `Raises:` sections)."""

from __future__ import annotations

import inspect
import pydoc
import re
from collections.abc import Callable
from typing import Any

import pytest

import polydl
import polydl.api
import polydl.onnx

_SECTION = re.compile(r"^(\w[\w ]*):\s*$")
_ENTRY = re.compile(r"^(\*{0,2}\w+)(?: \([^)]*\))?:")


def _public_functions() -> list[tuple[str, Callable[..., Any]]]:
    found: dict[str, Callable[..., Any]] = {}
    for module in (polydl, polydl.api, polydl.onnx):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isfunction(value) and value not in found.values():  # polydl.compile is api's
                found[f"{module.__name__}.{name}"] = value
    for name in ("__call__", "reference", "constants_changed"):
        found[f"polydl.Kernel.{name}"] = getattr(polydl.Kernel, name)
    return sorted(found.items())


def _sections(doc: str) -> dict[str, list[str]]:
    """The docstring's sections by title, each its lines (the summary is under "")."""
    sections: dict[str, list[str]] = {"": []}
    current = ""
    for line in doc.splitlines():
        match = _SECTION.match(line)
        if match and not line.startswith(" "):
            current = match.group(1)
            sections[current] = []
        else:
            sections[current].append(line)
    return sections


def _documented_arguments(lines: list[str]) -> list[str]:
    """The names an Args section documents: its entries at the section's own indentation."""
    entries = [line for line in lines if line.strip()]
    if not entries:
        return []
    indent = min(len(line) - len(line.lstrip()) for line in entries)
    names = []
    for line in entries:
        if len(line) - len(line.lstrip()) == indent:
            match = _ENTRY.match(line.strip())
            names.append(match.group(1).lstrip("*") if match else line.strip())
    return names


def _parameters(function: Callable[..., Any]) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values() if p.name != "self"]


def _returns_something(function: Callable[..., Any]) -> bool:
    annotation = inspect.signature(function).return_annotation
    return annotation not in (None, "None", inspect.Signature.empty)


def docstring_problems(function: Callable[..., Any]) -> list[str]:
    """What the function's docstring leaves out or gets wrong (empty where it is complete)."""
    doc = inspect.getdoc(function)
    if not doc:
        return ["no docstring"]
    sections = _sections(doc)
    problems = []
    if not "".join(sections[""]).strip():
        problems.append("no summary line")
    parameters = _parameters(function)
    if parameters and "Args" not in sections:
        problems.append("no Args section")
    documented = _documented_arguments(sections.get("Args", []))
    problems += [f"parameter '{p}' is not in Args" for p in parameters if p not in documented]
    problems += [f"Args names '{d}', which is no parameter" for d in documented if d not in parameters]
    if _returns_something(function) and "Returns" not in sections:
        problems.append("no Returns section")
    return problems


FUNCTIONS = _public_functions()


@pytest.mark.parametrize(("name", "function"), FUNCTIONS, ids=[name for name, _ in FUNCTIONS])
def test_a_public_function_documents_its_parameters_and_result(
    name: str, function: Callable[..., Any]
) -> None:
    assert docstring_problems(function) == [], name


def test_the_functions_the_readme_names_are_checked() -> None:
    names = {name for name, _ in FUNCTIONS}
    expected = {"polydl.compile", "polydl.matmul", "polydl.conv2d", "polydl.lstm_cell", "polydl.aligned",
                "polydl.api.lower", "polydl.api.build_kernel", "polydl.onnx.compile",
                "polydl.onnx.write_library", "polydl.onnx.network_problems", "polydl.Kernel.__call__"}
    assert expected <= names


def test_help_shows_the_arguments_and_errors() -> None:
    text = pydoc.render_doc(polydl.compile, renderer=pydoc.plaintext)
    for part in ("Args:", "spec:", "params:", "Returns:", "Raises:", "SpecError"):
        assert part in text


def _undocumented(spec: str, sizes: int) -> int:
    """Compile a spec.

    Args:
        spec: the spec.

    Returns:
        A kernel.
    """
    return sizes


def _stale(spec: str) -> int:
    """Compile a spec.

    Args:
        spec: the spec.
        sizes: the sizes, no longer a parameter.

    Returns:
        A kernel.
    """
    return 0


def _variadic(*args: Any, **named: Any) -> int:
    """Call it.

    Args:
        *args: the inputs.
        **named: by name.

    Returns:
        The output.
    """
    return 0


def _no_returns(spec: str) -> int:
    """Compile a spec.

    Args:
        spec: the spec; the word Returns: in a line does not make a section.
    """
    return 0


def test_the_check_finds_what_a_docstring_leaves_out() -> None:
    assert docstring_problems(_undocumented) == ["parameter 'sizes' is not in Args"]
    assert docstring_problems(_stale) == ["Args names 'sizes', which is no parameter"]
    assert docstring_problems(_variadic) == []
    assert docstring_problems(_no_returns) == ["no Returns section"]
    assert docstring_problems(lambda x: x) == ["no docstring"]
