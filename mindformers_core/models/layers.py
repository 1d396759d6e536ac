"""Shared layers: linear (weight [out_features, in_features]), RMSNorm, word embedding, rotary.

Every layer is a thin Cell holding its Parameters plus a pure function of (inputs, weights):
``construct`` calls ``apply(weights(), ...)``, and ``models.compiled`` calls the same ``apply``
inside ``mindspore.jit`` with the weights passed as graph inputs (a jit graph that captured
Parameters as free variables would keep reading their old buffers after ``set_data``).

The hot paths avoid the two slow patterns of MindSpore 2.10 on CPU: strided views (each costs a
``Contiguous`` copy kernel) and implicit broadcasts in element-wise ops (~10x slower than
same-shape ops). Activations are 2-D ``[tokens, features]`` matrices, linears are 2-D
``MatMul(transpose_b)``, norms and RoPE take full-shape operands built by small matmuls or
cached tables.

All weights are created as zero placeholders in the parameter dtype; ``init.init_weights``
fills them deterministically from a seed once the whole model (and so every parameter name)
exists.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from .precision import Precision

# y = x W^T for 2-D x [T, in] and W [out, in]; batched q k^T and p v for 4-D tensors
matmul_tb = ops.MatMul(transpose_b=True)
matmul = ops.MatMul()
batch_matmul_tb = ops.BatchMatMul(transpose_b=True)
batch_matmul = ops.BatchMatMul()


def placeholder(shape, dtype, name, requires_grad=True) -> Parameter:
    return Parameter(Tensor(np.zeros(shape, np.float32)).astype(dtype), name=name,
                     requires_grad=requires_grad)


def linear(x, weight, precision: Precision):
    """x W^T in the compute dtype; x is [..., in] (folded to 2-D for the matmul)."""
    x = precision.cast(x)
    w = precision.cast(weight)
    if x.ndim == 2:
        return matmul_tb(x, w)
    lead = x.shape[:-1]
    return matmul_tb(x.reshape(-1, x.shape[-1]), w).reshape(lead + (w.shape[0],))


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
        return linear(x, self.weight, self.precision)


def rms_norm(x, weight, eps: float, mean_column):
    """x / sqrt(mean(x^2) + eps) * weight in float32, returned in x's dtype.

    Without broadcasts: mean(x^2) is the matmul (x*x) @ (1/H) [H, 1]; the per-row factor and
    the gain are spread to [T, H] by exact outer products with ones (rsqrt(.) [T, 1] @ 1 [1, H],
    1 [T, 1] @ weight [1, H]), so both element-wise multiplies are same-shape and keep the
    (x * inv) * weight rounding order.
    """
    shape = x.shape
    x32 = x.reshape(-1, shape[-1]).astype(ms.float32)
    ones_row = mean_column.reshape(1, -1) * shape[-1]
    inv = matmul(ops.rsqrt(matmul(x32 * x32, mean_column) + eps), ones_row)
    gain = matmul(ops.ones((x32.shape[0], 1), ms.float32), weight.astype(ms.float32).reshape(1, -1))
    return (x32 * inv * gain).astype(x.dtype).reshape(shape)


class RMSNorm(nn.Cell):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32, returned in x's dtype."""

    def __init__(self, size: int, eps: float, precision: Precision):
        super().__init__()
        self.eps = eps
        self.weight = placeholder((size,), precision.param, "weight")
        self.mean_column = Tensor(np.full((size, 1), 1.0 / size, np.float32))

    def construct(self, x):
        return rms_norm(x, self.weight, self.eps, self.mean_column)


class WordEmbedding(nn.Cell):
    """Table [vocab_size, hidden_size]; lookup returns compute-dtype rows."""

    def __init__(self, vocab_size: int, hidden_size: int, precision: Precision):
        super().__init__()
        self.precision = precision
        self.weight = placeholder((vocab_size, hidden_size), precision.param, "weight")

    def construct(self, input_ids):
        return embed(input_ids, self.weight, self.precision)


def embed(input_ids, table, precision: Precision):
    """Rows of ``table`` for ``input_ids`` in the compute dtype."""
    # cast the table first: CPU has no bf16 Gather kernel (no-op when dtypes match)
    return ops.gather(precision.cast(table), input_ids, 0)


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


def rotate_half_matrix(dim: int) -> np.ndarray:
    """R [dim, dim] with x @ R = rotate_half(x) = [-x2, x1] (exact: one +-1 per column)."""
    half = dim // 2
    r = np.zeros((dim, dim), np.float32)
    r[np.arange(half) + half, np.arange(half)] = -1.0
    r[np.arange(half), np.arange(half) + half] = 1.0
    return r


def apply_rotary(x, cos, sin, rot):
    """RoPE on the last dim of x [..., S, d]: x*cos + rotate_half(x)*sin.

    ``cos``/``sin`` have x's full shape (cached tables, no broadcast) and rotate_half is the
    matmul with ``rot`` = ``rotate_half_matrix(d)`` (no slices, negation or concat).
    """
    d = x.shape[-1]
    rotated = matmul(x.reshape(-1, d), rot).reshape(x.shape)
    return x * cos + rotated * sin


def causal_attention(q, k, v, scale: float, mask_bias):
    """Softmax attention with a causal mask; returns (context, max_logit_per_head).

    q, k: [B, N, S, D]; v: [B, N, S, Dv]; mask_bias: float32 [B, N, S, S], -inf where key j >
    query i and 0 elsewhere (full shape: the add is not a broadcast).
    scores = q k^T * scale (float32), masked entries -inf before the softmax.
    max_logit_per_head [N] = max over batch, query and unmasked key of the scaled scores,
    detached (one reduction per layer; used by QK-Clip).
    """
    scores = batch_matmul_tb(q, k).astype(ms.float32) * scale + mask_bias
    max_logits = ops.stop_gradient(ops.amax(scores, axis=(0, 2, 3)))
    probs = ops.softmax(scores, -1).astype(v.dtype)
    return batch_matmul(probs, v), max_logits


def attention_tables(batch: int, seq: int, q_heads: int, k_heads: int, dim: int, theta: float,
                     precision: Precision, start: int = 0, rope=None):
    """Full-shape constants of one (batch, seq) for attention, as Tensors:
    (cos_q, sin_q [B, Nq, S, d], cos_k, sin_k [B, Nk, S, d], rot [d, d], mask_bias
    [B, Nq, S, start + S] float32 (-inf above the diagonal, 0 elsewhere)).

    The S rows are positions ``start .. start + S - 1`` (their rotary angles) and query i sees
    keys ``j <= start + i`` of all ``start + S`` positions (``start > 0``: new tokens after a
    key/value cache, ``models/kv_cache.py``). ``rope``: (cos, sin) [start + S, d] numpy tables
    to use instead of plain RoPE's (e.g. ``models.yarn``).
    """
    keys = start + seq
    cos, sin = rotary_tables(keys, dim, theta) if rope is None else rope
    cos, sin = cos[start:], sin[start:]

    def full(table, heads):
        return precision.cast(Tensor(np.ascontiguousarray(
            np.broadcast_to(table, (batch, heads, seq, dim)))))

    after = np.arange(keys)[None, :] > start + np.arange(seq)[:, None]
    bias = np.where(after, -np.inf, 0.0).astype(np.float32)
    mask = Tensor(np.ascontiguousarray(np.broadcast_to(bias, (batch, q_heads, seq, keys))))
    rot = precision.cast(Tensor(rotate_half_matrix(dim)))
    return (full(cos, q_heads), full(sin, q_heads), full(cos, k_heads), full(sin, k_heads),
            rot, mask)
