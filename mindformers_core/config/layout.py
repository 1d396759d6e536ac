"""``check_layout``: which parallel layouts this package runs (pure; no MindSpore).

One function decides, from the run's :class:`~mindformers_core.core.parallel_dims.ParallelDims`,
its model and its ``parallelism:`` section, whether the combination runs. It accepts exactly the
combinations the code can run and refuses every other one with a ``ConfigError`` whose path is a
``parallelism.*`` field (or, when the fix lies in another section, whose text names the
``parallelism.*`` field it collides with). It runs at config load, so ``--check`` refuses a
layout before any model is built, and the run setup (``distributed/setup.py``) builds only
what it accepted (:func:`parallel_steps` names the builders, in the order
``distributed.setup.parallelize`` applies them).

What runs (each composition tested against 1 process, tests/distributed/layout_cases.py):

    data parallel          any dp, ZeRO-1 over data_parallel_shard, every shard strategy
    tensor parallel (+sp)  x data parallel with ZeRO-1 (strategies no_shard / optim)
    tp x FSDP              optim_grads / optim_grads_params: dp rows of each tp slice
    ep x FSDP              the dense weights FSDP-split over dp, the experts over ep (whole);
                           also x tp (the dp rows of each dense tp slice) and x pp (each
                           stage's)
    expert parallel        x data parallel (ep carved out of dp), ZeRO-1 (no_shard / optim)
    tp x ep                ep folded over tp x dp (core/parallel_dims.py), ZeRO-1 over dp
    pipeline parallel      x data parallel with ZeRO-1 (no_shard / optim), 1F1B or interleaved;
                           x FSDP (optim_grads / optim_grads_params over each stage's dp),
                           also with tp inside (the dp rows of each stage's tp slices)
    pp x ep                ep carved out of each stage's dp (DeepSeek-V3's pp x ep x ZeRO-1 dp),
                           experts' gradients over the stage's edp
    pp x tp (x ep)         tp (+sp) inside each stage, ep folded over the stage's tp x dp
    context parallel       x data parallel with ZeRO-1 (no_shard / optim); colossal, ulysses,
                           hybrid (docs/context_parallel.md)
    cp x tp                tp (+sp) inside each cp rank; gradients over dp x cp (dp_cp)
    cp x ep                ep folded over cp x dp (core/parallel_dims.py), ZeRO-1 over dp x cp;
                           also x tp (cp x tp x ep: ep folded over tp x cp x dp)
    cp x FSDP              optim_grads / optim_grads_params over dp x cp (the ``dp_cp`` group,
                           torchtitan's dp_shard_cp), also with tp inside (its slices' rows);
                           also x ep (the dense weights' rows over dp x cp, the experts whole
                           on their ep rank, as ep x FSDP)
    cp x pp                each stage's ranks as cp without pp (x tp, x ep, ZeRO-1 or FSDP
                           over the stage's dp x cp); the stages pass each cp rank's chunks

Every product of these axes runs, so :func:`check_layout` refuses no combination of them
today; what is still refused is a size against the model or the world, or a setting against
the layout (an expert capacity under tp x ep or cp, MTP under ``optim_grads_params``,
``disable_gradient_division``), each by its own rule (config/expert_layout.py,
context_parallel_rules.py, shard_strategy.py, tensor_parallel_rules.py, pipeline.py).
"""
from __future__ import annotations

from typing import List

from ..core.parallel_dims import ParallelDims, fsdp_ranks
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
                  "experts split over ep, their state whole), also x tp (the dp rows of each "
                  "dense tp slice) and x pp (each stage's)"),
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
                  "(dp x cp rows of each tp slice) and / or x ep (the dense weights' rows)"),
    ("cp x pp", "cp x pp x dp, also x tp and x ep, with ZeRO-1 (no_shard / optim) or FSDP "
                "over each stage's dp x cp (with ep: the dense weights')"),
)

def _shards_grads(dims: ParallelDims) -> bool:
    """The strategy splits gradients over more than one rank (under cp: over dp x cp)."""
    return (dims.shard_strategy in GRAD_SHARDING
            and fsdp_ranks(dims.dp, dims.dp_shard, dims.cp) > 1)


def check_layout(dims: ParallelDims) -> None:
    """Raise ``ConfigError`` naming ``parallelism.*`` unless the layout runs (module docstring:
    every product of the axes runs today, so a composition that stops running is refused
    here). The rules of one size against the model (heads, experts, layers per stage) are
    the config's own checks (config/tensor_parallel_rules.py, expert_layout.py, pipeline.py)."""
    parallel_steps(dims)   # an accepted layout has its builders


def parallel_steps(dims: ParallelDims) -> List[str]:
    """The builders ``distributed.setup`` applies to an accepted layout, in order (empty on
    one process): ``pipeline`` (this rank's stage, ZeRO-1 over its dp group), ``tensor``
    (TP/SP slices, ZeRO-1 over dp; over dp x cp with cp),
    ``fsdp`` (the shard strategy over dp: gradient / parameter shards, or nothing to do for
    ZeRO-1), ``expert`` (the EP cut), ``context`` (the cp attention and sequence chunks).
    Every layout has its builders today (the module docstring's table)."""
    if dims.world == 1:
        return []
    # each stage's (pp) ranks cut over tp, their weights / gradients sharded over dp (dp x cp
    # under cp: the dp_cp group; tp x FSDP: the rows of each tp slice), their cp chunks, then
    # their experts over ep (setup.py). Plain dp keeps the fsdp step without sharding: there
    # it also divides the gradients (disable_gradient_division: False)
    plain = dims.tp == dims.pp == dims.cp == 1
    return ((["pipeline"] if dims.pp > 1 else []) + (["tensor"] if dims.tp > 1 else [])
            + (["fsdp"] if plain or _shards_grads(dims) else [])
            + (["context"] if dims.cp > 1 else []) + (["expert"] if dims.ep > 1 else []))
