"""The interfaces the trainer calls, declared as ``typing.Protocol``s.

The trainer checks what a model or an optimizer offers with ``isinstance(obj, Protocol)``
against these declarations instead of probing attribute names; the parallel layout it calls
through one interface for every layout, with no check at all:

* :class:`RunLayout` this process's part of the run's layout
  (``distributed.setup.ParallelRun``; :class:`trainer.grad_reducer.IdentityGradReducer` is the
  single-process one that tests pass to the helpers taking a layout);
* :class:`TrainData` the training data (``data.builder.TrainDataset``): its micro-batches,
  its resume position and the corpus' entropy floor when known;
* :class:`ExpertBiasModel` MoE models with the aux-loss-free expert-bias update, and
  :class:`MoEStatsModel` those whose expert loads a skipped step must drop;
* :class:`MaxLogitsModel` models that track max attention logits (QK-Clip input);
* :class:`QKClipModel` models that name the q/kv weights QK-Clip rescales (declared in
  ``optim.qk_clip``, which reads it);
* :class:`QKClipOptimizer` optimizers that report what QK-Clip did (Muon).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

from ..optim.qk_clip import QKClipModel  # declared where QK-Clip reads it

__all__ = ["RunLayout", "TrainData", "ExpertBiasModel", "MoEStatsModel", "MaxLogitsModel",
           "QKClipModel", "QKClipOptimizer"]


class RunLayout(Protocol):
    """What the trainer asks the layout (distributed/setup.py has the contract's details)."""
    world_size: int
    rank: int
    data_rank: int          #: this rank's index among the data-parallel replicas
    group_comm: Any         #: the run's GroupCommunicator (None on one process)
    dims: Any               #: the run's ParallelDims (core/parallel_dims.py)

    def coords(self) -> Dict[str, int]:
        """This rank's index along every axis (checkpoint layouts)."""

    def axis_sizes(self) -> Dict[str, int]:
        """The size of every axis of :meth:`coords`."""

    def parallelize(self, model) -> Any:
        """This rank's model, cut by every builder of the layout in their one order."""

    def attach(self, model) -> None:
        """Keep this pipeline stage's parameters (after any checkpoint load)."""

    def forward_only(self, model) -> Any:
        """What evaluation and generation call: the model, or its forward through the
        pipeline stages."""

    def parameter_sizes(self, model) -> Dict[str, int]:
        """name -> element count of the whole model's parameters (every stage's)."""

    def describe(self, num_micro: int) -> Optional[str]:
        """Run-log lines about the layout beyond the plan's, or None."""

    def optimizer_sharding(self) -> Optional[Any]:
        """What ``build_optimizer(..., shard_layout=...)`` takes (None: plain)."""

    def bind_optimizer(self, optimizer) -> None:
        """The optimizer's parameter order (gradients come aligned with it)."""

    collective_checkpoint: bool

    def gather_checkpoint(self, tensors: dict, state: dict) -> Tuple[dict, dict]:
        """Every stage's checkpoint entries on rank 0 (a collective under pipeline)."""

    def global_token_count(self, local_tokens: float) -> float:
        """Loss tokens of the whole global step (before any backward pass)."""

    def forward_backward(self, accumulate: Callable, params: Sequence, batches: Sequence[dict],
                         total_tokens: float, loss_scale: float = 1.0) -> Tuple[List, float, float]:
        """(gradients aligned with params, this rank's loss sum, mean aux loss)."""

    def combine_mtp_loss(self, mtp_loss: Optional[float]) -> Optional[float]:
        """This replica's MTP loss on every rank (from the stage that runs the MTP depths)."""

    def reduce(self, grads: Sequence, loss_sum: float,
               n_tokens: float) -> Tuple[List, float, float]:
        """SUM of gradients, token-loss sums and token counts over the replicas."""

    def step_aux(self, aux: float) -> float:
        """The step's logged aux loss."""

    def mean_over_ranks(self, value: float) -> float:
        """The mean over the replicas of a per-rank scalar metric."""

    def sync_moe_stats(self, model) -> None:
        """SUM the MoE token-per-expert counts over the ranks that routed other tokens."""

    def grad_norm(self, grads: Sequence) -> float:
        """The global L2 norm of the reduced gradients (the same on every rank)."""

    def combine_qk_stats(self, stats) -> Any:
        """One QK-Clip report for the step from every rank's."""

    def broadcast_flag(self, flag: bool) -> bool:
        """True on every rank when any rank raised ``flag``."""


@runtime_checkable
class TrainData(Protocol):
    """What the trainer reads of its training data (data/builder.py ``TrainDataset``)."""

    @property
    def entropy_floor(self) -> Optional[float]:
        """The corpus' exact entropy rate in nats/token, or None when unknown."""

    def micro_batch(self, step: int, micro_index: int, num_micro: int, local_batch_size: int,
                    step_start: Optional[int] = None) -> Dict[str, Any]:
        """This rank's micro-batch ``micro_index`` of ``num_micro`` in step ``step``."""

    def state_dict(self) -> Dict[str, Any]:
        """The data position a checkpoint stores."""

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from a checkpoint's data position."""


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
