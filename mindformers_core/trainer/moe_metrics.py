"""MoE load statistics of an optimizer step, for ``metrics.jsonl`` and the step line.

Every step the per-layer tokens-per-expert counts gathered over the step's micro-batches are
summed over the data-parallel ranks (the DP reducer's ``sync_moe_stats``; the expert-bias
update after the optimizer step reads the same global counts). Every ``log_interval`` steps
(and the last) the step's statistics are read back from the model's MoE layers:

* ``tokens_per_expert`` [E]: routed (token, expert) pairs of the whole step, all ranks (before
  capacity drops);
* ``imbalance``: max / mean of ``tokens_per_expert`` (1 = perfectly balanced; 0 if nothing
  was routed);
* ``aux_loss``: the layer's load-balancing loss (coefficient included), mean over the
  step's micro-batches of every data-parallel replica (distributed/setup.py
  ``ParallelRun.sync_moe_stats``); null when the layer has none;
* ``dropped``: pairs dropped by the expert capacity in the step's micro-batches, every
  replica's;
* ``tokens_per_ep_rank`` (expert parallel only) [ep]: the pairs routed to each EP rank's
  experts, ``sum of tokens_per_expert`` over that rank's block of ``E / ep`` experts (the
  rows its experts compute, before drops).

``metrics.jsonl`` gets ``"moe": {"layers": {"<i>": {...}}, "max_imbalance", "dropped"}``; the step
line gets ``moe_imbalance: <max over layers>, moe_dropped: <sum>`` and, under expert
parallelism, ``moe_ep_rank_tokens: [per EP rank, summed over layers]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol, runtime_checkable

import numpy as np

__all__ = ["MoELayerStats", "MoEStepStats", "ep_rank_load", "load_imbalance", "log_due",
           "moe_step_stats"]


@runtime_checkable
class MoEModel(Protocol):
    def moe_layers(self) -> Dict[int, Any]: ...


def load_imbalance(load) -> float:
    """max / mean of a tokens-per-expert vector (0 when it is all zeros)."""
    load = np.asarray(load, np.float64)
    mean = load.mean() if load.size else 0.0
    return float(load.max() / mean) if mean > 0 else 0.0


def ep_rank_load(load, ep: int) -> List[float]:
    """Pairs routed to each of ``ep`` ranks' consecutive expert blocks."""
    load = np.asarray(load, np.float64)
    if ep < 1 or load.size % ep:
        raise ValueError(f"{load.size} experts cannot be split over {ep} expert-parallel ranks")
    return [float(x) for x in load.reshape(ep, -1).sum(1)]


def log_due(step: int, log_interval: int, total_steps: int) -> bool:
    return step % log_interval == 0 or step == total_steps


@dataclass(frozen=True)
class MoELayerStats:
    tokens_per_expert: List[float]
    imbalance: float
    aux_loss: Optional[float]
    dropped: int
    tokens_per_ep_rank: Optional[List[float]] = None

    def row(self) -> dict:
        out = {"tokens_per_expert": self.tokens_per_expert, "imbalance": self.imbalance,
               "aux_loss": self.aux_loss, "dropped": self.dropped}
        if self.tokens_per_ep_rank is not None:
            out["tokens_per_ep_rank"] = self.tokens_per_ep_rank
        return out


@dataclass(frozen=True)
class MoEStepStats:
    layers: Dict[int, MoELayerStats]

    @property
    def max_imbalance(self) -> float:
        return max(s.imbalance for s in self.layers.values())

    @property
    def dropped(self) -> int:
        return sum(s.dropped for s in self.layers.values())

    @property
    def tokens_per_ep_rank(self) -> Optional[List[float]]:
        """Pairs per EP rank summed over the layers (None without expert parallelism)."""
        per = [s.tokens_per_ep_rank for s in self.layers.values()
               if s.tokens_per_ep_rank is not None]
        return [float(x) for x in np.sum(per, 0)] if per else None

    def row(self) -> dict:
        out = {"layers": {str(i): s.row() for i, s in sorted(self.layers.items())},
               "max_imbalance": self.max_imbalance, "dropped": self.dropped}
        if self.tokens_per_ep_rank is not None:
            out["tokens_per_ep_rank"] = self.tokens_per_ep_rank
        return out

    def short(self) -> str:
        text = f"moe_imbalance: {self.max_imbalance:.2f}, moe_dropped: {self.dropped}"
        ranks = self.tokens_per_ep_rank
        if ranks is not None:
            text += f", moe_ep_rank_tokens: {[int(x) for x in ranks]}"
        return text


def layer_stats(moe) -> MoELayerStats:
    """The statistics a MoE layer gathered since its last ``reset_stats``."""
    load = (np.zeros(moe.num_experts, np.float32) if moe.tokens_per_expert is None
            else np.asarray(moe.tokens_per_expert.asnumpy(), np.float32))
    aux = None
    if moe.aux_sum is not None and moe.num_forwards:
        aux = float(moe.aux_sum.asnumpy()) / moe.num_forwards
    ep = int(moe.expert_parallel)
    return MoELayerStats([float(x) for x in load], load_imbalance(load), aux, int(moe.dropped),
                         ep_rank_load(load, ep) if ep > 1 else None)


def moe_step_stats(model, layout, due: bool) -> Optional[MoEStepStats]:
    """Sum the step's expert loads over the DP ranks, then (when ``due``) read the statistics;
    None for a model without MoE layers or when not due. Call once per step, after the
    micro-batches' forward passes and before the expert-bias update."""
    if not isinstance(model, MoEModel) or not model.moe_layers():
        return None
    layout.sync_moe_stats(model)   # trainer.protocols.RunLayout
    if not due:
        return None
    return MoEStepStats({i: layer_stats(m) for i, m in model.moe_layers().items()})
