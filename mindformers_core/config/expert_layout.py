"""``parallelism.expert_parallel`` against the model and the world: the checks and the plan's
expert layout (pure; no MindSpore).

Checks (``core.expert_rules``, wrapped as ``ConfigError("parallelism.expert_parallel", ...)``):
``model.n_routed_experts`` divisible by ``expert_parallel`` (whatever the world size, so a
``--check`` on a development machine catches it), and the data-parallel size of the
launcher's world divisible by it (EP is carved out of data parallelism).

The plan (:class:`ExpertPlan`, per EP rank): ``E / ep`` experts of each of the MoE layers
(decoder layers from ``first_k_dense_replace`` on, and every multi-token-prediction depth),
their parameters ``3 H F`` per expert (``weight1`` [H, 2F], ``weight2`` [F, H]) and bytes in
``params_dtype``; ``edp = dp / ep`` ranks hold the same experts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..core.expert_rules import check_expert_count, check_expert_fold
from ..core.memory_plan import DTYPE_BYTES
from ..errors import ConfigError

__all__ = ["ExpertPlan", "check_expert_parallel", "expert_plan"]

FIELD = "parallelism.expert_parallel"


def _routed_experts(model) -> Optional[int]:
    return model.n_routed_experts if model.model_type == "deepseek_v3" else None


def check_expert_parallel(cfg, dp: Optional[int] = None) -> None:
    """ConfigError naming ``parallelism.expert_parallel`` (and ``model.n_routed_experts``);
    with the world's ``dp``, ep must divide the ranks of a stage (``tp * cp * dp``: the
    experts are folded over them, core/parallel_dims.py)."""
    par = cfg.parallelism
    ep = par.expert_parallel
    try:
        check_expert_count(_routed_experts(cfg.model), ep)
        if dp is not None:
            check_expert_fold(par.tensor_parallel, par.context_parallel, dp, ep)
    except ValueError as exc:
        raise ConfigError(FIELD, str(exc)) from None


@dataclass(frozen=True)
class ExpertPlan:
    """Experts per EP rank (see the module docstring)."""
    expert_parallel: int
    expert_data_parallel: int
    num_experts: int
    experts_per_rank: int
    moe_layers: int
    expert_params_per_rank: int
    expert_bytes_per_rank: int
    #: pipeline stages (pp x ep): the counts above are over every stage's MoE layers, and a
    #: rank holds its stage's (the memory plan counts the busiest stage)
    pipeline_parallel: int = 1

    def format(self) -> str:
        where = (f" if it held every stage's layers (pp {self.pipeline_parallel}: a rank "
                 f"holds its stage's MoE layers)" if self.pipeline_parallel > 1 else "")
        return (f"expert parallel  : {self.expert_parallel} (edp {self.expert_data_parallel}); "
                f"{self.experts_per_rank} of {self.num_experts} experts per rank in each of "
                f"{self.moe_layers} MoE layers: {self.expert_params_per_rank} expert params, "
                f"{self.expert_bytes_per_rank} bytes per rank{where}")


def expert_plan(cfg, dp: int, edp: Optional[int] = None) -> Optional[ExpertPlan]:
    """The expert layout of a MoE model on ``dp`` data-parallel ranks (None without routed
    experts); ``edp``: the ranks holding the same experts (``ParallelDims.edp``, ``dp / ep``
    when absent); raises ConfigError as :func:`check_expert_parallel`."""
    check_expert_parallel(cfg, dp)
    m = cfg.model
    num_experts = _routed_experts(m)
    if not num_experts:
        return None
    ep = cfg.parallelism.expert_parallel
    layers = max(0, m.num_layers - m.first_k_dense_replace) + m.num_nextn_predict_layers
    per_rank = num_experts // ep
    params = layers * per_rank * 3 * m.hidden_size * m.resolved_moe_intermediate_size()
    return ExpertPlan(ep, dp // ep if edp is None else int(edp), num_experts, per_rank, layers,
                      params, params * DTYPE_BYTES[m.params_dtype],
                      cfg.parallelism.pipeline_parallel)
