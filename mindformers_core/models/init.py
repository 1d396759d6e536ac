"""Deterministic weight initialisation from a seed, independent of MindSpore's RNG state.

Each parameter gets its own numpy ``RandomState(seed, crc32(name))`` stream, so two builds with
the same seed are bit-identical and adding a parameter does not change the others.
Rules (Megatron): norms = 1; ``expert_bias`` = 0; every other weight ~ N(0, sigma) with
sigma = initializer_range, and sigma / sqrt(2 * num_layers) for the projections that write
into the residual stream (``linear_proj``, ``linear_fc2``, ``experts.weight2``).

muP (``mup_width_mult`` w = hidden_size / base_hidden_size, seeds 003/004): every hidden matrix
(ndim >= 2, not the word / position embedding or the output layer -- the same classes as
``optim.mup``) gets sigma / sqrt(w), i.e. init variance ~ 1/fan_in relative to the base width.
Embeddings, the output layer and norms keep sigma (the readout is scaled by the model's 1/w
logit multiplier instead). w None or 1 leaves every value bit-identical to the plain init.
"""
from __future__ import annotations

import math
import zlib

import numpy as np
from mindspore import Tensor

_RESIDUAL_OUT = ("linear_proj.weight", "linear_fc2.weight", "experts.weight2")
# one dimension does not grow with width: muP "vector-like" (optim.mup / optim.param_key globs)
_VECTOR_LIKE_NAMES = ("word_embeddings", "position_embeddings", "output_layer")


def is_mup_hidden_matrix(name: str, shape) -> bool:
    """True for muP hidden (matrix-like) parameters: ndim >= 2 and not an embedding / output."""
    return len(shape) >= 2 and not any(part in name for part in _VECTOR_LIKE_NAMES)


def init_value(name: str, shape, seed: int, initializer_range: float, num_layers: int,
               mup_width_mult=None) -> np.ndarray:
    """The float32 initial value of parameter ``name``."""
    if name.endswith("norm.weight"):
        return np.ones(shape, np.float32)
    if name.endswith("expert_bias"):
        return np.zeros(shape, np.float32)
    sigma = initializer_range
    if name.endswith(_RESIDUAL_OUT):
        sigma = sigma / math.sqrt(2.0 * num_layers)
    if mup_width_mult is not None and mup_width_mult != 1.0 and is_mup_hidden_matrix(name, shape):
        sigma = sigma / math.sqrt(mup_width_mult)
    rng = np.random.RandomState([seed & 0xFFFFFFFF, zlib.crc32(name.encode())])
    return (rng.standard_normal(shape) * sigma).astype(np.float32)


def init_weights(model, seed: int, initializer_range: float, num_layers: int,
                 mup_width_mult=None) -> None:
    """Fill every parameter of ``model`` in place (cast to its storage dtype)."""
    for param in model.get_parameters():
        value = init_value(param.name, tuple(param.shape), seed, initializer_range, num_layers,
                           mup_width_mult)
        param.set_data(Tensor(value).astype(param.dtype))
