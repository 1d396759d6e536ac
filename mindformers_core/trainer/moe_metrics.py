"""MoE load statistics of an optimizer step, for ``metrics.jsonl`` and the step line.

Every step the per-layer tokens-per-expert counts gathered over the step's micro-batches are
summed over the data-parallel ranks (the DP reducer's ``sync_moe_stats``; the expert-bias
update after the optimizer step reads the same global counts). Every ``log_interval`` steps
(and the last) the step's statistics are read back from the model's MoE layers:

* ``tokens_per_expert`` [E]: routed (token, expert) pairs of the whole step, all ranks (before
  capacity drops);
* ``imbalance``: max / mean of ``tokens_per_expert`` (1 = perfectly balanced; 0 if nothing
  was routed);
* ``aux_loss``: the layer's load-balancing loss (coefficient included), mean over this
  rank's micro-batches; null when the layer has none;
* ``dropped``: pairs dropped by the expert capacity in this rank's micro-batches.

``metrics.jsonl`` gets ``"moe": {"layers": {"<i>": {...}}, "max_imbalance", "dropped"}``; the step
line gets ``moe_imbalance: <max over layers>, moe_dropped: <sum>``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol, runtime_checkable

import numpy as np

__all__ = ["MoELayerStats", "MoEStepStats", "load_imbalance", "log_due", "moe_step_stats"]


@runtime_checkable
class MoEModel(Protocol):
    def moe_layers(self) -> Dict[int, Any]: ...


@runtime_checkable
class MoELoadReducer(Protocol):
    def sync_moe_stats(self, model) -> None: ...


def load_imbalance(load) -> float:
    """max / mean of a tokens-per-expert vector (0 when it is all zeros)."""
    load = np.asarray(load, np.float64)
    mean = load.mean() if load.size else 0.0
    return float(load.max() / mean) if mean > 0 else 0.0


def log_due(step: int, log_interval: int, total_steps: int) -> bool:
    return step % log_interval == 0 or step == total_steps


@dataclass(frozen=True)
class MoELayerStats:
    tokens_per_expert: List[float]
    imbalance: float
    aux_loss: Optional[float]
    dropped: int

    def row(self) -> dict:
        return {"tokens_per_expert": self.tokens_per_expert, "imbalance": self.imbalance,
                "aux_loss": self.aux_loss, "dropped": self.dropped}


@dataclass(frozen=True)
class MoEStepStats:
    layers: Dict[int, MoELayerStats]

    @property
    def max_imbalance(self) -> float:
        return max(s.imbalance for s in self.layers.values())

    @property
    def dropped(self) -> int:
        return sum(s.dropped for s in self.layers.values())

    def row(self) -> dict:
        return {"layers": {str(i): s.row() for i, s in sorted(self.layers.items())},
                "max_imbalance": self.max_imbalance, "dropped": self.dropped}

    def short(self) -> str:
        return f"moe_imbalance: {self.max_imbalance:.2f}, moe_dropped: {self.dropped}"


def layer_stats(moe) -> MoELayerStats:
    """The statistics a MoE layer gathered since its last ``reset_stats``."""
    load = (np.zeros(moe.num_experts, np.float32) if moe.tokens_per_expert is None
            else np.asarray(moe.tokens_per_expert.asnumpy(), np.float32))
    aux = None
    if moe.aux_sum is not None and moe.num_forwards:
        aux = float(moe.aux_sum.asnumpy()) / moe.num_forwards
    return MoELayerStats([float(x) for x in load], load_imbalance(load), aux, int(moe.dropped))


def moe_step_stats(model, grad_reducer, due: bool) -> Optional[MoEStepStats]:
    """Sum the step's expert loads over the DP ranks, then (when ``due``) read the statistics;
    None for a model without MoE layers or when not due. Call once per step, after the
    micro-batches' forward passes and before the expert-bias update."""
    if not isinstance(model, MoEModel) or not model.moe_layers():
        return None
    if isinstance(grad_reducer, MoELoadReducer):
        grad_reducer.sync_moe_stats(model)
    if not due:
        return None
    return MoEStepStats({i: layer_stats(m) for i, m in model.moe_layers().items()})
