"""Frontends: specs (C loop nests, TOML primitive specs, Python builders) -> `LoopNest` IR.

`load_spec(spec, params)` takes a path or the text of a spec and the size values and returns
`(LoopNest, params)`; `parse_c` parses C text alone; `primitives.PRIMITIVES` builds primitives.
"""

from polydl.frontends import builders
from polydl.frontends.c_loopnest import parse_c
from polydl.frontends.loading import load_spec
from polydl.frontends.toml_spec import parse_toml

__all__ = ["builders", "load_spec", "parse_c", "parse_toml"]
