"""Pipeline parallelism for the trainer: one rank per stage and data-parallel replica.

The reduction of the run's layout when ``parallelism.pipeline_parallel`` > 1
(``distributed.setup.ParallelRun`` runs its schedule). World = ``pp * dp`` ranks in Megatron
order (core/parallel_dims.py): the ``pp`` ranks of one data-parallel index form one pipeline
(its ``pp`` group), the ``dp`` ranks of one stage hold the same stage (its ``dp`` group).
Under pp x tp (x ep) the world is ``pp * dp * tp``: each stage's ``tp`` ranks hold one tensor-
parallel replica of the stage, and the stage's data-parallel reduction below is the tensor-
(and expert-) parallel one (:meth:`set_stage_reduction`; docs/pipeline_parallel.md). Under
cp x pp each stage's ``cp`` ranks hold their chunks of the same sequences (models/cp_model.py)
and its data-parallel sums, ZeRO-1 / FSDP and MoE statistics run over its dp x cp ranks (the
``dp_cp`` group, ``data_group``); what travels is each cp rank's chunk rows
(docs/context_parallel.md).
Per optimizer step:

1. the stages of one pipeline read the same micro-batches (the data shard of their dp index,
   ``ParallelRun.data_rank``); the step's loss tokens are summed over dp (one collective,
   before any backward), the number of micro-batches is the accumulation count
   (``pipeline_parallel_microbatch_size`` is overwritten with it, as upstream);
2. :meth:`forward_backward` runs this stage's program (distributed/pipeline_schedule.py):
   forwards keep their backward (pipeline_stage.py), activations go to the next virtual stage
   and gradients back with the communicator's send/recv, always to the rank of the same dp
   index (``stage_ranks`` is this rank's pp group; shapes from the config:
   ``[local_batch * seq, hidden]``, nothing negotiated); the aux-loss gradient is weighted
   ``1 / (micro-batches * dp)`` as in data parallel (trainer/accumulate.py);
3. the logged loss sum comes from the last stage and the aux loss is the sum over stages
   (one all-reduce over the pipeline group); the embedding table's gradient is summed over
   the first and last stage when both read it (tied output layer or MTP), so its two copies
   get the same update; then gradients, loss sum and token count are summed over dp
   (``DataParallelGradReducer`` over the dp group, bucketed), and the optimizer state is
   sharded over dp per ``parallelism.data_parallel_shard`` (ZeRO-1, :meth:`optimizer_sharding`;
   Muon's QK-Clip max logits are a MAX over dp there);
4. the gradient norm is ``sqrt(sum over stages of the stage's squared norm)``, each parameter
   counted once (the shared table on the first stage; the dp replicas hold the same reduced
   gradients): clipping, skip decisions and ``max_consecutive_skipped_steps`` see the same
   number on every rank; the MTP loss, the aux loss and the MoE statistics are the means /
   sums over dp of each pipeline's, the same on every rank.

Each rank builds the whole model (the same initialisation as one process) and keeps only its
stage's parameters: the others are frozen and emptied (distributed/pipeline_release.py) before
the optimizer is built, so the rank holds its stage's share of the weights, and the optimizer
(AdamW, Muon, QK-Clip on the stage's own layers: the other layers' max logits stay -inf) and
the expert-bias update (the released layers are skipped) run per stage.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..core.pipeline_split import EMBEDDING, StageSplit
from .collectives import GroupCommunicator
from .grad_reduce import DataParallelGradReducer
from .grad_route import GradRoute, rerouted
from .group_view import GroupView
from .pipeline_schedule import Transfer, p2p_program, schedule
from .pipeline_stage import StageExecutor, StageRunner
from .shard_spec import ShardSpec, model_rows, whole_shape

__all__ = ["PipelineParallel", "stage_split_for", "micro_batch_tensors"]

MICROBATCH_MESSAGE = ("pipeline_parallel_microbatch_size {old} is overwritten with the "
                      "accumulation count {new} (global_batch_size // (data_parallel * "
                      "local_batch_size)): the micro-batches of one pipeline step")


def stage_split_for(cfg) -> StageSplit:
    """The stage split of a RunConfig's model and parallelism."""
    par, m = cfg.parallelism, cfg.model
    return StageSplit.build(m.num_layers, par.pipeline_parallel,
                            par.pipeline_parallel_interleave_num,
                            par.pipeline_parallel_layers_per_stage,
                            shares_embedding=bool(m.tie_word_embeddings
                                                  or m.num_nextn_predict_layers))


class PipelineParallel:
    """This rank's stage: the layout's reduction and the executor of its schedule."""

    def __init__(self, cfg, comm: GroupCommunicator, data_group: str = "dp"):
        self.cfg = cfg
        self.comm = comm
        self.mesh = comm.mesh
        self.world_size = self.mesh.world
        self.rank = comm.rank
        self.stage = self.mesh.coords(self.rank)["pp"]
        self.data_rank = self.mesh.coords(self.rank)["dp"]
        self.split = stage_split_for(cfg)
        self.schedule_name = cfg.parallelism.pipeline_parallel_schedule
        # this pipeline: the stages of this rank's dp index (its pp group, ascending by stage)
        self.stage_ranks = {s: r for s, r in enumerate(self.comm.ranks("pp"))}
        self.dp = self.mesh.dp
        #: the ranks of this stage that hold the same weights and read other tokens (its
        #: ZeRO-1 group): ``dp``, under cp x pp ``dp_cp`` (distributed/setup.py registers it)
        self.data_group = data_group
        self.data_view = GroupView(comm, data_group)
        #: the data-parallel sums (token count, gradients, loss) over this stage's data group
        #: and its optimizer sharding: a ``GradReduction`` (distributed/setup.py), the
        #: tensor-parallel one under pp x tp, the expert-parallel one under pp x ep
        self.data = DataParallelGradReducer(self.data_view, data_parallel=self.data_view.world_size,
                                            group=data_group)
        #: name -> ShardSpec of the parameters this rank holds a shard of (pp x tp: tp
        #: slices, pp x ep: experts; the model's ``shard_specs()`` at ``attach``)
        self.specs: Dict[str, ShardSpec] = {}
        self.runner: Optional[StageRunner] = None
        self._programs: Dict[int, list] = {}
        self.model = None
        #: the whole model's parameter shapes (name -> shape), recorded before the release
        self.full_shapes: Dict[str, Tuple[int, ...]] = {}

    # -- construction ---------------------------------------------------------------------------
    def set_stage_reduction(self, reduction) -> None:
        """The stage's data-parallel reduction (distributed/setup.py): under pp x tp the
        tensor-parallel one over this stage's dp group (tp_reduce.py: its slices' norm summed
        over ``tp``, the optimizer over the slices), under pp x ep the expert-parallel one
        wrapping it (ep_reduce.py: expert gradients summed over ``edp``, their optimizer
        state kept whole, their squared norm summed over ``ep``)."""
        self.data = reduction

    def attach(self, model) -> None:
        """Freeze and release the parameters other stages own (after any checkpoint load,
        before the optimizer is built)."""
        from .pipeline_release import release_foreign_parameters
        self.model = model
        self.specs = dict(model.shard_specs())
        shapes = release_foreign_parameters(model, self.split, self.stage)
        rows = model_rows(model)   # pp x tp x FSDP: dp rows of the tp slice
        # a shard (tp slice, expert, dp rows) is recorded at the whole model's shape
        self.full_shapes = {n: whole_shape(n, s, self.specs, rows) for n, s in shapes.items()}

    def parameter_sizes(self) -> Dict[str, int]:
        """name -> element count of the whole model's parameters (every stage's)."""
        return {n: int(np.prod(s, dtype=np.int64)) for n, s in self.full_shapes.items()}

    def describe(self, num_micro: int) -> str:
        old = self.cfg.parallelism.pipeline_parallel_microbatch_size
        order = "interleaved 1F1B" if self.split.vpp > 1 else "1F1B"
        lines = [f"pipeline parallel: stage {self.stage} of {self.split.pp} "
                 f"(interleave {self.split.vpp}, {order}, {num_micro} micro-batches, "
                 f"activations recomputed in the backward); {self.split.describe()}"]
        if self.model is not None:
            from .pipeline_release import held_parameter_bytes
            held = sum(int(p.size) for p in self.model.get_parameters())
            lines.append(f"this stage holds {held:,} of the model's "
                         f"{sum(self.parameter_sizes().values()):,} parameters "
                         f"({held_parameter_bytes(self.model) / 2**20:.2f} MiB)")
        if old != num_micro:
            lines.append(MICROBATCH_MESSAGE.format(old=old, new=num_micro))
        return "\n".join(lines)

    def program(self, num_micro: int) -> list:
        """This stage's compute and transfer operations for ``num_micro`` micro-batches."""
        if num_micro not in self._programs:
            pp, vpp = self.split.pp, self.split.vpp
            scheds = {s: schedule(self.schedule_name, pp, s, num_micro, vpp) for s in range(pp)}
            self._programs[num_micro] = p2p_program(scheds, pp, vpp, self.stage_ranks)[self.stage]
        return self._programs[num_micro]

    # -- GradReduction (distributed/setup.py) ------------------------------------------------------
    def global_token_count(self, local_tokens: float) -> float:
        """The step's loss tokens: this pipeline's (its stages read the same micro-batches)
        summed over the dp replicas."""
        return self.data.global_token_count(local_tokens)

    def grad_routes(self, params: Sequence) -> List[GradRoute]:
        """The stage reduction's routes; the shared embedding table's gradient summed over
        its two stages first; a parameter counted in the norm only on the stage that owns it
        (each once; the stages' sums are added over ``pp``, :attr:`norm_outer`)."""
        shared = len(self.split.holders(EMBEDDING)) > 1
        return [rerouted(r, sum_over=("pp",) + r.sum_over if shared and p.name == EMBEDDING
                         else r.sum_over,
                         counted=r.counted and self.split.owner(p.name) == self.stage)
                for p, r in zip(params, self.data.grad_routes(params))]

    #: the stages' norms are added over the pipeline (``grad_route.combine_sq_norms``)
    norm_outer = ("pp",)

    @property
    def token_group(self) -> str:
        """The loss sum and token count are the stage reduction's (summed over dp)."""
        return self.data.token_group

    def mean_over_ranks(self, value: float) -> float:
        """The mean over the dp replicas of a value every stage of a pipeline holds (the MTP
        loss from combine_mtp_loss, the aux loss)."""
        return self.data.mean_over_ranks(value)

    def optimizer_sharding(self, cfg):
        """The stage reduction's: ZeRO-1 over this stage's dp group per
        ``parallelism.data_parallel_shard`` (Muon's QK-Clip logits MAX-reduced there; None
        with data parallel 1, the plain optimizer of the stage's parameters), over the tp
        slices under pp x tp, the experts kept whole under pp x ep."""
        return self.data.optimizer_sharding(cfg)

    def broadcast_flag(self, flag: bool) -> bool:
        return self.comm.any_flag(flag)

    def combine_mtp_loss(self, mtp_loss: Optional[float]) -> Optional[float]:
        """The step's MTP loss on every stage: the last stage's (the MTP depths run there)."""
        out = self.comm.all_reduce(np.array([0.0 if mtp_loss is None else mtp_loss,
                                             mtp_loss is not None], np.float32), "pp")
        return float(out[0]) if out[1] else None

    def sync_moe_stats(self, model) -> None:
        """Every MoE layer's step statistics on every rank (a layer's are non-zero only on
        its stage: a SUM over the pipeline group, then over dp (cp x pp: dp x cp, whose aux
        parts add up to the whole sequences' and whose forward counts are cp times one
        replica's): the global batch's loads, drops and mean aux loss), so the logged MoE line
        is the same everywhere and each stage's expert-bias update sees its layers' global
        loads."""
        import mindspore as ms
        moes = sorted(model.moe_layers().items())
        rows = []
        for _, moe in moes:
            load, dropped, aux_sum, n = moe.stats_state()
            load = np.zeros(moe.num_experts, np.float32) if load is None else load.asnumpy()
            aux = 0.0 if aux_sum is None else float(aux_sum.asnumpy())
            rows.append(np.concatenate([load.astype(np.float32), np.array(
                [dropped, aux, n, aux_sum is not None], np.float32)]))
        if not rows:
            return
        width = max(r.size for r in rows)
        table = np.stack([np.pad(r, (0, width - r.size)) for r in rows])
        total = self.comm.all_reduce(self.comm.all_reduce(table, "pp"), self.data_group)
        cp = self.mesh.cp   # cp x pp: every cp rank ran each layer's forwards once
        for (_, moe), row in zip(moes, total):
            e = moe.num_experts
            load = row[:e]
            moe.load_stats_state((ms.Tensor(load) if load.any() else None, int(row[e]),
                                  ms.Tensor(np.float32(row[e + 1])) if row[e + 3] else None,
                                  int(round(row[e + 2] / cp))))

    def combine_qk_stats(self, stats):
        """QK-Clip's step report over every stage (a collective: every stage calls it):
        clipped heads summed, the largest logit; None when no stage clipped anything. The dp
        replicas of a stage clipped the same heads (their max logits are a MAX over dp);
        under pp x tp the stage reduction then sums the tp ranks' (other heads)."""
        from .qk_clip_stats import combine_qk_stats
        return self.data.combine_qk_stats(combine_qk_stats(self.comm, "pp", stats))

    def _whole_rows(self, tensors: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """``tensors`` with every weight stored as dp rows of its tp slice (pp x tp x FSDP,
        ``model.row_shards()``) all-gathered over dp into the slice (a collective of the dp
        group, in name order), so each entry is a tp slice as the joins expect; the
        optimizer's slots come whole from its collective ``state_dict``."""
        rows = model_rows(self.model)
        if not rows:
            return tensors
        import mindspore as ms
        out = dict(tensors)
        for name in sorted(rows):
            key = f"model.{name}"
            if key in out and self.split.owner(name) == self.stage:
                out[key] = self.comm.all_gather(ms.Tensor(np.ascontiguousarray(out[key])),
                                                self.data_group, 0).asnumpy()
        return out

    def gather_checkpoint(self, tensors: Dict[str, np.ndarray], state: dict):
        """(tensors, state) of the whole model on rank 0 from every stage's payload (a
        collective; distributed/pipeline_checkpoint.py); other ranks get theirs back. Each
        piece is sent once, by the first rank of the stage that holds it (the dp replicas
        hold the same weights and, after the optimizer's collective ``state_dict``, the same
        whole (ZeRO-gathered) optimizer state); rank 0 joins the tp slices and the experts
        into the single-process tensors."""
        from .pipeline_checkpoint import (gather_to_all, join_shards, merge_stage_payloads,
                                          sender_entries, sharded_entries, stage_map,
                                          stage_payload)
        own = sender_entries(stage_payload(self.split, self.stage, self._whole_rows(tensors)),
                             self.specs, self.mesh.coords(self.rank))
        parts = gather_to_all(self.comm, own)
        if self.rank != 0:
            return tensors, state
        parts, whole = join_shards(parts, [self.mesh.coords(r) for r in range(self.world_size)],
                                   self.specs)
        local_shards = sharded_entries(tensors, self.specs)
        merged = merge_stage_payloads({k: v for k, v in tensors.items() if k not in local_shards},
                                      parts + [whole], self.full_shapes)
        state = dict(state, pipeline_stages=stage_map(
            self.split, [k[len("model."):] for k in merged if k.startswith("model.")]))
        if state.get("has_optimizer"):
            state["optimizer_tensors"] = sorted(k[len("optim."):] for k in merged
                                                if k.startswith("optim."))
        return merged, state

    # -- one step's micro-batches ---------------------------------------------------------------
    def forward_backward(self, params: Sequence, batches: Sequence[dict], total_tokens: float,
                         loss_scale: float = 1.0) -> Tuple[List, float, float]:
        """This stage's part of the step: (fp32 gradients aligned with ``params``, the step's
        loss sum from the last stage, the mean aux loss over micro-batches summed over
        stages)."""
        import mindspore as ms
        if total_tokens <= 0:
            raise ValueError("the optimizer step has no loss tokens (every loss_mask is 0); "
                             "check the dataset's loss_mask")
        self._params = list(params)
        if self.runner is None or self.runner.params != self._params:
            self.runner = StageRunner(self.model, self.split, self.stage, self._params)
        num_micro = len(batches)
        ex = StageExecutor(self.runner, micro_batch_tensors(batches),
                           ms.Tensor(np.float32(loss_scale / total_tokens)),
                           ms.Tensor(np.float32(loss_scale / (num_micro * self.dp))))
        rows, seq = np.asarray(batches[0]["input_ids"]).shape
        like = ms.Tensor(np.zeros(self.runner.activation_shape(rows, seq),
                                  np.float32)).astype(self.model.precision.compute)
        for op in self.program(num_micro):
            if not isinstance(op, Transfer):
                ex.compute(op)
            elif op.src == self.rank:
                self.comm.send(ex.outgoing(op), op.dst)
            else:
                ex.incoming(op, self.comm.recv(like, op.src))
        grads, local_loss, local_aux = ex.result()
        both = self.comm.all_reduce(np.array([local_loss, local_aux], np.float32), "pp")
        return grads, float(both[0]), float(both[1])


def micro_batch_tensors(batches: Sequence[dict]) -> List[dict]:
    """The micro-batches as Tensors (int32 ids and labels, float32 mask)."""
    import mindspore as ms
    return [{k: ms.Tensor(np.asarray(b[k], dtype=np.float32 if k == "loss_mask" else np.int32))
             for k in ("input_ids", "labels", "loss_mask")} for b in batches]
