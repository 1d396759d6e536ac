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

Each forward stores the detached per-head max of the scaled logits in ``self.last_max_logits``.
"""
from __future__ import annotations

import math

from mindspore import mint, nn

from .layers import Linear, RMSNorm, apply_rotary, causal_attention
from .precision import Precision


def _heads(x, n_heads: int, head_dim: int):
    """[B, S, n*d] -> [B, n, S, d]."""
    b, s, _ = x.shape
    return x.reshape(b, s, n_heads, head_dim).transpose(0, 2, 1, 3)


def _merge(x):
    """[B, n, S, d] -> [B, S, n*d]."""
    b, n, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * d)


class SelfAttention(nn.Cell):
    """GPT attention: fused ``linear_qkv`` (block layout), RoPE on q and k, ``linear_proj``."""

    def __init__(self, hidden_size: int, num_heads: int, num_query_groups: int, precision: Precision):
        super().__init__()
        self.num_heads = num_heads
        self.num_groups = num_query_groups
        self.head_dim = hidden_size // num_heads
        self.softmax_scale = 1.0 / math.sqrt(self.head_dim)
        d = self.head_dim
        self.linear_qkv = Linear(hidden_size, (num_heads + 2 * num_query_groups) * d, precision)
        self.linear_proj = Linear(num_heads * d, hidden_size, precision)
        self.last_max_logits = None

    def construct(self, x, cos, sin, causal_mask):
        n, g, d = self.num_heads, self.num_groups, self.head_dim
        qkv = self.linear_qkv(x)
        q = _heads(qkv[..., : n * d], n, d)
        k = _heads(qkv[..., n * d: (n + g) * d], g, d)
        v = _heads(qkv[..., (n + g) * d:], g, d)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        if g != n:  # grouped-query attention: each kv group serves n/g consecutive heads
            b, _, s, _ = k.shape
            k = k[:, :, None].broadcast_to((b, g, n // g, s, d)).reshape(b, n, s, d)
            v = v[:, :, None].broadcast_to((b, g, n // g, s, d)).reshape(b, n, s, d)
        ctx, self.last_max_logits = causal_attention(q, k, v, self.softmax_scale, causal_mask)
        return self.linear_proj(_merge(ctx))


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
        self.last_max_logits = None

    @property
    def q_param_attr(self) -> str:
        """Attribute name of the projection that holds the per-head q rows."""
        return "linear_q_proj" if self.q_lora_rank is None else "linear_q_up_proj"

    def construct(self, x, cos, sin, causal_mask):
        n, dn, dr, dv = self.num_heads, self.dn, self.dr, self.dv
        if self.q_lora_rank is None:
            q = self.linear_q_proj(x)
        else:
            q = self.linear_q_up_proj(self.q_layernorm(self.linear_q_down_proj(x)))
        q = _heads(q, n, dn + dr)
        kv_a = self.linear_kv_down_proj(x)
        c_kv = self.kv_layernorm(kv_a[..., : self.kv_lora_rank])
        k_pe = kv_a[..., self.kv_lora_rank:][:, None]            # [B, 1, S, dr]
        kv = _heads(self.linear_kv_up_proj(c_kv), n, dn + dv)
        b, _, s, _ = kv.shape
        k_pe = apply_rotary(k_pe, cos, sin).broadcast_to((b, n, s, dr))
        q = mint.cat([q[..., :dn], apply_rotary(q[..., dn:], cos, sin)], -1)
        k = mint.cat([kv[..., :dn], k_pe], -1)
        ctx, self.last_max_logits = causal_attention(q, k, kv[..., dn:], self.softmax_scale,
                                                     causal_mask)
        return self.linear_proj(_merge(ctx))
