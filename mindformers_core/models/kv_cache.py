"""Incremental decoding with a key/value cache, for MHA/GQA (``SelfAttention``) and MLA.

``CachedDecoder(model)`` runs the model's own layers (norms, MLP/MoE, readout) on new tokens
only. Attention runs in the two halves of ``attention.CacheableAttention``: ``project`` the new
tokens, append their ``kv`` entries to the layer's cache along the sequence axis, ``attend``
the new queries to the whole cache. What is kept per layer is what ``project`` returns:

* MHA / GQA: the rotated keys and the values of the ``G`` kv groups, ``[B, G, T, d]`` (the
  groups are expanded to the heads at attention time, as in a full forward);
* MLA: the normalised latent ``c_kv`` ``[B, 1, T, kv_lora_rank]`` and the rotated shared rope
  key ``k_pe`` ``[B, 1, T, dr]`` (DeepSeek-V3's compressed cache); per-head ``k_nope`` and
  ``v`` are re-expanded from the latent at each step.

New tokens at positions ``t0 .. t0 + L - 1`` get the rotary angles of those positions and
attend causally to positions ``<= t0 + i`` (``GPTModel.position_tables(B, L, t0)``), so the
logits equal a full forward over the whole sequence (tested to rel 1e-5). The cache holds at
most ``max_length`` positions (the model's ``seq_length``, the longest sequence its full
forward sees in training); beyond that the caller recomputes over the last window
(``models/generation.py``).

Every weight is read through ``model.full_weights``: under fully sharded data parallel
(distributed/fsdp.py) each layer's weights are gathered from their shards just before the
layer runs and dropped after it, as in training, so a rank holds one layer's full weights at
a time; every rank of the group decodes the same prompt together.
"""
from __future__ import annotations

from typing import List, Optional

from mindspore import Tensor, mint

from .attention import CacheableAttention
from .layers import rms_norm

__all__ = ["CachedDecoder"]


class CachedDecoder:
    """``prefill(ids [B, L]) -> logits [B, L, V]``; ``step(ids [B, 1]) -> logits [B, 1, V]``."""

    def __init__(self, model, max_length: Optional[int] = None):
        self.model = model
        self.max_length = int(max_length or model.cfg.seq_length)
        self.reset()

    def reset(self) -> None:
        self.length = 0
        self._cache: List[Optional[tuple]] = [None] * len(self.model.decoder.layers)

    def _attention(self, i: int, attn: CacheableAttention, x, tables, ws):
        q, kv = attn.project(x, tables, *ws)
        if self._cache[i] is not None:
            kv = tuple(mint.cat([old, new], 2) for old, new in zip(self._cache[i], kv))
        self._cache[i] = kv
        out, _ = attn.attend(q, kv, tables[-1], *ws)
        return out

    def _forward(self, ids) -> Tensor:
        b, new = (int(n) for n in ids.shape)
        if self.length + new > self.max_length:
            raise ValueError(f"the cache holds {self.max_length} positions; {self.length} used, "
                             f"{new} more asked")
        model = self.model
        tables = model.position_tables(b, new, self.length)
        h = model.embed_tokens(ids, *model.full_weights((model.embedding.word_embeddings.weight,)))
        for i, layer in enumerate(model.decoder.layers):
            ws = model.full_weights(layer.weights())
            na = len(layer.self_attention.weights())
            norm1, norm2 = layer.input_layernorm, layer.pre_mlp_layernorm
            x = rms_norm(h, ws[0], norm1.eps, norm1.mean_column)
            h = h + self._attention(i, layer.self_attention, x, tables, ws[1:1 + na])
            x = rms_norm(h, ws[1 + na], norm2.eps, norm2.mean_column)
            # the MLP runs as its Cell unless its weights were gathered (an expert-parallel
            # MoE Cell holds its own experts)
            h, _ = layer.mlp_block(h, x, tables, *(ws[2 + na:] if model.gathers_weights else ()))
        self.length += new
        return model.readout(h, *model.full_weights(model.output_weights())).reshape(b, new, -1)

    def prefill(self, ids) -> Tensor:
        """Start a sequence: logits of every position of ``ids``."""
        self.reset()
        return self._forward(ids)

    def step(self, ids) -> Tensor:
        """Append ``ids`` (usually one token per row) and return their logits."""
        return self._forward(ids)
