"""The hook where data-parallel gradient reduction plugs into the trainer.

The trainer calls, once per optimizer step:

* ``global_token_count(local_tokens) -> float`` before any backward pass, because each
  micro-batch's loss is divided by the token count of the whole global step;
* ``reduce(grads, loss_sum, n_tokens) -> (grads, loss_sum, n_tokens)`` on the accumulated fp32
  gradients (already weighted by 1/global tokens, so a SUM across ranks gives the global mean
  gradient), the summed token losses and the token count of this rank.

:class:`IdentityGradReducer` is the exact single-process implementation (world size 1: the
local sums are the global sums). The distributed package provides the all-reduce version;
:func:`default_grad_reducer` picks the one of a run and :func:`grad_norm_rule` the global
gradient norm that goes with it.
"""
from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

from .protocols import ShardedGradNorm

__all__ = ["IdentityGradReducer", "default_grad_reducer", "grad_norm_rule"]


def default_grad_reducer(cfg):
    """The parallel reducer of ``cfg`` when launched by msrun (communication initialised
    there; pipeline parallel when ``parallelism.pipeline_parallel > 1``, tensor parallel when
    ``parallelism.tensor_parallel > 1``), the identity in a plain process (no communication
    init)."""
    from ..launch_env import launched_by_msrun
    if launched_by_msrun() and cfg.parallelism.pipeline_parallel > 1:
        from ..distributed.pipeline_parallel import setup_pipeline_parallel
        return setup_pipeline_parallel(cfg)
    if launched_by_msrun():
        from ..distributed.setup import setup_parallel
        return setup_parallel(cfg)
    return IdentityGradReducer()


def grad_norm_rule(pipeline, model_parallel, reducer, model, params) -> Callable:
    """``norm(grads) -> float``, the global L2 norm of the reduced gradients, identical on
    every rank: over the pipeline stages, over tensor-parallel shards (``model_parallel``, a
    ``ModelParallelReducer``), over FSDP / expert-parallel shards (a ``ShardedGradNorm``
    reducer), or of whole gradients."""
    if pipeline is not None:
        return pipeline.global_grad_norm
    if model_parallel is not None:
        return model_parallel.grad_norm_fn(model, params)
    if isinstance(reducer, ShardedGradNorm):
        return reducer.grad_norm
    from ..optim.clip_grad import global_grad_norm
    return global_grad_norm


class IdentityGradReducer:
    """World size 1: nothing to reduce."""
    world_size = 1
    rank = 0

    def global_token_count(self, local_tokens: float) -> float:
        return float(local_tokens)

    def reduce(self, grads: Sequence, loss_sum: float, n_tokens: float) -> Tuple[List, float, float]:
        return list(grads), float(loss_sum), float(n_tokens)

    def mean_over_ranks(self, value: float) -> float:
        return float(value)

    def broadcast_flag(self, flag: bool) -> bool:
        """Agree on a stop request across ranks (single process: the flag itself)."""
        return bool(flag)
