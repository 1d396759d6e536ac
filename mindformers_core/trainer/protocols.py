"""The interfaces the trainer calls, declared as ``typing.Protocol``s.

The trainer checks what a model, an optimizer or a gradient reducer offers with
``isinstance(obj, Protocol)`` against these declarations instead of probing attribute names:

* :class:`GradReducer` every reducer (``trainer.grad_reducer.IdentityGradReducer``);
  :class:`DataParallelReducer` the data-parallel one (``distributed.grad_reduce``): it also
  builds the optimizer for the ranks (ZeRO sharding, QK-Clip MAX) and SUMs MoE loads;
  :class:`ShardedGradReducer` one over parameters split across ranks (expert parallel): it
  learns the parameters and computes the global gradient norm;
* :class:`PipelineReducer` the pipeline-parallel one (``distributed.pipeline_parallel``): it
  runs the forward+backward of a step's micro-batches for this rank's stage and sums the
  gradient norm over the stages;
  :class:`ModelParallelReducer` one that also shards the model (tensor parallel,
  ``distributed.tp_reduce``): it names the data shard of this rank, learns the sharded model
  (its ``shard_specs()`` lay out the optimizer) and gives the norm rule;
* :class:`QKStatsReducer` one whose ranks clip different heads (pipeline stages, tp ranks):
  it makes the step's one QK-Clip report;
* :class:`ExpertBiasModel` MoE models with the aux-loss-free expert-bias update, and
  :class:`MoEStatsModel` those whose expert loads a skipped step must drop;
* :class:`MaxLogitsModel` models that track max attention logits (QK-Clip input);
* :class:`QKClipModel` models that name the q/kv weights QK-Clip rescales (declared in
  ``optim.qk_clip``, which reads it);
* :class:`QKClipOptimizer` optimizers that report what QK-Clip did (Muon);
* :class:`ShardedGradNorm` reducers whose gradients are shards (``distributed.fsdp``): they
  compute the global norm.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

from ..optim.qk_clip import QKClipModel  # declared where QK-Clip reads it

__all__ = ["GradReducer", "DataParallelReducer", "ModelParallelReducer", "ShardedGradNorm",
           "ShardedGradReducer", "PipelineReducer", "ExpertBiasModel", "MoEStatsModel",
           "MaxLogitsModel", "QKClipModel", "QKClipOptimizer", "QKStatsReducer"]


@runtime_checkable
class GradReducer(Protocol):
    world_size: int
    rank: int

    def global_token_count(self, local_tokens: float) -> float:
        """Loss tokens of the whole global step (before any backward pass)."""

    def reduce(self, grads: Sequence, loss_sum: float,
               n_tokens: float) -> Tuple[List, float, float]:
        """SUM of gradients, token-loss sums and token counts over the ranks."""

    def mean_over_ranks(self, value: float) -> float:
        """The mean over the ranks of a per-rank scalar metric (the MTP loss)."""

    def broadcast_flag(self, flag: bool) -> bool:
        """True on every rank when any rank raised ``flag``."""


@runtime_checkable
class DataParallelReducer(GradReducer, Protocol):
    def optimizer_sharding(self, cfg) -> Optional[Any]:
        """What ``build_optimizer(..., shard_layout=...)`` takes for this run (None: plain)."""

    def sync_moe_stats(self, model) -> None:
        """SUM the MoE token-per-expert counts over ranks before the expert-bias update."""


@runtime_checkable
class ShardedGradNorm(Protocol):
    def grad_norm(self, grads: Sequence) -> float:
        """Global L2 norm of reduced gradients some of which are shards (same on every rank)."""


@runtime_checkable
class ShardedGradReducer(ShardedGradNorm, Protocol):
    """A sharded-gradient reducer that must learn the optimizer's parameter order (expert
    parallel); ``mean_over_ranks`` is the ``GradReducer``'s."""

    def bind_parameters(self, params: Sequence) -> None:
        """The parameters the gradients come aligned with (once the optimizer exists)."""


class PipelineReducer(GradReducer, Protocol):
    data_rank: int   #: this rank's index along data parallel (which rows it reads)

    def attach(self, model) -> None:
        """Keep only this stage's parameters (the others frozen and released; after any
        checkpoint load, before the optimizer is built)."""

    def parameter_sizes(self) -> Dict[str, int]:
        """name -> element count of the whole model's parameters (every stage's)."""

    def describe(self, num_micro: int) -> str:
        """The stage, its layers and the schedule, for the run log."""

    def forward_backward(self, params: Sequence, batches: Sequence[dict], total_tokens: float,
                         loss_scale: float = 1.0) -> Tuple[List, float, float]:
        """(gradients aligned with params, the step's loss sum, mean aux loss)."""

    def global_grad_norm(self, grads: Sequence) -> float:
        """The L2 norm over every stage's gradients."""

    def combine_mtp_loss(self, mtp_loss: Optional[float]) -> Optional[float]:
        """The step's MTP loss from the stage that runs the MTP depths."""

    def combine_qk_stats(self, stats) -> Any:
        """One QK-Clip report for the step from every stage's."""

    def gather_checkpoint(self, tensors: dict, state: dict) -> Tuple[dict, dict]:
        """Every stage's checkpoint entries on rank 0 (a collective)."""


class ModelParallelReducer(DataParallelReducer, Protocol):
    #: this rank's index among the data-parallel replicas (the data shard it reads)
    data_parallel_rank: int
    #: the GroupCommunicator the model is sharded over (models.tp_model.apply_tensor_parallel)
    model_parallel_comm: Any

    def bind_model(self, model) -> None:
        """The sharded model of this rank (before the optimizer is built)."""

    def grad_norm_fn(self, model, params) -> Any:
        """``norm(grads) -> float``: the global norm of gradients aligned with ``params``."""


@runtime_checkable
class QKStatsReducer(Protocol):
    def combine_qk_stats(self, stats) -> Any:
        """One QK-Clip report for the step from every rank's (each clipped other heads)."""


@runtime_checkable
class ExpertBiasModel(Protocol):
    def update_expert_bias(self) -> None:
        """Aux-loss-free expert-bias update, after the optimizer step."""


@runtime_checkable
class MoEStatsModel(Protocol):
    def reset_moe_stats(self) -> None:
        """Drop the expert loads gathered by a skipped step."""


@runtime_checkable
class MaxLogitsModel(Protocol):
    def reset_max_attention_logits(self) -> None:
        """Drop the max attention logits tracked by a skipped step."""


@runtime_checkable
class QKClipOptimizer(Protocol):
    #: what the last step's QK-Clip did (None before the first step or when off)
    last_qk_clip: Any
