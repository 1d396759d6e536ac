"""Memory-efficient causal attention (``use_flash_attention: True``).

CPU: blockwise attention with an online softmax (Milakov & Gimelshein 2018; FlashAttention,
Dao et al. 2022, Alg. 1). Queries and keys are cut into blocks of ``block_size`` positions;
for query block i only key blocks j <= i are visited (causal), and per query row a running max
m, normaliser l and unnormalised context acc are kept:

    s = q_i k_j^T * scale (+ causal bias on the diagonal block)
    m' = max(m, rowmax(s));  c = exp(m - m');  p = exp(s - m')
    l' = l * c + rowsum(p);  acc' = acc * c + p v_j;      context_i = acc / l

so no [S, S] score tensor exists (the largest is [B, N, block, block]). The final m of a row
is the max over its unmasked keys of the scaled logits, so the per-head max for QK-Clip is
amax over batch and rows of m -- the same value as the plain path's, from the same pass.
Each query block runs as a recomputed Cell (MindSpore's ``Cell.recompute``), so the backward
reruns it from (q block, k and v prefix) and no block's probabilities are kept either.

Ascend: MindSpore's fused ``FlashAttentionScore`` primitive (``ops.flash_attention_score`` in
2.10), whose ``softmax_max`` output gives the same per-row max. It cannot run on this CPU
backend; ``attention_function`` selects it only when the device target is Ascend.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from ..distributed.ring_attention import diagonal_bias
from .layers import batch_matmul, batch_matmul_tb, causal_attention

DEFAULT_BLOCK_SIZE = 128


def _query_block(qi, k, v, scale: float, block_size: int, bias=None):
    """(context [B, N, b, Dv], row max [B, N, b, 1]) of the query block ``qi`` whose rows are
    the last ``b`` positions of ``k`` / ``v`` (its causal prefix), one key block at a time.
    ``bias``: the rows of the block of a document mask bias [B, 1, b, s] (``models/documents.py``:
    its causal part included), else the causal bias on the diagonal block."""
    s, b = k.shape[2], qi.shape[2]
    i0 = s - b
    m = l = acc = None
    for j0 in range(0, s, block_size):
        j1 = min(j0 + block_size, s)
        sc = batch_matmul_tb(qi, k[:, :, j0:j1]).astype(ms.float32) * scale
        if bias is not None:
            sc = sc + bias[..., j0:j1]
        elif j0 == i0:   # the diagonal block (blocks share their starts): causal bias
            sc = sc + diagonal_bias(b)
        blk_max = sc.max(axis=-1, keepdims=True)
        m_new = blk_max if m is None else ops.maximum(m, blk_max)
        p = ops.exp(sc - m_new)
        pv = batch_matmul(p.astype(v.dtype), v[:, :, j0:j1]).astype(ms.float32)
        if m is None:
            l, acc = p.sum(-1, keepdims=True), pv
        else:
            c = ops.exp(m - m_new)
            l = l * c + p.sum(-1, keepdims=True)
            acc = acc * c + pv
        m = m_new
    return (acc / l).astype(v.dtype), m


class QueryBlock(nn.Cell):
    """``_query_block`` as a recomputed Cell: the backward reruns the block from its inputs,
    so no block's probabilities are kept between forward and backward."""

    def __init__(self, scale: float, block_size: int):
        super().__init__()
        self.scale, self.block_size = scale, block_size
        self.recompute()

    def construct(self, qi, k, v, bias=None):
        return _query_block(qi, k, v, self.scale, self.block_size, bias)


def blockwise_causal_attention(q, k, v, scale: float, block_size: int = DEFAULT_BLOCK_SIZE,
                               mask_bias=None):
    """(context [B, N, S, Dv], max_logit_per_head [N]) of causal softmax attention, computed
    block by block (see the module docstring). q, k: [B, N, S, D]; v: [B, N, S, Dv].
    ``mask_bias``: a document mask bias [B, 1, S, S] (``models/documents.py``), else causal."""
    s = q.shape[2]
    block = QueryBlock(scale, block_size)
    out, row_max = [], []
    for i0 in range(0, s, block_size):
        i1 = min(i0 + block_size, s)
        rows = () if mask_bias is None else (ops.stop_gradient(mask_bias[:, :, i0:i1, :i1]),)
        ctx, m = block(q[:, :, i0:i1], k[:, :, :i1], v[:, :, :i1], *rows)
        out.append(ctx)
        row_max.append(m)
    max_logits = ops.stop_gradient(ops.amax(ops.cat(row_max, 2), axis=(0, 2, 3)))
    return ops.cat(out, 2), max_logits


def ascend_flash_attention(q, k, v, scale: float, mask_bias=None):
    """(context, max_logit_per_head) through MindSpore's fused FlashAttentionScore (Ascend only;
    BNSD layout, causal ``sparse_mode`` 2 with the compressed 2048 x 2048 mask; v is zero-padded
    to q's head dim when MLA's Dv differs, and the padding is cut off the output).
    ``mask_bias``: a document mask bias [B, 1, S, S] (``models/documents.py``), passed as the
    full uint8 ``atten_mask`` (1: masked) of ``sparse_mode`` 0."""
    from mindspore.ops.operations.nn_ops import FlashAttentionScore
    b, n, s, d = q.shape
    dv = v.shape[-1]
    if dv != d:
        v = ops.cat((v, ops.zeros(v.shape[:-1] + (d - dv,), v.dtype)), -1)
    if mask_bias is None:
        mask = Tensor(np.triu(np.ones((2048, 2048), np.uint8), 1))
        fa = FlashAttentionScore(head_num=n, scale_value=scale, input_layout="BNSD",
                                 sparse_mode=2, next_tokens=0)
    else:
        mask = ops.stop_gradient((mask_bias < 0).astype(ms.uint8))
        fa = FlashAttentionScore(head_num=n, scale_value=scale, input_layout="BNSD",
                                 sparse_mode=0)
    softmax_max, _, _, ctx = fa(q, k, v, None, None, None, mask)
    max_logits = ops.stop_gradient(ops.amax(softmax_max, axis=(0, 2, 3)))
    return ctx[..., :dv], max_logits


def attention_function(use_flash_attention: bool, device_target: str,
                       block_size: int = DEFAULT_BLOCK_SIZE, documents: bool = False) -> Callable:
    """The core attention ``fn(q, k, v, scale, mask_bias) -> (context, max_logits)`` of a
    model: the plain path (``layers.causal_attention``, which adds ``mask_bias``), or the
    memory-efficient one for the device (fused on Ascend, blockwise elsewhere), which reads
    ``mask_bias`` only under document masking (``documents``: it is then a document mask,
    ``models/documents.py``) and otherwise applies the causal mask itself."""
    if not use_flash_attention:
        return causal_attention
    if device_target == "Ascend":
        return lambda q, k, v, scale, mask_bias: ascend_flash_attention(
            q, k, v, scale, mask_bias if documents else None)
    return lambda q, k, v, scale, mask_bias: blockwise_causal_attention(
        q, k, v, scale, block_size, mask_bias if documents else None)
