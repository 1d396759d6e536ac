"""Incremental decoding with a key/value cache, for MHA/GQA (``SelfAttention``) and MLA.

``CachedDecoder(model)`` runs the model's own layers (norms, projections, MLP/MoE) on new
tokens only and keeps, per layer, what later tokens attend to:

* MHA / GQA: the rotated keys and the values of the ``G`` kv groups, ``[B, G, T, d]`` (the
  groups are expanded to the heads at attention time, as in ``SelfAttention``);
* MLA: the normalised latent ``c_kv`` ``[B, T, kv_lora_rank]`` and the rotated shared rope key
  ``k_pe`` ``[B, 1, T, dr]`` (DeepSeek-V3's compressed cache); per-head ``k_nope`` and ``v``
  are re-expanded from the latent with ``linear_kv_up_proj`` at each step.

New tokens at positions ``t0 .. t0 + L - 1`` get the rotary angles of those positions and
attend causally to positions ``<= t0 + i``, so the logits equal a full forward over the whole
sequence (tested to rel 1e-5). The cache holds at most ``max_length`` positions (the model's
``seq_length``, the longest sequence its full forward sees in training); beyond that the
caller recomputes over the last window (``models/generation.py``).
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor, mint

from .attention import MLASelfAttention
from .layers import apply_rotary, causal_attention, rotary_tables

__all__ = ["CachedDecoder"]


def _split(x, n: int, d: int):
    b, s, _ = x.shape
    return x.reshape(b, s, n, d).transpose(0, 2, 1, 3)


def _join(x):
    b, n, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * d)


class CachedDecoder:
    """``prefill(ids [B, L]) -> logits [B, L, V]``; ``step(ids [B, 1]) -> logits [B, 1, V]``."""

    def __init__(self, model, max_length: Optional[int] = None):
        self.model = model
        cfg = model.cfg
        self.max_length = int(max_length or cfg.seq_length)
        attn0 = model.decoder.layers[0].self_attention
        rope_dim = attn0.dr if isinstance(attn0, MLASelfAttention) else attn0.head_dim
        cos, sin = rotary_tables(self.max_length, rope_dim, cfg.rope_theta)
        self._cos = model.precision.cast(Tensor(cos))
        self._sin = model.precision.cast(Tensor(sin))
        self.reset()

    def reset(self) -> None:
        self.length = 0
        self._cache: List[Optional[tuple]] = [None] * len(self.model.decoder.layers)

    # ------------------------------------------------------------------ attention
    def _mask(self, new: int) -> Tensor:
        """True where key position j is after query position t0 + i."""
        t0, total = self.length, self.length + new
        return Tensor(np.arange(total)[None, :] > (t0 + np.arange(new))[:, None])

    def _mha(self, i: int, attn, x, cos, sin, mask):
        n, g, d = attn.num_heads, attn.num_groups, attn.head_dim
        qkv = attn.linear_qkv(x)
        q = apply_rotary(_split(qkv[..., : n * d], n, d), cos, sin)
        k = apply_rotary(_split(qkv[..., n * d: (n + g) * d], g, d), cos, sin)
        v = _split(qkv[..., (n + g) * d:], g, d)
        if self._cache[i] is not None:
            k = mint.cat([self._cache[i][0], k], 2)
            v = mint.cat([self._cache[i][1], v], 2)
        self._cache[i] = (k, v)
        if g != n:
            b, _, t, _ = k.shape
            k = k[:, :, None].broadcast_to((b, g, n // g, t, d)).reshape(b, n, t, d)
            v = v[:, :, None].broadcast_to((b, g, n // g, t, d)).reshape(b, n, t, d)
        ctx, _ = causal_attention(q, k, v, attn.softmax_scale, mask)
        return attn.linear_proj(_join(ctx))

    def _mla(self, i: int, attn, x, cos, sin, mask):
        n, dn, dr, dv = attn.num_heads, attn.dn, attn.dr, attn.dv
        if attn.q_lora_rank is None:
            q = attn.linear_q_proj(x)
        else:
            q = attn.linear_q_up_proj(attn.q_layernorm(attn.linear_q_down_proj(x)))
        q = _split(q, n, dn + dr)
        q = mint.cat([q[..., :dn], apply_rotary(q[..., dn:], cos, sin)], -1)
        kv_a = attn.linear_kv_down_proj(x)
        c_kv = attn.kv_layernorm(kv_a[..., : attn.kv_lora_rank])
        k_pe = apply_rotary(kv_a[..., attn.kv_lora_rank:][:, None], cos, sin)
        if self._cache[i] is not None:
            c_kv = mint.cat([self._cache[i][0], c_kv], 1)
            k_pe = mint.cat([self._cache[i][1], k_pe], 2)
        self._cache[i] = (c_kv, k_pe)
        kv = _split(attn.linear_kv_up_proj(c_kv), n, dn + dv)
        b, _, t, _ = kv.shape
        k = mint.cat([kv[..., :dn], k_pe.broadcast_to((b, n, t, dr))], -1)
        ctx, _ = causal_attention(q, k, kv[..., dn:], attn.softmax_scale, mask)
        return attn.linear_proj(_join(ctx))

    # ------------------------------------------------------------------ forward
    def _forward(self, ids) -> Tensor:
        new = int(ids.shape[1])
        if self.length + new > self.max_length:
            raise ValueError(f"the cache holds {self.max_length} positions; {self.length} used, "
                             f"{new} more asked")
        t0 = self.length
        cos, sin = self._cos[t0:t0 + new], self._sin[t0:t0 + new]
        mask = self._mask(new)
        model = self.model
        h = model.embedding(ids)
        for i, layer in enumerate(model.decoder.layers):
            x = layer.input_layernorm(h)
            attn = layer.self_attention
            mix = self._mla if isinstance(attn, MLASelfAttention) else self._mha
            h = h + mix(i, attn, x, cos, sin, mask)
            out = layer.mlp(layer.pre_mlp_layernorm(h))
            h = h + (out[0] if isinstance(out, tuple) else out)
        self.length += new
        h = model.decoder.final_layernorm(h)
        weight = (model.embedding.word_embeddings.weight if model.output_layer is None
                  else model.output_layer.weight)
        p = model.precision
        logits = mint.nn.functional.linear(p.cast(h), p.cast(weight)).astype(ms.float32)
        if model.readout_multiplier is not None:
            logits = logits * model.readout_multiplier
        return logits

    def prefill(self, ids) -> Tensor:
        """Start a sequence: logits of every position of ``ids``."""
        self.reset()
        return self._forward(ids)

    def step(self, ids) -> Tensor:
        """Append ``ids`` (usually one token per row) and return their logits."""
        return self._forward(ids)
