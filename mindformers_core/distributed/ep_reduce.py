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

(``grad_route.GradRoute``: an expert's route sums over ``edp`` and counts its norm over ``ep``;
``specs`` is every layout of the model). Token counts, loss
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

from typing import Dict, List, Sequence

import numpy as np

from .collectives import GroupCommunicator
from .grad_route import GradRoute, rerouted
from .shard_spec import ShardSpec, spec_norm_group

__all__ = ["ExpertParallelReducer"]


class ExpertParallelReducer:
    """The trainer's reducer under expert parallelism (see the module docstring): dense
    gradients through ``inner`` (the data-parallel reducer), expert gradients over ``edp``.

    Its :meth:`grad_routes` are the wrapped reducer's, with each expert's summed over
    ``edp`` instead."""

    def __init__(self, inner, comm: GroupCommunicator, specs: Dict[str, ShardSpec]):
        self.inner = inner
        self.comm = comm
        self.specs = dict(specs)   # the model's layouts: experts over ep, any tp splits
        self.experts = frozenset(n for n, s in self.specs.items() if s.group == "ep")
        self.world_size = inner.world_size
        self.rank = inner.rank
        self.token_group = inner.token_group

    # -- the reducer protocol ------------------------------------------------------------------
    def global_token_count(self, local_tokens: float) -> float:
        return self.inner.global_token_count(local_tokens)

    def grad_routes(self, params: Sequence) -> List[GradRoute]:
        """The wrapped reducer's routes; an expert's gradient summed over ``edp`` only (no
        division), every norm counted over the group of its layout in ``specs``."""
        routes = self.inner.grad_routes(params)
        sums = ("edp",) if len(self.comm.ranks("edp")) > 1 else ()
        return [GradRoute(sums, norm_group=spec_norm_group(self.specs.get(p.name)))
                if p.name in self.experts else
                rerouted(r, norm_group=spec_norm_group(self.specs.get(p.name)))
                for p, r in zip(params, routes)]

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
