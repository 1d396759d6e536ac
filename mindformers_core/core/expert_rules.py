"""The rules of expert parallelism (pure; upstream's messages). The config layer wraps them as
``ConfigError("parallelism.expert_parallel", message)``; ``core.parallel_dims.make_mesh``
raises the same text.

* the routed experts are split into equal whole-expert blocks, one per EP rank:
  ``n_routed_experts % expert_parallel == 0`` (Megatron / MindSpeed's message);
* EP is carved out of data parallelism: ``data_parallel % expert_parallel == 0``;
* per EP rank: ``n_routed_experts / expert_parallel`` experts of every MoE layer.
"""
from __future__ import annotations

from typing import Optional

__all__ = ["EXPERTS_MESSAGE", "check_expert_count", "check_expert_dp", "check_expert_fold",
           "experts_per_rank"]

#: upstream's text for an expert count that the EP size does not divide
EXPERTS_MESSAGE = "Number of experts should be a multiple of expert model parallel_size."


def check_expert_count(num_experts: Optional[int], ep: int) -> None:
    """ValueError unless ``ep`` >= 1 and ``ep`` whole-expert blocks fit ``num_experts``
    (``None``: a model without routed experts, which only ep 1 fits)."""
    if int(ep) < 1:
        raise ValueError(f"expert_parallel must be a positive integer, but got {ep}.")
    if ep == 1:
        return
    if not num_experts:
        raise ValueError(f"expert_parallel({ep}) splits the routed experts over ranks, but the "
                         f"model has none (model.model_type: deepseek_v3 with "
                         f"model.n_routed_experts)")
    if num_experts % ep:
        raise ValueError(f"{EXPERTS_MESSAGE} model.n_routed_experts({num_experts}) is not "
                         f"divisible by parallelism.expert_parallel({ep}).")


def check_expert_dp(dp: int, ep: int) -> None:
    """ValueError unless the data-parallel size is a multiple of ``ep``."""
    if dp % ep:
        raise ValueError(f"data_parallel({dp}) must be divisible by expert_parallel({ep}).")


def check_expert_fold(tp: int, cp: int, dp: int, ep: int) -> None:
    """ValueError unless ``ep`` divides the ranks of a pipeline stage, ``tp * cp * dp`` (the
    routed experts folded over them, core/parallel_dims.py); without tp and cp upstream's
    data-parallel message (:func:`check_expert_dp`)."""
    if tp * cp == 1:
        check_expert_dp(dp, ep)
    elif (tp * cp * dp) % ep:
        raise ValueError(f"expert_parallel({ep}) must divide tensor_parallel({tp}) * "
                         f"context_parallel({cp}) * data_parallel({dp}) = {tp * cp * dp}: the "
                         f"routed experts are folded over the ranks of a pipeline stage.")


def experts_per_rank(num_experts: int, ep: int) -> int:
    check_expert_count(num_experts, ep)
    return int(num_experts) // int(ep)
