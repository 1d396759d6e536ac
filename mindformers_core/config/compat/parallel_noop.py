"""Upstream `parallelism:` keys of features that do not exist here: the accepted values.

Data, tensor (+sequence), expert and pipeline parallelism are implemented (which combinations
run: config/layout.py); the keys below belong to features that are not. Such a key is accepted
with its no-op value; any other value is a ConfigError naming the field and saying the feature
is not implemented (``noop.require_noop``).

``data_parallel_shard_strategy`` and ``disable_gradient_division`` are implemented (their
values and refused combinations: config/shard_strategy.py); they are checked here with the
launcher's data-parallel size.
"""
from __future__ import annotations

from typing import Any, Optional

from ...errors import ConfigError
from .noop import require_noop
from ..shard_strategy import SHARD_STRATEGIES, check_shard_strategy

__all__ = ["check_parallel_noop", "SHARD_STRATEGIES"]

#: field -> (accepted values, feature)
_NOOP = {
    "cpu_offload": ((False,), "FSDP CPU offload"),
    "dense_fsdp_shard_size": ((None,), "FSDP dense shard limits"),
    "context_parallel_async": ((False,), "context parallelism"),
    "ulysses_degree_in_cp": ((None,), "Ulysses context parallelism"),
    "context_parallel_mask_type": (("causal",), "a non-causal context-parallel mask"),
    "pipeline_parallel_overlap_p2p": ((False,), "pipeline communication overlap"),
    "pipeline_parallel_overlap_b_f": ((False,), "pipeline compute overlap"),
    "pipeline_parallel_enable_dxdw_split": ((False,), "pipeline dx/dw split"),
    "enable_mc2": ((False,), "MC2 matmul-communication fusion"),
    "enable_loss_parallel": ((False,), "vocab-parallel loss"),
    "moe_token_dispatcher_type": (("alltoall",), "the alltoall_deredundancy dispatcher"),
    "expert_parallel_async_d2h": ((False,), "asynchronous expert-parallel counts"),
    "hsdp_shard_size": ((1,), "HSDP sharding"),
}
#: field -> its known upstream values (any of them is a no-op here)
_CHOICES = {
    "context_parallel_method": ("colossal", "ulysses", "hybrid"),
    "pipeline_parallel_schedule": ("1f1b", "interleaved_1f1b", "gpipe"),
    "pipeline_parallel_p2p_transport": ("plain", "auto"),
    "reshard_after_forward_policy": ("default", "always", "never"),
    "hsdp_optimizer_level": ("level1", "level2", "level3"),
    "data_parallel_shard_strategy": SHARD_STRATEGIES,
}


def check_parallel_noop(cfg: Any, path: str, dp: Optional[int]) -> None:
    """Check every upstream-only parallelism field of ``cfg`` (a ParallelismConfig); ``dp`` is
    the launcher's data-parallel size, or None when it is not known yet."""
    for name, choices in _CHOICES.items():
        value = getattr(cfg, name)
        if value not in choices:
            raise ConfigError(f"{path}.{name}", f"must be one of {list(choices)}, got {value!r}")
    for name, (accepted, feature) in _NOOP.items():
        require_noop(f"{path}.{name}", getattr(cfg, name), accepted, feature)
    if cfg.npu_nums_per_device < 1:
        raise ConfigError(f"{path}.npu_nums_per_device",
                          f"must be >= 1, got {cfg.npu_nums_per_device}")
    if cfg.hsdp_threshold < 0:
        raise ConfigError(f"{path}.hsdp_threshold", f"must be >= 0, got {cfg.hsdp_threshold}")
    if not isinstance(cfg.disable_gradient_division, bool):
        raise ConfigError(f"{path}.disable_gradient_division",
                          f"must be a bool, got {cfg.disable_gradient_division!r}")
    if dp is None:
        return
    _, shard = cfg.dp_shard(dp)
    try:
        check_shard_strategy(cfg.data_parallel_shard_strategy, dp, shard,
                             cfg.reshard_after_forward_policy)
    except ValueError as err:
        raise ConfigError(f"{path}.data_parallel_shard_strategy", str(err)) from None
