"""Decoder-only language model shared by ``gpt``, ``qwen3`` and ``deepseek_v3``.

Pre-norm layers: h = h + attn(input_layernorm(h)); h = h + mlp(pre_mlp_layernorm(h)).
``model(input_ids, labels, loss_mask) -> (loss_sum, n_tokens, aux_loss)`` (float32 scalars):
loss_sum = sum_t loss_mask_t * CE(logits_t, labels_t) (nats), n_tokens = sum(loss_mask),
aux_loss = the MoE sequence aux losses, already multiplied by ``moe_aux_loss_coeff`` (0 when
there is none). Positions whose mask is 0 may carry any label (negatives are read as 0).

muP (``mup_width_mult`` w, Megatron / Tensor Programs V): logits = (h W_out^T) * (1/w), the
readout multiplier, so the output layer keeps the base init and the base lr (Adam) while its
effective weight W_out / w has std ~ 1/fan_in. w None or 1.0: no multiply at all.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor, mint, nn, ops

from ..distributed.fsdp_layout import row_block
from ..distributed.model_runner import ModelRunner
from ..distributed.shard_spec import collect_shard_specs
from . import compiled, qk_clip, yarn
from .attention import MLASelfAttention, SelfAttention
from .blockwise_attention import attention_function
from ..core.documents import Documents
from .documents import document_tables
from .layers import Embedding, Linear, attention_tables, embed, linear, rms_norm
from .mlp import MLP
from .moe import MoE, MoESpec
from .router import expert_bias_step
from .mtp import MTPLayer, MultiTokenPrediction
from .precision import Precision
from .transformer_config import GPTTransformerConfig
from .transformer_layer import Decoder, TransformerLayer


def token_losses(logits, labels, loss_mask):
    """(sum of loss_mask * CE, sum of loss_mask) for float32 logits [T, V], labels/mask [T]."""
    logp = ops.log_softmax(logits, -1)
    safe = ops.where(labels >= 0, labels, 0).astype(ms.int64).reshape(-1, 1)
    nll = -mint.gather(logp, 1, safe).reshape(-1)
    mask = loss_mask.astype(ms.float32)
    return (nll * mask).sum(), mask.sum()


class GPTModel(nn.Cell):
    """Embedding -> decoder layers -> final RMSNorm -> output layer, with optimizer metadata."""

    def __init__(self, cfg, precision: Precision, transformer_config: GPTTransformerConfig,
                 mup_width_mult: Optional[float] = None, documents: Optional[Documents] = None):
        super().__init__()
        self.cfg = cfg
        # document masking (models/documents.py): tables from each batch's ids, or None
        self.documents = documents
        self.mup_width_mult = mup_width_mult
        # None (not 1.0) when there is nothing to scale, so the plain model runs no extra op
        self.readout_multiplier = (None if mup_width_mult is None or mup_width_mult == 1.0
                                   else 1.0 / float(mup_width_mult))
        self.precision = precision
        self._tc = transformer_config
        h = cfg.hidden_size
        self.embedding = Embedding(cfg.vocab_size, h, precision)
        self.decoder = Decoder([self._make_layer(i) for i in range(cfg.num_layers)], h,
                               cfg.norm_epsilon, precision)
        self.output_layer = None if cfg.tie_word_embeddings else Linear(h, cfg.vocab_size, precision)
        # multi-token prediction depths (training forward only); their attention max logits
        # follow the decoder layers' rows
        self.mtp = None if not cfg.num_nextn_predict_layers else MultiTokenPrediction(
            [MTPLayer(self._make_layer(cfg.num_layers + k), h, cfg.norm_epsilon, precision)
             for k in range(cfg.num_nextn_predict_layers)], cfg.mtp_loss_scaling_factor)
        self._num_tracked_layers = cfg.num_layers + cfg.num_nextn_predict_layers
        self._mtp_losses: List[Tensor] = []
        mla = transformer_config.multi_latent_attention
        self._rope_dim = cfg.qk_rope_head_dim if mla else transformer_config.kv_channels
        # key heads of the rotary tables: MLA shares one rope key across heads
        self._rope_key_heads = 1 if mla else transformer_config.num_query_groups
        # (batch, seq) -> tables, and "documents": the last batch's (tables_for)
        self._tables: Dict[object, tuple] = {}
        # attention heads (and rotary key heads) this process runs: all of them, or the local
        # ones under tensor parallelism (set_parallel_runner)
        self._local_heads = cfg.num_attention_heads
        # name -> ShardSpec of the parameters stored as shards by tensor parallel or FSDP
        # (set_shard_specs); expert-parallel Cells report their own (shard_specs())
        self._shard_specs: Dict[str, object] = {}
        # name -> (start, stop, rows of the slice) of parameters stored as dp rows of their
        # tp slice (tp x FSDP, set_row_shards)
        self._row_shards: Dict[str, tuple] = {}
        self._max_logits: List[Optional[Tensor]] = [None] * self._num_tracked_layers
        # context parallel: this rank's tokens of each sequence (models/cp_model.py), or None
        self._chunks = None
        self._runner: ModelRunner = compiled.Runner(self, "none")
        self._eager_runner: Optional[ModelRunner] = None   # run_layers(..., eager=True)

    # ----------------------------------------------------------------- construction
    def _make_layer(self, i: int) -> TransformerLayer:
        cfg, p = self.cfg, self.precision
        if self._tc.multi_latent_attention:
            attn = MLASelfAttention(cfg.hidden_size, cfg.num_attention_heads, cfg.q_lora_rank,
                                    cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                                    cfg.v_head_dim, cfg.norm_epsilon, p)
        else:
            attn = SelfAttention(cfg.hidden_size, cfg.num_attention_heads,
                                 self._tc.num_query_groups, p, self._tc.kv_channels,
                                 cfg.resolved_qk_layernorm(), cfg.norm_epsilon)
        attn.softmax_scale *= yarn.softmax_scale_multiplier_for(cfg)
        attn.core_attention = attention_function(
            cfg.use_flash_attention, ms.get_context("device_target"),
            documents=self.documents is not None and self.documents.reset_mask)
        moe = cfg.model_type == "deepseek_v3" and i >= cfg.first_k_dense_replace
        if moe:
            mlp = MoE(cfg.hidden_size, MoESpec.from_model_config(cfg), p)
        else:
            mlp = MLP(cfg.hidden_size, self._tc.ffn_hidden_size, p)
        return TransformerLayer(attn, mlp, cfg.hidden_size, cfg.norm_epsilon, p, dense_mlp=not moe)

    def set_jit(self, mode: str) -> None:
        """``training.jit``: "none" (PyNative), "layer" (each layer's pure part compiled with
        ``mindspore.jit``) or "model" (the whole forward; dense models only)."""
        if mode == "model" and self.mtp is not None:
            raise ValueError("training.jit: model does not cover multi-token prediction "
                             "(num_nextn_predict_layers > 0); use layer or none")
        self._runner = compiled.Runner(self, mode)

    def set_recompute(self, layers, modules=None) -> None:
        """Recompute these decoder layers (and the MTP depths' layers when ``layers`` covers
        every decoder layer) in the backward, and the parts ``modules`` = ``{layer: parts}``
        of others (``core.recompute``, ``mode: select``); PyNative layers only."""
        modules = modules or {}
        if self._runner.mode != "none" and (layers or modules):
            raise ValueError(f"recompute runs the layers as Cells: it needs training.jit: none, "
                             f"got {self._runner.mode!r}")
        for i in layers:
            self.decoder.layers[i].recompute()
        for i, parts in modules.items():
            self.decoder.layers[i].recompute_parts(parts)
        if self.mtp is not None and len(layers) == self.cfg.num_layers:
            for depth in self.mtp.layers:
                depth.transformer_layer.recompute()

    @property
    def jit_mode(self) -> str:
        return self._runner.mode

    def set_runner(self, runner: ModelRunner) -> None:
        """Run the forward through ``runner`` (``distributed.model_runner.ModelRunner``);
        fully sharded data parallel installs its own (``distributed/fsdp.py``)."""
        self._runner = runner

    @property
    def runner(self) -> ModelRunner:
        """The runner the forward goes through (tp x FSDP tells the tp one about the rows,
        ``distributed/fsdp.py``)."""
        return self._runner

    def decoder_layers(self) -> list:
        """The decoder layers in order: index i is layer i (what the runners run)."""
        return list(self.decoder.layers)

    # ----------------------------------------------------------------- parallel layout
    # The model owns its shard plan: the run's layout (distributed/setup.py) asks the model to
    # cut itself, so distributed/ never imports a model.
    def apply_tensor_parallel(self, comm):
        """Keep this rank's tensor-parallel (+sequence-parallel) slices over ``comm``'s ``tp``
        group (models/tp_model.py); returns the model."""
        from .tp_model import apply_tensor_parallel
        return apply_tensor_parallel(self, comm)

    def apply_expert_parallel(self, comm) -> Dict[str, object]:
        """Keep this rank's routed experts over ``comm``'s ``ep`` group
        (models/expert_parallel.py); returns their specs (name -> ShardSpec)."""
        from .expert_parallel import shard_experts
        return shard_experts(self, comm)

    def apply_context_parallel(self, comm, method: str, ulysses_degree: int = 1):
        """Run on this rank's chunks of every sequence with ``method``'s attention over
        ``comm``'s ``cp`` group (models/cp_model.py); returns the model."""
        from .cp_model import apply_context_parallel
        return apply_context_parallel(self, comm, method, ulysses_degree)

    def attention_blocks(self) -> list:
        """Every attention block: the decoder layers', then the MTP depths'."""
        layers = self.decoder_layers()
        if self.mtp is not None:
            layers += [depth.transformer_layer for depth in self.mtp.layers]
        return [layer.self_attention for layer in layers]

    def set_sequence_chunks(self, chunks) -> None:
        """Keep ``chunks``' tokens of every sequence (``cp_model.SequenceChunks``)."""
        self._chunks = chunks
        self._tables = {}

    def whole_sequences(self):
        """Context: this rank runs whole sequences (``cp_model.whole_sequences``)."""
        from .cp_model import whole_sequences
        return whole_sequences(self, self._chunks)

    def _local(self, x):
        """This rank's tokens of ``x`` [B, S] (all of them without context parallel)."""
        return x if self._chunks is None else self._chunks.take(x)

    def set_shard_specs(self, specs) -> None:
        """Record the layouts of parameters whose data was replaced by their shards."""
        self._shard_specs.update(specs)

    def set_parallel_runner(self, runner, shard_specs: Dict[str, object], local_heads: int,
                            local_key_heads: int) -> None:
        """Run through a model-parallel runner (``models.tp_model.apply_tensor_parallel``):
        its parameters are already this rank's slices, described by ``shard_specs``."""
        self.set_runner(runner)
        self.set_shard_specs(shard_specs)
        self._local_heads = local_heads
        self._rope_key_heads = local_key_heads
        self._tables = {}

    def static_tables(self, batch: int, seq_len: int) -> tuple:
        """``layers.attention_tables`` of a (batch, seq_len), cached."""
        key = (batch, seq_len)
        if key not in self._tables:
            tables = self.position_tables(batch, seq_len)
            # context parallel: the rows of this rank's global positions
            self._tables[key] = tables if self._chunks is None else self._chunks.tables(tables)
        return self._tables[key]

    def tables_for(self, input_ids) -> tuple:
        """The attention tables of a forward of ``input_ids`` [B, S]: :meth:`static_tables`,
        or under document masking those of this batch's documents (``models/documents.py``;
        context parallel: the cos/sin rows of this rank's positions, the whole mask)."""
        b, s = input_ids.shape
        if self.documents is None:
            return self.static_tables(b, s)
        ids = input_ids.asnumpy()
        key = (ids.shape, ids.tobytes())
        # the last batch's, kept: the MTP depths and every virtual stage of a pipeline read
        # the tables of the batch the decoder layers just read
        last = self._tables.get("documents")
        if last is not None and last[0] == key:
            return last[1]
        tables = document_tables(ids, self.documents, self._local_heads,
                                 self._rope_key_heads, self._rope_dim, self.cfg.rope_theta,
                                 self.precision, yarn.rope_tables_for(self.cfg, s,
                                                                      self._rope_dim))
        if self._chunks is not None:
            tables = self._chunks.tables(tables, whole_mask=True)
        self._tables["documents"] = (key, tables)
        return tables

    def position_tables(self, batch: int, seq_len: int, start: int = 0) -> tuple:
        """``layers.attention_tables`` of positions start .. start + seq_len - 1 (uncached)."""
        return attention_tables(batch, seq_len, self._local_heads,
                                self._rope_key_heads, self._rope_dim, self.cfg.rope_theta,
                                self.precision, start,
                                rope=yarn.rope_tables_for(self.cfg, start + seq_len,
                                                          self._rope_dim))

    # ----------------------------------------------------------------- forward
    def output_weights(self) -> tuple:
        """(final norm gain, output matrix) -- the embedding table when tied."""
        out = (self.embedding.word_embeddings.weight if self.output_layer is None
               else self.output_layer.weight)
        return (self.decoder.final_layernorm.weight, out)

    def readout(self, h, w_norm, w_out):
        """Float32 logits [T, V] of the last hidden states h [T, H] (final norm, output layer,
        muP readout multiplier)."""
        norm = self.decoder.final_layernorm
        logits = linear(rms_norm(h, w_norm, norm.eps, norm.mean_column), w_out,
                        self.precision).astype(ms.float32)
        if self.readout_multiplier is not None:
            logits = logits * self.readout_multiplier
        return logits

    def embed_tokens(self, input_ids, table):
        """[B*S, H] rows of the embedding table."""
        return embed(input_ids.reshape(-1), table, self.precision)

    def record_max_logits(self, per_layer, start: int = 0) -> None:
        """Fold one forward's per-layer max logits (each [N]) into the running max (rows from
        ``start``)."""
        for i, new in enumerate(per_layer, start):
            old = self._max_logits[i]
            self._max_logits[i] = new if old is None else ops.maximum(old, new)

    def embed_ids(self, input_ids):
        """The embedded tokens [B*S, H] of ``input_ids`` [B, S] through the runner: this rank's
        tokens (``_local``; a pipeline stage's first layers read them)."""
        return self._runner.embed(self._local(input_ids))

    def hidden_shape(self, batch: int, seq: int) -> tuple:
        """The shape of the hidden states ``embed_ids`` / ``run_layers`` hold on this rank for
        ``batch`` x ``seq`` tokens (what a pipeline stage sends): ``[B*S / tp, H]`` under
        sequence parallelism (the runner's ``sequence_shards``), of this rank's ``S / cp``
        tokens per sequence under context parallel (cp x pp)."""
        local = seq if self._chunks is None else seq // self._chunks.cp
        return (batch * local // self._runner.sequence_shards, int(self.cfg.hidden_size))

    def padded_length(self, seq: int) -> int:
        """The length a decoding forward of ``seq`` tokens runs at (the runner's: ``seq``, or
        under tensor parallelism ``seq_length`` rounded up to the sequence split)."""
        return self._runner.padded_length(seq)

    def position_logits(self, h, position: int) -> np.ndarray:
        """The whole float32 logits ``[V]`` of token ``position`` of the last hidden states
        ``h`` (``run_layers``' output; a collective of the tp group under tensor
        parallelism), what a pipeline's last stage decodes from."""
        return self._runner.position_logits(h, position)

    def _last_hidden(self, input_ids):
        """(h [B*S, H] before the final norm, summed aux loss or None); records max logits.
        Under context parallel h holds this rank's tokens only (``_local``)."""
        h, aux, max_logits = self._runner.layers(self.embed_ids(input_ids),
                                                 self.tables_for(input_ids))
        self.record_max_logits(max_logits)
        return h, aux

    def _whole_model_only(self, what: str) -> None:
        if self._chunks is not None:
            raise NotImplementedError(f"{what} of a context-parallel model (each rank holds "
                                      f"its own chunks of the sequence); the training forward "
                                      f"model(ids, labels, mask) is")
        if self._shard_specs and not self.gathers_weights:
            raise NotImplementedError(f"{what} of a tensor-parallel model (each rank holds "
                                      f"its own tokens and vocabulary rows); the training "
                                      f"forward model(ids, labels, mask) is")

    @property
    def gathers_weights(self) -> bool:
        """Whether this rank stores shards of weights that :meth:`full_weights` gathers
        (fully sharded data parallel, distributed/fsdp.py): a collective of the group."""
        return self._runner.gathers_weights

    def full_weights(self, weights) -> tuple:
        """``weights`` whole: gathered from their shards under :attr:`gathers_weights`, else
        as they are (the runner's ``full_weights``)."""
        return self._runner.full_weights(weights)

    def hidden_states(self, input_ids):
        """Final-normed hidden states [B, S, H] and the summed aux loss (Tensor or None)."""
        self._whole_model_only("hidden_states")
        h, aux = self._last_hidden(input_ids)
        norm = self.decoder.final_layernorm
        w_norm, = self.full_weights((norm.weight,))
        h = rms_norm(h, w_norm, norm.eps, norm.mean_column)
        return h.reshape(input_ids.shape + (h.shape[-1],)), aux

    def logits(self, input_ids):
        """Float32 logits [B, S, vocab_size] (times 1/mup_width_mult under muP)."""
        self._whole_model_only("logits")
        h, _ = self._last_hidden(input_ids)
        return self.readout(h, *self.full_weights(self.output_weights())).reshape(
            input_ids.shape + (-1,))

    @property
    def vocab_parallel(self) -> bool:
        """Whether the output layer is split over tensor-parallel ranks: no rank has whole
        logits (:meth:`logits` refuses), :meth:`greedy_next` combines the ranks' tops."""
        return self._runner.vocab_parallel

    def greedy_next(self, input_ids) -> int:
        """The greedy next id after ``input_ids`` [1, S] (the lowest id on ties): under tensor
        parallelism a collective of the tp group (``TensorParallelRunner.greedy_next``), else
        the argmax of :meth:`logits`' last position."""
        if self.vocab_parallel:
            return self._runner.greedy_next(input_ids)
        return int(np.argmax(self.logits(input_ids).asnumpy()[0, -1]))

    def next_logits(self, input_ids) -> np.ndarray:
        """The whole float32 logits ``[V]`` of the last position after ``input_ids`` [1, S]:
        under tensor parallelism a collective of the tp group that gathers that position's
        vocabulary shards (``TensorParallelRunner.next_logits``), else :meth:`logits`'."""
        if self.vocab_parallel:
            return self._runner.next_logits(input_ids)
        return self.logits(input_ids).asnumpy()[0, -1]

    def cached_decoder(self, max_length: int):
        """A key/value-cached decoder of this model (models/kv_cache.py), through its runner:
        under a parallel layout a collective of the group."""
        from .kv_cache import CachedDecoder
        return CachedDecoder(self, max_length)

    def head(self, h, labels, loss_mask, w_norm, w_out):
        """(loss_sum, n_tokens) of the last hidden states h [T, H] and labels / mask [T]."""
        return token_losses(self.readout(h, w_norm, w_out), labels, loss_mask)

    def apply(self, input_ids, labels, loss_mask, tables, *ws):
        """The whole dense forward as a pure function of ``all_weights()``:
        (loss_sum, n_tokens, max_logits [L, N]) (what ``training.jit: model`` compiles)."""
        h = self.embed_tokens(input_ids, ws[0])
        start, max_logits = 1, []
        for layer in self.decoder.layers:   # traced into training.jit: model's graph as it was
            n = len(layer.weights())
            h, ml = layer.apply(h, tables, *ws[start:start + n])
            max_logits.append(ml)
            start += n
        loss_sum, n_tokens = self.head(h, labels.reshape(-1), loss_mask.reshape(-1), *ws[start:])
        return loss_sum, n_tokens, ops.stack(max_logits, 0)

    def all_weights(self) -> tuple:
        """Every weight of a dense model, in ``apply``'s order."""
        ws = (self.embedding.word_embeddings.weight,)
        for layer in self.decoder_layers():
            ws = ws + layer.weights()
        return ws + self.output_weights()

    def construct(self, input_ids, labels, loss_mask):
        if self._runner.mode == "model":
            loss_sum, n_tokens, max_logits = self._runner.model(input_ids, labels, loss_mask)
            self.record_max_logits(ops.unstack(max_logits, 0))
            return loss_sum, n_tokens, mint.zeros((), dtype=ms.float32)
        h, aux = self._last_hidden(input_ids)
        return self.finish(h, aux, input_ids, labels, loss_mask)

    def run_layers(self, h, tables, indices, eager: bool = False) -> tuple:
        """Decoder layers ``indices`` (consecutive, ascending) on h [B*S, H]: (h, summed aux
        loss or None); records their max logits in their rows (a pipeline stage's part).
        ``eager``: in PyNative whatever ``training.jit`` is (the same values): for calls whose
        shapes change from call to call, such as generation's growing window, where a compiled
        layer would compile again for every new length."""
        indices = list(indices)
        runner = self._runner
        # only the model's own runner has a PyNative twin (a parallel runner's forward is its own)
        if eager and runner.mode != "none" and isinstance(runner, compiled.Runner):
            if self._eager_runner is None:
                self._eager_runner = compiled.Runner(self, "none")
            runner = self._eager_runner
        h, aux, max_logits = runner.layers(h, tables, indices)
        if indices:
            self.record_max_logits(max_logits, start=indices[0])
        return h, aux

    def finish(self, h, aux, input_ids, labels, loss_mask) -> tuple:
        """(loss_sum, n_tokens, aux) of the last hidden states h [B*S, H] (before the final
        norm) and the decoder's summed aux loss (or None): head, loss and the MTP depths."""
        loss_sum, n_tokens = self._runner.head(h, self._local(labels).reshape(-1),
                                               self._local(loss_mask).reshape(-1))
        aux = mint.zeros((), dtype=ms.float32) if aux is None else aux.astype(ms.float32)
        if self.mtp is not None:
            aux = aux + self.mtp_loss(h, input_ids, labels, loss_mask)
        return loss_sum, n_tokens, aux

    def mtp_loss(self, h, input_ids, labels, loss_mask):
        """The scaled MTP loss (plus the MTP layers' MoE aux loss) of the main model's last
        hidden states h [B*S, H]; records it (``pop_mtp_losses``) and the depths' max logits."""
        runner = self._runner
        loss, max_logits, aux = self.mtp(
            h, input_ids, labels, loss_mask, self.tables_for(input_ids), runner.embed,
            runner.mtp_head, None if self._chunks is None else self._chunks.take,
            runner.mtp_depth)
        self.record_max_logits(max_logits, start=self.cfg.num_layers)
        self._mtp_losses.append(ops.stop_gradient(loss))
        return loss if aux is None else loss + aux.astype(ms.float32)

    @contextlib.contextmanager
    def recomputing(self):
        """Within: a forward that repeats one already run (a pipeline stage's recompute for its
        backward) leaves the MoE statistics and the recorded MTP losses as they were."""
        moes = self.moe_layers()
        stats = {i: moe.stats_state() for i, moe in moes.items()}
        mtp = list(self._mtp_losses)
        try:
            yield
        finally:
            for i, moe in moes.items():
                moe.load_stats_state(stats[i])
            self._mtp_losses = mtp

    def pop_mtp_losses(self) -> List[float]:
        """The MTP losses of the forwards since the last call (empty without MTP)."""
        out = [float(x.asnumpy()) for x in self._mtp_losses]
        self._mtp_losses = []
        return out

    # ----------------------------------------------------------------- optimizer metadata
    def get_gpt_transformer_config(self) -> GPTTransformerConfig:
        return self._tc

    def is_legacy_model(self) -> bool:
        return False

    def reset_max_attention_logits(self) -> None:
        """Start a new running max (call once per optimizer step)."""
        self._max_logits = [None] * self._num_tracked_layers

    def max_attention_logits_tensor(self) -> Tensor:
        """Running max [num_layers (+ MTP depths), num_heads] float32 Tensor (-inf where nothing ran yet),
        e.g. for an all-reduce(MAX) across data-parallel ranks. Under tensor parallelism the
        columns are this rank's local heads (num_heads / tp)."""
        n = self._local_heads
        rows = [m if m is not None else Tensor(np.full((n,), -np.inf, np.float32))
                for m in self._max_logits]
        return ops.stack(rows, 0)

    def get_max_attention_logits(self) -> np.ndarray:
        """Per layer and head, max over batch and positions (causal-masked entries excluded)
        of q.k * softmax_scale since the last reset; numpy float32 [num_layers, num_heads]."""
        return self.max_attention_logits_tensor().asnumpy().astype(np.float32)

    def set_max_attention_logits(self, values) -> None:
        """Replace the running max (e.g. with the all-reduced values)."""
        arr = np.asarray(values.asnumpy() if isinstance(values, Tensor) else values, np.float32)
        self._max_logits = [Tensor(row.copy()) for row in arr]

    def qk_clip_layout(self) -> list:
        """Per-layer row layout for QK-Clip (see ``models.qk_clip``); [] for non-MLA models."""
        if not self._tc.multi_latent_attention:
            return []
        attns = [(f"decoder.layers.{i}.self_attention", layer.self_attention)
                 for i, layer in enumerate(self.decoder_layers())]
        attns += [(f"mtp.layers.{k}.transformer_layer.self_attention",
                   depth.transformer_layer.self_attention)
                  for k, depth in enumerate(self.mtp.layers if self.mtp is not None else ())]
        return [qk_clip.mla_layer_layout(i, prefix, a.q_param_attr, a.num_heads, a.dn, a.dr, a.dv)
                for i, (prefix, a) in enumerate(attns)]

    def apply_qk_clip_scaling(self, threshold, param_map=None):
        """gamma_h = min(1, tau/S_h); scale q_nope and k_nope rows by sqrt(gamma_h), q_rope rows by
        gamma_h in ``param_map`` (name -> Parameter/Tensor, e.g. fp32 masters; default the model's
        own parameters). Returns (num_clipped_heads, max_logit). No-op for non-MLA models."""
        tau = qk_clip.threshold_value(threshold)
        max_logits = self.get_max_attention_logits()
        max_logit = float(max_logits.max()) if max_logits.size else float("-inf")
        layout = self.qk_clip_layout()
        if not layout:
            return 0, max_logit
        if param_map is None:
            param_map = {p.name: p for p in self.get_parameters()}
        return qk_clip.apply_qk_clip(layout, max_logits, tau, param_map), max_logit

    def set_row_shards(self, specs, index: int) -> None:
        """Record that the parameters of ``specs`` (dim-0 ``ShardSpec``s of their tp slice,
        ``distributed/fsdp_layout.py``) now hold block ``index`` of their rows (tp x FSDP):
        checkpoints read :meth:`row_shards` on top of :meth:`shard_specs`."""
        for name, spec in specs.items():
            self._row_shards[name] = row_block(spec, index)

    def row_shards(self) -> Dict[str, tuple]:
        """name -> (start, stop, rows of the tp slice) of the parameters stored as dp rows of
        their tp slice (tp x FSDP; empty otherwise)."""
        return dict(self._row_shards)

    def shard_specs(self) -> dict:
        """Parameter name -> ShardSpec of the parameters split across ranks (expert / tensor
        parallel, FSDP; replicated ones absent): what the optimizer, the grad norm and
        checkpoints read layouts from."""
        return {**collect_shard_specs(self), **self._shard_specs}

    # ----------------------------------------------------------------- MoE statistics
    def moe_layers(self) -> Dict[int, MoE]:
        """Index -> MoE block: decoder layers 0..L-1, then the MTP depths' layers as L + k (the
        rows of ``get_max_attention_logits``), so that their loads are logged, summed over the
        data-parallel ranks and drive their expert bias like the decoder's."""
        layers = self.decoder_layers()
        if self.mtp is not None:
            layers += [depth.transformer_layer for depth in self.mtp.layers]
        return {i: l.mlp for i, l in enumerate(layers) if isinstance(l.mlp, MoE)}

    def get_tokens_per_expert(self) -> Dict[int, np.ndarray]:
        """Layer index -> float32 [E] token-slot counts since the last reset (zeros if none)."""
        out = {}
        for i, moe in self.moe_layers().items():
            t = moe.tokens_per_expert
            out[i] = np.zeros(moe.num_experts, np.float32) if t is None else t.asnumpy()
        return out

    def reset_moe_stats(self) -> None:
        for moe in self.moe_layers().values():
            moe.reset_stats()

    def update_expert_bias(self, reset: bool = True) -> None:
        """Aux-loss-free balancing: bias_e += rate * sign(mean(load) - load_e) per MoE layer,
        using the counts since the last reset; then resets the counts (unless ``reset=False``).
        No-op when ``moe_router_enable_expert_bias`` is False or no tokens were routed."""
        if self.cfg.model_type != "deepseek_v3" or not self.cfg.moe_router_enable_expert_bias:
            return
        rate = self.cfg.moe_router_bias_update_rate
        for i, load in self.get_tokens_per_expert().items():
            if load.sum() == 0:
                continue
            bias = self.moe_layers()[i].router.expert_bias
            if bias.size == 0:   # another pipeline stage's layer (distributed/pipeline_release.py)
                continue
            bias.set_data(Tensor(expert_bias_step(bias.asnumpy(), load, rate)))
        if reset:
            self.reset_moe_stats()
