"""One virtual pipeline stage of a ``GPTModel``: its forward on a micro-batch and its backward.

Virtual stage ``v`` (core/pipeline_split.py) runs

    v == 0      the embedding of the micro-batch's tokens
    layers      its decoder layers (``model.run_layers``: max logits into their rows)
    v == V - 1  final norm, output layer, loss and the MTP depths (``model.finish``)

The forward runs under ``mindspore.vjp``, which keeps what the backward needs (the
activations of this micro-batch on this stage) until :meth:`StageRunner.backward` is called
with the received output gradient; the last stage differentiates its objective
``loss_sum * loss_weight + aux * aux_weight`` (accumulate.py) with cotangent 1. A stage that is
not the last returns ``(h, aux * aux_weight)`` and gets the cotangents ``(grad of h, 1)``, so a
MoE layer's aux-loss gradient is its own and the rest flows back through ``h``.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["StageRunner"]


class StageRunner:
    """Forward and backward of the virtual stages of one rank over the weights ``params``."""

    def __init__(self, model, split, stage: int, params: Sequence):
        self.model = model
        self.split = split
        self.stage = stage
        self.params = list(params)
        self._saved: Dict[Tuple[int, int], Callable] = {}

    def activation_shape(self, batch_rows: int, seq: int) -> Tuple[int, int]:
        return (batch_rows * seq, self.model.cfg.hidden_size)

    def _stage_fn(self, v: int, batch: dict, loss_weight, aux_weight):
        import mindspore as ms
        from mindspore import mint
        model = self.model
        ids, labels, mask = batch["input_ids"], batch["labels"], batch["loss_mask"]
        b, s = ids.shape
        tables = model.static_tables(b, s)
        layers = self.split.layers[v]
        last = v == self.split.num_virtual - 1

        def fn(h_in):
            h = model.embed_tokens(ids, model.embedding.word_embeddings.weight) if v == 0 \
                else h_in
            h, aux = model.run_layers(h, tables, layers)
            if last:
                loss_sum, n_tokens, aux = model.finish(h, aux, ids, labels, mask)
                return loss_sum * loss_weight + aux * aux_weight, (loss_sum, n_tokens, aux)
            aux = mint.zeros((), dtype=ms.float32) if aux is None else aux.astype(ms.float32)
            return (h, aux * aux_weight), (aux,)
        return fn

    def forward(self, v: int, micro: int, h_in, batch: dict, loss_weight, aux_weight):
        """Run virtual stage ``v`` on micro-batch ``micro``: (h to send or None, stats), with
        stats ``(loss_sum, n_tokens, aux)`` on the last stage and ``(aux,)`` elsewhere."""
        import mindspore as ms
        from mindspore import ops
        if h_in is None:   # the first stage differentiates nothing by its input
            h_in = ms.Tensor(np.zeros((1,), np.float32))
        else:
            # a fresh leaf: fed the output of another live vjp, MindSpore 2.10 returns zero
            # gradients for a weight both graphs use (the tied embedding table)
            h_in = ops.stop_gradient(h_in)
        out, vjp_fn, stats = ms.vjp(self._stage_fn(v, batch, loss_weight, aux_weight), h_in,
                                    weights=self.params, has_aux=True)
        self._saved[(v, micro)] = vjp_fn
        last = v == self.split.num_virtual - 1
        return (None if last else out[0]), stats

    def backward(self, v: int, micro: int, grad_out) -> Tuple[object, List]:
        """Backward of (v, micro) with the received gradient of its output (None on the last
        stage): (gradient of its input h, or None on virtual stage 0; weight gradients)."""
        import mindspore as ms
        vjp_fn = self._saved.pop((v, micro))
        if grad_out is None:
            grads_in, grads_w = vjp_fn(ms.Tensor(np.float32(1.0)))
        else:
            grads_in, grads_w = vjp_fn((grad_out, ms.Tensor(np.float32(1.0))))
        g_in = grads_in[0] if isinstance(grads_in, tuple) else grads_in
        return (None if v == 0 else g_in), list(grads_w)

    @property
    def in_flight(self) -> int:
        """Micro-batches whose activations this rank holds now."""
        return len(self._saved)
