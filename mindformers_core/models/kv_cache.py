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

The pieces run through the model's runner (``distributed.model_runner.ModelRunner``'s
``decode_*``), where every rank of a group holds each new token's whole row:

* one process, and fully sharded data parallel (distributed/fsdp.py): the layer's own parts;
  every weight is read through ``full_weights``, so under FSDP each layer's weights are
  gathered from their shards just before the layer runs and dropped after it, as in training;
* tensor parallelism (models/tp_model.py): each rank caches its local heads (or MLA's latent,
  replicated), the row-parallel outputs and the vocabulary-parallel embedding are summed over
  tp, and only the last position's top id (greedy) or its logits (sampling) is combined.

Every rank of the group decodes the same prompt together. A pipeline stage runs its own
layers' range through :meth:`CachedDecoder.run_layers` (distributed/pipeline_eval.py).
"""
from __future__ import annotations

import functools
from typing import List, Optional, Sequence

from mindspore import Tensor, mint

from .attention import CacheableAttention

__all__ = ["CachedDecoder"]


class CachedDecoder:
    """``feed(ids [1, L])`` then ``greedy_next()`` / ``next_logits()`` of what was fed (what
    ``models.generation.generate`` calls; collectives of the group under a parallel layout);
    ``prefill(ids [B, L]) -> logits [B, L, V]`` and ``step(ids [B, 1]) -> logits [B, 1, V]``
    of a model with whole logits."""

    def __init__(self, model, max_length: Optional[int] = None):
        self.model = model
        self.max_length = int(max_length or model.cfg.seq_length)
        self.reset()

    def reset(self) -> None:
        self.length = 0
        self._cache: List[Optional[tuple]] = [None] * len(self.model.decoder_layers())
        self._last = None

    def _attention(self, i: int, attn: CacheableAttention, x, tables, ws):
        q, kv = attn.project(x, tables, *ws)
        if self._cache[i] is not None:
            kv = tuple(mint.cat([old, new], 2) for old, new in zip(self._cache[i], kv))
        self._cache[i] = kv
        return attn.attend(q, kv, tables[-1], *ws)

    def tables(self, batch: int, new: int) -> tuple:
        """The attention tables of ``new`` tokens after the cached ones."""
        if self.length + new > self.max_length:
            raise ValueError(f"the cache holds {self.max_length} positions; {self.length} used, "
                             f"{new} more asked")
        return self.model.position_tables(batch, new, self.length)

    def run_layers(self, h, tables, indices: Optional[Sequence[int]] = None):
        """h after the decoder layers ``indices`` (all for None), each with its cache."""
        layers, runner = self.model.decoder_layers(), self.model.runner
        for i in range(len(layers)) if indices is None else indices:
            h = runner.decode_layer(layers[i], h, tables, functools.partial(self._attention, i))
        return h

    def advance(self, new: int) -> None:
        """Count ``new`` positions as cached (after every layer ran on them)."""
        self.length += new

    def _forward(self, ids) -> Tensor:
        b, new = (int(n) for n in ids.shape)
        tables = self.tables(b, new)
        h = self.run_layers(self.model.runner.decode_embed(ids), tables)
        self.advance(new)
        return h

    def feed(self, ids) -> None:
        """Append ``ids`` [1, L] (the prompt, then each new token)."""
        self._last = self._forward(ids)[-1:]

    def greedy_next(self) -> int:
        """The greedy id after what was fed (the lowest on ties)."""
        return self.model.runner.decode_greedy(self._last)

    def next_logits(self):
        """The whole float32 logits ``[V]`` after what was fed."""
        return self.model.runner.decode_logits(self._last)

    def _logits(self, ids) -> Tensor:
        model = self.model
        if model.vocab_parallel:
            raise NotImplementedError("the logits of a vocabulary-parallel model are split over "
                                      "its ranks: use feed, then greedy_next or next_logits")
        b, new = (int(n) for n in ids.shape)
        h = self._forward(ids)
        return model.readout(h, *model.full_weights(model.output_weights())).reshape(b, new, -1)

    def prefill(self, ids) -> Tensor:
        """Start a sequence: logits of every position of ``ids``."""
        self.reset()
        return self._logits(ids)

    def step(self, ids) -> Tensor:
        """Append ``ids`` (usually one token per row) and return their logits."""
        return self._logits(ids)
