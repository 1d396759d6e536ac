"""Token-weighted gradient accumulation over the micro-batches of one optimizer step.

The model returns ``(loss_sum, n_tokens, aux_loss)``: the SUM of token cross-entropies over
``loss_mask``, the token count and the (coefficient-weighted) MoE auxiliary loss. With ``T``
the loss tokens of the whole optimizer step (all micro-batches, all data-parallel ranks, known
before any forward pass because masks come with the data) and ``N`` micro-batches, micro-batch
``j`` back-propagates::

    objective_j = S * (loss_sum_j / T + aux_j / (N * dp))

(``S`` the loss scale, 1 unless fp16 / static loss scaling; ``dp`` the data-parallel ranks
whose gradients are summed). Summed over ``j`` and the ranks this is
``S * (sum of all token losses / T + mean aux)``, whose gradient equals the gradient of ONE
batch holding every micro-batch -- also when micro-batches hold unequal token counts, where
upstream's ``mean_j / N`` is biased (docs/differences.md, row 30). The auxiliary loss follows upstream
(``sense / N`` per micro-batch with ``sense = 1/dp`` under data parallel: a mean over the
micro-batches of every rank).

Gradients of bf16/fp16 parameters are cast to fp32 before they are summed; on CPU the sums of
a micro-batch are one host call (``optim/host/accumulate.py``).
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["make_grad_fn", "accumulate_gradients", "count_loss_tokens"]


def make_grad_fn(model, params: Sequence) -> Callable:
    """``grad_fn(ids, labels, mask, loss_weight, aux_weight)`` ->
    ``((objective, loss_sum, n_tokens, aux), grads)`` with grads aligned with ``params``."""
    import mindspore as ms

    def objective(input_ids, labels, loss_mask, loss_weight, aux_weight):
        loss_sum, n_tokens, aux = model(input_ids, labels, loss_mask)
        return loss_sum * loss_weight + aux * aux_weight, loss_sum, n_tokens, aux

    return ms.value_and_grad(objective, grad_position=None, weights=list(params), has_aux=True)


def count_loss_tokens(batches: Sequence[dict]) -> float:
    """Loss tokens of a list of micro-batches (sum of their ``loss_mask``), in float64."""
    return float(sum(np.asarray(b["loss_mask"], dtype=np.float64).sum() for b in batches))


def accumulate_gradients(grad_fn: Callable, batches: Sequence[dict], total_tokens: float,
                         loss_scale: float = 1.0,
                         data_parallel: int = 1,
                         on_micro: Optional[Callable] = None) -> Tuple[List, float, float]:
    """Run forward+backward on every micro-batch and sum the fp32 gradients.

    Returns ``(grads, loss_sum, aux_mean)``: the gradients of
    ``loss_scale * (sum of token losses / total_tokens + mean aux)``, the local sum of token
    losses (nats) and the mean auxiliary loss over micro-batches (unscaled).
    ``total_tokens`` (all ranks) must be > 0; ``data_parallel`` is the number of ranks whose
    gradients are summed afterwards, so the aux-loss gradient is a mean over all of them.
    ``on_micro(loss_sum_j, tokens_j, grads_j)``, if given, sees every micro-batch's own
    gradients (a monitor; it costs a host sync per micro-batch).
    """
    import mindspore as ms
    from ..optim.host.accumulate import GradientSum
    from ..optim.host.seam import host_kernels

    if total_tokens <= 0:
        raise ValueError("the optimizer step has no loss tokens (every loss_mask is 0); "
                         "check the dataset's loss_mask")
    num_micro = len(batches)
    loss_weight = ms.Tensor(np.float32(loss_scale / total_tokens))
    aux_weight = ms.Tensor(np.float32(loss_scale / (num_micro * data_parallel)))
    acc = GradientSum(host_kernels().accumulate)
    loss_parts, aux_parts = [], []
    for batch in batches:
        (_, loss_sum, _, aux), grads = grad_fn(
            ms.Tensor(np.asarray(batch["input_ids"], dtype=np.int32)),
            ms.Tensor(np.asarray(batch["labels"], dtype=np.int32)),
            ms.Tensor(np.asarray(batch["loss_mask"], dtype=np.float32)),
            loss_weight, aux_weight)
        grads = [g if g.dtype == ms.float32 else g.astype(ms.float32) for g in grads]
        if on_micro is not None:
            on_micro(float(loss_sum.asnumpy()), float(np.asarray(batch["loss_mask"]).sum()),
                     grads)
        acc.add(grads)
        loss_parts.append(loss_sum)
        aux_parts.append(aux)
    # One host sync for all scalars (PyNative is asynchronous; each .asnumpy() waits).
    loss_total = float(sum(float(x.asnumpy()) for x in loss_parts))
    aux_mean = float(sum(float(np.asarray(x.asnumpy())) for x in aux_parts)) / num_micro
    return acc.sums, loss_total, aux_mean
