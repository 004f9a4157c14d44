"""PyTorch eager references of the general suite's DL operators, keyed by kernel name.

Each computes what its C file computes, with PyTorch's own operators (`F.gelu`,
`F.layer_norm`, `torch.optim.Adam`, `aten.native_batch_norm_backward`, ...) rather than a
transcription of the C, so it is an independent reference as well as the eager side of the
benchmark. An operator takes the kernel's arguments by name (arrays as tensors sharing the
numpy buffers, scalars as floats) and its sizes, and returns the outputs it defines by name
(in-place updates such as an optimiser's return the updated tensors); `call` copies them into
the output buffers. The tensors' dtype is the caller's: float32 when timed beside the C,
float64 in the correctness tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import numpy as np

Tensors = dict[str, Any]
Operator = Callable[[Tensors, Mapping[str, int]], Tensors]


def _rope(x: Any, cos: Any, sin: Any) -> Any:
    """Rotate interleaved pairs (x[2k], x[2k+1]) of x[S][NH][D] by angles given per (s, k)."""
    pairs = x.unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch_module().stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def _adam(kind: str) -> Operator:
    def step(v: Tensors, s: Mapping[str, int]) -> Tensors:
        torch = torch_module()
        w = v["w"]
        w.grad = v["g"]
        optimiser = getattr(torch.optim, kind)(
            [w], lr=v["lr"], betas=(v["beta1"], v["beta2"]), eps=v["eps"],
            weight_decay=v["weight_decay"], foreach=False)
        # PyTorch counts the step before its update: state step t - 1 makes this step t
        optimiser.state[w] = {"step": torch.tensor(float(s["t"] - 1)), "exp_avg": v["m"],
                              "exp_avg_sq": v["v"]}
        optimiser.step()
        return {"w": w, "m": v["m"], "v": v["v"]}

    return step


def _sgd_momentum(v: Tensors, s: Mapping[str, int]) -> Tensors:
    torch = torch_module()
    w = v["w"]
    w.grad = v["g"]
    optimiser = torch.optim.SGD([w], lr=v["lr"], momentum=v["momentum"],
                                weight_decay=v["weight_decay"], foreach=False)
    optimiser.state[w] = {"momentum_buffer": v["buf"]}
    optimiser.step()
    return {"w": w, "buf": v["buf"]}


def _layernorm_backward(v: Tensors, s: Mapping[str, int]) -> Tensors:
    torch = torch_module()
    # the bias's values are not read; it must be given for dbeta to be computed
    dx, dgamma, dbeta = torch.ops.aten.native_layer_norm_backward(
        v["dy"], v["x"], [s["D"]], v["mean"][:, None], v["rstd"][:, None], v["gamma"],
        torch.zeros_like(v["gamma"]), [True, True, True])
    return {"dx": dx, "dgamma": v["dgamma"] + dgamma, "dbeta": v["dbeta"] + dbeta}


def _batchnorm_backward(v: Tensors, s: Mapping[str, int]) -> Tensors:
    aten = torch_module().ops.aten
    dx, dgamma, dbeta = aten.native_batch_norm_backward(
        v["dy"], v["x"], v["gamma"], None, None, v["mean"], v["invstd"], True, 1e-5,
        [True, True, True])
    return {"dx": dx, "dgamma": dgamma, "dbeta": dbeta}


def _attention(causal: bool) -> Operator:
    def attention(v: Tensors, s: Mapping[str, int]) -> Tensors:
        torch = torch_module()
        scores = v["Q"] @ v["K"].T * v["scale"]
        if causal:
            above = torch.ones(s["S"], s["S"], dtype=torch.bool).triu(1)
            scores = scores.masked_fill(above, float("-inf"))
        p = torch.softmax(scores, dim=1)
        return {"P": p, "out": p @ v["V"]}

    return attention


def _rope_computed(v: Tensors, s: Mapping[str, int]) -> Tensors:
    torch = torch_module()
    x = v["x"]
    freq = 1.0 / 10000.0 ** (torch.arange(0, s["D"], 2, dtype=x.dtype) / s["D"])
    angle = torch.arange(s["S"], dtype=x.dtype)[:, None] * freq
    return {"y": _rope(x, torch.cos(angle), torch.sin(angle))}


def _groupnorm(v: Tensors, s: Mapping[str, int]) -> Tensors:
    F = torch_module().nn.functional
    x = v["x"]
    y = F.group_norm(x.flatten(1, 2), s["G"], v["gamma"].flatten(), v["beta"].flatten(), v["eps"])
    return {"y": y.view(x.shape)}


def _maxpool_argmax(v: Tensors, s: Mapping[str, int]) -> Tensors:
    F = torch_module().nn.functional
    y, idx = F.max_pool2d(v["x"], 2, 2, return_indices=True)
    return {"y": y, "idx": idx}


@cache
def _operators() -> dict[str, Operator]:
    torch = torch_module()
    F = torch.nn.functional

    def unary(f: Callable[[Any], Any]) -> Operator:
        return lambda v, s: {"y": f(v["x"])}

    def rows(f: Callable[..., Any]) -> Operator:
        return lambda v, s: {"y": f(v["x"], dim=1)}

    def layernorm(v: Tensors, s: Mapping[str, int]) -> Tensors:
        return {"y": F.layer_norm(v["x"], (s["D"],), v["gamma"], v["beta"], v["eps"])}

    return {
        "gelu_erf": unary(F.gelu),
        "gelu_tanh": unary(lambda x: F.gelu(x, approximate="tanh")),
        "silu": unary(F.silu),
        "swiglu": lambda v, s: {"y": F.silu(v["x"][:, :s["D"]]) * v["x"][:, s["D"]:]},
        "mish": unary(F.mish),
        "elu": lambda v, s: {"y": F.elu(v["x"], v["alpha"])},
        "hardswish": unary(F.hardswish),
        "hardswish_ifelse": unary(F.hardswish),
        "sigmoid": unary(torch.sigmoid),
        "softplus": unary(F.softplus),
        "leaky_relu": lambda v, s: {"y": F.leaky_relu(v["x"], v["slope"])},
        "bias_leaky_relu": lambda v, s: {"y": F.leaky_relu(v["x"] + v["b"], v["slope"])},
        "layernorm": layernorm,
        "layernorm_fused": layernorm,
        "rmsnorm": lambda v, s: {"y": F.rms_norm(v["x"], (s["D"],), v["gamma"], v["eps"])},
        "groupnorm": _groupnorm,
        "instancenorm": lambda v, s: {"y": F.instance_norm(v["x"], weight=v["gamma"],
                                                           bias=v["beta"], eps=v["eps"])},
        "batchnorm_stats": lambda v, s: dict(zip(
            ("var", "mean"), torch.var_mean(v["x"], dim=(0, 2, 3), correction=0), strict=True)),
        "layernorm_backward": _layernorm_backward,
        "batchnorm_backward": _batchnorm_backward,
        "softmax": rows(torch.softmax),
        "softmax_fmaxf": rows(torch.softmax),
        "softmax_ternary": rows(torch.softmax),
        "softmax_online": rows(torch.softmax),
        "log_softmax": rows(F.log_softmax),
        "cross_entropy": lambda v, s: {
            "loss": F.cross_entropy(v["logits"], v["label"].long(), reduction="none"),
            "lp": F.log_softmax(v["logits"], dim=1)},
        "attention": _attention(causal=False),
        "attention_causal": _attention(causal=True),
        "rope_tables": lambda v, s: {"y": _rope(v["x"], v["cos_t"], v["sin_t"])},
        "rope_computed": _rope_computed,
        "embedding": lambda v, s: {"out": F.embedding(v["tok"].long(), v["emb"])},
        "embedding_backward": lambda v, s: {
            "dW": v["dW"].index_add(0, v["tok"].long(), v["g"])},
        "maxpool_argmax": _maxpool_argmax,
        "sgd_momentum": _sgd_momentum,
        "adam": _adam("Adam"),
        "adamw": _adam("AdamW"),
        "transpose_2d": lambda v, s: {"y": v["x"].T},
        "nchw_to_nhwc": lambda v, s: {"y": v["x"].permute(0, 2, 3, 1)},
        "im2col": lambda v, s: {"col": F.unfold(v["x"][None], 3, padding=1).view(
            9 * s["C"], s["H"], s["W"])},
        "cumsum_rows": rows(torch.cumsum),
        "cumsum_local": rows(torch.cumsum),
        "depthwise_conv3x3": lambda v, s: {"y": F.conv2d(v["x"], v["k"][:, None], padding=1,
                                                         groups=s["C"])},
        "batched_gemm": lambda v, s: {"C": torch.baddbmm(v["C"], v["A"], v["Bm"], beta=v["beta"],
                                                         alpha=v["alpha"])},
        "linear_bias_relu": lambda v, s: {
            "y": torch.relu(F.linear(v["x"], v["w"], v["b"]) + v["y"])},
    }


_TORCH: list[Any] = []


def torch_module() -> Any:
    """PyTorch, imported on first use (it is optional: the benchmark runs without it)."""
    if not _TORCH:
        import torch

        _TORCH.append(torch)
    return _TORCH[0]


def operator_names() -> frozenset[str]:
    """The kernels that have a PyTorch reference (needs PyTorch).

    Returns:
        Their names.
    """
    return frozenset(_operators())


def call(name: str, values: Mapping[str, np.ndarray], sizes: Mapping[str, int],
         outputs: Mapping[str, np.ndarray]) -> tuple[str, ...]:
    """Run kernel `name`'s PyTorch operator and copy what it defines into `outputs`.

    Args:
        name: the corpus kernel.
        values: every argument by name (arrays, 0-d arrays for scalars); outputs hold their
            starting values.
        sizes: the kernel's size parameters.
        outputs: the output buffers by name (may be the same arrays as in `values`).

    Returns:
        The outputs it defined, the ones a comparison may check.

    Raises:
        KeyError: `name` has no PyTorch operator.
    """
    torch = torch_module()
    tensors = {k: (torch.from_numpy(a) if a.ndim else float(a)) for k, a in values.items()}
    with torch.no_grad():
        result = _operators()[name](tensors, sizes)
        for k, value in result.items():
            target = torch.from_numpy(outputs[k])
            if target.data_ptr() != value.data_ptr():
                target.copy_(value)
    return tuple(result)
