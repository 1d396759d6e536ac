"""The trainer's reducer under tensor parallelism (``parallelism.tensor_parallel > 1``).

World = ``tp * dp`` ranks in Megatron order (``groups.make_mesh``). The ``tp`` ranks of one
data-parallel index hold the shards of one model replica and read the same micro-batches
(``data_parallel_rank``); everything data parallel runs over the ``dp`` group through
``group_view.GroupView``:

* the token count, the loss sum and the gradients are SUMmed over dp
  (``DataParallelGradReducer``); the tp sums that sequence parallelism needs were already done
  in the backward (``models/tp_model.py``: a replicated weight's gradient leaves the model
  summed over tp);
* the optimizer is built by ``tp_sharding.TensorParallelSharding`` from the model's
  ``shard_specs()`` (:meth:`bind_model` names the model): AdamW per tp shard, Muon with
  the full shapes and its ``comm_strategy`` exchange over the tp group; ZeRO-1
  (``parallelism.data_parallel_shard``) shards each rank's *local* tensors over its dp group
  on top, so moments and fp32 masters are per tp shard and then per dp shard;
* MoE expert counts are SUMmed over dp only (every tp rank counted all tokens of its replica);
* the MAX of the QK-Clip max logits runs over dp only (tp ranks hold other heads;
  ``tp_sharding.LocalHeadLogits``), and the step's QK-Clip report (:meth:`combine_qk_stats`)
  sums the clipped heads over tp and takes the largest logit;
* the gradient routes (:meth:`grad_routes`, ``grad_route.GradRoute``): every gradient summed
  over dp; a tp slice's squared norm summed over tp (``grad_route.combine_sq_norms``)::

      ||g||^2 = sum_{replicated p} ||g_p||^2 + AllReduce_tp( sum_{sharded p} ||g_p||^2 )

  identical on every rank, so clipping and skipping agree everywhere.

A stop request is agreed over the whole world.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from .collectives import GroupCommunicator
from .grad_reduce import DataParallelGradReducer
from .grad_route import GradRoute
from .group_view import GroupView
from .shard_spec import spec_norm_group

__all__ = ["TensorParallelGradReducer"]


class TensorParallelGradReducer:
    """The trainer's reducer for tp x dp (module docstring). ``rank``/``world_size`` are the
    world's; ``data_parallel_rank`` picks the data shard."""

    def __init__(self, comm: GroupCommunicator, data_group: str = "dp"):
        self.comm = comm
        self.world_size = comm.mesh.world
        self.rank = comm.rank
        #: ``dp``, or ``dp_cp`` under cp x tp (distributed/setup.py ``ParallelRun``)
        self.data_group = data_group
        self.dp_comm = GroupView(comm, data_group)
        self.data_parallel_rank = self.dp_comm.rank
        self.data = DataParallelGradReducer(self.dp_comm, group=data_group)
        self.token_group = data_group
        self._model = None

    # -- GradReduction (distributed/setup.py) -----------------------------------------------------
    def global_token_count(self, local_tokens: float) -> float:
        return self.data.global_token_count(local_tokens)

    def mean_over_ranks(self, value: float) -> float:
        """The mean over the data-parallel replicas (the tp ranks of one replica agree)."""
        return self.data.mean_over_ranks(value)

    def broadcast_flag(self, flag: bool) -> bool:
        return self.comm.any_flag(flag)

    def optimizer_sharding(self, cfg, **rows):
        """``tp_sharding.TensorParallelSharding`` over the shards of the model that
        :meth:`bind_model` named, ZeRO-1 over dp per ``parallelism.dp_shard``; ``rows``:
        its ``grad_rows`` / ``param_rows`` / ``row_shapes`` under tp x FSDP
        (``fsdp.FSDPGradReducer``)."""
        from .tp_sharding import TensorParallelSharding
        if self._model is None:
            raise RuntimeError("TensorParallelGradReducer.optimizer_sharding needs the sharded "
                               "model: call bind_model(model) first")
        shards = cfg.parallelism.optimizer_shards(self.dp_comm.world_size)
        # the slices the optimizer updates: under pp x tp another stage's are released and
        # frozen (distributed/pipeline_release.py), the optimizer never sees them
        trainable = {p.name for p in self._model.trainable_params()}
        specs = {n: s for n, s in self._model.shard_specs().items() if n in trainable}
        return TensorParallelSharding(specs, self.comm, data_parallel_shard=shards,
                                      data_group=self.data_group, **rows)

    def sync_moe_stats(self, model) -> None:
        self.data.sync_moe_stats(model)

    def reduce_max(self, values: np.ndarray) -> np.ndarray:
        """Element-wise MAX over the dp group only (QK-Clip's local-head max logits)."""
        return self.data.reduce_max(values)

    def combine_qk_stats(self, stats):
        """The step's QK-Clip report over the tp ranks (each clipped its local heads): one
        process's count and max logit (``qk_clip_stats.combine_qk_stats``)."""
        from .qk_clip_stats import combine_qk_stats
        return combine_qk_stats(self.comm, "tp", stats)

    # -- the sharded model -------------------------------------------------------------------------
    def bind_model(self, model) -> None:
        """The tensor-parallel model of this rank (``models.tp_model.apply_tensor_parallel``
        over :attr:`model_parallel_comm`): its ``shard_specs()`` lay out the optimizer
        (:meth:`optimizer_sharding`)."""
        self._model = model

    @property
    def model_parallel_comm(self) -> GroupCommunicator:
        """What ``models.tp_model.apply_tensor_parallel`` shards the model over."""
        return self.comm

    def grad_routes(self, params: Sequence) -> List[GradRoute]:
        """Every gradient summed over the data group; a tp slice counted over ``tp`` in the
        norm (module docstring)."""
        if self._model is None:
            raise RuntimeError("TensorParallelGradReducer.grad_routes needs the sharded "
                               "model: call bind_model(model) first")
        layout = self._model.shard_specs()
        sums = (self.data_group,) if self.dp_comm.world_size > 1 else ()
        return [GradRoute(sums, norm_group=spec_norm_group(layout.get(p.name)))
                for p in params]
