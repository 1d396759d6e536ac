"""The run setup: one ``ParallelDims``, one communicator, one :class:`ParallelRun` per process.

    run = setup_parallel(cfg)        # initialises communication only under msrun
    trainer = Trainer(cfg, out)      # builds its model, then:
    model = run.parallelize(model)   # TP/SP slices -> EP cut -> FSDP units -> cp chunks (one order)
    run.attach(model)                # pipeline: keep this stage's parameters (after a load)
    build_optimizer(..., shard_layout=run.optimizer_sharding())
    run.bind_optimizer(optimizer)

The layout is the config plan's (``RunConfig.parallel_dims``: ``config/layout.py`` accepted it
and named its builders, ``parallel_steps``), built once here with this process's world; the
:class:`~.collectives.GroupCommunicator` over its groups is created once and handed to every
builder. What each builder does lives in its own module (``tp_reduce`` / ``models.tp_model``,
``fsdp``, ``ep_reduce`` / ``models.expert_parallel``, ``pipeline_parallel``,
``models.cp_model``); the trainer sees
only :class:`ParallelRun`'s methods, the same for every layout.
"""
from __future__ import annotations

from typing import (Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple,
                    runtime_checkable)

import numpy as np

from ..core.parallel_dims import AXES, ParallelDims
from .comm import Communicator, init_distributed
from .grad_reduce import DataParallelGradReducer, RouteComm, gradient_norm, reduce_gradients
from .grad_route import GradRoute
from .shard_spec import model_rows, model_specs, whole_shape

__all__ = ["ParallelRun", "GradReduction", "setup_parallel"]


@runtime_checkable
class GradReduction(Protocol):
    """What :class:`ParallelRun` calls on the reduction the builders leave (data parallel,
    tensor parallel, FSDP, expert parallel or a pipeline stage): one interface for all. The
    builders only declare each gradient's route (``grad_route.GradRoute``); the reduction and
    the norm are :func:`~.grad_reduce.reduce_gradients` and
    :func:`~.grad_reduce.gradient_norm`, the same for every layout."""
    world_size: int
    rank: int
    #: the group the step's loss sum and token count are summed over
    token_group: str

    def global_token_count(self, local_tokens: float) -> float: ...

    def grad_routes(self, params: Sequence) -> List[GradRoute]: ...

    def mean_over_ranks(self, value: float) -> float: ...

    def broadcast_flag(self, flag: bool) -> bool: ...

    def sync_moe_stats(self, model) -> None: ...

    def combine_qk_stats(self, stats) -> Any: ...


class ParallelRun:
    """This process's part of a run's layout (module docstring): the one object the trainer
    asks how to shard the model and the optimizer, how to run a step's forward and backward,
    how to reduce its gradients and what their global norm is."""

    def __init__(self, cfg, dims: ParallelDims, comm: Communicator, group_comm=None):
        from ..config.layout import parallel_steps
        self.cfg, self.dims, self.comm = cfg, dims, comm
        self.world_size, self.rank = comm.world_size, comm.rank
        self.steps: List[str] = parallel_steps(dims)
        self.group_comm = group_comm
        #: the collectives the gradient routes name (grad_reduce.RouteComm)
        self.route_comm = RouteComm(comm, group_comm)
        #: each optimizer parameter's gradient route (:meth:`bind_optimizer`)
        self.routes: Optional[List[GradRoute]] = None
        self.pipeline = None
        self._tensor = None
        #: the ranks that hold the same model shard and read other tokens (``dp``, or ``dp_cp``
        #: under context parallel): the tensor-parallel data reduction and FSDP's group
        self.data_group = self._data_group(dims, group_comm) if self.steps else "dp"
        if "tensor" in self.steps:
            from .tp_reduce import TensorParallelGradReducer
            self._tensor = self.reducer = TensorParallelGradReducer(group_comm, self.data_group)
        if "pipeline" in self.steps:   # pp x tp: each stage's reduction is the tp one
            from .pipeline_parallel import PipelineParallel
            self.pipeline = PipelineParallel(cfg, group_comm, self.data_group)
            if self._tensor is not None:
                self.pipeline.set_stage_reduction(self._tensor)
            self.reducer = self.pipeline
        elif self._tensor is None:
            self.reducer = DataParallelGradReducer(comm)
        coords = dims.coords(self.rank)
        #: the data shard this rank reads: its index among the data-parallel replicas
        self.data_rank = coords["dp"]

    @staticmethod
    def _data_group(dims: ParallelDims, group_comm) -> str:
        """The group a tp shard's gradients, tokens and ZeRO-1 state are reduced over, and
        FSDP's: ``dp``, or under context parallel the ranks of both (``dp_cp``: every cp rank
        holds other tokens of the same sequences, models/cp_model.py)."""
        if dims.cp == 1:
            return "dp"
        group_comm.add_group("dp_cp", dims.dp_cp_group(group_comm.rank))
        return "dp_cp"

    # -- layout ----------------------------------------------------------------------------------
    def coords(self) -> Dict[str, int]:
        """This rank's index along every axis (checkpoint layouts)."""
        return dict(self.dims.coords(self.rank))

    def axis_sizes(self) -> Dict[str, int]:
        return {axis: self.dims.size(axis) for axis in AXES}

    # -- the model -------------------------------------------------------------------------------
    def parallelize(self, model):
        """This rank's model, cut by every builder of the layout, in their one order: TP/SP
        slices, the EP cut, the FSDP strategy (on the weights the EP cut left whole; over
        ``data_group``, dp x cp under context parallel), the cp chunks. (The pipeline keeps its stage in ``attach``,
        after any checkpoint load; under pp x tp / pp x FSDP / pp x ep each stage's
        data-parallel reduction is the tensor-parallel / FSDP / expert-parallel one, the
        last wrapping the tensor-parallel one.)"""
        if "tensor" in self.steps:   # the model cuts itself (models/tp_model.py)
            model = model.apply_tensor_parallel(self.group_comm)
            self._tensor.bind_model(model)
        if "expert" in self.steps:   # the model keeps its experts (models/expert_parallel.py)
            # before FSDP, which splits only the weights every rank holds whole (ep x FSDP)
            model.apply_expert_parallel(self.group_comm)
        rows = {}
        if "fsdp" in self.steps:   # under pp: each stage's, over its dp group
            from .fsdp import apply_fsdp, grad_row_specs
            base = self.reducer if self.pipeline is None else self.pipeline.data
            # tp x FSDP (pp x tp x FSDP: each stage's): the rows of each tp slice, the
            # tensor-parallel reduction inside
            reduction, model = apply_fsdp(self.cfg, base, model, self.group_comm,
                                          self._tensor, self.data_group)
            rows = grad_row_specs(reduction)
            if self.pipeline is None:
                self.reducer = reduction
            else:
                self.pipeline.set_stage_reduction(reduction)
        if "context" in self.steps:   # the model keeps its chunks (models/cp_model.py)
            from ..config.context_parallel_rules import ulysses_degree
            par = self.cfg.parallelism
            model = model.apply_context_parallel(self.group_comm, par.context_parallel_method,
                                                 ulysses_degree(par))
        if "expert" in self.steps:   # expert gradients over edp, the rest as before
            from .ep_reduce import ExpertParallelReducer
            # every layout of the gradients (tp, ep and FSDP-row splits): the norm counts
            # each over its group
            specs = {**model.shard_specs(), **rows}   # a tp slice's dp rows: over tp x dp
            if self.pipeline is not None:   # pp x ep: the stage's reduction over its dp group
                self.pipeline.set_stage_reduction(ExpertParallelReducer(
                    self.pipeline.data, self.group_comm, specs))
            else:
                self.reducer = ExpertParallelReducer(self.reducer, self.group_comm, specs)
        return model

    def attach(self, model) -> None:
        """Keep this stage's parameters (pipeline; after any checkpoint load)."""
        if self.pipeline is not None:
            self.pipeline.attach(model)

    def forward_only(self, model):
        """What held-out evaluation and generation call on this rank: ``model`` itself, or
        under pipeline parallel its forward through the stages (distributed/pipeline_eval.py:
        ``(loss_sum, n_tokens, aux)`` and ``greedy_next``, the same on every stage)."""
        if self.pipeline is None:
            return model
        from .pipeline_eval import PipelineForward
        return PipelineForward(self.pipeline)

    def parameter_sizes(self, model) -> Dict[str, int]:
        """name -> element count of the whole model's parameters (every stage's; a shard of
        tensor / expert parallel or FSDP counted at its full shape, ``model.shard_specs()``),
        so the logged counts and the FLOPs per token of MFU are the whole model's."""
        if self.pipeline is not None:
            return self.pipeline.parameter_sizes()
        specs, rows = model_specs(model), model_rows(model)
        return {p.name: int(np.prod(whole_shape(p.name, p.shape, specs, rows)))
                for p in model.get_parameters()}

    def describe(self, num_micro: int) -> Optional[str]:
        """The run log's layout lines beyond the plan's (the pipeline stage), or None."""
        return self.pipeline.describe(num_micro) if self.pipeline is not None else None

    # -- the optimizer ---------------------------------------------------------------------------
    def optimizer_sharding(self):
        """What ``build_optimizer(..., shard_layout=...)`` takes (None: plain)."""
        if self.world_size == 1:
            return None
        return self.reducer.optimizer_sharding(self.cfg)

    def bind_optimizer(self, optimizer) -> None:
        """The optimizer's parameter order: the gradients of :meth:`reduce` and
        :meth:`grad_norm` come aligned with it; each one's route, as the builders declare."""
        self.routes = list(self.reducer.grad_routes(optimizer.parameters))

    @property
    def collective_checkpoint(self) -> bool:
        """Whether a whole-model checkpoint is gathered from every rank (pipeline stages)."""
        return self.pipeline is not None

    def gather_checkpoint(self, tensors: dict, state: dict) -> Tuple[dict, dict]:
        if self.pipeline is None:
            return tensors, state
        return self.pipeline.gather_checkpoint(tensors, state)

    # -- one step --------------------------------------------------------------------------------
    def global_token_count(self, local_tokens: float) -> float:
        """Loss tokens of the global step from this rank's micro-batches. Context parallel:
        every cp rank read the same whole sequences (the model keeps its chunks), so the sum
        over all ranks counts each one cp times."""
        return self.reducer.global_token_count(local_tokens) / self.dims.cp

    def forward_backward(self, accumulate: Callable, params: Sequence, batches: Sequence[dict],
                         total_tokens: float, loss_scale: float = 1.0) -> Tuple[List, float, float]:
        """(fp32 gradients aligned with ``params``, this rank's loss sum, mean aux loss):
        this stage's schedule under pipeline parallel, else ``accumulate(batches,
        total_tokens, loss_scale, data_parallel)`` (the trainer's token-weighted micro-batch
        accumulation, trainer/accumulate.py)."""
        if self.pipeline is not None:
            return self.pipeline.forward_backward(params, batches, total_tokens, loss_scale)
        return accumulate(batches, total_tokens, loss_scale, self.dims.dp)

    def combine_mtp_loss(self, mtp_loss: Optional[float]) -> Optional[float]:
        """This replica's MTP loss on every rank (a pipeline's: its last stage's, where the
        MTP depths run; a collective over the stages)."""
        if self.pipeline is not None:
            return self.pipeline.combine_mtp_loss(mtp_loss)
        return mtp_loss

    def reduce(self, grads: Sequence, loss_sum: float, n_tokens: float):
        """``(reduced gradients, loss sum, token count)`` of the global step: every gradient
        through its route (``grad_reduce.reduce_gradients``)."""
        return reduce_gradients(grads, self.routes, self.route_comm, self.reducer.token_group,
                                loss_sum, n_tokens)

    def step_aux(self, aux: float) -> float:
        """The logged aux loss, the global batch's: under pipeline parallel the mean over the
        dp replicas of each pipeline's (its stages' sum), under context parallel the parts of
        the cp ranks combined (models/cp_model.py), elsewhere the mean over the data-parallel
        replicas (each routed its own micro-batches)."""
        if self.dims.cp > 1:   # cp x pp: the pipeline's mean over its dp x cp ranks, times cp
            return self.mean_over_ranks(aux)
        return self.reducer.mean_over_ranks(aux)

    def mean_over_ranks(self, value: float) -> float:
        """The global batch's value of a per-rank metric (the MTP loss): the mean over the
        data-parallel replicas; under context parallel each rank's value is its part, so the
        sum over the cp ranks of a replica (mean over all ranks times cp)."""
        return self.reducer.mean_over_ranks(value) * self.dims.cp

    def sync_moe_stats(self, model) -> None:
        """The step's expert loads summed over the ranks that routed other tokens (the
        reduction's), and each MoE layer's aux-loss sum, forward count and dropped pairs over
        the data-parallel replicas (``dp``: each routed its own micro-batches; the ranks of a
        tp group recorded the same one), so the logged statistics are the global batch's in
        every layout (a pipeline sums its stages' itself). Under context parallel each
        layer's recorded aux loss is then this replica's part (models/cp_model.py), summed
        over the cp group into the whole sequences' (every cp rank ran the same layers)."""
        if self.world_size == 1:
            return
        self.reducer.sync_moe_stats(model)
        if self.pipeline is not None:
            return
        import mindspore as ms
        layers = [m for _, m in sorted(model.moe_layers().items())]
        if layers and self.dims.dp > 1:
            rows = [[0.0 if m.aux_sum is None else float(m.aux_sum.asnumpy()), m.num_forwards,
                     m.dropped] for m in layers]
            total = self.group_comm.all_reduce(np.array(rows, np.float32), "dp")
            for m, (aux_sum, forwards, dropped) in zip(layers, total):
                if m.aux_sum is not None:
                    m.aux_sum = ms.Tensor(np.float32(aux_sum))
                m.num_forwards = int(round(float(forwards)))
                m.dropped = int(round(float(dropped)))
        layers = [m for m in layers if m.aux_sum is not None]
        if self.dims.cp > 1 and layers:
            parts = np.array([float(m.aux_sum.asnumpy()) for m in layers], np.float32)
            for moe, total in zip(layers, self.group_comm.all_reduce(parts, "cp")):
                moe.aux_sum = ms.Tensor(np.float32(total))

    def grad_norm(self, grads: Sequence) -> float:
        """The global L2 norm of the reduced gradients (aligned with the bound optimizer's
        parameters), the same on every rank: shards counted over their group, each parameter
        once (``grad_reduce.gradient_norm``; a pipeline's stages added over ``pp``)."""
        outer = self.pipeline.norm_outer if self.pipeline is not None else ()
        return float(gradient_norm(grads, self.routes, self.route_comm.group_sum, outer))

    def combine_qk_stats(self, stats):
        """One QK-Clip report for the step (pipeline stages and tp ranks clip other heads)."""
        return self.reducer.combine_qk_stats(stats)

    def broadcast_flag(self, flag: bool) -> bool:
        """True on every rank when any rank raised ``flag`` (a stop request, a failed save)."""
        return self.reducer.broadcast_flag(flag)


def setup_parallel(cfg, comm: Optional[Communicator] = None) -> ParallelRun:
    """This process's :class:`ParallelRun` for ``cfg`` (communication initialised only under
    msrun; one process gets the identity layout)."""
    comm = comm or init_distributed()
    dims = cfg.parallel_dims(comm.world_size)
    group_comm = None
    if comm.world_size > 1:
        from .collectives import GroupCommunicator
        group_comm = GroupCommunicator(dims, comm.rank)
    return ParallelRun(cfg, dims, comm, group_comm)
