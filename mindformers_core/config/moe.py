"""Rules of the DeepSeek-V3 router options of the ``model:`` section.

Each rule is a pure function that raises ``ValueError`` with upstream MindFormers' message
(its TransformerConfig names the fields moe_router_num_groups = ``n_group``,
moe_router_group_topk = ``topk_group``, num_moe_experts = ``n_routed_experts``);
``validate_moe_routing`` wraps them as ``ConfigError`` on the field at fault.
Group-limited routing is on when ``topk_group`` is set (``n_group`` alone changes nothing, as
upstream).
"""
from __future__ import annotations

from typing import Callable, Optional

from ..errors import ConfigError
from .schema import check_range


def check_n_group(num_experts: int, n_group: Optional[int], topk_group: Optional[int]) -> None:
    if topk_group is None:
        return
    if n_group is None:
        raise ValueError("When using group limited routing, moe_router_num_groups must be specified.")
    if num_experts % n_group != 0:
        raise ValueError(f"num_moe_experts ({num_experts}) should be divisible by "
                         f"moe_router_num_groups ({n_group}).")


def check_topk_group(n_group: Optional[int], topk_group: Optional[int]) -> None:
    if topk_group is not None and n_group is not None and topk_group > n_group:
        raise ValueError(f"moe_router_group_topk ({topk_group}) should be smaller than "
                         f"moe_router_num_groups ({n_group}).")


def check_topk_within_groups(num_experts: int, top_k: int, n_group: Optional[int],
                             topk_group: Optional[int]) -> None:
    """The k experts of a token must fit in its eligible groups (this project's rule)."""
    if topk_group is None or n_group is None:
        return
    eligible = topk_group * (num_experts // n_group)
    if top_k > eligible:
        raise ValueError(f"num_experts_per_tok ({top_k}) must be <= topk_group * n_routed_experts "
                         f"/ n_group ({eligible}), the experts a token may still choose from.")


DISPATCHER_KEY = "moe_token_dispatcher_type"
#: its values (models/ep_dispatch.py, models/ep_dedup.py)
DISPATCHER_TYPES = ("alltoall", "alltoall_deredundancy")


def dispatcher_into_model(data: dict) -> dict:
    """The raw config with ``parallelism.moe_token_dispatcher_type`` (upstream's newer place)
    copied into ``model:`` when that does not write it, since the MoE layers read the model's
    field; both written with different values is a ConfigError. ``data`` is not modified."""
    par, model = data.get("parallelism"), data.get("model")
    if not isinstance(par, dict) or par.get(DISPATCHER_KEY) not in DISPATCHER_TYPES:
        return data   # absent, or a value whose error parallelism's check names
    if model is not None and not isinstance(model, dict):
        return data   # the model section's own error names it
    model = dict(model or {})
    if DISPATCHER_KEY in model and model[DISPATCHER_KEY] != par[DISPATCHER_KEY]:
        raise ConfigError(f"parallelism.{DISPATCHER_KEY}",
                          f"{par[DISPATCHER_KEY]!r} disagrees with model.{DISPATCHER_KEY}: "
                          f"{model[DISPATCHER_KEY]!r}; write one of them")
    model[DISPATCHER_KEY] = par[DISPATCHER_KEY]
    return {**data, "model": model}


def _wrap(path: str, rule: Callable, *args) -> None:
    try:
        rule(*args)
    except ValueError as exc:
        raise ConfigError(path, str(exc)) from None


def validate_moe_routing(cfg, path: str) -> None:
    """Ranges and consistency of the router options of ModelConfig ``cfg`` at ``path``."""
    for name in ("n_group", "topk_group", "moe_shared_expert_intermediate_size"):
        check_range(getattr(cfg, name), f"{path}.{name}", lo=1)
    check_range(cfg.moe_expert_capacity_factor, f"{path}.moe_expert_capacity_factor", lo=0,
                lo_open=True)
    _wrap(f"{path}.n_group", check_n_group, cfg.n_routed_experts, cfg.n_group, cfg.topk_group)
    _wrap(f"{path}.topk_group", check_topk_group, cfg.n_group, cfg.topk_group)
    _wrap(f"{path}.num_experts_per_tok", check_topk_within_groups, cfg.n_routed_experts,
          cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group)
