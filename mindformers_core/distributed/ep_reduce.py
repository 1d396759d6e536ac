"""Expert parallelism in a run: the reducer that keeps expert gradients on their experts' ranks.

The run's layout (distributed/setup.py ``ParallelRun.parallelize``, ``parallelism.
expert_parallel`` = ep > 1; ``comm`` the run's ``GroupCommunicator``, core/parallel_dims.py
folds ep over the ranks of a stage) has the model cut its routed experts to this rank's
``E / ep`` (``model.apply_expert_parallel``: each expert weight's ShardSpec, split dim 0,
group ``ep``, goes into ``model.shard_specs()``) and wraps the data-parallel reducer in
:class:`ExpertParallelReducer`.

Gradients. Rank r's expert gradient already sums the tokens of every rank of its ``ep`` group
(the dispatch's backward brings them back), so an expert gradient is reduced only over the
ranks that hold the same experts, the ``edp`` group (size dp / ep; the identity for dp = ep);
summing it over dp would add different experts together. Dense gradients are reduced over dp by
the wrapped reducer as without EP (under tp x ep the tensor-parallel reducer: dense over dp,
the tp sums already done in the backward, models/tp_model.py). The global gradient norm
counts each expert shard once:

    ||g||^2 = sum_dense ||g||^2 + AllReduce_ep( sum_local experts ||g||^2 )
              [+ AllReduce_tp( sum_tp shards ||g||^2 ) under tp x ep]

(``shard_spec.global_sq_norm``; ``specs`` is every layout of the model). Token counts, loss
sums, the stop flag and QK-Clip's MAX go through the wrapped reducer as without EP; the MoE
loads are summed over the data-parallel ranks (the logged aux losses and dropped pairs too,
by the run as in every layout): each rank routes with the full router, so the summed tokens
per expert are the global ones and every rank applies the same expert-bias update to its
(replicated) router.

Optimizer state. ZeRO-1 (``data_parallel_shard``) shards dense state over the dp ranks as
without EP; expert weights keep their whole state on their rank (``ZeroSharding.keep_whole``):
the ranks of a ZeRO group hold different experts, so their rows must not be spread over them.
Their state is already 1/ep of the single-process one. Muon orthogonalises each local expert
matrix on its rank with no communication under both comm strategies (3-D weights are never
gathered, ``zero_muon``).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .collectives import GroupCommunicator
from .shard_spec import ShardSpec, replicated, sharded_grad_norm

__all__ = ["ExpertParallelReducer"]


class ExpertParallelReducer:
    """The trainer's reducer under expert parallelism (see the module docstring): dense
    gradients through ``inner`` (the data-parallel reducer), expert gradients over ``edp``.

    ``bind_parameters(params)`` (the trainer, once the optimizer exists) says which gradient
    belongs to which parameter; gradients come aligned with those parameters."""

    def __init__(self, inner, comm: GroupCommunicator, specs: Dict[str, ShardSpec]):
        self.inner = inner
        self.comm = comm
        self.specs = dict(specs)   # the model's layouts: experts over ep, any tp splits
        self.experts = frozenset(n for n, s in self.specs.items() if s.group == "ep")
        self.world_size = inner.world_size
        self.rank = inner.rank
        self._specs: Optional[List[ShardSpec]] = None

    # -- which gradient is which ---------------------------------------------------------------
    def bind_parameters(self, params: Sequence) -> None:
        self._specs = [self.specs.get(p.name) or replicated(p.shape) for p in params]
        self.inner.bind_parameters(params)

    def _bound(self, grads) -> List[ShardSpec]:
        if self._specs is None or len(self._specs) != len(grads):
            raise RuntimeError("ExpertParallelReducer: bind_parameters(optimizer.parameters) "
                               "must be called before the first reduction (got "
                               f"{len(grads)} gradients)")
        return self._specs

    # -- the reducer protocol ------------------------------------------------------------------
    def global_token_count(self, local_tokens: float) -> float:
        return self.inner.global_token_count(local_tokens)

    def reduce(self, grads: Sequence, loss_sum: float,
               n_tokens: float) -> Tuple[List, float, float]:
        grads = list(grads)
        specs = self._bound(grads)
        expert = [i for i, s in enumerate(specs) if s.group == "ep"]
        dense = [None if i in set(expert) else g for i, g in enumerate(grads)]
        out, loss_sum, n_tokens = self.inner.reduce(dense, loss_sum, n_tokens)
        for i in expert:
            if grads[i] is not None:
                out[i] = self.comm.all_reduce(grads[i], "edp")
        return out, loss_sum, n_tokens

    def grad_norm(self, grads: Sequence) -> float:
        """The global L2 norm of the reduced gradients (each expert shard counted once)."""
        from ..optim.clip_grad import global_grad_norm
        return sharded_grad_norm(grads, self._bound(list(grads)), self.comm.group_sum,
                                 global_grad_norm)

    def broadcast_flag(self, flag: bool) -> bool:
        return self.inner.broadcast_flag(flag)

    def optimizer_sharding(self, cfg):
        """The wrapped reducer's ZeRO sharding, with expert weights kept whole."""
        sharding = self.inner.optimizer_sharding(cfg)
        if sharding is not None:
            sharding.keep_whole = frozenset(sharding.keep_whole | self.experts)
        return sharding

    def mean_over_ranks(self, value: float) -> float:
        """The mean of ``value`` over every rank: the logged aux loss of one process (the mean
        over all micro-batches of the step) from each rank's mean over its own."""
        return self.inner.mean_over_ranks(value)

    def sync_moe_stats(self, model) -> None:
        """The wrapped reducer's global loads (the aux losses and drops are summed over the
        replicas by the run, distributed/setup.py ``ParallelRun.sync_moe_stats``)."""
        self.inner.sync_moe_stats(model)

    def reduce_max(self, values: np.ndarray) -> np.ndarray:
        return self.inner.reduce_max(values)

    def combine_qk_stats(self, stats):
        return self.inner.combine_qk_stats(stats)
