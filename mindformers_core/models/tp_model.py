"""Megatron tensor parallelism with sequence parallelism for ``GPTModel`` (GPT and DeepSeek-V3).

``apply_tensor_parallel(model, comm)`` takes a model built and initialised as usual (the same
seeded weights as one process) and keeps, for every parameter ``models/tp_plan.py``
splits, this rank's slice under the same name; ``model.shard_specs()`` then maps those names to
their :class:`~mindformers_core.distributed.shard_spec.ShardSpec` (absent = replicated). The
attention blocks run on their local heads (and GQA groups), the MLPs on their local ffn units,
the embedding / output layer / cross-entropy on the local vocabulary rows.

One layer, with ``h`` this rank's ``T/tp`` tokens of the residual stream (sequence parallel)
and ``models/sequence_parallel.py``'s boundaries:

    x   = RMSNorm(h)                                     local tokens
    h  += ScatterSequence(attn_local(GatherSequence(x)))  column-parallel q/k/v (or MLA's q / kv
                                                          up-projections) over heads, the core
                                                          on local heads, row-parallel proj
    x   = RMSNorm(h)
    h  += ScatterSequence(mlp_local(GatherSequence(x)))   dense MLP: fc1 column, fc2 row
    h  += SplitSequence(routed(GatherReplicated(x)))      MoE layer: routed experts (below)
          + ScatterSequence(shared_local(GatherSequence(x)))   and the shared experts, column /
                                                          row parallel like a dense MLP

The router and the routed experts are replicated and every tp rank runs them on all tokens of
the micro-batch: routing, expert counts and the sequence aux loss are then those of one
process exactly (the aux loss needs whole sequences, which a token shard does not hold), and
their gradient is complete on every rank. The cost is the routed-expert compute repeated tp
times; expert parallelism is the way to split it.

Tensor x expert parallel (the experts split over ep after this cut,
``models/expert_parallel.py``; ep folded over the ranks of a stage, core/parallel_dims.py).
The ranks of one tp group hold the same micro-batch, each its own ``T/tp`` tokens, so the
routed block runs on those local tokens, with no gather:

    scores, ids, gates = route(x_local; CopyToGroup(router))   per token, as one process
    out_local          = dispatch(x_local) over the ep group   only the local experts compute
    aux                = sequence_aux(GatherReplicated(scores), all_gather(ids))
    h_local           += out_local                             (+ the shared experts as above)

Every token of the world is dispatched exactly once (by the rank that holds it in the sequence
split), whether the ep group is the tp group (world 4, tp 2 x ep 2) or straddles data-parallel
ranks (ep 4 over tp 2 x dp 2), so one code path serves every folding. The cheaper-looking
alternative when ep == tp (every rank runs its local experts on all T tokens, then a sum over
ep) computes each expert on tp times the tokens this split sends it and holds only for that
one folding. Gradients: a token's expert output (and its gate) is computed for the rank that
holds the token, so its input gradient is complete there; the aux loss is computed whole and
identically on every tp rank (``GatherReplicated``: backward keeps the local rows); the
router's local gradient covers the local tokens only, hence ``CopyToGroup`` (tp sum). The
expert weights' gradient already sums every token sent to them over the ep group (the
exchange's backward) and is then reduced over edp (``distributed/ep_reduce.py``); never over
tp, whose ranks may hold other experts. The expert loads and the aux loss recorded are the
micro-batch's (the gathered ids), the same on every tp rank, as without ep. An expert capacity
would drop pairs per ``T/tp`` tokens instead of per micro-batch, so it is refused with tp x
ep (config/tensor_parallel_rules.py).

Gradients of replicated parameters. With sequence parallelism every replicated parameter
outside the MoE block has a *partial* local gradient: a norm gain sees only this rank's tokens,
and MLA's down-projections and their norms, replicated inside the tensor-parallel region, feed
only this rank's heads. Each such weight enters the forward through ``CopyToGroup`` (identity;
backward AllReduce over tp), so the gradient leaving the model is already the tp sum, the same
on every tp rank; sharded weights get their own slice's full gradient. Nothing after the
backward (data-parallel reduction, norm, optimizer) needs to know which is which, except the
global norm, which counts sharded gradients over the group (the tp reducer's routes,
``distributed/grad_route.py``).

Max attention logits are per *local* head: ``[num_layers, num_heads / tp]`` (a MAX across
ranks may only run over data-parallel replicas, never across tp ranks, which hold other heads).

Tensor x fully sharded data parallel (``distributed/fsdp.py`` ``apply_fsdp`` after this cut,
:meth:`TensorParallelRunner.hold_rows`): a parameter may then store only its dp rows of this
rank's tp slice. Every weight read goes through one accessor, which gathers the rows
(backward: reduce-scatter over dp) before the tp gradient sum, and each decoder layer's step
is one recomputed unit whose weights are gathered inside it, so the whole tp slices of one
layer exist at a time.

Generation (models/kv_cache.py through :meth:`TensorParallelRunner.decode_layer`): the same
layer step with other boundaries (``_Boundaries``): every tp rank holds each new token's whole
row (one token has no sequence split), so a gather or split is the identity and a scatter is
the sum over tp; the attention is the cache's (the local heads' keys and values, or MLA's
latent). Only the last position's top id, or its logits for sampling, is combined over tp.

``training.jit: layer``: the boundaries are host-side collectives with their own bprop, which
a ``mindspore.jit`` graph cannot hold, so they stay PyNative; each layer's attention on its
local heads and its dense MLP on its local units are compiled (one graph each, the weights and
the attention tables as graph inputs, as ``models.compiled``; the shared experts use the MLP
graph); the routed experts, the embedding and the head run in PyNative. ``training.jit:
model`` is refused under tensor parallelism (one graph of the whole forward would have to hold
the collectives).
"""
from __future__ import annotations

import functools

import mindspore as ms
import numpy as np
from mindspore import ops

from ..distributed.collectives import GroupCommunicator
from ..distributed.model_runner import RunnerDefaults, run_layer_steps
from ..distributed.shard_params import cut_parameters
from .tp_plan import (AttentionShape, is_partial_replicated, tp_shard_specs,
                                     vocab_range)
from .compiled import NUM_TABLES, effective_mode
from .layers import linear, rms_norm
from .sequence_parallel import (GatherReplicated, GatherSequence, ScatterSequence,
                                SplitSequence, vocab_parallel_embed, vocab_parallel_token_losses)
from .tensor_parallel import CopyToGroup, ReduceFromGroup

__all__ = ["apply_tensor_parallel", "TensorParallelRunner", "vocab_parallel_argmax"]


def _attention_shape(model) -> AttentionShape:
    cfg, tc = model.cfg, model.get_gpt_transformer_config()
    return AttentionShape(cfg.num_attention_heads, tc.num_query_groups, tc.kv_channels)


def apply_tensor_parallel(model, comm: GroupCommunicator, group: str = "tp"):
    """Shard ``model`` (a fully built ``GPTModel``) over ``comm``'s ``group``; returns it."""
    tp = len(comm.ranks(group))
    if tp == 1:
        return model
    if model.shard_specs():
        raise ValueError("the model is already tensor parallel")
    index = comm.mesh.local_rank(group, comm.rank)
    params = list(model.get_parameters())
    specs = tp_shard_specs(((p.name, p.shape) for p in params), tp, _attention_shape(model))
    # new Parameters: a virtual pipeline stage's backward reads none of its others' weights
    # (distributed/shard_params.py)
    cut_parameters(model, specs, index)
    mla = model.get_gpt_transformer_config().multi_latent_attention
    for attn in model.attention_blocks():   # the decoder layers', then the MTP depths'
        attn.num_heads //= tp
        if not mla:
            attn.num_groups //= tp
    runner = TensorParallelRunner(model, comm, group, {p.name for p in params
                                                       if p.name not in specs and p.requires_grad
                                                       and is_partial_replicated(p.name)},
                                  model.jit_mode)
    model.set_parallel_runner(runner, specs, model.cfg.num_attention_heads // tp,
                              1 if mla else model.get_gpt_transformer_config().num_query_groups
                              // tp)
    return model


def vocab_parallel_argmax(logits, start: int, comm: GroupCommunicator, group: str = "tp") -> int:
    """The greedy id of one position from this rank's logits ``[V/tp]`` of the vocabulary rows
    from ``start``: each rank's (max value, its global id), gathered over ``group`` (2 floats a
    rank, never the logits), and the largest value's id. Ties go to the lowest id as
    ``np.argmax`` of the whole row: the lowest local index, then the lowest rank (ranks hold
    the vocabulary in order, ``tp_plan.vocab_range``). Ids are sent as float32, exact below
    2**24."""
    local = np.asarray(logits.asnumpy(), np.float64).reshape(-1)
    i = int(np.argmax(local))
    mine = ms.Tensor(np.array([[local[i], start + i]], np.float32))
    tops = comm.all_gather(mine, group, 0).asnumpy()
    return int(tops[int(np.argmax(tops[:, 0])), 1])


def _graph(fn):
    """``fn(x, tables, *ws)`` compiled with the tables and weights as separate graph inputs."""
    def run(x, *args):
        return fn(x, args[:NUM_TABLES], *args[NUM_TABLES:])
    return ms.jit(run)


def _graph_mlp(template):
    """``template.apply(x, *ws)`` compiled, the weights as graph inputs."""
    def run(x, *ws):
        return template.apply(x, *ws)
    return ms.jit(run)


class _Boundaries:
    """Where a layer's tokens change hands between the tp ranks (module docstring):
    ``gather`` (local rows -> every token), ``scatter`` (partial sums of every token -> this
    rank's rows, summed), ``split`` (every token, replicated -> this rank's rows),
    ``gather_replicated`` (local rows -> every token, the backward keeping the local rows) and
    ``gather_ids`` (this rank's routed ids, numpy -> the micro-batch's)."""

    def __init__(self, gather, scatter, split, gather_replicated, gather_ids):
        self.gather, self.scatter, self.split = gather, scatter, split
        self.gather_replicated, self.gather_ids = gather_replicated, gather_ids


def _same(x):
    return x


def _int32(ids: np.ndarray) -> np.ndarray:
    return ids.astype(np.int32)


class TensorParallelRunner(RunnerDefaults):
    """Runs the embedding, decoder and head of a tensor-parallel ``GPTModel`` (the
    ``distributed.model_runner.ModelRunner`` interface; ``vocab_parallel``: the output layer
    is split, so :meth:`greedy_next` and :meth:`next_logits` combine the ranks); ``mode``
    "none" or "layer" (module docstring)."""

    def __init__(self, model, comm: GroupCommunicator, group: str, partial: set,
                 mode: str = "none"):
        if mode == "model":
            raise ValueError("training.jit: model compiles the whole forward as one graph, which "
                             "cannot hold the tensor-parallel collectives; use layer or none")
        self.mode = effective_mode(mode, model)
        self._model = model
        self.comm, self.group = comm, group
        self.tp = len(comm.ranks(group))
        self.index = comm.mesh.local_rank(group, comm.rank)
        self.vocab_start = vocab_range(model.cfg.vocab_size, self.tp, self.index)[0]
        self.partial = frozenset(partial)
        self.gather = GatherSequence(comm, group)
        self.scatter = ScatterSequence(comm, group)
        self.gather_replicated = GatherReplicated(comm, group)
        self.split = SplitSequence(comm, group)
        self.grad_sum = CopyToGroup(comm, group)
        self.reduce = ReduceFromGroup(comm, group)
        # training: sequence parallel (each rank its T/tp rows); the key/value-cached decode:
        # every rank holds every new token (a row-parallel output is summed over tp)
        self._sequence = _Boundaries(self.gather, self.scatter, self.split,
                                     self.gather_replicated, self._gather_ids)
        self._replicated = _Boundaries(_same, self.reduce, _same, _same, _int32)
        # FSDP over dp on top (hold_rows): the parameters stored as dp rows, and the whole
        # slices of the unit being run (name -> tensor)
        self._rows, self._gather_rows, self._inside = frozenset(), None, {}
        layers = model.decoder_layers()
        self._steps = [functools.partial(self._layer, layer) for layer in layers]
        dense = [layer.mlp for layer in layers if layer.dense_mlp]
        # one graph per kind: every layer has the same structure, only the weights differ
        self._attention = (_graph(layers[0].self_attention.apply) if self.mode == "layer"
                           else None)
        self._mlp = (_graph_mlp(dense[0]) if self.mode == "layer" and dense else None)

    def hold_rows(self, names, gather, unit) -> None:
        """Fully sharded data parallel on top of the tp shards (``distributed/fsdp.py``
        ``apply_fsdp``): the parameters ``names`` now hold only their dp rows of this rank's
        tp slice. ``gather`` (``fsdp.GatherShard``: all-gather over dp, the gradient
        reduce-scattered back) makes a slice whole where the forward reads it (:meth:`_w`),
        and ``unit(layer, fn)`` (``fsdp.layer_unit``: an ``fsdp.FSDPUnit``) wraps each decoder
        layer as one recomputed unit whose weights are gathered inside it, so whole slices exist for one
        layer at a time, forward and backward (the embedding and the head gather theirs
        outside a unit). Generation reads the same weights, so it is a collective of the dp
        group too (every rank decodes, trainer/progress.py)."""
        self._rows = frozenset(names)
        self._gather_rows = gather
        self._steps = [unit(layer, self._unit_fn(layer)) for layer in self._model.decoder_layers()]

    def _unit_fn(self, layer):
        """``fn(h, *tables, *whole weights)`` of ``layer``'s tp step, the unit's function: the
        weights it receives (``layer.weights()``'s order, gathered by the unit) are what
        :meth:`_w` reads while it runs (and again when the backward recomputes it)."""
        names = [w.name for w in layer.weights()]

        def run(h, *args):
            self._inside = dict(zip(names, args[NUM_TABLES:]))
            try:
                h, max_logits, aux = self._layer(layer, h, args[:NUM_TABLES])
            finally:
                self._inside = {}
            return (h, max_logits) if aux is None else (h, max_logits, aux)
        return run

    def _read(self, param):
        """A weight whole on this rank: its tp slice, gathered over dp when it holds rows."""
        w = self._inside.get(param.name)
        if w is None and param.name in self._rows:
            w = self._gather_rows(param)
        return param if w is None else w

    def _w(self, param):
        """A weight as the training forward uses it (:meth:`_read`), through the tp gradient
        sum when it is partial."""
        w = self._read(param)
        return self.grad_sum(w) if param.name in self.partial else w

    def embed(self, input_ids, io: _Boundaries = None):
        """This rank's ``[T/tp, H]`` tokens of the embedded micro-batch (``io``: the decode's
        boundaries, every token)."""
        m = self._model
        table = self._w(m.embedding.word_embeddings.weight)
        return (io or self._sequence).scatter(vocab_parallel_embed(
            input_ids.reshape(-1), table, self.vocab_start, m.precision))

    def _attend(self, attn, x, tables, ws):
        """A layer's attention on its local heads: the compiled graph under ``layer``."""
        if self._attention is not None:
            return self._attention(x, *tables, *ws)
        return attn.apply(x, tables, *ws)

    @property
    def vocab_parallel(self) -> bool:
        return True

    def layers(self, h, tables, indices=None):
        """(h [T/tp, H] after the last layer, summed aux loss or None, [max_logits [N/tp]]);
        only the decoder layers ``indices`` (in order) when given."""
        return run_layer_steps(self._steps, h, tables, indices)

    def _layer(self, layer, h, tables, io: _Boundaries = None, attention=None):
        """(h, max_logits, aux or None) after ``layer``: training's sequence-parallel step, or
        with the decode's ``io`` and cached ``attention`` (:meth:`decode_layer`)."""
        io, attention = io or self._sequence, attention or self._attend
        n1, n2, attn = layer.input_layernorm, layer.pre_mlp_layernorm, layer.self_attention
        x = rms_norm(h, self._w(n1.weight), n1.eps, n1.mean_column)
        out, max_logits = attention(attn, io.gather(x), tables,
                                    [self._w(w) for w in attn.weights()])
        h = h + io.scatter(out)
        x = rms_norm(h, self._w(n2.weight), n2.eps, n2.mean_column)
        if layer.dense_mlp:
            mlp = self._mlp or layer.mlp.apply
            ws = [self._w(w) for w in layer.mlp.weights()]
            return h + io.scatter(mlp(io.gather(x), *ws)), max_logits, None
        b, _, s, _ = tables[0].shape   # cos_q: this rank's rows (the mask may be whole)
        moe = layer.mlp
        if moe.expert_parallel > 1:
            out, aux = self._routed_split(moe, x, b, io)
            h = h + out.astype(x.dtype)
        else:
            x_all = io.gather_replicated(x)
            out, aux = moe.routed_apply(x_all, b, self._w(moe.router.weight),
                                        self._w(moe.experts.weight1),
                                        self._w(moe.experts.weight2))
            h = h + io.split(out.astype(x.dtype))
        if moe.shared_experts is not None:
            mlp = self._mlp or moe.shared_experts.apply
            ws = [self._w(w) for w in moe.shared_experts.weights()]
            h = h + io.scatter(mlp(io.gather(x), *ws))
        return h, max_logits, aux

    def _gather_ids(self, ids: np.ndarray) -> np.ndarray:
        """The micro-batch's routed ids from this rank's tokens' (all-gathered over tp)."""
        ids = self.comm.all_gather(ids.astype(np.float32), self.group, 0)
        return np.rint(ids).astype(np.int32)

    def _routed_split(self, moe, x, b: int, io: _Boundaries):
        """(routed output of this rank's tokens [T/tp, H], the micro-batch's aux loss) with
        the routed experts split over ep (module docstring, tensor x expert parallel)."""
        # this rank's tokens: a tp share; under tp x ep x FSDP its dp rows gathered (_read)
        w_router = self.grad_sum(self._read(moe.router.weight))
        scores, idx, gate_w = moe.route(x, w_router)
        out, _, dropped = moe.dispatch(x, gate_w, idx, self._w(moe.experts.weight1),
                                       self._w(moe.experts.weight2))
        # the micro-batch's routing on every tp rank, as one process records it
        ids = io.gather_ids(idx.asnumpy())
        counts = np.bincount(ids.reshape(-1), minlength=moe.num_experts).astype(np.float32)
        aux = moe.sequence_aux(io.gather_replicated(scores), ms.Tensor(ids), b)
        moe.record(ms.Tensor(ids), ms.Tensor(counts), dropped, aux)
        return out, aux

    # -- the key/value-cached decode (models/kv_cache.py): every rank holds every new token --
    def decode_embed(self, input_ids):
        return self.embed(input_ids, self._replicated)

    def decode_layer(self, layer, h, tables, attention):
        """h after ``layer`` on the new tokens: the local heads attend to this rank's cache,
        the row-parallel outputs summed over tp."""
        return self._layer(layer, h, tables, self._replicated, attention)[0]

    def decode_logits(self, h_row) -> np.ndarray:
        """The whole logits ``[V]`` of ``h_row``: its vocabulary shards gathered over tp."""
        shard = self._logits_shard(h_row, 0, self._replicated)
        return self.comm.all_gather(shard, self.group, 1).asnumpy().reshape(-1)

    def decode_greedy(self, h_row) -> int:
        """The greedy id of ``h_row``: each rank's top combined (:func:`vocab_parallel_argmax`)."""
        return vocab_parallel_argmax(self._logits_shard(h_row, 0, self._replicated),
                                     self.vocab_start, self.comm, self.group)

    def head(self, h, labels, loss_mask, w_norm=None):
        """(loss_sum, n_tokens) of the micro-batch (the same on every tp rank): final norm on
        the local tokens (its gain ``w_norm``: an MTP depth's, :meth:`mtp_head`; default the
        decoder's), local-vocabulary logits of all tokens, vocabulary-parallel CE."""
        m = self._model
        final_norm, w_out = m.output_weights()
        w_norm = final_norm if w_norm is None else w_norm
        norm = m.decoder.final_layernorm
        x = self.gather(rms_norm(h, self._w(w_norm), norm.eps, norm.mean_column))
        logits = linear(x, self._w(w_out), m.precision).astype(ms.float32)
        if m.readout_multiplier is not None:
            logits = logits * m.readout_multiplier
        return vocab_parallel_token_losses(logits, labels, loss_mask, self.vocab_start,
                                           self.comm, self.reduce, self.group)

    # -- multi-token prediction (models/mtp.py): a depth is a decoder layer's step ---------------
    def mtp_depth(self, depth, h, emb, tables) -> tuple:
        """(h^k, max_logits of the local heads, aux or None) of one MTP depth on this rank's
        ``T/tp`` rows: the norms and ``eh_proj`` (replicated, a partial gradient) on the local
        rows, then the depth's transformer layer cut as a decoder layer (:meth:`_layer`)."""
        x = depth.project(h, emb, self._w(depth.enorm.weight), self._w(depth.hnorm.weight),
                          self._w(depth.eh_proj.weight))
        return self._layer(depth.transformer_layer, x, tables)

    def mtp_head(self, h, labels, loss_mask, w_norm) -> tuple:
        """A depth's (loss_sum, n_tokens): :meth:`head` with its final norm gain."""
        return self.head(h, labels, loss_mask, w_norm)

    def greedy_next(self, input_ids) -> int:
        """The greedy next id after ``input_ids`` [1, S], the same on every tp rank (a
        collective: every rank of the group calls it with the same ids; the tops of
        :meth:`last_logits_shard`, combined by :func:`vocab_parallel_argmax`)."""
        return vocab_parallel_argmax(self.last_logits_shard(input_ids), self.vocab_start,
                                     self.comm, self.group)

    def next_logits(self, input_ids) -> np.ndarray:
        """The whole logits ``[V]`` of the last position after ``input_ids`` [1, S], the same
        on every tp rank (a collective, :meth:`position_logits`), for sampling
        (models/generation.py)."""
        h, s = self._decode_hidden(input_ids)
        return self.position_logits(h, s - 1)

    @property
    def sequence_shards(self) -> int:
        return self.tp

    def padded_length(self, seq: int) -> int:
        """``seq_length`` (or past it a multiple of ``tp``, the sequence-parallel split): one
        shape for every decoded token, so ``training.jit: layer`` compiles its graphs once."""
        length = max(int(seq), int(self._model.cfg.seq_length))
        return length + (-length) % self.tp

    def position_logits(self, h, position: int) -> np.ndarray:
        """The whole logits ``[V]`` of token ``position`` of the sequence-parallel ``h``
        (this rank's ``T/tp`` rows), the same on every tp rank (a collective): each rank's
        :meth:`position_logits_shard` all-gathered over the group in vocabulary order
        (``tp_plan.vocab_range``), that one position only."""
        shard = self.position_logits_shard(h, position)
        return self.comm.all_gather(shard, self.group, 1).asnumpy().reshape(-1)

    def position_logits_shard(self, h, position: int):
        """This rank's float32 logits ``[1, V/tp]`` of token ``position`` of ``h``: the
        final-normed tokens gathered over the group, that position's row against this rank's
        output rows (a collective)."""
        return self._logits_shard(h, position, self._sequence)

    def _logits_shard(self, h, position: int, io: _Boundaries):
        m = self._model
        w_norm, w_out = m.output_weights()
        norm = m.decoder.final_layernorm
        x = io.gather(rms_norm(h, self._read(w_norm), norm.eps,
                               norm.mean_column))[position:position + 1]
        logits = linear(x, self._read(w_out), m.precision).astype(ms.float32)
        if m.readout_multiplier is not None:
            logits = logits * m.readout_multiplier
        return logits

    def _decode_hidden(self, input_ids):
        """(h after the last layer, S) of a full forward of ``input_ids`` [1, S] (generation
        past the key/value cache's ``seq_length``), padded at the end to
        :meth:`padded_length`; causal attention keeps the padding from position ``S - 1``."""
        m = self._model
        s = int(input_ids.shape[1])
        length = self.padded_length(s)
        ids = input_ids if length == s else ops.cat(
            [input_ids, ops.zeros((1, length - s), input_ids.dtype)], 1)
        h, _, _ = self.layers(self.embed(ids), m.static_tables(1, length))
        return h, s

    def last_logits_shard(self, input_ids):
        """This rank's float32 logits ``[1, V/tp]`` of the last position of ``input_ids``."""
        h, s = self._decode_hidden(input_ids)
        return self.position_logits_shard(h, s - 1)

