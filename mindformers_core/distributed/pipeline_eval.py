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
batches, the same prompt). Generation through it is a full forward over the last
``seq_length`` tokens per token (``models/generation.py`` asks :meth:`greedy_next` or
:meth:`next_logits`, as for a vocabulary-parallel model: no rank has whole logits), every
rank drawing a sampled id with the same seeded generator.

Only forward passes run: the running statistics they add (the MoE loads, the max attention
logits of the stage's layers) are cleared by the caller (trainer/evaluate.py
``reset_running_stats`` on the model), as for one process.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

__all__ = ["PipelineForward"]


class PipelineForward:
    """``forward(ids, labels, mask) -> (loss_sum, n_tokens, 0)`` and ``greedy_next(ids)`` of a
    pipeline-parallel model, the same values on every stage (module docstring).

    ``pipeline`` is this rank's ``PipelineParallel`` after ``attach(model)``."""

    #: no rank has whole logits: ``models.generation.generate`` decodes through greedy_next
    #: and samples from next_logits
    vocab_parallel = True

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.model = pipeline.model
        self.cfg = self.model.cfg

    def _through_stages(self, ids, last: Callable, eager: bool = False):
        """``last(h)`` of the last virtual stage on its rank (None on the others) after running
        ``ids`` [B, S] through every virtual stage (``eager``: the layers in PyNative,
        ``model.run_layers``)."""
        import mindspore as ms
        pipe, model = self.pipeline, self.model
        split, comm, ranks = pipe.split, pipe.comm, pipe.stage_ranks
        b, s = (int(n) for n in ids.shape)
        tables = model.static_tables(b, s)
        like = None
        for v in range(split.num_virtual):
            if v % split.pp != pipe.stage:
                continue
            if v == 0:
                h = model.embed_ids(ids)
            else:
                if like is None:
                    like = ms.Tensor(np.zeros(model.hidden_shape(b, s), np.float32)
                                     ).astype(model.precision.compute)
                h = comm.recv(like, ranks[(v - 1) % split.pp])
            h, _ = model.run_layers(h, tables, split.layers[v], eager=eager)
            if v == split.num_virtual - 1:
                return last(h)
            comm.send(h, ranks[(v + 1) % split.pp])
        return None

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

        both = self._to_every_stage(self._through_stages(input_ids, loss), 2)
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
        last = self._through_stages(ids, lambda h: model.position_logits(h, s - 1), eager=True)
        return self._to_every_stage(last, int(self.cfg.vocab_size))

    def greedy_next(self, input_ids) -> int:
        """The greedy next id after ``input_ids`` [1, S] on every stage (the lowest on ties)."""
        return int(np.argmax(self.next_logits(input_ids)))
