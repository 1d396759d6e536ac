"""Optimizers on tensor-parallel-sharded weights (``build_optimizer(..., shard_layout=...)``).

Under tensor parallel the model holds each sharded weight's local slice under its usual name
and says how it is split (``model.shard_specs() -> {name: ShardSpec}``; absent = replicated).
:class:`TensorParallelSharding` builds the optimizer over those local Parameters:

* AdamW, Lion, SGD and Muon's AdamW branch are element-wise: the optimizer built over the
  local slices is already right (moments, weight decay and fp32 masters per shard).
* Muon gets the full shapes (``full_shapes``: split rules, pieces and the update scale use
  them, never the shard's) and a ``shard_exchange.ShardedMuonExchange`` whose first level is
  the tensor-parallel :class:`~.shard_exchange.SpecLevel` (``comm_strategy`` allgather /
  allgather_deredundency, send/recv by ``collectives.CAPABILITIES``).
* QK-Clip runs on the local q/kv shards with the model's max logits of its local heads
  (heads are split in contiguous blocks, so local head j's rows are rows ``j * period + ...``
  of the local shard: the local layout is the full one restricted to ``N / tp`` heads);
  the logits are MAX-reduced over the data-parallel group only (the tp ranks hold different
  heads).
* under tp x ep the routed experts (``keep_whole``: split over ep, not tp) keep their whole
  local state and are orthogonalised per local expert with no exchange (no level splits them);
* ``data_parallel_shard`` != 1 adds ZeRO-1 over the dp group on top of the TP shards
  (``zero.ZeroSharding`` over a ``group_view.GroupView`` of the dp group: a
  ``zero.ZeroOptimizer`` holding the optimizer; Muon's exchange levels are
  ``[tp, ZeRO rows of the TP shard]``);
* tp x FSDP (``fsdp.apply_fsdp`` over the tensor-parallel reduction): the same ZeRO rows of
  each TP shard, with ``grad_rows`` (gradients arrive as those rows) and ``param_rows`` (the
  parameter stores only them; ``row_shapes``: the whole TP shard's shape, which the ZeRO
  layout uses, while Muon's ``full_shapes`` stay the unsharded ones), so a weight split in two
  dimensions is orthogonalised through both levels (``comm_strategy`` allgather /
  allgather_deredundency).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Sequence

import numpy as np

from .collectives import GroupCommunicator
from .group_view import GroupView
from .shard_exchange import ShardedMuonExchange, SpecLevel
from .shard_spec import ShardSpec, local_shape

__all__ = ["TensorParallelSharding", "LocalHeadLogits", "check_shard_specs", "local_heads"]


def check_shard_specs(specs: Mapping[str, ShardSpec], params, tp_size: int,
                      row_shapes: Optional[Mapping[str, tuple]] = None) -> Dict[str, ShardSpec]:
    """The split specs of ``params`` (Parameters of the optimizer); every spec must name one of
    them, be split over the tp group of ``tp_size`` ranks and match the local shape (a
    parameter stored as dp rows of its slice: its ``row_shapes`` entry, the whole slice)."""
    row_shapes = row_shapes or {}
    by_name = {p.name: p for p in params}
    out = {}
    for name, spec in specs.items():
        if name not in by_name:
            raise ValueError(f"shard_specs names {name!r}, which is not a parameter the "
                             "optimizer updates")
        if not spec.is_sharded:
            continue
        if spec.group != "tp":
            raise ValueError(f"{name!r} is split over group {spec.group!r}; tensor-parallel "
                             "sharding takes 'tp' splits only")
        if spec.num_shards != tp_size:
            raise ValueError(f"{name!r} is split into {spec.num_shards} shards, but the tp group "
                             f"has {tp_size} ranks")
        shape = tuple(row_shapes.get(name, by_name[name].shape))
        if shape != local_shape(spec):
            raise ValueError(f"{name!r} has shape {shape}, but its "
                             f"ShardSpec's local shape is {local_shape(spec)}")
        out[name] = spec
    return out


_Q_WEIGHTS = ("linear_q_up_proj.weight", "linear_q_proj.weight")


def local_heads(tc, specs: Mapping[str, ShardSpec]) -> int:
    """Attention heads of this rank: the local rows of a split MLA q weight over the per-head
    period ``qk_head_dim + qk_pos_emb_head_dim`` (``tc``: the model's transformer config);
    all ``num_attention_heads`` when no q weight is split."""
    for name, spec in sorted(specs.items()):
        if name.endswith(_Q_WEIGHTS) and tc.qk_head_dim is not None:
            return local_shape(spec)[0] // (tc.qk_head_dim + tc.qk_pos_emb_head_dim)
    return int(tc.num_attention_heads)


class LocalHeadLogits:
    """Muon's ``max_logits_reducer`` under tensor parallel: checks that the tracked max logits
    are those of this rank's ``local_heads`` heads, then MAX-reduces them over the
    data-parallel group (``dp``: a :class:`GroupView`)."""

    def __init__(self, local_heads: int, dp: GroupView):
        self.local_heads, self.dp = int(local_heads), dp

    def __call__(self, logits) -> np.ndarray:
        arr = np.asarray(logits, np.float32)
        if arr.ndim != 2 or arr.shape[1] != self.local_heads:
            raise ValueError(f"max attention logits have shape {arr.shape}; a tensor-parallel "
                             f"rank tracks [layers, {self.local_heads}] (its local heads)")
        return self.dp.all_reduce_max(arr)


class TensorParallelSharding:
    """``optim.build.OptimizerSharding`` for tensor parallel (module docstring).

    Args:
        specs: ``model.shard_specs()``: parameter name -> ShardSpec (group 'tp').
        comm: this rank's ``GroupCommunicator`` (groups 'tp' and 'dp').
        data_parallel_shard: ZeRO-1 shards over the dp group on top (1: none; -1 / None: all
            dp ranks).
        p2p: Muon deredundency's send/recv: None = as ``collectives.CAPABILITIES`` says for
            the backend, True / False to force it (``shard_exchange.SpecLevel``).
        data_group: the data-parallel group (``dp``; ``dp_cp`` under cp x tp, whose cp ranks
            hold the same shards).
    """

    def __init__(self, specs: Mapping[str, ShardSpec], comm: GroupCommunicator,
                 data_parallel_shard: Optional[int] = 1, p2p: Optional[bool] = None,
                 data_group: str = "dp", grad_rows: Iterable[str] = (),
                 param_rows: Iterable[str] = (),
                 row_shapes: Optional[Mapping[str, Sequence[int]]] = None):
        self.specs, self.comm, self.p2p = dict(specs), comm, p2p
        self.dp = GroupView(comm, data_group)
        self.data_parallel_shard = data_parallel_shard
        # tp x FSDP (module docstring): ZeRO rows that the gradients / parameters already are
        self.grad_rows, self.param_rows = frozenset(grad_rows), frozenset(param_rows)
        self.row_shapes = {k: tuple(int(d) for d in v) for k, v in (row_shapes or {}).items()}
        #: names whose state stays whole on their rank, not tp-split nor ZeRO-sharded: the
        #: experts under tp x ep (``ep_reduce.ExpertParallelReducer.optimizer_sharding``)
        self.keep_whole = frozenset()

    def build(self, cls: type, groups, kwargs: Dict[str, Any]):
        """``cls(groups, **kwargs)`` over the local shards (ZeRO-1 over dp when asked)."""
        from ..optim.muon import Muon
        from .zero import ZeroSharding
        params = [p for g in groups for p in g["params"]]
        specs = check_shard_specs({n: s for n, s in self.specs.items()
                                   if n not in self.keep_whole}, params,
                                  self.comm.mesh.size("tp"), self.row_shapes)
        kwargs = dict(kwargs)
        is_muon = issubclass(cls, Muon)
        if is_muon:
            kwargs["full_shapes"] = {n: s.full_shape for n, s in specs.items()}
            model = kwargs.get("model")      # None: Muon raises its own message
            if model is not None:
                kwargs.setdefault("max_logits_reducer", LocalHeadLogits(
                    local_heads(model.get_gpt_transformer_config(), specs), self.dp))
        zero = ZeroSharding(self.dp, self.data_parallel_shard, keep_whole=self.keep_whole,
                            grad_rows=self.grad_rows, param_rows=self.param_rows,
                            full_shapes=self.row_shapes)
        opt = zero.build(cls, groups, kwargs)   # a zero.ZeroOptimizer over > 1 shard
        if is_muon:
            sharded = zero.num_shards > 1
            muon = opt.inner if sharded else opt
            tp = SpecLevel({muon.index_of(n): s for n, s in specs.items()}, self.comm, "tp",
                           p2p=self.p2p)
            rows = [opt.zero_level] if sharded else []
            muon.use_exchange(ShardedMuonExchange.for_optimizer(muon, [tp] + rows))
        return opt
