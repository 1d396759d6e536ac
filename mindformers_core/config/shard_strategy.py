"""``parallelism.data_parallel_shard_strategy`` and ``disable_gradient_division``: the values
and the combinations that are refused (pure rules; the config layer wraps them as ConfigError).

Upstream's values (MindFormers' PyNative trainer and Megatron-FSDP use the same names), what
each shards over the ``dp_shard`` data-parallel ranks, and how this package runs it
(``distributed/fsdp.py``):

    no_shard            nothing sharded: optimizer state replicated on every rank
    optim               optimizer state (fp32 masters, moments): ZeRO-1 (distributed/zero.py)
    optim_grads         + gradients: reduce-scattered, each rank keeps its 1/dp shard
    optim_grads_params  + parameters: each rank stores a 1/dp shard, all-gathered per layer
                        just in time for forward and backward (FSDP / ZeRO-3)

Upstream's default is ``optim_grads_params``; this package keeps ``optim`` (ZeRO-1) as its
default: on one process every value is the same run, and under msrun ZeRO-1 keeps full
parameters, so the weights are all-gathered once per step instead of once per layer in forward
and again in backward (CPU has no native reduce-scatter and no sub-group all-gather), and every
model feature (``training.jit`` graphs, generation) works on it.

``disable_gradient_division`` (upstream default True): the data-parallel reduction SUMs the
gradients, which are already normalised by the global loss-token count, so the result is the
gradient of the global batch mean. False divides the reduced gradient by the data-parallel
size once more, as upstream's averaging reduction does on top of its loss scaling.

Refused combinations (each message names the field):

* ``optim_grads`` / ``optim_grads_params`` with ``1 < data_parallel_shard < dp`` (HSDP: shards
  over a sub-group, replicas across): only sharding over all data-parallel ranks is
  implemented;
* ``optim_grads_params`` with ``reshard_after_forward_policy: never`` (keep the gathered
  parameters from forward to backward): this package always frees them after the forward and
  gathers again in the backward;
* ``optim_grads_params`` sharding over more than one rank (:func:`sharded_parameter_problem`)
  with a ``training.jit`` other than ``none`` written in the config (the per-layer gathers are
  PyNative Cells).
* ``disable_gradient_division: False`` where the FSDP reduction (``distributed/fsdp.py``, the
  one that divides) is not the run's data-parallel reduction (:func:`gradient_division_problem`):
  tensor, pipeline or context parallel without a gradient-sharding strategy, and expert
  parallel (its expert gradients are summed over ``edp`` undivided).
"""
from __future__ import annotations

from typing import Optional, Tuple

__all__ = ["SHARD_STRATEGIES", "GRAD_SHARDING", "PARAM_SHARDING", "check_shard_strategy",
           "shards_grads", "shards_params", "optimizer_shard_count", "sharded_parameter_problem",
           "gradient_division_problem"]

SHARD_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
GRAD_SHARDING = ("optim_grads", "optim_grads_params")
PARAM_SHARDING = ("optim_grads_params",)


def shards_grads(strategy: str) -> bool:
    return strategy in GRAD_SHARDING


def shards_params(strategy: str) -> bool:
    return strategy in PARAM_SHARDING


def optimizer_shard_count(strategy: str, dp_shard: int) -> int:
    """Ranks the optimizer state is split over: 1 for ``no_shard``, else ``dp_shard``."""
    return 1 if strategy == "no_shard" else int(dp_shard)


def check_shard_strategy(strategy: str, dp: int, dp_shard: int,
                         reshard_after_forward_policy: str = "default") -> None:
    """ValueError for a refused combination (module docstring); ``dp`` data-parallel ranks,
    ``dp_shard`` of them sharding (``parallelism.dp_shard``)."""
    if strategy not in SHARD_STRATEGIES:
        raise ValueError(f"must be one of {list(SHARD_STRATEGIES)}, got {strategy!r}")
    if shards_grads(strategy) and 1 < dp_shard < dp:
        raise ValueError(f"{strategy!r} shards over all data-parallel ranks here, but "
                         f"data_parallel_shard gives {dp_shard} of data_parallel({dp}) "
                         f"(HSDP, sharded within groups and replicated across them, is not "
                         f"implemented for {strategy!r}); set data_parallel_shard: -1, or use "
                         f"'optim' for HSDP of the optimizer state")
    if shards_params(strategy) and dp_shard > 1 and reshard_after_forward_policy == "never":
        raise ValueError(f"{strategy!r} with reshard_after_forward_policy 'never' keeps the "
                         f"gathered parameters from forward to backward, which is not "
                         f"implemented here: the parameters are freed after each layer's "
                         f"forward and gathered again in its backward; use 'default' or "
                         f"'always'")


def sharded_parameter_problem(strategy: str, shards: int, jit: str,
                              jit_written: bool) -> Optional[Tuple[str, str]]:
    """``(field, message)`` of what ``optim_grads_params`` over ``shards`` ranks does not run
    with (module docstring), or None; ``jit_written``: ``training.jit`` is in the config (an
    unwritten one runs as ``none``)."""
    if not shards_params(strategy) or shards <= 1:
        return None
    path = "parallelism.data_parallel_shard_strategy"
    if jit != "none" and jit_written:
        return ("training.jit", f"must be 'none' with {path}: optim_grads_params (its "
                                f"per-layer gathers are PyNative Cells), got {jit!r}")
    return None


def gradient_division_problem(disable_gradient_division: bool, steps, expert_parallel: int,
                              layout: str) -> Optional[Tuple[str, str]]:
    """``(field, message)`` when ``disable_gradient_division: False`` would not divide every
    gradient of the run whose builders are ``steps`` (``config.layout.parallel_steps``; empty on
    one process, where dp is 1 and dividing changes nothing), or None. Only the FSDP reduction
    divides, and expert parallel sums its expert gradients over ``edp`` undivided."""
    if disable_gradient_division or not steps:
        return None
    if "fsdp" in steps and expert_parallel == 1:
        return None
    why = ("its expert gradients are summed over edp undivided" if expert_parallel > 1 else
           "only the data_parallel_shard_strategy reduction divides, and this layout's "
           "reduction is the tensor/pipeline/context-parallel one (use optim_grads or "
           "optim_grads_params)")
    return ("parallelism.disable_gradient_division",
            f"False (divide the reduced gradients by data_parallel) is not implemented with "
            f"{layout}: {why}; set it to True (upstream's default)")
