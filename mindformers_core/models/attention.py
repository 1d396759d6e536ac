"""Self-attention blocks: multi-head / grouped-query (GPT) and multi-latent attention (MLA).

Row layouts (weights are [out_features, in_features]):

* ``linear_qkv`` (GPT) is a block layout: rows ``[0, N*d)`` are the query heads (head h owns
  rows ``h*d .. h*d+d-1``), then ``G*d`` key rows, then ``G*d`` value rows (G query groups,
  head h uses group ``h // (N/G)``).
* MLA ``linear_q_up_proj`` (or ``linear_q_proj`` when ``q_lora_rank`` is None) is periodic per
  head with period ``dn + dr``: head h's q_nope rows are ``h*(dn+dr) + [0, dn)`` and its q_rope
  rows ``h*(dn+dr) + [dn, dn+dr)``.
* MLA ``linear_kv_down_proj`` rows ``[0, kv_lora_rank)`` are the compressed kv, the last ``dr``
  rows the shared rope key k_pe (one for all heads).
* MLA ``linear_kv_up_proj`` is periodic per head with period ``dn + dv``: k_nope rows
  ``h*(dn+dv) + [0, dn)``, v rows ``h*(dn+dv) + [dn, dn+dv)``.

Inputs are 2-D ``x [B*S, H]``; ``tables`` is ``layers.attention_tables(...)`` of the batch
(full-shape cos/sin, the rotate-half matrix and the causal mask bias, whose shape also carries
B and S). The weight slices are taken on the weights (row blocks, or one de-interleaving copy of
a weight), never on activations. ``construct`` returns ``(output [B*S, H], max_logits [N])``:
the detached per-head max of the scaled logits, for QK-Clip; nothing is stored on the Cell.

Both blocks are ``apply = attend(project(...))`` (the ``CacheableAttention`` protocol), with the
weights of ``weights()`` passed to both halves:

* ``project(x, tables, *ws) -> (q [B, N, S, dq], kv)``: the queries and the tuple of what later
  tokens attend to, every entry ``[B, heads, S, dim]`` with the sequence on axis 2 (MHA/GQA:
  the rotated keys and the values of the G groups; MLA: the normalised latent c_kv
  ``[B, 1, S, kv_lora_rank]`` and the rotated shared rope key ``[B, 1, S, dr]``);
* ``attend(q, kv, mask, *ws) -> (output [B*S, H], max_logits [N])`` for kv entries holding
  ``T >= S`` positions and a mask bias ``[B, N, S, T]``, so ``models/kv_cache.py`` can append
  kv along axis 2 and attend the new queries to the whole cache.
"""
from __future__ import annotations

import math

from typing import Optional, Protocol, Tuple

from mindspore import nn, ops

from .layers import Linear, RMSNorm, apply_rotary, causal_attention, linear, rms_norm
from .precision import Precision


class CacheableAttention(Protocol):
    """An attention block split at what a key/value cache keeps (see the module docstring)."""

    def weights(self) -> tuple: ...

    def project(self, x, tables, *ws) -> Tuple[object, tuple]: ...

    def attend(self, q, kv: tuple, mask, *ws) -> tuple: ...


def split_heads(x2d, b: int, s: int, n_heads: int, head_dim: int):
    """[B*S, n*d] -> [B, n, S, d]."""
    return x2d.reshape(b, s, n_heads, head_dim).transpose(0, 2, 1, 3)


def merge_heads(x):
    """[B, n, S, d] -> [B*S, n*d]."""
    b, n, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b * s, n * d)


def _periodic_rows(weight, n: int, a: int, b: int):
    """Split a weight whose rows repeat [a rows | b rows] n times into ([n*a, in], [n*b, in])."""
    cols = weight.shape[-1]
    first, second = ops.split(weight.reshape(n, a + b, cols), (a, b), axis=1)
    return first.reshape(n * a, cols), second.reshape(n * b, cols)


class SelfAttention(nn.Cell):
    """GPT attention: fused ``linear_qkv`` (block layout), RoPE on q and k, ``linear_proj``.

    ``head_dim`` d need not be hidden_size / num_heads (Qwen3's explicit ``head_dim``). With
    ``qk_layernorm`` (Qwen3), ``q_layernorm`` and ``k_layernorm`` (gains [d], shared by all
    heads) normalise every head's query and key before RoPE; the norm runs on the projection
    reshaped to one row per (token, head), a contiguous reshape of the 2-D activations.
    ``weights()``: ``(linear_qkv, linear_proj)``, or ``(linear_qkv, q_layernorm, k_layernorm,
    linear_proj)``.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_query_groups: int,
                 precision: Precision, head_dim: Optional[int] = None,
                 qk_layernorm: bool = False, norm_eps: float = 1e-6):
        super().__init__()
        self.num_heads = num_heads
        self.num_groups = num_query_groups
        self.head_dim = hidden_size // num_heads if head_dim is None else head_dim
        self.softmax_scale = 1.0 / math.sqrt(self.head_dim)
        self.core_attention = causal_attention   # or models.blockwise_attention's
        self.precision = precision
        d = self.head_dim
        self.linear_qkv = Linear(hidden_size, (num_heads + 2 * num_query_groups) * d, precision)
        self.qk_layernorm = qk_layernorm
        if qk_layernorm:
            self.q_layernorm = RMSNorm(d, norm_eps, precision)
            self.k_layernorm = RMSNorm(d, norm_eps, precision)
        self.linear_proj = Linear(num_heads * d, hidden_size, precision)

    def weights(self) -> tuple:
        norms = (self.q_layernorm.weight, self.k_layernorm.weight) if self.qk_layernorm else ()
        return (self.linear_qkv.weight,) + norms + (self.linear_proj.weight,)

    def _heads(self, x, w, norm_weight, b: int, s: int, heads: int):
        """[B, heads, S, d] of the projection x W^T, each head RMS-normed when a gain is given."""
        d, p = self.head_dim, self.precision
        y = linear(x, w, p)
        if norm_weight is not None:
            norm = self.q_layernorm   # q and k norms share eps and the mean column of size d
            y = rms_norm(y.reshape(-1, d), norm_weight, norm.eps, norm.mean_column)
        return split_heads(y, b, s, heads, d)

    def project(self, x, tables, *ws):
        """(q [B, N, S, d], (k, v) [B, G, S, d]): rotated queries and keys, the values."""
        n, g, d, p = self.num_heads, self.num_groups, self.head_dim, self.precision
        cos_q, sin_q, cos_k, sin_k, rot, mask = tables
        b, _, s, _ = cos_q.shape   # this rank's rows (a document mask may be whole)
        w_q_norm, w_k_norm = (ws[1], ws[2]) if self.qk_layernorm else (None, None)
        # row blocks of the weight in the compute dtype (no bf16 slice-gradient kernel on CPU)
        wq, wk, wv = ops.split(p.cast(ws[0]), (n * d, g * d, g * d), axis=0)
        q = apply_rotary(self._heads(x, wq, w_q_norm, b, s, n), cos_q, sin_q, rot)
        k = apply_rotary(self._heads(x, wk, w_k_norm, b, s, g), cos_k, sin_k, rot)
        v = split_heads(linear(x, wv, p), b, s, g, d)
        return q, (k, v)

    def attend(self, q, kv, mask, *ws):
        """(output [B*S, H], max_logits [N]) of q over kv = (k, v) [B, G, T, d]."""
        n, g, d = self.num_heads, self.num_groups, self.head_dim
        k, v = kv
        b, _, t, _ = k.shape
        if g != n:  # grouped-query attention: each kv group serves n/g consecutive heads
            k = k[:, :, None].broadcast_to((b, g, n // g, t, d)).reshape(b, n, t, d)
            v = v[:, :, None].broadcast_to((b, g, n // g, t, d)).reshape(b, n, t, d)
        ctx, max_logits = self.core_attention(q, k, v, self.softmax_scale, mask)
        return linear(merge_heads(ctx), ws[-1], self.precision), max_logits

    def apply(self, x, tables, *ws):
        q, kv = self.project(x, tables, *ws)
        return self.attend(q, kv, tables[-1], *ws)

    def construct(self, x, tables):
        return self.apply(x, tables, *self.weights())


class MLASelfAttention(nn.Cell):
    """DeepSeek-V3 multi-latent attention (see the module docstring for the row layouts).

    q = W_qu RMSNorm(W_qd x) (or W_q x), split per head into q_nope [dn] and q_pe [dr];
    [c_kv, k_pe] = W_kvd x; [k_nope, v] = W_kvu RMSNorm(c_kv) per head;
    q = [q_nope, rope(q_pe)], k = [k_nope, rope(k_pe)] (k_pe shared by all heads),
    softmax_scale = 1/sqrt(dn + dr).
    """

    def __init__(self, hidden_size, num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim,
                 qk_rope_head_dim, v_head_dim, norm_eps, precision: Precision):
        super().__init__()
        self.num_heads = num_heads
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.dn, self.dr, self.dv = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.softmax_scale = 1.0 / math.sqrt(self.dn + self.dr)
        self.core_attention = causal_attention   # or models.blockwise_attention's
        self.precision = precision
        q_out = num_heads * (self.dn + self.dr)
        if q_lora_rank is None:
            self.linear_q_proj = Linear(hidden_size, q_out, precision)
        else:
            self.linear_q_down_proj = Linear(hidden_size, q_lora_rank, precision)
            self.q_layernorm = RMSNorm(q_lora_rank, norm_eps, precision)
            self.linear_q_up_proj = Linear(q_lora_rank, q_out, precision)
        self.linear_kv_down_proj = Linear(hidden_size, kv_lora_rank + self.dr, precision)
        self.kv_layernorm = RMSNorm(kv_lora_rank, norm_eps, precision)
        self.linear_kv_up_proj = Linear(kv_lora_rank, num_heads * (self.dn + self.dv), precision)
        self.linear_proj = Linear(num_heads * self.dv, hidden_size, precision)

    @property
    def q_param_attr(self) -> str:
        """Attribute name of the projection that holds the per-head q rows."""
        return "linear_q_proj" if self.q_lora_rank is None else "linear_q_up_proj"

    def weights(self) -> tuple:
        """(q weights..., kv_down, kv_layernorm, kv_up, proj); q: (q_proj,) or
        (q_down, q_layernorm, q_up)."""
        if self.q_lora_rank is None:
            q = (self.linear_q_proj.weight,)
        else:
            q = (self.linear_q_down_proj.weight, self.q_layernorm.weight,
                 self.linear_q_up_proj.weight)
        return q + (self.linear_kv_down_proj.weight, self.kv_layernorm.weight,
                    self.linear_kv_up_proj.weight, self.linear_proj.weight)

    def project(self, x, tables, *ws):
        """(q [B, N, S, dn+dr], (c_kv [B, 1, S, kv_lora_rank], k_pe [B, 1, S, dr])): the
        queries with rotated q_pe, the normalised latent and the rotated shared rope key."""
        n, dn, dr, p = self.num_heads, self.dn, self.dr, self.precision
        cos_q, sin_q, cos_k, sin_k, rot, mask = tables
        b, _, s, _ = cos_q.shape   # this rank's rows (a document mask may be whole)
        if self.q_lora_rank is None:
            w_q, q_in = ws[0], x
        else:
            w_q = ws[2]
            q_in = rms_norm(linear(x, ws[0], p), ws[1], self.q_layernorm.eps,
                            self.q_layernorm.mean_column)
        w_kvd, w_kvn = ws[-4], ws[-3]
        w_q_nope, w_q_pe = _periodic_rows(p.cast(w_q), n, dn, dr)
        q_nope = split_heads(linear(q_in, w_q_nope, p), b, s, n, dn)
        q_pe = apply_rotary(split_heads(linear(q_in, w_q_pe, p), b, s, n, dr), cos_q, sin_q, rot)
        w_ckv, w_kpe = ops.split(p.cast(w_kvd), (self.kv_lora_rank, dr), axis=0)
        c_kv = rms_norm(linear(x, w_ckv, p), w_kvn, self.kv_layernorm.eps,
                        self.kv_layernorm.mean_column)
        k_pe = apply_rotary(linear(x, w_kpe, p).reshape(b, 1, s, dr), cos_k, sin_k, rot)
        q = ops.cat((q_nope, q_pe), -1)
        return q, (c_kv.reshape(b, 1, s, self.kv_lora_rank), k_pe)

    def attend(self, q, kv, mask, *ws):
        """(output [B*S, H], max_logits [N]) of q over kv = (c_kv, k_pe) of T positions:
        per-head k_nope and v are expanded from the latent."""
        n, dn, dr, dv, p = self.num_heads, self.dn, self.dr, self.dv, self.precision
        c_kv, k_pe = kv
        b, _, t, _ = k_pe.shape
        w_kvu, w_proj = ws[-2], ws[-1]
        c_kv = c_kv.reshape(b * t, self.kv_lora_rank)
        w_k_nope, w_v = _periodic_rows(p.cast(w_kvu), n, dn, dv)
        k_nope = split_heads(linear(c_kv, w_k_nope, p), b, t, n, dn)
        v = split_heads(linear(c_kv, w_v, p), b, t, n, dv)
        k = ops.cat((k_nope, k_pe.broadcast_to((b, n, t, dr))), -1)
        ctx, max_logits = self.core_attention(q, k, v, self.softmax_scale, mask)
        return linear(merge_heads(ctx), w_proj, p), max_logits

    def apply(self, x, tables, *ws):
        q, kv = self.project(x, tables, *ws)
        return self.attend(q, kv, tables[-1], *ws)

    def construct(self, x, tables):
        return self.apply(x, tables, *self.weights())
