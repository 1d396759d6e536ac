"""Deterministic weight initialisation from a seed, independent of MindSpore's RNG state.

Each parameter gets its own numpy ``RandomState(seed, crc32(name))`` stream, so two builds with
the same seed are bit-identical and adding a parameter does not change the others.
Rules (Megatron): norms = 1; ``expert_bias`` = 0; every other weight ~ N(0, sigma) with
sigma = initializer_range, and sigma / sqrt(2 * num_layers) for the projections that write
into the residual stream (``linear_proj``, ``linear_fc2``, ``experts.weight2``).
"""
from __future__ import annotations

import math
import zlib

import numpy as np
from mindspore import Tensor

_RESIDUAL_OUT = ("linear_proj.weight", "linear_fc2.weight", "experts.weight2")


def init_value(name: str, shape, seed: int, initializer_range: float, num_layers: int) -> np.ndarray:
    """The float32 initial value of parameter ``name``."""
    if name.endswith("norm.weight"):
        return np.ones(shape, np.float32)
    if name.endswith("expert_bias"):
        return np.zeros(shape, np.float32)
    sigma = initializer_range
    if name.endswith(_RESIDUAL_OUT):
        sigma = sigma / math.sqrt(2.0 * num_layers)
    rng = np.random.RandomState([seed & 0xFFFFFFFF, zlib.crc32(name.encode())])
    return (rng.standard_normal(shape) * sigma).astype(np.float32)


def init_weights(model, seed: int, initializer_range: float, num_layers: int) -> None:
    """Fill every parameter of ``model`` in place (cast to its storage dtype)."""
    for param in model.get_parameters():
        value = init_value(param.name, tuple(param.shape), seed, initializer_range, num_layers)
        param.set_data(Tensor(value).astype(param.dtype))
