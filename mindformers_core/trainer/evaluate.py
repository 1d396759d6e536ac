"""Held-out evaluation: mean token cross-entropy and perplexity on fixed samples.

Every evaluation reads the same samples: stream positions ``[0, eval_steps * G)`` of the
held-out dataset (its sampler's seeded permutation of epoch 0 spreads them over the whole
set), ``G`` the global batch size (``eval_steps`` counts global batches, as Megatron's
``eval_iters``), laid out over the data-parallel replicas like a training step: ``G`` is
``micro_batches`` (the accumulation count) batches of ``dp * local_batch_size``, of which
replica ``layout.data_rank`` of ``layout.dims.dp`` reads its slice, and the ranks of one
replica (its tensor-parallel ranks, whose vocabulary-parallel cross-entropy already agrees;
its pipeline stages) read the same one. So the samples, and the loss, are those of one process
with the same global batch, whatever the layout. Each rank sums its token losses and loss
tokens; the sums go through ``layout.global_token_count`` (an all-reduce SUM over the
data-parallel replicas only), so every rank gets ``loss = sum of token losses / loss tokens``
of the whole set, independent of the layout for the same ``G`` (under context parallel each
cp rank's loss sum is its chunks' part, so the summed losses are not divided by cp as the
token counts are). Forward passes only: no
gradient is computed and nothing in the model changes except the running statistics that
:func:`evaluate` resets (QK-Clip max logits, MoE loads), so an evaluation between steps does
not alter training.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .protocols import MaxLogitsModel, MoEStatsModel

__all__ = ["EvalResult", "evaluate", "eval_positions", "reset_running_stats"]


@dataclass
class EvalResult:
    step: int
    loss: float          # nats per loss token
    tokens: int          # loss tokens evaluated (all ranks)

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss) if self.loss < 700 else math.inf


def eval_positions(eval_step: int, local_batch_size: int, rank: int, world: int) -> np.ndarray:
    """Stream positions of ``rank``'s batch ``eval_step`` (contiguous per rank)."""
    base = (int(eval_step) * world + rank) * int(local_batch_size)
    return base + np.arange(int(local_batch_size), dtype=np.int64)


def reset_running_stats(model) -> None:
    """Clear the statistics forward passes collect (MoE loads, QK-Clip max logits)."""
    if isinstance(model, MoEStatsModel):
        model.reset_moe_stats()
    if isinstance(model, MaxLogitsModel):
        model.reset_max_attention_logits()


def evaluate(model, held_out, eval_steps: int, local_batch_size: int, layout,
             step: int = 0, micro_batches: int = 1) -> EvalResult:
    """Evaluate ``model`` on ``eval_steps`` global batches of ``held_out`` (a
    ``TrainDataset``), each ``micro_batches`` batches of ``local_batch_size`` per rank;
    ``layout`` is the run's ``RunLayout`` (trainer/protocols.py)."""
    import mindspore as ms
    loss_parts, local_tokens = [], 0.0
    sampler = held_out.sampler
    for j in range(int(eval_steps) * int(micro_batches)):
        positions = eval_positions(j, local_batch_size, layout.data_rank, layout.dims.dp)
        batch = held_out.samples(sampler.sample_indices(positions))
        loss_sum, n_tokens, _ = model(ms.Tensor(batch["input_ids"].astype(np.int32)),
                                      ms.Tensor(batch["labels"].astype(np.int32)),
                                      ms.Tensor(batch["loss_mask"].astype(np.float32)))
        loss_parts.append(loss_sum)
        local_tokens += float(np.asarray(batch["loss_mask"], np.float64).sum())
    reset_running_stats(model)
    local_loss = float(sum(float(x.asnumpy()) for x in loss_parts))
    total_tokens = layout.global_token_count(local_tokens)
    # context parallel: every cp rank counts the whole sequences' tokens (global_token_count
    # divides their sum by cp) but returns the loss of its own chunks only (models/cp_model.py)
    total_loss = layout.global_token_count(local_loss) * layout.dims.cp
    if total_tokens <= 0:
        raise ValueError("the held-out batches have no loss tokens (every loss_mask is 0)")
    return EvalResult(step=int(step), loss=total_loss / total_tokens, tokens=int(total_tokens))
