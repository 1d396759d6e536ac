"""Multi-token prediction (DeepSeek-V3 sec. 2.2; upstream's ``num_nextn_predict_layers`` /
``mtp_loss_scaling_factor``).

Depth k = 1..D sees the tokens shifted left by k. With h^0 the main model's last hidden states
(before its final norm) and e^k = Emb(t_{i+k}) from the SHARED embedding table:

    h^k_i = TransformerLayer_k(eh_proj_k([enorm_k(e^k_i), hnorm_k(h^{k-1}_i)]))

and depth k predicts t_{i+k+1} through its own ``final_layernorm`` and the SHARED output layer.
Its loss is the mean token cross-entropy over the positions whose label exists (the last k
positions of each sequence have none and are masked), and

    mtp_loss = mtp_loss_scaling_factor * mean_k loss_k.

Parameter names follow Megatron's MultiTokenPredictionLayer (``mtp.layers.{k}.enorm`` /
``hnorm`` / ``eh_proj`` / ``transformer_layer.*`` / ``final_layernorm``), so the transformer
layer's weights carry the same suffixes as a decoder layer's (``self_attention.linear_*``,
``mlp.*``) and the optimizers' name rules (Muon routing and splits, QK-Clip) treat them alike.
The depth modules only run in the training forward (``GPTModel.construct``); ``logits`` and
generation never call them. They run through the model's runner
(distributed/model_runner.py ``mtp_depth`` / ``mtp_head``): under tensor parallelism the
depth's transformer layer is cut like a decoder layer, and its embedding and head are the
vocabulary-parallel ones (models/tp_model.py).
"""
from __future__ import annotations

from typing import Callable, List, Optional, Protocol, runtime_checkable

import mindspore as ms
from mindspore import nn, ops

from .layers import Linear, RMSNorm, linear, rms_norm
from .precision import Precision


def shift_left(x, zero_fill: bool = False):
    """x [B, S] moved one position left: position i gets x[:, i+1]; the last column is 0
    (``zero_fill``) or the first column (a roll: its value is masked anyway)."""
    last = ops.zeros_like(x[:, :1]) if zero_fill else x[:, :1]
    return ops.cat((x[:, 1:], last), 1)


class MTPLayer(nn.Cell):
    """One prediction depth around a TransformerLayer (see the module docstring)."""

    def __init__(self, transformer_layer: nn.Cell, hidden_size: int, eps: float,
                 precision: Precision):
        super().__init__()
        self.enorm = RMSNorm(hidden_size, eps, precision)
        self.hnorm = RMSNorm(hidden_size, eps, precision)
        self.eh_proj = Linear(2 * hidden_size, hidden_size, precision)
        self.transformer_layer = transformer_layer
        self.final_layernorm = RMSNorm(hidden_size, eps, precision)
        self.precision = precision

    def weights(self) -> tuple:
        """Every weight of the depth but its final norm (the head's), in ``run_with``'s order."""
        return ((self.enorm.weight, self.hnorm.weight, self.eh_proj.weight)
                + self.transformer_layer.weights())

    def project(self, h, emb, w_enorm, w_hnorm, w_proj):
        """The transformer layer's input: ``eh_proj([enorm(e^k); hnorm(h^{k-1})])``."""
        e, n = self.enorm, self.hnorm
        x = ops.cat((rms_norm(emb, w_enorm, e.eps, e.mean_column),
                     rms_norm(h, w_hnorm, n.eps, n.mean_column)), -1)
        return linear(x, w_proj, self.precision)

    def run_with(self, h, emb, tables, *ws):
        """``construct`` with ``weights()`` as arguments (fully sharded data parallel gathers
        them, distributed/fsdp.py ``FSDPRunner``)."""
        return self.transformer_layer.run_with(self.project(h, emb, *ws[:3]), tables, *ws[3:])

    def construct(self, h, emb, tables):
        """(h^k [B*S, H], max_logits [N], aux or None) from h^{k-1} and e^k (both [B*S, H]);
        the layer runs as its Cell (its recompute and compiled forms)."""
        x = self.project(h, emb, self.enorm.weight, self.hnorm.weight, self.eh_proj.weight)
        return self.transformer_layer(x, tables)


class MultiTokenPrediction(nn.Cell):
    """The D depth modules; ``construct`` returns (mtp_loss float32 scalar, per-depth max logits,
    summed MoE aux loss or None)."""

    def __init__(self, layers: List[MTPLayer], loss_scaling_factor: float):
        super().__init__()
        self.layers = nn.CellList(layers)
        self.loss_scaling_factor = float(loss_scaling_factor)

    def construct(self, h, input_ids, labels, loss_mask, tables, embed_fn: Callable,
                  head_fn: Callable, local: Optional[Callable] = None,
                  depth_fn: Optional[Callable] = None):
        """``embed_fn(ids [B, S]) -> [B*S, H]``; ``head_fn(h, labels [T], mask [T], w_norm) ->
        (loss_sum, n_tokens)`` with the shared output layer; ``depth_fn(layer, h, e, tables)``
        runs one depth (default: the layer itself). ``local`` (context parallel,
        models/cp_model.py): this rank's tokens of a [B, S] array; the shifts run on the whole
        sequences, and each depth's loss is this rank's token losses over the whole sequences'
        count (a part: the sum over the cp ranks is the loss)."""
        ids, lab, mask = input_ids, labels, loss_mask.astype(ms.float32)
        take = (lambda x: x) if local is None else local
        run = depth_fn or (lambda layer, hk, e, t: layer(hk, e, t))
        losses, max_logits, aux = [], [], None
        for layer in self.layers:
            ids, lab, mask = shift_left(ids), shift_left(lab), shift_left(mask, zero_fill=True)
            h, ml, a = run(layer, h, embed_fn(take(ids)), tables)
            loss_sum, n_tokens = head_fn(h, take(lab).reshape(-1), take(mask).reshape(-1),
                                         layer.final_layernorm.weight)
            if local is not None:
                n_tokens = mask.sum()
            losses.append(loss_sum / ops.maximum(n_tokens, 1.0))
            max_logits.append(ml)
            if a is not None:
                aux = a if aux is None else aux + a
        mtp_loss = ops.stack(losses).mean() * self.loss_scaling_factor
        return mtp_loss, max_logits, aux


@runtime_checkable
class RecordsMTPLoss(Protocol):
    """A model that records the MTP loss of each training forward (``GPTModel``)."""

    def pop_mtp_losses(self) -> List[float]: ...


def step_mtp_loss(model) -> Optional[float]:
    """Mean MTP loss of the forwards since the last call (this rank's micro-batches), or None
    when the model has no MTP (what the trainer logs as ``mtp_loss``)."""
    if not isinstance(model, RecordsMTPLoss):
        return None
    losses = model.pop_mtp_losses()
    return sum(losses) / len(losses) if losses else None
