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
    # the routed experts' weights are whole on their ep rank (docs/expert_parallel.md)
    "expert_tensor_parallel": ((1,), "expert tensor parallelism (experts split over tp)"),
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
    "param_dtype": ("float32", (
        "changes nothing here: the FSDP units gather each weight in its stored dtype "
        "(model.params_dtype) and the layers cast it to model.compute_dtype, which is where "
        "the compute precision is chosen (distributed/fsdp.py GatherShard)")),
    "reduce_dtype": ("float32", (
        "is not applied here: the gradients are reduce-scattered and all-reduced in float32 "
        "(distributed/fsdp.py GatherShard), the more exact of the two")),
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
    # upstream's FSDP mixed-precision dtypes (PERFORMANCE_FLAGS)
    "param_dtype": ("float16", "float32", "bfloat16"),
    "reduce_dtype": ("float16", "float32", "bfloat16"),
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


#: what the implemented `parallelism:` keys accept (the rows :func:`key_rows` cannot derive
#: from the tables above); a field of the section without a row here or above is an error of
#: :func:`key_rows`, so docs/migrating_from_mindformers.md's table cannot miss a key
IMPLEMENTED = {
    "tensor_parallel": ">= 1: tensor parallel with sequence parallel (which combinations run: "
                       "docs/parallelism.md)",
    "context_parallel": ">= 1: context parallel (docs/context_parallel.md)",
    "pipeline_parallel": ">= 1: pipeline parallel (docs/pipeline_parallel.md)",
    "data_parallel_shard": "-1 (every data-parallel rank) or a divisor of dp: the ranks the "
                           "optimizer state (and under FSDP the gradients and parameters) is "
                           "sharded over (docs/data_parallel.md)",
    "data_parallel_shard_strategy": "ZeRO-1 (`optim`), FSDP (`optim_grads`, "
                                    "`optim_grads_params`) or nothing sharded "
                                    "(docs/data_parallel.md); **default here `optim`** "
                                    "(upstream: `optim_grads_params`)",
    "disable_gradient_division": "`True` (upstream's default: the token-normalised gradients "
                                 "are summed); `False` divides them by dp once more where the "
                                 "FSDP reduction runs (docs/data_parallel.md)",
    "reshard_after_forward_policy": "`never` is refused with `optim_grads_params` over more "
                                    "than one rank (the gathered weights are freed after each "
                                    "layer's forward and gathered again for its backward)",
    "expert_parallel": ">= 1: expert parallel, folded over the dp (x cp x tp) ranks "
                       "(docs/expert_parallel.md)",
    "context_parallel_method": "docs/context_parallel.md",
    "ulysses_degree_in_cp": "null; `hybrid`: a divisor of context_parallel; `ulysses`: null or "
                            "context_parallel",
    "context_parallel_mask_type": "`causal` (the only context-parallel mask implemented)",
    "pipeline_parallel_schedule": "1F1B, interleaved when pipeline_parallel_interleave_num > 1 "
                                  "(`gpipe` is refused under pipeline parallel)",
    "pipeline_parallel_microbatch_size": ">= 1: overwritten with the step's micro-batch count "
                                         "(global_batch_size / (dp x local_batch_size)), as "
                                         "upstream",
    "pipeline_parallel_interleave_num": ">= 1: virtual stages per pipeline rank",
    "pipeline_parallel_layers_per_stage": "null / `auto` (an even split), or one layer-range "
                                          "string per stage (`\"0-1, 4-8\"`), or upstream's "
                                          "one string, the stages separated by `|`",
    "sequence_parallel": "`True` / `False`; unwritten with tensor_parallel > 1 it is `True` "
                         "(upstream turns it on with tensor parallel); a written `False` with "
                         "tensor_parallel > 1 is refused",
    "npu_nums_per_device": ">= 1",
    "moe_token_dispatcher_type": "read by the MoE layers as model.moe_token_dispatcher_type "
                                 "(docs/expert_parallel.md)",
    "expert_parallel_use_safe_tokens": "`True` / `False`",
    "hsdp_optimizer_level": "older branches; no effect",
    "hsdp_threshold": ">= 0 (older branches; no effect)",
}


def _values(values) -> str:
    return ", ".join("null" if v is None else f"`{v}`" for v in values)


def key_rows(fields) -> list:
    """``[(key, what it accepts here)]`` of the `parallelism:` section, one per field of
    ``fields`` (``(name, default)`` pairs of ParallelismConfig, in its order): from the tables
    of this module (the accepted values of :data:`_CHOICES`, the no-op values of :data:`_NOOP`,
    :data:`PERFORMANCE_FLAGS`' texts) and :data:`IMPLEMENTED`."""
    rows = []
    for name, default in fields:
        parts = []
        if name in _CHOICES:
            parts.append(_values(_CHOICES[name]))
        if name in _NOOP:
            accepted, feature = _NOOP[name]
            parts.append(f"{_values(accepted)} only ({feature} is not implemented)")
        elif name in PERFORMANCE_FLAGS:
            off, text = PERFORMANCE_FLAGS[name]
            parts.append(("" if name in _CHOICES else "any; ")
                         + f"another value than {_values([off])} is a launch-doctor WARN: it "
                           f"{text}")
        elif name in IMPLEMENTED:
            parts.append(IMPLEMENTED[name])
        elif name not in _CHOICES:
            raise KeyError(f"parallelism.{name} has no row: add it to IMPLEMENTED "
                           f"(config/compat/parallel_noop.py)")
        rows.append((f"`{name}`", "; ".join(parts) + f" (default {_values([default])})"))
    return rows


def key_table(fields) -> str:
    """:func:`key_rows` as the markdown table of docs/migrating_from_mindformers.md."""
    lines = ["| key | accepted here |", "|---|---|"]
    lines += [f"| {key} | {text} |" for key, text in key_rows(fields)]
    return "\n".join(lines)
