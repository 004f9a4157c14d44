"""The numpy reference of a nest, built on first use: a kernel loaded from the cache never
needs isl unless its reference is asked for."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from polydl.ir import LoopNest
from polydl.poly.model import PolyModel, build_model
from polydl.poly.reference import make_reference


class LazyReference:
    def __init__(self, nest: LoopNest, params: Mapping[str, int], model: PolyModel | None = None) -> None:
        self.nest, self.params, self.model = nest, dict(params), model
        self._run: Callable[[dict[str, np.ndarray]], None] | None = None

    def __call__(self, arrays: dict[str, np.ndarray]) -> None:
        if self._run is None:
            model = self.model or build_model(self.nest, self.params)
            self._run = make_reference(model)
        self._run(arrays)
