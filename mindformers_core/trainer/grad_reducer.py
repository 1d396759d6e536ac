"""The single-process layout the trainer's helpers take (evaluation, MoE statistics).

:class:`IdentityGradReducer` is the exact world-1 implementation of the parts of
``trainer.protocols.RunLayout`` that ``trainer.evaluate.evaluate`` and
``trainer.moe_metrics.moe_step_stats`` call (the local sums are the global sums). A run gets
its layout from ``distributed.setup.setup_parallel`` (world 1 included).
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

    def sync_moe_stats(self, model) -> None:
        """One process routed every token: its counts are the global ones."""

    def broadcast_flag(self, flag: bool) -> bool:
        """Agree on a stop request across ranks (single process: the flag itself)."""
        return bool(flag)
