"""The hook where data-parallel gradient reduction plugs into the trainer.

The trainer calls, once per optimizer step:

* ``global_token_count(local_tokens) -> float`` before any backward pass, because each
  micro-batch's loss is divided by the token count of the whole global step;
* ``reduce(grads, loss_sum, n_tokens) -> (grads, loss_sum, n_tokens)`` on the accumulated fp32
  gradients (already weighted by 1/global tokens, so a SUM across ranks gives the global mean
  gradient), the summed token losses and the token count of this rank.

:class:`IdentityGradReducer` is the exact single-process implementation (world size 1: the
local sums are the global sums). The distributed package provides the all-reduce version.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

__all__ = ["IdentityGradReducer"]


class IdentityGradReducer:
    """World size 1: nothing to reduce."""
    world_size = 1
    rank = 0

    def global_token_count(self, local_tokens: float) -> float:
        return float(local_tokens)

    def reduce(self, grads: Sequence, loss_sum: float, n_tokens: float) -> Tuple[List, float, float]:
        return list(grads), float(loss_sum), float(n_tokens)

    def mean_over_ranks(self, value: float) -> float:
        return float(value)

    def broadcast_flag(self, flag: bool) -> bool:
        """Agree on a stop request across ranks (single process: the flag itself)."""
        return bool(flag)
