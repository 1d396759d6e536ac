"""Fully sharded data parallel: ``parallelism.data_parallel_shard_strategy`` ``optim_grads`` and
``optim_grads_params`` (values and refused combinations: config/shard_strategy.py; which
parameters are split: fsdp_layout.py).

``optim_grads``: parameters stay full on every rank. After the backward, the gradients of the
split parameters are reduce-scattered over the ``dp`` group (one flat buffer, rank-major), so
each rank keeps only its ``1/dp`` rows; the others are all-reduced as before. The optimizer is
the ZeRO-1 one (distributed/zero.py) told that those gradients are already rows.

``optim_grads_params``: each rank stores only its rows of the split parameters (the Parameter's
data is replaced by its shard; the name stays, the layout is in ``model.shard_specs()``). The
model's forward runs through :class:`FSDPRunner`: the embedding lookup, every decoder layer and
the head are each one :class:`FSDPUnit`, a recomputed Cell whose forward all-gathers its
weights (:class:`GatherShard`), runs the layer's pure function on the full weights and drops
them; the backward runs the unit again (gathering the weights again) and
:class:`GatherShard`'s ``bprop`` reduce-scatters each weight's gradient over ``dp``. So full
weights exist for one unit at a time, forward and backward, and every rank's gradient of a split
parameter is its rows of the summed gradient:

    d(sum_r L_r) / d shard_k = rows_k( sum_r dL_r / dW )      = ReduceScatter_dp(dL_r / dW)

which is the reduction the data-parallel reducer does for full gradients. The optimizer is the
ZeRO-1 one told that those parameters and gradients are rows: it updates them in place, with no
all-gather after the step. Muon takes the same path as ZeRO-1 (``shard_exchange.ShardedMuonExchange``
under ``Muon._muon_update``, both comm strategies) on the full shapes.

Both: the reducer declares each gradient's route (``grad_route.GradRoute``: reduce-scattered
over ``dp``, already reduced, or all-reduced as before); the norm counts a split gradient over
its group and a replicated one once, identical on every rank, so clipping and skip decisions
agree.
``disable_gradient_division: False`` divides the reduced gradients by dp (upstream's averaging).

Limits of ``optim_grads_params`` here (refused by the config, at ``--check``:
config/shard_strategy.py ``sharded_parameter_problem``):
``training.jit`` runs as ``none`` (the units are PyNative Cells with collectives; another value
written in the config is refused). Each multi-token prediction depth is one unit (models/mtp.py
``MTPLayer.run_with``), its head another, and its shifted tokens go through the embedding
unit. Under context parallel the rows are split over the dp x cp ranks
(the ``dp_cp`` group, :func:`apply_fsdp`'s ``group``). Under expert parallel
the routed experts are cut over ep before this (distributed/setup.py) and are not split here: a
unit passes them through. Under tensor parallel (tp x FSDP, :func:`apply_fsdp`'s ``tensor``) the
rows are those of each rank's tp slice, gathered over its dp group inside one unit per tensor-
parallel layer (``models/tp_model.py`` ``hold_rows``). Under pipeline parallel each stage's
weights are split over its own dp group: the pipeline's stage runs the same units
(core/pipeline_split.py picks the stage's layers) and this reducer is the stage's reduction
(distributed/setup.py). Outside the units (the model's ``logits``, ``hidden_states`` and
generation's key/value-cache decoder) the weights are gathered one layer at a time through
:meth:`FSDPRunner.full_weights`, a collective: every rank of the ``dp`` group generates together
(trainer/progress.py). The side effect of recomputation applies: a MoE layer counts its routing
statistics twice per step (core/recompute.py: the expert-bias update is unchanged).
"""
from __future__ import annotations

import functools
from typing import Callable, Dict, List, Optional, Protocol, Sequence, runtime_checkable

import numpy as np
import mindspore as ms
from mindspore import nn

from ..config.shard_strategy import optimizer_shard_count, shards_grads, shards_params
from ..core.parallel_dims import fsdp_ranks
from .collectives import GroupCommunicator
from .fsdp_layout import FSDP_GROUP, fsdp_specs
from .model_runner import RunnerDefaults, run_layer_steps
from .shard_params import cut_parameters
from .grad_route import GradRoute, rerouted
from .shard_spec import ShardSpec, spec_norm_group
from .zero import ZeroSharding

__all__ = ["GatherShard", "FSDPUnit", "FSDPRunner", "FSDPGradReducer",
           "RowHoldingRunner", "layer_unit", "shard_model", "apply_fsdp", "grad_row_specs"]


#: tp x FSDP: the tp and dp ranks of one pipeline stage (the norm of a weight split over both)
TP_DP_GROUP = "tp_dp"


class GatherShard(nn.Cell):
    """All-gather of a dim-0 shard over ``group`` forward; reduce-scatter of the gradient."""

    def __init__(self, comm: GroupCommunicator, group: str = FSDP_GROUP):
        super().__init__()
        self.comm, self.group = comm, group

    def construct(self, shard_tensor):
        return self.comm.all_gather(shard_tensor, self.group, 0)

    def bprop(self, shard_tensor, out, dout):
        g = self.comm.reduce_scatter(dout.astype(ms.float32), self.group, 0)
        return (g.astype(shard_tensor.dtype),)


class FSDPUnit(nn.Cell):
    """``fn(*inputs, *weights)`` with the split weights all-gathered just in time; recomputed
    in the backward, so the gathered weights (and the unit's activations) are not kept.

    Called as ``unit(*inputs, *weights)``; ``split[j]`` says whether weight j is a shard."""

    def __init__(self, fn, split: Sequence[bool], gather: GatherShard):
        super().__init__()
        self.fn = fn
        self.split = tuple(bool(s) for s in split)
        self.gather = gather
        self.recompute()

    def construct(self, *args):
        n = len(args) - len(self.split)
        full = [self.gather(w) if s else w for w, s in zip(args[n:], self.split)]
        return self.fn(*args[:n], *full)


def _dense_fn(layer):
    def run(h, *args):
        h, max_logits = layer.apply(h, args[:6], *args[6:])
        return h, max_logits
    return run


def _packed(h, max_logits, aux) -> tuple:
    """A unit's outputs: a Cell returns no None, so a dense MLP's missing aux is left out."""
    return (h, max_logits) if aux is None else (h, max_logits, aux)


def _unpacked(out) -> tuple:
    """(h, max_logits, aux or None) of a unit's :func:`_packed` outputs."""
    return out[0], out[1], out[2] if len(out) > 2 else None


def _moe_fn(layer):
    def run(h, *args):
        return _packed(*layer.run_with(h, args[:6], *args[6:]))
    return run


def _mtp_fn(depth):
    count = len(depth.weights())

    def run(h, emb, *args):
        return _packed(*depth.run_with(h, emb, args[:-count], *args[-count:]))
    return run


def layer_unit(layer, fn, split_names, gather: GatherShard):
    """``step(h, tables) -> (h, max_logits, aux or None)``: ``fn(h, *tables, *weights)`` (it
    returns ``(h, max_logits[, aux])``) run on ``layer.weights()`` as one :class:`FSDPUnit`
    (those in ``split_names`` gathered inside it). :class:`FSDPRunner`'s layers, and under
    tensor parallel the tp layers (``models/tp_model.py`` ``hold_rows``)."""
    weights = layer.weights()
    run = FSDPUnit(fn, [w.name in split_names for w in weights], gather)

    def step(h, tables):
        return _unpacked(run(h, *tables, *layer.weights()))
    return step


class FSDPRunner(RunnerDefaults):
    """The forward of a ``GPTModel`` whose split parameters hold shards (module docstring):
    the ``model_runner.ModelRunner`` interface under ``training.jit: none``, gathering the
    weights (``gathers_weights``)."""

    mode = "none"

    def __init__(self, model, comm: GroupCommunicator, split_names, group: str = FSDP_GROUP):
        self._model = model
        self._comm, self._split_names, self._group = comm, frozenset(split_names), group
        gather = GatherShard(comm, group)

        def unit(fn, weights):
            return FSDPUnit(fn, [w.name in split_names for w in weights], gather)

        self._embed = unit(model.embed_tokens, [model.embedding.word_embeddings.weight])
        self._steps = [layer_unit(layer, _dense_fn(layer) if layer.dense_mlp else _moe_fn(layer),
                                  self._split_names, gather)
                       for layer in model.decoder_layers()]
        self._head = unit(model.head, model.output_weights())
        # multi-token prediction: each depth one unit (the shared embedding is the embed
        # unit's), and its head one with its final norm and the shared output layer
        depths = [] if model.mtp is None else list(model.mtp.layers)
        self._depths = {id(d): unit(_mtp_fn(d), d.weights()) for d in depths}
        w_out = model.output_weights()[1]
        self._mtp_heads = {d.final_layernorm.weight.name: unit(
            model.head, (d.final_layernorm.weight, w_out)) for d in depths}

    @property
    def gathers_weights(self) -> bool:
        return True

    def embed(self, input_ids):
        return self._embed(input_ids, self._model.embedding.word_embeddings.weight)

    def layers(self, h, tables, indices=None):
        """(h after the last layer, summed aux loss or None, [max_logits per layer]); only the
        decoder layers ``indices`` (in order) when given: each one unit (its weights gathered
        for it alone)."""
        return run_layer_steps(self._steps, h, tables, indices)

    def head(self, h, labels, loss_mask) -> tuple:
        return self._head(h, labels, loss_mask, *self._model.output_weights())

    def mtp_depth(self, depth, h, emb, tables) -> tuple:
        """(h^k, max_logits, aux or None) of one MTP depth, its weights gathered in its unit."""
        return _unpacked(self._depths[id(depth)](h, emb, *tables, *depth.weights()))

    def mtp_head(self, h, labels, loss_mask, w_norm) -> tuple:
        """A depth's (loss_sum, n_tokens): its final norm gain ``w_norm`` and the shared
        output layer, gathered in the depth's head unit."""
        return self._mtp_heads[w_norm.name](h, labels, loss_mask, w_norm,
                                            self._model.output_weights()[1])

    def full_weights(self, weights: Sequence) -> tuple:
        """``weights`` with the split ones all-gathered over the FSDP group (a collective of
        the group: every rank asks for the same ones): what generation reads outside the
        units, one layer at a time (models/kv_cache.py), so full weights exist for one layer
        at a time there as in training."""
        return tuple(self._comm.all_gather(w, self._group, 0) if w.name in self._split_names
                     else w for w in weights)


def shard_model(model, specs: Dict[str, ShardSpec], index: int) -> None:
    """Replace every parameter in ``specs`` by a new Parameter holding its shard ``index``
    (same name and dtype; shard_params.py: under an interleaved pipeline a virtual stage's
    backward differentiates the rank's other virtual stage's weights, and an in-place cut
    gave those zeros of the whole shape) and record the layouts (``model.shard_specs()``)."""
    cut_parameters(model, specs, index)
    model.set_shard_specs(specs)


class FSDPGradReducer:
    """The trainer's data-parallel reducer under a sharding strategy (module docstring):
    ``base``'s by delegation, with the split gradients' routes (:meth:`grad_routes`)."""

    def __init__(self, base, comm: GroupCommunicator, strategy: str,
                 specs: Dict[str, ShardSpec], num_shards: int,
                 disable_gradient_division: bool = True, data_parallel: Optional[int] = None,
                 tensor_specs: Optional[Dict[str, ShardSpec]] = None, group: str = FSDP_GROUP):
        """``base``: the data-parallel reduction (a ``DataParallelGradReducer``), or under tp x
        FSDP the tensor-parallel one (``tp_reduce.TensorParallelGradReducer``), whose model's
        tp layouts are ``tensor_specs``; ``specs``: the rows over ``group`` (``dp``, or
        ``dp_cp`` under context parallel; of each tp slice); ``data_parallel``: the dp size
        ``disable_gradient_division: False`` divides by."""
        self.base = base
        self.comm = base.comm
        self.world_size, self.rank = base.world_size, base.rank
        self.group_comm = comm
        self.strategy = strategy
        self.specs = dict(specs)
        self.num_shards = int(num_shards)
        self.divide = not disable_gradient_division
        self.data_parallel = int(data_parallel or base.world_size)
        self.tensor_specs = None if tensor_specs is None else dict(tensor_specs)
        self.group = group
        self.token_group = base.token_group

    # -- delegated -------------------------------------------------------------------------------
    def global_token_count(self, local_tokens: float) -> float:
        return self.base.global_token_count(local_tokens)

    def broadcast_flag(self, flag: bool) -> bool:
        return self.base.broadcast_flag(flag)

    def mean_over_ranks(self, value: float) -> float:
        return self.base.mean_over_ranks(value)

    def sync_moe_stats(self, model) -> None:
        self.base.sync_moe_stats(model)

    def reduce_max(self, values: np.ndarray) -> np.ndarray:
        return self.base.reduce_max(values)

    def combine_qk_stats(self, stats):
        return self.base.combine_qk_stats(stats)

    # -- the optimizer -----------------------------------------------------------------------------
    def optimizer_sharding(self, cfg):
        """``zero.ZeroSharding`` told which of its rows the gradients and parameters already
        are, or under tp x FSDP the tensor-parallel sharding told so."""
        split = set(self.specs) if shards_grads(self.strategy) else set()
        stored = split if shards_params(self.strategy) else set()
        shapes = {n: self.specs[n].full_shape for n in stored}
        if self.tensor_specs is not None:
            return self.base.optimizer_sharding(cfg, grad_rows=split, param_rows=stored,
                                                row_shapes=shapes)
        return ZeroSharding(self.comm, num_shards=optimizer_shard_count(self.strategy,
                                                                        self.num_shards),
                            grad_rows=split, param_rows=stored, full_shapes=shapes)

    # -- gradients ---------------------------------------------------------------------------------
    def grad_routes(self, params: Sequence) -> List[GradRoute]:
        """``base``'s routes for the replicated gradients and the token sums; a split gradient
        reduce-scattered over ``group`` to this rank's rows (``optim_grads``) or already
        reduced by the backward (``optim_grads_params``); all divided by dp under
        ``disable_gradient_division: false``; each norm over its :meth:`norm_specs` group."""
        routes = self.base.grad_routes(params)
        split = shards_grads(self.strategy)
        norms = self.norm_specs()
        scale = 1.0 / self.data_parallel if self.divide else 1.0
        out = []
        for p, route in zip(params, routes):
            norm = spec_norm_group(norms.get(p.name))
            if split and p.name in self.specs:
                scatter = None if shards_params(self.strategy) else self.group
                route = GradRoute((), scatter, norm_group=norm)
            else:
                route = rerouted(route, norm_group=norm)
            out.append(rerouted(route, scale=scale))
        return out

    def norm_specs(self) -> Dict[str, ShardSpec]:
        """The layout each gradient's norm is counted under (``grad_route.GradRoute.norm_group``;
        a name not here is replicated): a gradient left as rows over ``group``; under tp x
        FSDP a tp slice over tp (an expert, under tp x ep x FSDP, over ep: the model's own
        layouts), its dp rows over tp and dp (``TP_DP_GROUP``: the ranks of this rank's
        pipeline stage, cp and the folded ep included)."""
        tensor = {n: s for n, s in (self.tensor_specs or {}).items()
                  if s.is_sharded and s.num_shards > 1}
        rows = set(self.specs) if shards_grads(self.strategy) else set()
        out = {n: s for n, s in tensor.items() if n not in rows}
        if rows:
            both = len(self.group_comm.ranks(TP_DP_GROUP)) if tensor else 1
            split = ShardSpec((self.num_shards,), 0, self.group, self.num_shards)
            across = ShardSpec((both,), 0, TP_DP_GROUP, both)
            out.update({n: across if n in tensor else split for n in rows})
        return out


def grad_row_specs(reduction) -> Dict[str, ShardSpec]:
    """The norm layouts (:meth:`FSDPGradReducer.norm_specs`) of the gradients that
    ``reduction`` (:func:`apply_fsdp`'s result) leaves as rows, and of the tp slices beside
    them: {} unless it is an FSDP reduction whose strategy shards gradients (the
    expert-parallel norm counts them so, distributed/ep_reduce.py)."""
    if isinstance(reduction, FSDPGradReducer) and shards_grads(reduction.strategy):
        return reduction.norm_specs()
    return {}


@runtime_checkable
class RowHoldingRunner(Protocol):
    """A tensor-parallel model's runner (``models/tp_model.py``) as tp x FSDP drives it."""

    def hold_rows(self, names, gather: GatherShard, unit: Callable) -> None: ...


def apply_fsdp(cfg, reducer, model, comm: Optional[GroupCommunicator] = None,
               tensor=None, group: str = FSDP_GROUP):
    """``(reducer, model)`` of this run: unchanged unless the strategy shards gradients or
    parameters or ``disable_gradient_division`` is False (over more than one rank); then the
    :class:`FSDPGradReducer`, and under ``optim_grads_params`` the model's split parameters
    replaced by this rank's shards and its forward by :class:`FSDPRunner`. ``comm``: the
    run's communicator (distributed/setup.py).

    ``tensor``: the tensor-parallel reduction of a model already cut over tp (tp x FSDP;
    ``reducer`` is then that reduction): the rows are those of each rank's tp slice over its
    dp group, the model's ``shard_specs()`` stay the tp layouts (the rows are recorded by
    ``model.set_row_shards``), and its tp runner gathers the rows inside one unit per layer
    (:class:`RowHoldingRunner`).

    ``group``: the ranks the rows are split over, ``dp`` (a pipeline stage's: its own), or
    under context parallel ``dp_cp`` (cp x FSDP: the cp ranks of a replica hold the same
    weights and read other tokens; torchtitan's dp_shard_cp), added to ``comm`` by the run
    setup. Every rank of it sharding (``data_parallel_shard`` -1 or dp), the rows are
    ``1/|group|`` of each weight."""
    par = cfg.parallelism
    strategy = par.data_parallel_shard_strategy
    world = reducer.world_size
    if world == 1:
        return reducer, model
    if comm is not None:
        members = comm.ranks(group)
        dp = len(comm.ranks(FSDP_GROUP))
    else:   # the refusals below need no communicator (a pipeline stage's reduction says its dp)
        dp = (tensor.dp_comm.world_size if tensor is not None
              else reducer.data_parallel or cfg.data_parallel(world))
        members = tuple(range(dp))
    _, dp_shard = par.dp_shard(dp)
    num_shards = fsdp_ranks(dp, dp_shard, len(members) // dp)   # dp x cp under cp
    split_on = shards_grads(strategy) and num_shards > 1
    if not split_on and par.disable_gradient_division:   # no_shard / optim: the base's ZeRO-1
        return reducer, model
    if comm is None:
        raise ValueError("apply_fsdp shards over the run's GroupCommunicator: pass comm "
                         "(distributed/setup.py does)")
    # ep x FSDP: the experts are already split over ep (distributed/setup.py cuts them first)
    expert = {n for n, s in model.shard_specs().items() if s.group == "ep"}
    trainable = [(p.name, tuple(p.shape)) for p in model.trainable_params()
                 if p.name not in expert]
    specs = fsdp_specs(trainable, num_shards, group) if split_on else {}
    index = members.index(comm.rank)
    if tensor is not None and specs:   # the norm of a weight split over both tp and dp
        mesh = comm.mesh
        stage = mesh.coords(comm.rank)["pp"]
        comm.add_group(TP_DP_GROUP, [r for r in range(mesh.world)
                                     if mesh.coords(r)["pp"] == stage])
    if shards_params(strategy) and specs and tensor is not None:
        runner = model.runner
        if not isinstance(runner, RowHoldingRunner):
            raise TypeError(f"tp x FSDP needs the model's tensor-parallel runner, got "
                            f"{type(runner).__name__}")
        cut_parameters(model, specs, index)
        model.set_row_shards(specs, index)
        gather = GatherShard(comm, group)
        runner.hold_rows(set(specs), gather, functools.partial(
            layer_unit, split_names=frozenset(specs), gather=gather))
    elif shards_params(strategy) and specs:
        shard_model(model, specs, index)
        model.set_runner(FSDPRunner(model, comm, set(specs), group))
    return FSDPGradReducer(reducer, comm, strategy, specs, num_shards,
                           par.disable_gradient_division, dp,
                           None if tensor is None else model.shard_specs(), group), model
