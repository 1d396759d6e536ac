"""``check_layout``: which parallel layouts this package runs (pure; no MindSpore).

One function decides, from the run's :class:`~mindformers_core.core.parallel_dims.ParallelDims`,
its model and its ``parallelism:`` section, whether the combination runs. It accepts exactly the
combinations the code can run and refuses every other one with a ``ConfigError`` whose path is a
``parallelism.*`` field (or, when the fix lies in another section, whose text names the
``parallelism.*`` field it collides with). It runs at config load, so ``--check`` refuses a
layout before any model is built, and the run setup (``distributed/setup.py``) builds only
what it accepted (:func:`parallel_steps` names the builders, in the order
``distributed.setup.parallelize`` applies them).

What runs today (every kind alone was tested against 1 process; the composed ones are refused
until they are):

    data parallel          any dp, ZeRO-1 over data_parallel_shard, every shard strategy
    tensor parallel (+sp)  x data parallel with ZeRO-1 (strategies no_shard / optim)
    expert parallel        x data parallel (ep carved out of dp), ZeRO-1 (no_shard / optim)
    pipeline parallel      alone (data parallel 1), 1F1B or interleaved
    context parallel       x data parallel with ZeRO-1 (optim); colossal, ulysses, hybrid
                           (docs/context_parallel.md)

The refusals in words: ``tensor_parallel`` with ``expert_parallel`` (tp x ep), with
``pipeline_parallel`` or with a gradient/parameter-sharding strategy (tp x FSDP);
``expert_parallel`` with ``pipeline_parallel`` or with FSDP; ``pipeline_parallel`` with data
parallel; ``context_parallel`` with ``tensor_parallel``, ``expert_parallel``,
``pipeline_parallel`` or a strategy other than ``optim``.
"""
from __future__ import annotations

from typing import List

from ..core.parallel_dims import ParallelDims
from ..errors import ConfigError
from .shard_strategy import GRAD_SHARDING

__all__ = ["check_layout", "parallel_steps", "LAYOUT_TABLE"]

#: what runs, per kind (docs/parallelism.md's table is checked against it)
LAYOUT_TABLE = (
    ("data parallel", "dp, ZeRO-1 (data_parallel_shard), optim_grads, optim_grads_params"),
    ("tensor parallel", "tp (+sequence parallel) x dp with ZeRO-1 (no_shard / optim)"),
    ("expert parallel", "ep x dp (ep divides dp) with ZeRO-1 (no_shard / optim)"),
    ("pipeline parallel", "pp alone (dp 1), 1F1B or interleaved 1F1B"),
    ("context parallel", "cp x dp with ZeRO-1 (optim): colossal, ulysses, hybrid"),
)

P = "parallelism"


def _refuse(field: str, text: str) -> ConfigError:
    return ConfigError(f"{P}.{field}", text)


def _shards_grads(dims: ParallelDims) -> bool:
    return dims.shard_strategy in GRAD_SHARDING and dims.dp_shard > 1


def check_layout(dims: ParallelDims) -> None:
    """Raise ``ConfigError`` naming ``parallelism.*`` unless the layout runs (module docstring).
    The rules of one size against the model (heads, experts, layers per stage) are the
    config's own checks (config/tensor_parallel_rules.py, expert_layout.py, pipeline.py)."""
    if dims.cp > 1:
        _check_context(dims)
    if dims.pp > 1 and dims.world != dims.pp:
        raise _refuse("pipeline_parallel",
                      f"pipeline_parallel({dims.pp}) runs with data_parallel 1 here: world_size"
                      f"({dims.world}) must equal pipeline_parallel (pipeline x data or tensor "
                      f"parallel layouts are not implemented)")
    if dims.tp > 1 and dims.ep > 1:
        raise _refuse("expert_parallel",
                      f"expert_parallel({dims.ep}) with parallelism.tensor_parallel({dims.tp}) "
                      f"is not implemented yet (tp x ep); set parallelism.expert_parallel: 1 "
                      f"(the routed experts then run on every tp rank) or "
                      f"parallelism.tensor_parallel: 1")
    if _shards_grads(dims) and dims.tp > 1:
        raise _refuse("data_parallel_shard_strategy",
                      f"{dims.shard_strategy!r} with parallelism.tensor_parallel({dims.tp}) is "
                      f"not implemented yet (tp x FSDP); use 'optim' (ZeRO-1 over the "
                      f"data-parallel ranks of each tp shard) or tensor_parallel: 1")
    if _shards_grads(dims) and dims.ep > 1:
        raise _refuse("data_parallel_shard_strategy",
                      f"{dims.shard_strategy!r} with parallelism.expert_parallel({dims.ep}) is "
                      f"not implemented yet (ep x FSDP); use 'optim' (ZeRO-1; the expert "
                      f"weights keep their whole state on their rank) or expert_parallel: 1")
    parallel_steps(dims)   # an accepted layout has its builders


def _check_context(dims: ParallelDims) -> None:
    """cp runs with data parallel and ZeRO-1 only (each composition refused names its field)."""
    for field, size in (("tensor_parallel", dims.tp), ("pipeline_parallel", dims.pp),
                        ("expert_parallel", dims.ep)):
        if size > 1:
            raise _refuse(field, f"{field}({size}) with parallelism.context_parallel({dims.cp}) "
                                 f"is not implemented yet (cp x {field.split('_')[0]}); set "
                                 f"parallelism.{field}: 1 or context_parallel: 1")
    if dims.shard_strategy != "optim":
        raise _refuse("data_parallel_shard_strategy",
                      f"{dims.shard_strategy!r} with parallelism.context_parallel({dims.cp}) is "
                      f"not implemented yet (cp x FSDP); use 'optim' (ZeRO-1 over "
                      f"data_parallel_shard) or context_parallel: 1")


def _cp_runs(dims: ParallelDims) -> bool:
    return dims.tp == dims.pp == dims.ep == 1 and dims.shard_strategy == "optim"


def parallel_steps(dims: ParallelDims) -> List[str]:
    """The builders ``distributed.setup`` applies to an accepted layout, in order (empty on
    one process): ``pipeline`` (this rank's stage), ``tensor`` (TP/SP slices, ZeRO-1 over dp),
    ``fsdp`` (the shard strategy over dp: gradient / parameter shards, or nothing to do for
    ZeRO-1), ``expert`` (the EP cut), ``context`` (the cp attention and sequence chunks).
    Raises ValueError for a layout no builder covers."""
    if dims.world == 1:
        return []
    if dims.pp > 1:
        if dims.world != dims.pp:
            raise ValueError(f"no builder for pipeline parallel with {dims.describe()}")
        return ["pipeline"]
    if dims.cp > 1:
        if not _cp_runs(dims):
            raise ValueError(f"no builder for {dims.describe()}")
        return ["context"]   # the data-parallel reduction over every rank: dp x cp
    if (dims.tp > 1 and dims.ep > 1) or (_shards_grads(dims) and (dims.tp > 1 or dims.ep > 1)):
        raise ValueError(f"no builder for {dims.describe()}")
    steps = ["tensor"] if dims.tp > 1 else ["fsdp"]
    return steps + (["expert"] if dims.ep > 1 else [])
