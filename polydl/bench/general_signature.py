"""A corpus kernel's C signature read on its own: the arguments the reference builds and PyTorch
take, whether or not polydl accepts the body.

Takes a C file of one function (comments and preprocessor lines skipped: the signature uses
no macro); returns
the function's name, its size parameters and its array and scalar arguments with their shapes
at given sizes. A kernel polydl refuses is still built by gcc and run by PyTorch with these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pycparser import c_ast, c_parser

from polydl.errors import PolyDLError
from polydl.frontends.c_text import strip_comments

_DTYPES = {"float": "float32", "double": "float64", "int": "int32", "long": "int64"}


@dataclass(frozen=True)
class Argument:
    """One argument of the kernel function after its size parameters.

    Attributes:
        name: the parameter's name.
        dtype: the element (or scalar) type.
        shape: the extents at the given sizes; () for a scalar.
        is_input: a `const` array or a scalar (the others are outputs, updated in place).
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    is_input: bool


@dataclass(frozen=True)
class Signature:
    """The kernel function's name, its `int` size parameters and its other arguments."""

    function: str
    size_names: tuple[str, ...]
    parameters: tuple[c_ast.Decl, ...]

    def arguments(self, sizes: Mapping[str, int]) -> list[Argument]:
        """The arguments after the sizes, their shapes evaluated at `sizes`.

        Args:
            sizes: every size parameter's value.

        Returns:
            One `Argument` per array or scalar parameter, in declaration order.

        Raises:
            PolyDLError: a size missing from `sizes`, or an extent this reader cannot evaluate.
        """
        missing = [n for n in self.size_names if n not in sizes]
        if missing:
            raise PolyDLError(f"{self.function}: sizes {missing} are not given")
        out = []
        for decl in self.parameters:
            if decl.name in self.size_names:
                continue
            shape: list[int] = []
            node = decl.type
            while isinstance(node, c_ast.ArrayDecl):
                shape.append(_extent(node.dim, sizes, self.function))
                node = node.type
            words = node.type.names if isinstance(node, c_ast.TypeDecl) else []
            dtype = _DTYPES.get(" ".join(w for w in words if w != "signed"))
            if dtype is None:
                raise PolyDLError(f"{self.function}: parameter {decl.name} has type {words}")
            is_const = "const" in (node.quals or [])
            out.append(Argument(decl.name, np.dtype(dtype), tuple(shape), is_const or not shape))
        return out


def read_signature(path: Path) -> Signature:
    """The signature of the one function `path` defines.

    Args:
        path: a C file.

    Returns:
        Its `Signature`.

    Raises:
        PolyDLError: the file does not parse or defines no function or several.
    """
    text = "\n".join("" if line.lstrip().startswith("#") else line
                     for line in strip_comments(path.read_text(), str(path)).splitlines())
    try:
        ast = c_parser.CParser().parse(text, str(path))
    except c_parser.ParseError as exc:
        raise PolyDLError(f"{path}: {exc}") from exc
    functions = [node for node in ast.ext if isinstance(node, c_ast.FuncDef)]
    if len(functions) != 1:
        raise PolyDLError(f"{path}: expected one function, found {len(functions)}")
    decl = functions[0].decl
    params = tuple(p for p in (decl.type.args.params if decl.type.args else ())
                   if isinstance(p, c_ast.Decl))
    sizes = tuple(p.name for p in params
                  if isinstance(p.type, c_ast.TypeDecl) and p.type.type.names == ["int"])
    return Signature(decl.name, sizes, params)


def _extent(node: c_ast.Node, sizes: Mapping[str, int], function: str) -> int:
    if isinstance(node, c_ast.ID) and node.name in sizes:
        return int(sizes[node.name])
    if isinstance(node, c_ast.Constant) and node.type == "int":
        return int(node.value, 0)
    if isinstance(node, c_ast.BinaryOp) and node.op in ("+", "-", "*", "/"):
        a, b = _extent(node.left, sizes, function), _extent(node.right, sizes, function)
        return {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[node.op]
    raise PolyDLError(f"{function}: cannot evaluate the extent at {node.coord}")
