"""`parallelism:` section (upstream field names; docs/data_parallel.md). Owned by the distributed package.

Fields: ``tensor_parallel`` (1; above 1 runs with sequence parallel, upstream's rule, and needs
the model sizes it splits: config/tensor_parallel_rules.py), ``sequence_parallel`` (False; true
when unwritten and ``tensor_parallel > 1``, as upstream enables it with TP; a written false with
``tensor_parallel > 1`` is refused),
``context_parallel`` (1), ``pipeline_parallel`` (1; above 1 see config/pipeline.py),
``data_parallel_shard`` (-1 default) and ``expert_parallel`` (1; the routed experts split over
that many data-parallel ranks, docs/expert_parallel.md; its rules against the model and the
world are config/expert_layout.py's). Which combinations of them run is decided in one place,
config/layout.py (``check_layout``). ``data_parallel`` is not a field: it is derived from
the launcher's world size,

    dp = world_size // (tensor_parallel * pipeline_parallel * context_parallel)

and writing it gives upstream's unknown-key error text.

``data_parallel_shard`` says over how many data-parallel ranks the optimizer state (fp32
masters and moments) is sharded, ZeRO-1 style (upstream derivation):

    dp_replicate = 1                            if data_parallel_shard < 0   (-1: all DP ranks)
                 = max(dp // data_parallel_shard, 1)  otherwise
    dp_shard     = dp // dp_replicate

so -1 shards over every DP rank and 1 replicates the state on every rank. Unlike upstream, a
shard size above dp (on more than one data-parallel rank), or one that does not divide dp, is an
error (upstream silently shards over
another number of ranks: a value above dp is clamped to dp, and dp 6 with shard 4 gives 6).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from ..errors import ConfigError
from .compat.parallel_noop import check_parallel_noop
from .context_parallel_rules import check_context_parallel_fields
from .pipeline import check_pipeline_fields, stage_ranges
from .schema import Section
from .shard_strategy import optimizer_shard_count

__all__ = ["ParallelismConfig", "resolve_dp_shard", "DATA_PARALLEL_KEY_MESSAGE",
           "MODEL_PARALLEL_FIELDS"]

MODEL_PARALLEL_FIELDS = ("tensor_parallel", "pipeline_parallel", "context_parallel")

#: upstream's text for a `data_parallel` key, and what to do instead
DATA_PARALLEL_KEY_MESSAGE = (
    "unknown key (Unknown configuration keys for ParallelismConfig: ['data_parallel']); "
    "data_parallel is not a config field: it is world_size // (tensor_parallel * "
    "pipeline_parallel * context_parallel), i.e. the number of workers the launcher starts "
    "(bash scripts/msrun_launcher.sh \"CMD\" WORKER_NUM); valid keys: {valid}")


def resolve_dp_shard(data_parallel_shard: int, dp: int,
                     path: str = "parallelism.data_parallel_shard") -> Tuple[int, int]:
    """``(dp_replicate, dp_shard)`` for ``dp`` data-parallel ranks (formula in the module doc).

    Raises ConfigError for a value other than -1 or >= 1, and for a shard size in (1, dp)
    that does not divide dp.
    """
    if dp < 1:
        raise ValueError(f"data parallel size must be >= 1, got {dp}")
    if data_parallel_shard == 0 or data_parallel_shard < -1:
        raise ConfigError(path, f"must be -1 (shard the optimizer state over all data-parallel "
                                f"ranks) or >= 1, got {data_parallel_shard}")
    if data_parallel_shard < 0:
        return 1, dp
    if data_parallel_shard > dp > 1:   # one process has nothing to shard: any size is 1
        raise ConfigError(path, f"data_parallel_shard({data_parallel_shard}) is larger than "
                                f"data_parallel({dp}): the optimizer state can be sharded over "
                                f"at most the {dp} data-parallel ranks (-1 for all of them, 1 "
                                f"to replicate)")
    if 1 < data_parallel_shard < dp and dp % data_parallel_shard != 0:
        raise ConfigError(path, f"data_parallel_shard({data_parallel_shard}) must divide "
                                f"data_parallel({dp}) (or be -1 for all ranks, 1 to replicate)")
    replicate = max(dp // data_parallel_shard, 1)
    return replicate, dp // replicate


@dataclass
class ParallelismConfig(Section):
    tensor_parallel: int = 1
    context_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel_shard: int = -1   # -1: shard optimizer state over all DP ranks; 1: replicate
    # upstream keys of features that are off here (accepted values: config/compat/parallel_noop.py)
    # what is sharded over dp_shard ranks (config/shard_strategy.py; upstream's default is
    # optim_grads_params, this package's is ZeRO-1) and whether the reduced gradient is
    # divided by dp again (False)
    data_parallel_shard_strategy: str = "optim"
    disable_gradient_division: bool = True
    reshard_after_forward_policy: str = "default"
    cpu_offload: bool = False
    param_dtype: str = "float32"      # FSDP mixed precision (config/compat/parallel_noop.py)
    reduce_dtype: str = "float32"
    dense_fsdp_shard_size: Optional[int] = None
    expert_parallel: int = 1          # implemented (config/expert_layout.py checks it)
    expert_tensor_parallel: int = 1
    context_parallel_method: str = "colossal"
    context_parallel_async: bool = False
    ulysses_degree_in_cp: Optional[int] = None
    context_parallel_mask_type: str = "causal"
    pipeline_parallel_schedule: str = "1f1b"
    pipeline_parallel_microbatch_size: int = 1
    pipeline_parallel_interleave_num: int = 1
    pipeline_parallel_layers_per_stage: Any = "auto"
    pipeline_parallel_overlap_p2p: bool = False
    pipeline_parallel_overlap_b_f: bool = False
    pipeline_parallel_enable_dxdw_split: bool = False
    pipeline_parallel_p2p_transport: str = "plain"
    sequence_parallel: bool = False
    enable_mc2: bool = False
    enable_loss_parallel: bool = False
    npu_nums_per_device: int = 8
    moe_token_dispatcher_type: str = "alltoall"
    expert_parallel_async_d2h: bool = False
    expert_parallel_use_safe_tokens: bool = True
    hsdp_shard_size: int = 1          # older branches (r1.9)
    hsdp_optimizer_level: str = "level1"
    hsdp_threshold: int = 64

    @classmethod
    def from_dict(cls, data, path: str):
        if isinstance(data, dict) and "data_parallel" in data:
            raise ConfigError(f"{path}.data_parallel",
                              DATA_PARALLEL_KEY_MESSAGE.format(valid=sorted(cls.field_names())))
        return super().from_dict(data, path)

    def validate(self, path: str) -> None:
        for name in MODEL_PARALLEL_FIELDS:
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"{path}.{name}", f"must be >= 1, got {value}")
        if self.tensor_parallel > 1 and "sequence_parallel" not in self.explicit_keys:
            # upstream's PyNative path turns sequence parallel on with tensor parallel (its
            # parallel-training guide: "SP is automatically enabled with TP"), so an unwritten
            # sequence_parallel follows tensor_parallel; a written false is refused
            # (config/tensor_parallel_rules.py check_sequence_parallel)
            self.sequence_parallel = True
        self.pipeline_parallel_layers_per_stage = stage_ranges(
            self.pipeline_parallel_layers_per_stage)
        check_parallel_noop(self, path, self._env_data_parallel())
        check_pipeline_fields(self, path)   # pipeline parallel (config/pipeline.py)
        check_context_parallel_fields(self, path)   # config/context_parallel_rules.py
        if self.data_parallel_shard == 0 or self.data_parallel_shard < -1:
            resolve_dp_shard(self.data_parallel_shard, 1, f"{path}.data_parallel_shard")
        dp = self._env_data_parallel()
        if dp is not None:
            resolve_dp_shard(self.data_parallel_shard, dp, f"{path}.data_parallel_shard")

    def model_parallel_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * self.context_parallel

    def _env_data_parallel(self) -> Optional[int]:
        """dp of the launcher's world when it divides cleanly (else ``plan()`` reports it)."""
        from ..launch_env import env_world_size  # no MindSpore import
        ws, mp = env_world_size(), self.model_parallel_size()
        if mp > ws or ws % mp != 0:
            return None
        return ws // mp

    def dp_shard(self, dp: int) -> Tuple[int, int]:
        """``(dp_replicate, dp_shard)`` for ``dp`` data-parallel ranks."""
        return resolve_dp_shard(self.data_parallel_shard, dp)

    def optimizer_shards(self, dp: int) -> int:
        """Ranks ZeRO-1 splits the optimizer state over, for ``dp`` data-parallel ranks:
        ``dp_shard``, or 1 under ``no_shard`` (replicated on every rank). The one rule the
        reductions read (distributed/grad_reduce.py, tp_reduce.py, zero.py): under tp, pp or
        cp too, ``no_shard`` keeps the whole state on each rank."""
        return optimizer_shard_count(self.data_parallel_shard_strategy, self.dp_shard(dp)[1])

