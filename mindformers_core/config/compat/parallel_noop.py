"""Upstream `parallelism:` keys of features that do not exist here: the accepted values.

Data, tensor (+sequence), expert, pipeline and context parallelism are implemented (which combinations
run: config/layout.py); the keys below belong to features that are not. Such a key is accepted
with its no-op value; any other value is a ConfigError naming the field and saying the feature
is not implemented (``noop.require_noop``).

:data:`PERFORMANCE_FLAGS` are upstream's performance choices that do not change the math: every
value is accepted, and one that asks for something this backend does not do (or already does)
is reported by :func:`performance_flag_notes`, which the launch doctor prints as a WARN under
``--check`` (tools/doctor.py ``check_performance_flags``).

``data_parallel_shard_strategy`` and ``disable_gradient_division`` are implemented (their
values and refused combinations: config/shard_strategy.py); they are checked here with the
launcher's data-parallel size.
"""
from __future__ import annotations

from typing import Any, Optional

from ...errors import ConfigError
from .noop import require_noop
from ..moe import DISPATCHER_TYPES
from ..shard_strategy import SHARD_STRATEGIES, check_shard_strategy

__all__ = ["check_parallel_noop", "SHARD_STRATEGIES", "PERFORMANCE_FLAGS",
           "performance_flag_notes"]

#: field -> (accepted values, feature)
_NOOP = {
    "cpu_offload": ((False,), "FSDP CPU offload"),
    "pipeline_parallel_enable_dxdw_split": ((False,), "pipeline dx/dw split"),
    "expert_parallel_async_d2h": ((False,), "asynchronous expert-parallel counts"),
    "hsdp_shard_size": ((1,), "HSDP sharding"),
}
#: field -> (its off value, what a value other than that does on this backend). Accepted with
#: any value of the field's type; a value other than the off one is a doctor WARN with the text.
PERFORMANCE_FLAGS = {
    "enable_loss_parallel": (False, (
        "changes nothing here: the vocab-parallel loss is what tensor parallel already does "
        "(the output layer's logits stay split over the tensor-parallel ranks and the "
        "cross-entropy reduces over them, models/sequence_parallel.py "
        "vocab_parallel_token_losses); with tensor_parallel 1 there is no vocabulary split")),
    "enable_mc2": (False, (
        "changes nothing here: MC2 fuses the tensor-parallel matmul with its communication "
        "into one Ascend kernel; this backend runs the matmul and the collective as separate "
        "ops (the same math)")),
    "pipeline_parallel_overlap_p2p": (False, (
        "changes nothing here: the pipeline's stage-to-stage sends and receives are not "
        "overlapped with compute on this backend (the same math, the same schedule)")),
    "pipeline_parallel_overlap_b_f": (False, (
        "changes nothing here: the pipeline schedule (1F1B or interleaved 1F1B) runs one "
        "micro-batch's backward and the next one's forward one after the other, not overlapped "
        "(the same math)")),
    "context_parallel_async": (False, (
        "changes nothing here: the ring's K/V exchange is not overlapped with the block "
        "computations on this backend (the same math, the same ring schedule: "
        "distributed/ring_attention.py)")),
    "dense_fsdp_shard_size": (None, (
        "changes nothing here: dense parameters are sharded over the data_parallel_shard ranks "
        "that data_parallel_shard_strategy names, with no separate dense shard group")),
}
#: field -> its known upstream values (any of them is a no-op here)
_CHOICES = {
    "context_parallel_method": ("colossal", "ulysses", "hybrid"),
    "pipeline_parallel_schedule": ("1f1b", "interleaved_1f1b", "gpipe"),
    "pipeline_parallel_p2p_transport": ("plain", "auto"),
    "reshard_after_forward_policy": ("default", "always", "never"),
    "hsdp_optimizer_level": ("level1", "level2", "level3"),
    "data_parallel_shard_strategy": SHARD_STRATEGIES,
    # read by the MoE layers through model.moe_token_dispatcher_type (config/moe.py)
    "moe_token_dispatcher_type": DISPATCHER_TYPES,
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
    shard_size = cfg.dense_fsdp_shard_size
    if shard_size is not None and shard_size < 1:
        raise ConfigError(f"{path}.dense_fsdp_shard_size",
                          f"must be null or >= 1, got {shard_size}")
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


def performance_flag_notes(cfg: Any, path: str = "parallelism") -> list:
    """``"parallelism.<flag>: <value> <what it does here>"`` for each of :data:`PERFORMANCE_FLAGS`
    that ``cfg`` (a ParallelismConfig) sets to something other than its off value."""
    notes = []
    for name, (off, text) in PERFORMANCE_FLAGS.items():
        value = getattr(cfg, name)
        if value is not off and value != off:
            notes.append(f"{path}.{name}: {value!r} {text}")
    return notes
