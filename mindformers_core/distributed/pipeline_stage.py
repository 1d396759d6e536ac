"""One virtual pipeline stage of a ``GPTModel``: its forward on a micro-batch and its backward.

Virtual stage ``v`` (core/pipeline_split.py) runs

    v == 0      the embedding of the micro-batch's tokens (``model.embed_ids``)
    layers      its decoder layers (``model.run_layers``: the model's runner,
                distributed/model_runner.py, on their indices; max logits into their rows)
    v == V - 1  final norm, output layer, loss and the MTP depths (``model.finish``)

The forward keeps the stage's input (the received activation, or nothing on virtual stage 0);
the backward recomputes the stage under ``mindspore.vjp`` and applies the received output
gradient at once. Keeping the forward's own graph until the backward is not possible in
PyNative: MindSpore 2.10 runs a ``vjp`` function only while no later ``vjp`` forward is
pending ("Can not find top cell for backward" otherwise), and 1F1B runs the backward of an
older micro-batch after a newer forward. The recompute repeats the forward exactly and inside
``model.recomputing()``, so the expert loads and MTP losses are counted once (the max logits
are a max: unchanged).

The last stage differentiates its objective ``loss_sum * loss_weight + aux * aux_weight``
(accumulate.py) with cotangent 1. A stage that is not the last returns ``(h, aux *
aux_weight)`` and gets the cotangents ``(grad of h, 1)``, so a MoE layer's aux-loss gradient is
its own and the rest flows back through ``h``.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["StageRunner", "StageExecutor"]


class StageRunner:
    """Forward and backward of the virtual stages of one rank over the weights ``params``."""

    def __init__(self, model, split, stage: int, params: Sequence):
        self.model = model
        self.split = split
        self.stage = stage
        self.params = list(params)
        self._saved: Dict[Tuple[int, int], tuple] = {}

    def activation_shape(self, batch_rows: int, seq: int) -> Tuple[int, int]:
        """What travels between stages: this rank's hidden states (``[T/tp, H]`` under
        sequence parallelism)."""
        return self.model.hidden_shape(batch_rows, seq)

    def _stage_fn(self, v: int, batch: dict, loss_weight, aux_weight):
        import mindspore as ms
        from mindspore import mint
        model = self.model
        ids, labels, mask = batch["input_ids"], batch["labels"], batch["loss_mask"]
        tables = model.tables_for(ids)
        layers = self.split.layers[v]
        last = v == self.split.num_virtual - 1

        def fn(h_in):
            h = model.embed_ids(ids) if v == 0 else h_in
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
            # a fresh leaf: fed the output of another vjp, MindSpore 2.10 returns zero
            # gradients for a weight both graphs use (the tied embedding table)
            h_in = ops.stop_gradient(h_in)
        fn = self._stage_fn(v, batch, loss_weight, aux_weight)
        out, stats = fn(h_in)
        self._saved[(v, micro)] = (fn, h_in)
        last = v == self.split.num_virtual - 1
        return (None if last else out[0]), stats

    def backward(self, v: int, micro: int, grad_out) -> Tuple[object, List]:
        """Backward of (v, micro) with the received gradient of its output (None on the last
        stage): (gradient of its input h, or None on virtual stage 0; weight gradients)."""
        import mindspore as ms
        fn, h_in = self._saved.pop((v, micro))
        with self.model.recomputing():
            _, vjp_fn, _ = ms.vjp(fn, h_in, weights=self.params, has_aux=True)
        one = ms.Tensor(np.float32(1.0))
        grads_in, grads_w = vjp_fn(one if grad_out is None else (grad_out, one))
        g_in = grads_in[0] if isinstance(grads_in, tuple) else grads_in
        return (None if v == 0 else g_in), list(grads_w)

    @property
    def in_flight(self) -> int:
        """Micro-batches whose activations this rank holds now."""
        return len(self._saved)


class StageExecutor:
    """One optimizer step of one rank: runs its compute actions and holds what travels.

    ``compute(action)`` runs a forward or backward (its input must have arrived);
    ``outgoing(transfer)`` hands over the tensor a transfer sends, ``incoming(transfer, t)``
    stores what it received; ``result()`` is (fp32 gradients summed over micro-batches, this
    rank's loss sum, its aux loss summed over its stages and averaged over micro-batches).
    """

    def __init__(self, runner: StageRunner, batches: Sequence[dict], loss_weight, aux_weight):
        self.runner = runner
        self.batches = list(batches)
        self.loss_weight, self.aux_weight = loss_weight, aux_weight
        self.inbox: Dict[tuple, object] = {}
        self.outbox: Dict[tuple, object] = {}
        self.acc = None
        self.loss_parts: List = []
        self.aux_parts: List = []

    def _v(self, op) -> int:
        return op.chunk * self.runner.split.pp + op.stage

    def compute(self, op) -> None:
        import mindspore as ms
        v = self._v(op)
        if op.kind == "forward":
            h_in = self.inbox.pop((v, op.micro, "forward")) if v > 0 else None
            out, stats = self.runner.forward(v, op.micro, h_in, self.batches[op.micro],
                                             self.loss_weight, self.aux_weight)
            if out is not None:
                self.outbox[(v, op.micro, "forward")] = out
            if len(stats) == 3:
                self.loss_parts.append(stats[0])
            self.aux_parts.append(stats[-1])
            return
        g_out = self.inbox.pop((v, op.micro, "backward"), None)
        g_in, grads = self.runner.backward(v, op.micro, g_out)
        if g_in is not None:
            self.outbox[(v, op.micro, "backward")] = g_in
        grads = [g if g.dtype == ms.float32 else g.astype(ms.float32) for g in grads]
        if self.acc is None:   # on CPU one host add per micro-batch (optim/host/accumulate.py)
            from ..optim.host.accumulate import GradientSum
            from ..optim.host.seam import host_kernels
            self.acc = GradientSum(host_kernels().accumulate)
        self.acc.add(grads)

    def outgoing(self, t):
        return self.outbox.pop((t.src_v, t.micro, t.kind))

    def incoming(self, t, tensor) -> None:
        self.inbox[(t.dst_v, t.micro, t.kind)] = tensor

    def result(self) -> Tuple[List, float, float]:
        if self.inbox or self.outbox or self.runner.in_flight:
            raise RuntimeError(f"pipeline step ended with tensors in flight: received "
                               f"{sorted(self.inbox)}, unsent {sorted(self.outbox)}")
        loss = float(sum(float(x.asnumpy()) for x in self.loss_parts))
        aux = float(sum(float(np.asarray(x.asnumpy())) for x in self.aux_parts))
        return self.acc.sums, loss, aux / len(self.batches)
