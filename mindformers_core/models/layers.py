"""Shared layers: linear (weight [out_features, in_features]), RMSNorm, word embedding, rotary.

All weights are created as zero placeholders in the parameter dtype; ``init.init_weights``
fills them deterministically from a seed once the whole model (and so every parameter name)
exists.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, mint, nn, ops

from .precision import Precision


def placeholder(shape, dtype, name, requires_grad=True) -> Parameter:
    return Parameter(Tensor(np.zeros(shape, np.float32)).astype(dtype), name=name,
                     requires_grad=requires_grad)


class Linear(nn.Cell):
    """y = x W^T without bias; ``weight`` is [out_features, in_features] (MindSpore Dense layout).

    The weight is cast to the compute dtype for the matmul (bf16 storage -> fp32 on CPU).
    """

    def __init__(self, in_features: int, out_features: int, precision: Precision):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.precision = precision
        self.weight = placeholder((out_features, in_features), precision.param, "weight")

    def construct(self, x):
        p = self.precision
        return mint.nn.functional.linear(p.cast(x), p.cast(self.weight))


class RMSNorm(nn.Cell):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32, returned in x's dtype."""

    def __init__(self, size: int, eps: float, precision: Precision):
        super().__init__()
        self.eps = eps
        self.weight = placeholder((size,), precision.param, "weight")

    def construct(self, x):
        x32 = x.astype(ms.float32)
        inv = mint.rsqrt(mint.mean(x32 * x32, -1, keepdim=True) + self.eps)
        return (x32 * inv * self.weight.astype(ms.float32)).astype(x.dtype)


class WordEmbedding(nn.Cell):
    """Table [vocab_size, hidden_size]; lookup returns compute-dtype rows."""

    def __init__(self, vocab_size: int, hidden_size: int, precision: Precision):
        super().__init__()
        self.precision = precision
        self.weight = placeholder((vocab_size, hidden_size), precision.param, "weight")

    def construct(self, input_ids):
        # cast the table first: CPU has no bf16 Gather kernel (no-op when dtypes match)
        return ops.gather(self.precision.cast(self.weight), input_ids, 0)


class Embedding(nn.Cell):
    """Holder so that the table is named ``embedding.word_embeddings.weight``."""

    def __init__(self, vocab_size: int, hidden_size: int, precision: Precision):
        super().__init__()
        self.word_embeddings = WordEmbedding(vocab_size, hidden_size, precision)

    def construct(self, input_ids):
        return self.word_embeddings(input_ids)


def rotary_tables(seq_length: int, dim: int, theta: float):
    """cos, sin tables [seq_length, dim] (float32 numpy) for the rotate-half convention.

    inv_freq_i = theta^(-2i/dim), i < dim/2; angle[t, i] = t * inv_freq_i, repeated twice.
    """
    inv_freq = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.outer(np.arange(seq_length, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rotary(x, cos, sin):
    """RoPE on the last dim of x [..., S, d]: x*cos + rotate_half(x)*sin, rotate_half = [-x2, x1]."""
    half = x.shape[-1] // 2
    rotated = mint.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def causal_attention(q, k, v, scale: float, causal_mask):
    """Softmax attention with a causal mask; returns (context, max_logit_per_head).

    q, k: [B, N, S, D]; v: [B, N, S, Dv]; causal_mask: bool [S, S], True where key j > query i.
    scores = q k^T * scale (float32); masked entries are -inf before the softmax.
    max_logit_per_head [N] = max over batch, query and unmasked key of the scaled scores,
    detached (one reduction per layer; used by QK-Clip).
    """
    scores = ops.matmul(q, k.swapaxes(-1, -2)).astype(ms.float32) * scale
    scores = ops.masked_fill(scores, causal_mask, float("-inf"))
    max_logits = ops.stop_gradient(ops.amax(scores, axis=(0, 2, 3)))
    probs = mint.softmax(scores, -1).astype(v.dtype)
    return ops.matmul(probs, v), max_logits
