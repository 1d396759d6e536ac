"""Decoder-only language model shared by ``gpt`` and ``deepseek_v3``.

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

from typing import Dict, List, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor, mint, nn, ops

from . import qk_clip
from .attention import MLASelfAttention, SelfAttention
from .layers import Embedding, Linear, RMSNorm, rotary_tables
from .mlp import MLP
from .moe import MoE, MoESpec
from .router import expert_bias_step
from .precision import Precision
from .transformer_config import GPTTransformerConfig


class TransformerLayer(nn.Cell):
    def __init__(self, attention: nn.Cell, mlp: nn.Cell, hidden_size: int, eps: float,
                 precision: Precision):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, eps, precision)
        self.self_attention = attention
        self.pre_mlp_layernorm = RMSNorm(hidden_size, eps, precision)
        self.mlp = mlp

    def construct(self, h, cos, sin, causal_mask):
        h = h + self.self_attention(self.input_layernorm(h), cos, sin, causal_mask)
        out = self.mlp(self.pre_mlp_layernorm(h))
        aux = None
        if isinstance(out, tuple):
            out, aux = out
        return h + out, aux


class Decoder(nn.Cell):
    def __init__(self, layers: List[TransformerLayer], hidden_size: int, eps: float,
                 precision: Precision):
        super().__init__()
        self.layers = nn.CellList(layers)
        self.final_layernorm = RMSNorm(hidden_size, eps, precision)


class GPTModel(nn.Cell):
    """Embedding -> decoder layers -> final RMSNorm -> output layer, with optimizer metadata."""

    def __init__(self, cfg, precision: Precision, transformer_config: GPTTransformerConfig,
                 mup_width_mult: Optional[float] = None):
        super().__init__()
        self.cfg = cfg
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
        rope_dim = cfg.qk_rope_head_dim if transformer_config.multi_latent_attention \
            else h // cfg.num_attention_heads
        self._rope_dim = rope_dim
        self._tables: Dict[int, tuple] = {}
        self._max_logits: List[Optional[Tensor]] = [None] * cfg.num_layers

    # ----------------------------------------------------------------- construction
    def _make_layer(self, i: int) -> TransformerLayer:
        cfg, p = self.cfg, self.precision
        if self._tc.multi_latent_attention:
            attn = MLASelfAttention(cfg.hidden_size, cfg.num_attention_heads, cfg.q_lora_rank,
                                    cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                                    cfg.v_head_dim, cfg.norm_epsilon, p)
        else:
            attn = SelfAttention(cfg.hidden_size, cfg.num_attention_heads,
                                 self._tc.num_query_groups, p)
        if cfg.model_type == "deepseek_v3" and i >= cfg.first_k_dense_replace:
            mlp = MoE(cfg.hidden_size, MoESpec.from_model_config(cfg), p)
        else:
            mlp = MLP(cfg.hidden_size, self._tc.ffn_hidden_size, p)
        return TransformerLayer(attn, mlp, cfg.hidden_size, cfg.norm_epsilon, p)

    def _static_tables(self, seq_len: int):
        """(cos, sin, causal_mask) for a sequence length, cached."""
        if seq_len not in self._tables:
            cos, sin = rotary_tables(seq_len, self._rope_dim, self.cfg.rope_theta)
            mask = np.triu(np.ones((seq_len, seq_len), dtype=bool), 1)
            self._tables[seq_len] = (self.precision.cast(Tensor(cos)),
                                     self.precision.cast(Tensor(sin)), Tensor(mask))
        return self._tables[seq_len]

    # ----------------------------------------------------------------- forward
    def hidden_states(self, input_ids):
        """Final-normed hidden states [B, S, H] and the summed aux loss (Tensor or None)."""
        cos, sin, mask = self._static_tables(input_ids.shape[1])
        h = self.embedding(input_ids)
        aux_total = None
        for i, layer in enumerate(self.decoder.layers):
            h, aux = layer(h, cos, sin, mask)
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
            new = layer.self_attention.last_max_logits
            old = self._max_logits[i]
            self._max_logits[i] = new if old is None else ops.maximum(old, new)
        return self.decoder.final_layernorm(h), aux_total

    def _output_weight(self):
        if self.output_layer is None:
            return self.embedding.word_embeddings.weight
        return self.output_layer.weight

    def _readout(self, h):
        """Float32 logits of final hidden states h, times the muP readout multiplier if any."""
        p = self.precision
        logits = mint.nn.functional.linear(p.cast(h), p.cast(self._output_weight())).astype(ms.float32)
        if self.readout_multiplier is not None:
            logits = logits * self.readout_multiplier
        return logits

    def logits(self, input_ids):
        """Float32 logits [B, S, vocab_size] (times 1/mup_width_mult under muP)."""
        h, _ = self.hidden_states(input_ids)
        return self._readout(h)

    def construct(self, input_ids, labels, loss_mask):
        h, aux = self.hidden_states(input_ids)
        logits = self._readout(h)
        logp = ops.log_softmax(logits, -1)
        safe = mint.where(labels >= 0, labels, 0).astype(ms.int64)[..., None]
        nll = -mint.gather(logp, -1, safe)[..., 0]
        mask = loss_mask.astype(ms.float32)
        loss_sum = (nll * mask).sum()
        aux = mint.zeros((), dtype=ms.float32) if aux is None else aux.astype(ms.float32)
        return loss_sum, mask.sum(), aux

    # ----------------------------------------------------------------- optimizer metadata
    def get_gpt_transformer_config(self) -> GPTTransformerConfig:
        return self._tc

    def is_legacy_model(self) -> bool:
        return False

    def reset_max_attention_logits(self) -> None:
        """Start a new running max (call once per optimizer step)."""
        self._max_logits = [None] * self.cfg.num_layers

    def max_attention_logits_tensor(self) -> Tensor:
        """Running max [num_layers, num_heads] float32 Tensor (-inf where nothing ran yet),
        e.g. for an all-reduce(MAX) across data-parallel ranks."""
        n = self.cfg.num_attention_heads
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
        out = []
        for i, layer in enumerate(self.decoder.layers):
            a = layer.self_attention
            out.append(qk_clip.mla_layer_layout(i, f"decoder.layers.{i}.self_attention",
                                                a.q_param_attr, a.num_heads, a.dn, a.dr, a.dv))
        return out

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

    # ----------------------------------------------------------------- MoE statistics
    def moe_layers(self) -> Dict[int, MoE]:
        return {i: l.mlp for i, l in enumerate(self.decoder.layers) if isinstance(l.mlp, MoE)}

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
            bias.set_data(Tensor(expert_bias_step(bias.asnumpy(), load, rate)))
        if reset:
            self.reset_moe_stats()
