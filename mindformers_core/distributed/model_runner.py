"""The interface a ``GPTModel`` runs its forward through, and the pipeline stages through it.

A runner holds how the model's pieces execute on this rank: ``models/compiled.py``'s
``Runner`` (one process, ``training.jit`` none / layer / model), ``models/tp_model.py``'s
``TensorParallelRunner`` (the tensor-parallel cut) and ``distributed/fsdp.py``'s
``FSDPRunner`` (the weights gathered one unit at a time). The model calls

* ``embed(input_ids)``: the embedded tokens ``[T, H]`` (this rank's tokens);
* ``layers(h, tables, indices)``: the decoder layers ``indices`` (consecutive, ascending; None
  = all of them) on ``h``: ``(h, summed aux loss or None, [max_logits per layer run])`` -- a
  pipeline stage runs its range of layers through the same call;
* ``head(h, labels, loss_mask)``: ``(loss_sum, n_tokens)``;
* ``model(input_ids, labels, loss_mask)``: the compiled whole forward, under ``mode`` "model"
  only;
* ``mtp_depth(depth, h, e, tables)`` / ``mtp_head(h, labels, loss_mask, w_norm)``: one
  multi-token prediction depth (models/mtp.py ``MTPLayer``) on the previous depth's hidden
  states and the shifted tokens' embedding ``e`` (``embed``'s), and a depth's ``(loss_sum,
  n_tokens)`` through its own final norm gain and the shared output layer;
* ``position_logits(h, position)``: the whole float32 logits ``[V]`` of one position of the
  last hidden states (what a pipeline's last stage decodes from; a collective of the group
  when the vocabulary is split);
* ``sequence_shards`` / ``padded_length(seq)``: how many ranks split a micro-batch's tokens
  (``h`` holds ``T / sequence_shards`` rows) and the length a decoding forward of ``seq``
  tokens runs at;
* the key/value-cached decode (models/kv_cache.py), where every rank of the group holds
  every new token's whole row: ``decode_embed(ids)``, ``decode_layer(layer, h, tables,
  attention)`` (the cache's ``attention(attn, x, tables, attn_weights) -> (out,
  max_logits)``), and of one last row ``decode_logits(h_row)`` (whole float32 logits ``[V]``)
  and ``decode_greedy(h_row)`` (its greedy id), the same on every rank of the group.

The capabilities a runner may lack are members with a declared answer rather than methods a
caller looks for: ``gathers_weights`` / ``full_weights`` (the weights are shards that the
runner gathers), ``vocab_parallel`` / ``greedy_next`` / ``next_logits`` (no rank has whole
logits; the runner combines the ranks' vocabulary shards). :class:`RunnerDefaults` gives the
answers of a runner that has none of them. This module lives in ``distributed/`` because
``models/`` already imports ``distributed/`` and never the other way (``fsdp.py`` implements
it without importing a model).
"""
from __future__ import annotations

from typing import Optional, Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = ["ModelRunner", "RunnerDefaults", "run_layer_steps"]


@runtime_checkable
class ModelRunner(Protocol):
    """What ``GPTModel`` (models/language_model.py) and the pipeline call (module docstring)."""

    #: the ``training.jit`` mode that runs: "none", "layer" or "model"
    mode: str

    @property
    def gathers_weights(self) -> bool:
        """Whether :meth:`full_weights` gathers shards (a collective of the group)."""

    @property
    def vocab_parallel(self) -> bool:
        """Whether :meth:`greedy_next` and :meth:`next_logits` combine vocabulary shards."""

    def embed(self, input_ids): ...

    def layers(self, h, tables, indices: Optional[Sequence[int]] = None) -> tuple: ...

    def head(self, h, labels, loss_mask) -> tuple: ...

    def model(self, input_ids, labels, loss_mask) -> tuple: ...

    def mtp_depth(self, depth, h, emb, tables) -> tuple: ...

    def mtp_head(self, h, labels, loss_mask, w_norm) -> tuple: ...

    def full_weights(self, weights: Sequence) -> tuple: ...

    @property
    def sequence_shards(self) -> int:
        """The ranks a micro-batch's tokens are split over (sequence parallel: tp)."""

    def padded_length(self, seq: int) -> int: ...

    def position_logits(self, h, position: int): ...

    def greedy_next(self, input_ids) -> int: ...

    def next_logits(self, input_ids): ...

    def decode_embed(self, input_ids): ...

    def decode_layer(self, layer, h, tables, attention): ...

    def decode_logits(self, h_row) -> np.ndarray: ...

    def decode_greedy(self, h_row) -> int: ...


class RunnerDefaults:
    """The answers of a runner without the optional capabilities: whole weights, whole
    logits, no compiled whole forward. A runner inherits these and overrides what it has."""

    mode: str
    #: the model whose pieces the runner runs (every runner holds it)
    _model: object

    @property
    def gathers_weights(self) -> bool:
        return False

    @property
    def sequence_shards(self) -> int:
        return 1

    def padded_length(self, seq: int) -> int:
        """``seq``: every length runs as it is."""
        return int(seq)

    def position_logits(self, h, position: int):
        """The float32 logits ``[V]`` of row ``position`` of ``h`` (final norm, output layer)."""
        m = self._model
        return m.readout(h[position:position + 1],
                         *self.full_weights(m.output_weights())).asnumpy()[0]

    @property
    def vocab_parallel(self) -> bool:
        return False

    def full_weights(self, weights: Sequence) -> tuple:
        """``weights`` as they are: they are whole on this rank."""
        return tuple(weights)

    # -- the multi-token prediction depths (models/mtp.py) on the whole weights -------------
    def mtp_depth(self, depth, h, emb, tables) -> tuple:
        """(h^k, max_logits, aux or None): the depth's own forward."""
        return depth(h, emb, tables)

    def mtp_head(self, h, labels, loss_mask, w_norm) -> tuple:
        """(loss_sum, n_tokens) of a depth's hidden states: its final norm gain ``w_norm``,
        then the shared output layer."""
        m = self._model
        return m.head(h, labels, loss_mask, w_norm, m.output_weights()[1])

    # -- the key/value-cached decode: the layers' own pieces on the whole weights ------------
    def decode_embed(self, input_ids):
        """The embedded new tokens ``[B*L, H]``."""
        m = self._model
        return m.embed_tokens(input_ids, *self.full_weights((m.embedding.word_embeddings.weight,)))

    def decode_layer(self, layer, h, tables, attention):
        """h after ``layer`` on the new tokens (``TransformerLayer.cached_step``)."""
        return layer.cached_step(h, tables, attention, self.full_weights(layer.weights()),
                                 self.gathers_weights)

    def decode_logits(self, h_row) -> np.ndarray:
        """The float32 logits ``[V]`` of the last hidden row ``h_row`` ``[1, H]``."""
        return np.asarray(self.position_logits(h_row, 0), np.float32)

    def decode_greedy(self, h_row) -> int:
        """The greedy id after ``h_row`` (the lowest on ties)."""
        return int(np.argmax(self.decode_logits(h_row)))

    def model(self, input_ids, labels, loss_mask) -> tuple:
        raise NotImplementedError(f"{type(self).__name__} has no compiled whole forward "
                                  f"(training.jit: model); it runs under mode "
                                  f"{self.mode!r}")

    def greedy_next(self, input_ids) -> int:
        raise NotImplementedError(f"{type(self).__name__} splits no vocabulary "
                                  f"(vocab_parallel False): take the argmax of the model's logits")

    def next_logits(self, input_ids):
        raise NotImplementedError(f"{type(self).__name__} splits no vocabulary "
                                  f"(vocab_parallel False): read the model's logits")


def run_layer_steps(steps: Sequence, h, tables, indices: Optional[Sequence[int]]) -> tuple:
    """``layers``' answer from one step per decoder layer (``step(h, tables) -> (h,
    max_logits, aux or None)``): the steps ``indices`` (all for None) in order, their aux
    losses summed in that order, their max logits listed."""
    aux_total, max_logits = None, []
    for step in (steps if indices is None else [steps[i] for i in indices]):
        h, ml, aux = step(h, tables)
        max_logits.append(ml)
        if aux is not None:
            aux_total = aux if aux_total is None else aux_total + aux
    return h, aux_total, max_logits
