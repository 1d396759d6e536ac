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
    tp x FSDP              optim_grads / optim_grads_params: dp rows of each tp slice
    ep x FSDP              the dense weights FSDP-split over dp, the experts over ep (whole)
    expert parallel        x data parallel (ep carved out of dp), ZeRO-1 (no_shard / optim)
    tp x ep                ep folded over tp x dp (core/parallel_dims.py), ZeRO-1 over dp
    pipeline parallel      x data parallel with ZeRO-1 (no_shard / optim), 1F1B or interleaved;
                           x FSDP (optim_grads / optim_grads_params over each stage's dp),
                           also with tp inside (the dp rows of each stage's tp slices)
    pp x ep                ep carved out of each stage's dp (DeepSeek-V3's pp x ep x ZeRO-1 dp),
                           experts' gradients over the stage's edp
    pp x tp (x ep)         tp (+sp) inside each stage, ep folded over the stage's tp x dp
    context parallel       x data parallel with ZeRO-1 (no_shard / optim); colossal, ulysses,
                           hybrid
                           (docs/context_parallel.md)
    cp x tp                tp (+sp) inside each cp rank; gradients over dp x cp (dp_cp)
    cp x ep                ep folded over cp x dp (core/parallel_dims.py), ZeRO-1 over dp x cp;
                           also x tp (cp x tp x ep: ep folded over tp x cp x dp)
    cp x FSDP              optim_grads / optim_grads_params over dp x cp (the ``dp_cp`` group,
                           torchtitan's dp_shard_cp), also with tp inside (its slices' rows);
                           also x ep (the dense weights' rows over dp x cp, the experts whole
                           on their ep rank, as ep x FSDP)
    cp x pp                each stage's ranks as cp without pp (x tp, x ep, ZeRO-1 or FSDP
                           over the stage's dp x cp); the stages pass each cp rank's chunks

The refusal in words: ``expert_parallel`` with FSDP and tp or pp (with or without cp).
"""
from __future__ import annotations

from typing import List

from ..core.parallel_dims import ParallelDims, fsdp_ranks
from ..errors import ConfigError
from .shard_strategy import GRAD_SHARDING

__all__ = ["check_layout", "parallel_steps", "LAYOUT_TABLE"]

#: what runs, per kind (docs/parallelism.md's table is checked against it)
LAYOUT_TABLE = (
    ("data parallel", "dp, ZeRO-1 (data_parallel_shard), optim_grads, optim_grads_params"),
    ("tensor parallel", "tp (+sequence parallel) x dp with ZeRO-1 (no_shard / optim)"),
    ("expert parallel", "ep x dp (ep divides dp) with ZeRO-1 (no_shard / optim)"),
    ("tp x FSDP", "tp (+sp) x dp with optim_grads / optim_grads_params (dp rows of each tp "
                  "slice)"),
    ("ep x FSDP", "ep x dp with optim_grads / optim_grads_params on the dense weights (the "
                  "experts split over ep, their state whole)"),
    ("tp x ep",
     "tp (+sp) x ep (ep divides dp, folded over tp x dp) with ZeRO-1 (no_shard / optim)"),
    ("pipeline parallel", "pp x dp with ZeRO-1 (no_shard / optim), 1F1B or interleaved 1F1B"),
    ("pp x FSDP", "pp x dp with optim_grads / optim_grads_params over each stage's dp, "
                  "1F1B or interleaved 1F1B, also x tp (dp rows of each tp slice)"),
    ("pp x ep", "pp x ep (ep divides each stage's dp) with ZeRO-1 (no_shard / optim)"),
    ("pp x tp", "pp x tp (+sp) x dp, and x ep (folded over each stage's tp x dp), "
                "with ZeRO-1 (no_shard / optim)"),
    ("context parallel", "cp x dp with ZeRO-1 (no_shard / optim): colossal, ulysses, hybrid"),
    ("cp x tp", "cp x tp (+sp) x dp with ZeRO-1 (no_shard / optim) over dp x cp"),
    ("cp x ep", "cp x ep (folded over cp x dp), also x tp (folded over tp x cp x dp), with "
                "ZeRO-1 (no_shard / optim)"),
    ("cp x FSDP", "cp x dp with optim_grads / optim_grads_params over dp x cp, also x tp "
                  "(dp x cp rows of each tp slice) or x ep (the dense weights' rows)"),
    ("cp x pp", "cp x pp x dp, also x tp and x ep, with ZeRO-1 (no_shard / optim) or FSDP "
                "over each stage's dp x cp"),
)

P = "parallelism"


def _refuse(field: str, text: str) -> ConfigError:
    return ConfigError(f"{P}.{field}", text)


def _not_yet(field: str, what: str, kind: str, fixes: str) -> ConfigError:
    """The refusal of a composition that does not run yet: ``what`` (the sizes), its short
    ``kind`` (``pp x tp``) and the settings that run (``fixes``)."""
    return _refuse(field, f"{what} is not implemented yet ({kind}); set {fixes}")


def _shards_grads(dims: ParallelDims) -> bool:
    """The strategy splits gradients over more than one rank (under cp: over dp x cp)."""
    return (dims.shard_strategy in GRAD_SHARDING
            and fsdp_ranks(dims.dp, dims.dp_shard, dims.cp) > 1)


def check_layout(dims: ParallelDims) -> None:
    """Raise ``ConfigError`` naming ``parallelism.*`` unless the layout runs (module docstring).
    The rules of one size against the model (heads, experts, layers per stage) are the
    config's own checks (config/tensor_parallel_rules.py, expert_layout.py, pipeline.py)."""
    if _shards_grads(dims) and dims.ep > 1 and (dims.tp > 1 or dims.pp > 1):
        other = "tensor_parallel" if dims.tp > 1 else "pipeline_parallel"
        kind = "tp x ep x FSDP" if dims.tp > 1 else "pp x ep x FSDP"
        raise _refuse("data_parallel_shard_strategy",
                      f"{dims.shard_strategy!r} with parallelism.expert_parallel({dims.ep}) and "
                      f"{other}({dims.tp if dims.tp > 1 else dims.pp}) is not implemented yet "
                      f"({kind}); use 'optim' (ZeRO-1; the expert weights keep their whole "
                      f"state on their rank), expert_parallel: 1 or {other}: 1 (ep x FSDP runs)")
    parallel_steps(dims)   # an accepted layout has its builders


def parallel_steps(dims: ParallelDims) -> List[str]:
    """The builders ``distributed.setup`` applies to an accepted layout, in order (empty on
    one process): ``pipeline`` (this rank's stage, ZeRO-1 over its dp group), ``tensor``
    (TP/SP slices, ZeRO-1 over dp; over dp x cp with cp),
    ``fsdp`` (the shard strategy over dp: gradient / parameter shards, or nothing to do for
    ZeRO-1), ``expert`` (the EP cut), ``context`` (the cp attention and sequence chunks).
    Raises ValueError for a layout no builder covers."""
    if dims.world == 1:
        return []
    if dims.pp > 1:
        if _shards_grads(dims) and dims.ep > 1:
            raise ValueError(f"no builder for pipeline parallel with {dims.describe()}")
        # each stage cut over its tp group, then its experts over its ep group, or its
        # weights / gradients sharded over its dp (cp x pp: dp x cp) group, then its cp
        # chunks (setup.py)
        return (["pipeline"] + (["tensor"] if dims.tp > 1 else [])
                + (["fsdp"] if _shards_grads(dims) else [])
                + (["context"] if dims.cp > 1 else [])
                + (["expert"] if dims.ep > 1 else []))
    if dims.cp > 1:
        # the data-parallel reduction over dp x cp (without tp: every rank); FSDP over the
        # same dp x cp ranks
        return ((["tensor"] if dims.tp > 1 else [])
                + (["fsdp"] if _shards_grads(dims) else []) + ["context"]
                + (["expert"] if dims.ep > 1 else []))
    if _shards_grads(dims) and dims.ep > 1 and dims.tp > 1:
        raise ValueError(f"no builder for {dims.describe()}")
    # tp x FSDP: the rows are those of each tp slice, over its dp group (distributed/fsdp.py)
    steps = ["tensor"] if dims.tp > 1 else []
    if dims.tp == 1 or _shards_grads(dims):
        steps.append("fsdp")
    return steps + (["expert"] if dims.ep > 1 else [])
