"""Forward-only passes through the pipeline stages: held-out evaluation and greedy generation
under ``parallelism.pipeline_parallel`` > 1.

A pipeline rank holds only its stage's weights (distributed/pipeline_release.py), so neither
``model(ids, labels, mask)`` nor ``model.logits`` runs on one rank. :class:`PipelineForward`
runs one batch through the virtual stages in order, each on its rank (virtual stage ``v`` on
stage ``v mod pp``, core/pipeline_split.py): virtual stage 0 embeds the tokens
(``model.embed_ids``), each one runs its decoder layers (``model.run_layers``) and sends the
hidden states ``[B*S, H]`` to the next one's rank; the last computes

* the loss (``model.finish``: the same head and loss as one process's forward), or
* the whole logits of the last position (``model.position_logits``; under pp x tp the tp
  ranks' vocabulary shards of that position gathered), for greedy decoding (their argmax:
  the lowest id on ties, as ``models/generation.next_token``) and for sampling.

Under pp x tp the hidden states are each rank's sequence-parallel ``T/tp`` rows
(``model.hidden_shape``), sent to the rank of the same tp index in the next stage, and a
prompt runs padded to ``model.padded_length`` (the sequence split).

One batch at a time, without the training schedule's overlap: nothing is kept for a
backward. The result goes to every stage with one all-reduce (SUM) over the ``pp`` group, the
other stages adding 0 (exact: one non-zero term), so every rank logs the same eval loss and
decodes the same ids. Every rank of the pipeline group must make the same calls (the same
batches, the same prompt).

Generation (models/generation.py) decodes with a key/value cache (:class:`PipelineDecoder`):
each rank keeps the caches of its virtual stages' layers (models/kv_cache.py
``CachedDecoder.run_layers``), and only the new tokens' whole hidden rows ``[B*L, H]`` go
from stage to stage (under pp x tp every tp rank holds them, the runner's decode). The last
stage gives the next id (greedy: under tp its ranks' tops combined) or, for sampling, the
last position's whole logits, to every stage, where each rank draws a sampled id with the
same seeded generator. Past ``seq_length`` (no room in the cache) each token is a full
forward over the last ``seq_length`` tokens (:meth:`PipelineForward.greedy_next`,
:meth:`PipelineForward.next_logits`).

Only forward passes run: the running statistics they add (the MoE loads, the max attention
logits of the stage's layers) are cleared by the caller (trainer/evaluate.py
``reset_running_stats`` on the model), as for one process.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

__all__ = ["PipelineForward", "PipelineDecoder"]


class PipelineForward:
    """``forward(ids, labels, mask) -> (loss_sum, n_tokens, 0)`` and ``greedy_next(ids)`` of a
    pipeline-parallel model, the same values on every stage (module docstring).

    ``pipeline`` is this rank's ``PipelineParallel`` after ``attach(model)``."""

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.model = pipeline.model
        self.cfg = self.model.cfg

    def _through_stages(self, shape: tuple, embed: Callable, run: Callable, last: Callable):
        """``last(h)`` of the last virtual stage on its rank (None on the others): virtual
        stage 0 starts from ``embed()``, each runs ``run(h, layer indices)``, and the hidden
        states of ``shape`` go from each rank to the next."""
        import mindspore as ms
        pipe, model = self.pipeline, self.model
        split, comm, ranks = pipe.split, pipe.comm, pipe.stage_ranks
        like = None
        for v in range(split.num_virtual):
            if v % split.pp != pipe.stage:
                continue
            if v == 0:
                h = embed()
            else:
                if like is None:
                    like = ms.Tensor(np.zeros(shape, np.float32)).astype(model.precision.compute)
                h = comm.recv(like, ranks[(v - 1) % split.pp])
            h = run(h, split.layers[v])
            if v == split.num_virtual - 1:
                return last(h)
            comm.send(h, ranks[(v + 1) % split.pp])
        return None

    def _forward(self, ids, last: Callable, eager: bool = False):
        """``last(h)`` on the last stage after a full forward of ``ids`` [B, S] (``eager``:
        the layers in PyNative, ``model.run_layers``)."""
        model = self.model
        b, s = (int(n) for n in ids.shape)
        tables = model.tables_for(ids)
        return self._through_stages(
            model.hidden_shape(b, s), lambda: model.embed_ids(ids),
            lambda h, layers: model.run_layers(h, tables, layers, eager=eager)[0], last)

    def _to_every_stage(self, values: Optional[np.ndarray], size: int) -> np.ndarray:
        """The last stage's ``values`` on every stage (others pass None: zeros)."""
        mine = np.zeros(size, np.float32) if values is None else values.astype(np.float32)
        return np.asarray(self.pipeline.comm.all_reduce(mine, "pp"), np.float32)

    def __call__(self, input_ids, labels, loss_mask):
        """(loss_sum, n_tokens, aux 0) as Tensors, the last stage's on every stage."""
        import mindspore as ms

        def loss(h):
            loss_sum, n_tokens, _ = self.model.finish(h, None, input_ids, labels, loss_mask)
            return np.array([float(loss_sum.asnumpy()), float(n_tokens.asnumpy())])

        both = self._to_every_stage(self._forward(input_ids, loss), 2)
        return (ms.Tensor(both[0]), ms.Tensor(both[1]), ms.Tensor(np.float32(0.0)))

    def next_logits(self, input_ids) -> np.ndarray:
        """The whole float32 logits ``[V]`` of the last position after ``input_ids`` [1, S]
        on every stage (padded at the end to ``model.padded_length``: causal attention keeps
        the padding from position S - 1)."""
        import mindspore as ms
        model = self.model
        s = int(input_ids.shape[1])
        length = model.padded_length(s)
        ids = input_ids if length == s else ms.Tensor(np.concatenate(
            [input_ids.asnumpy(), np.zeros((1, length - s), np.int32)], 1))
        # eager: without padding the window grows by one token per call, and a compiled layer
        # would compile again for each length (measured: ~3 of the 4 minutes of a 16-token
        # sample under pp2)
        last = self._forward(ids, lambda h: model.position_logits(h, s - 1), eager=True)
        return self._to_every_stage(last, int(self.cfg.vocab_size))

    def greedy_next(self, input_ids) -> int:
        """The greedy next id after ``input_ids`` [1, S] on every stage (the lowest on ties)."""
        return int(np.argmax(self.next_logits(input_ids)))

    def cached_decoder(self, max_length: int) -> "PipelineDecoder":
        """The key/value-cached decode through the stages (:class:`PipelineDecoder`)."""
        return PipelineDecoder(self, max_length)


class PipelineDecoder:
    """``models.generation.IncrementalDecoder`` through the pipeline stages (module
    docstring): every rank of the pipeline group feeds the same ids."""

    def __init__(self, forward: PipelineForward, max_length: int):
        self.forward = forward
        self.cache = forward.model.cached_decoder(max_length)   # this rank's layers' caches
        self._last = None   # the last stage's last hidden row (None on the other stages)

    def feed(self, input_ids) -> None:
        """Append ``input_ids`` [1, L] through every stage."""
        model, cache = self.forward.model, self.cache
        b, new = (int(n) for n in input_ids.shape)
        tables = cache.tables(b, new)
        self._last = self.forward._through_stages(
            (b * new, int(model.cfg.hidden_size)),
            lambda: model.runner.decode_embed(input_ids),
            lambda h, layers: cache.run_layers(h, tables, layers), lambda h: h[-1:])
        cache.advance(new)

    def greedy_next(self) -> int:
        """The last stage's greedy id on every stage (exact as float32 below 2**24)."""
        mine = (None if self._last is None else
                np.array([self.forward.model.runner.decode_greedy(self._last)], np.float32))
        return int(self.forward._to_every_stage(mine, 1)[0])

    def next_logits(self) -> np.ndarray:
        """The last stage's whole logits ``[V]`` of the last position on every stage."""
        mine = (None if self._last is None
                else self.forward.model.runner.decode_logits(self._last))
        return self.forward._to_every_stage(mine, int(self.forward.cfg.vocab_size))
