"""Inputs for the general suite's kernels: random, then conditioned so every result is finite and
means something.

PolyBench kernels take values in [0, 1), as PolyBench's initialisations do, except where a
factorisation or recurrence needs more (a symmetric positive definite matrix for Cholesky and
LU, a diagonally dominant triangle, a contracting Levinson recurrence): random data makes LU
divide by tiny pivots and the recurrences diverge, and then every side computes NaNs. DL
operators take values in [-2, 2) (both branches of an activation run), integer indices in range
(labels below the vocabulary, tokens below the table's rows), non-negative second moments, and
saved statistics (mean, 1/std) that are those of the data they come with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from polydl.bench.general_corpus import CORPUS
from polydl.bench.general_signature import Argument

Values = dict[str, np.ndarray]
# a conditioner sets one argument from the random values of all of them
Conditioner = Callable[[Values, np.random.Generator, Mapping[str, int]], np.ndarray]

SCALARS = {"alpha": 1.5, "beta": 1.2, "eps": 1e-5, "scale": 0.125, "slope": 0.01, "lr": 1e-3,
           "momentum": 0.9, "weight_decay": 0.01, "beta1": 0.9, "beta2": 0.999}


def _spd(v: Values, rng: np.random.Generator, s: Mapping[str, int]) -> np.ndarray:
    n = v["A"].shape[0]
    b = rng.random(v["A"].shape)
    return b @ b.T / n + np.eye(n)


def _row_stats(v: Values) -> tuple[np.ndarray, np.ndarray]:
    x = v["x"].astype(np.float64)
    mean = x.mean(axis=1)
    return mean, 1.0 / np.sqrt(x.var(axis=1) + SCALARS["eps"])


def _channel_stats(v: Values) -> tuple[np.ndarray, np.ndarray]:
    x = v["x"].astype(np.float64)
    mean = x.mean(axis=(0, 2, 3))
    return mean, 1.0 / np.sqrt(x.var(axis=(0, 2, 3)) + SCALARS["eps"])


def _wide(low: float, high: float) -> Conditioner:
    return lambda v, rng, s: rng.uniform(low, high, v["x"].shape)


def _below(size: str, array: str) -> Conditioner:
    return lambda v, rng, s: rng.integers(0, s[size], v[array].shape)


CONDITIONING: dict[str, dict[str, Conditioner]] = {
    "cholesky": {"A": _spd},
    "lu": {"A": _spd},
    "ludcmp": {"A": _spd},
    "trisolv": {"L": lambda v, rng, s: np.tril(rng.random(v["L"].shape)) / s["N"] + np.eye(s["N"])},
    "durbin": {"r": lambda v, rng, s: rng.random(v["r"].shape) / (4 * s["N"])},
    "gramschmidt": {"A": lambda v, rng, s: rng.random(v["A"].shape) + np.eye(*v["A"].shape)},
    "nussinov": {"seq": lambda v, rng, s: rng.integers(0, 4, v["seq"].shape),
                 "table": lambda v, rng, s: np.zeros_like(v["table"])},
    "deriche": {"alpha": lambda v, rng, s: np.asarray(0.25)},
    "correlation": {"float_n": lambda v, rng, s: np.asarray(float(s["N"]))},
    "covariance": {"float_n": lambda v, rng, s: np.asarray(float(s["N"]))},
    # every branch of the piecewise activations runs
    "elu": {"x": _wide(-5, 5)},
    "hardswish": {"x": _wide(-5, 5)},
    "hardswish_ifelse": {"x": _wide(-5, 5)},
    "softplus": {"x": _wide(-30, 30)},
    "cross_entropy": {"label": _below("V", "label")},
    "embedding": {"tok": _below("V", "tok")},
    "embedding_backward": {"tok": _below("V", "tok")},
    "adam": {"v": lambda v, rng, s: rng.random(v["v"].shape)},
    "adamw": {"v": lambda v, rng, s: rng.random(v["v"].shape)},
    "layernorm_backward": {"mean": lambda v, rng, s: _row_stats(v)[0],
                           "rstd": lambda v, rng, s: _row_stats(v)[1]},
    "batchnorm_backward": {"mean": lambda v, rng, s: _channel_stats(v)[0],
                           "invstd": lambda v, rng, s: _channel_stats(v)[1]},
}


def make_inputs(name: str, args: list[Argument], sizes: Mapping[str, int],
                seed: int = 0) -> Values:
    """Every argument's starting value (outputs too: `+=` reads them).

    Args:
        name: the corpus kernel.
        args: its arguments at `sizes` (`Signature.arguments`).
        sizes: its size parameters.
        seed: the random generator's seed.

    Returns:
        One C-contiguous array per argument (a 0-d array for a scalar), of its dtype.
    """
    rng = np.random.default_rng(seed)
    dl = CORPUS[name].suite == "dl"
    values: Values = {}
    for a in args:
        if not a.shape:
            values[a.name] = np.asarray(SCALARS.get(a.name, 0.5))
        elif a.dtype.kind in "iu":
            values[a.name] = rng.integers(0, 4, a.shape)
        elif dl:
            values[a.name] = rng.uniform(-2.0, 2.0, a.shape)
        else:
            values[a.name] = rng.random(a.shape)
    for arg, conditioner in CONDITIONING.get(name, {}).items():
        values[arg] = conditioner(values, rng, sizes)
    # astype copies: every array is C-contiguous and owns its data; a scalar stays 0-d
    return {a.name: np.asarray(values[a.name]).astype(a.dtype) for a in args}
