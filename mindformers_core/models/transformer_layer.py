"""The decoder's pre-norm layer and the decoder (its layers and the final norm) of ``GPTModel``
(models/language_model.py).

Pre-norm layers: h = h + attn(input_layernorm(h)); h = h + mlp(pre_mlp_layernorm(h)). Each
layer's pure parts take the weights as arguments, which ``models/compiled.py`` (``mindspore.jit``
graphs), ``models/tp_model.py`` and ``distributed/fsdp.py`` (gathered weights) run.
"""
from __future__ import annotations

from typing import List

from mindspore import nn

from .layers import RMSNorm, rms_norm
from .precision import Precision

__all__ = ["RecomputedCore", "TransformerLayer", "Decoder"]


class RecomputedCore(nn.Cell):
    """A core attention function ``fn(q, k, v, scale, mask_bias) -> (context, max_logits)``
    as a recomputed Cell: the backward reruns it from q, k, v, so its scores and
    probabilities are not kept (``recompute.select_module``'s ``core_attention``)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.recompute()

    def construct(self, q, k, v, scale, mask_bias):
        return self.fn(q, k, v, scale, mask_bias)


class TransformerLayer(nn.Cell):
    """Pre-norm layer on 2-D hidden states [B*S, H].

    ``construct(h, tables) -> (h, max_logits [N], aux)`` (aux None for a dense MLP). The pure
    parts take their weights as arguments (``attention_block``: the two norms and the
    attention, ``apply``: the whole dense layer), so ``models.compiled`` can run them under
    ``mindspore.jit`` with the weights as graph inputs.
    """

    def __init__(self, attention: nn.Cell, mlp: nn.Cell, hidden_size: int, eps: float,
                 precision: Precision, dense_mlp: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, eps, precision)
        self.self_attention = attention
        self.pre_mlp_layernorm = RMSNorm(hidden_size, eps, precision)
        self.mlp = mlp
        self.dense_mlp = dense_mlp
        self._num_attention_weights = len(attention.weights())
        self._attention_as_cell = False

    def attention_weights(self) -> tuple:
        return ((self.input_layernorm.weight,) + self.self_attention.weights()
                + (self.pre_mlp_layernorm.weight,))

    def weights(self) -> tuple:
        """Every weight of the layer, in ``apply``'s (dense) / ``run_with``'s order."""
        return self.attention_weights() + self.mlp.weights()

    def run_with(self, h, tables, *ws):
        """``construct`` with ``weights()`` as arguments: (h, max_logits, aux)."""
        na = self._num_attention_weights + 2
        h, x, max_logits = self.attention_block(h, tables, *ws[:na])
        h, aux = self.mlp_block(h, x, tables, *ws[na:])
        return h, max_logits, aux

    def attention_block(self, h, tables, *ws):
        """(h + attn(norm1(h)), norm2 of that, max_logits) with ``attention_weights()``."""
        na = self._num_attention_weights
        norm1, norm2 = self.input_layernorm, self.pre_mlp_layernorm
        x = rms_norm(h, ws[0], norm1.eps, norm1.mean_column)
        if self._attention_as_cell:   # recomputed: a Cell call (its weights are ws[1:1 + na])
            out, max_logits = self.self_attention(x, tables)
        else:
            out, max_logits = self.self_attention.apply(x, tables, *ws[1:1 + na])
        h = h + out
        return h, rms_norm(h, ws[1 + na], norm2.eps, norm2.mean_column), max_logits

    def cached_step(self, h, tables, attention, ws, mlp_weights: bool):
        """The layer on new tokens of a key/value-cached decode (models/kv_cache.py): h after
        it, with ``weights()`` as ``ws`` and ``attention(attn, x, tables, attn_ws) -> (out,
        max_logits)`` the cache's attention; ``mlp_weights``: the MLP runs on ``ws``' MLP
        weights (gathered from shards) instead of as its Cell (an expert-parallel MoE Cell
        holds its own experts)."""
        na = self._num_attention_weights
        norm1, norm2 = self.input_layernorm, self.pre_mlp_layernorm
        x = rms_norm(h, ws[0], norm1.eps, norm1.mean_column)
        out, _ = attention(self.self_attention, x, tables, ws[1:1 + na])
        h = h + out
        x = rms_norm(h, ws[1 + na], norm2.eps, norm2.mean_column)
        h, _ = self.mlp_block(h, x, tables, *(ws[2 + na:] if mlp_weights else ()))
        return h

    def recompute_parts(self, parts) -> None:
        """Recompute these parts (``core.recompute.SELECTIVE_PARTS``) in the backward."""
        for part in parts:
            if part == "self_attention":
                self.self_attention.recompute()
                self._attention_as_cell = True
            elif part == "self_attention.core_attention":
                self.self_attention.core_attention = RecomputedCore(
                    self.self_attention.core_attention)
            elif part == "mlp":
                self.mlp.recompute()
            else:
                raise ValueError(f"cannot recompute part {part!r} of a decoder layer")

    def apply(self, h, tables, *ws):
        """The dense layer with ``weights()``: (h, max_logits)."""
        na = self._num_attention_weights
        h, x, max_logits = self.attention_block(h, tables, *ws[:na + 2])
        return h + self.mlp.apply(x, *ws[na + 2:]), max_logits

    def mlp_block(self, h, x, tables, *ws):
        """h + mlp(x) for the normed x; (h, aux) (aux None for a dense MLP). ``ws``: the MLP's
        weights as arguments (FSDP's gathered ones); without them the MLP runs as its Cell,
        so a recomputed MLP (``recompute`` / selective recompute) recomputes."""
        mlp = (lambda v: self.mlp.apply(v, *ws)) if ws else self.mlp
        if self.dense_mlp:
            return h + mlp(x), None
        b, _, s, _ = tables[0].shape   # cos_q: this rank's rows (the mask may be whole)
        out, aux = mlp(x.reshape(b, s, x.shape[-1]))   # the MoE reads sequences
        return h + out.reshape(x.shape), aux

    def construct(self, h, tables):
        h, x, max_logits = self.attention_block(h, tables, *self.attention_weights())
        h, aux = self.mlp_block(h, x, tables)
        return h, max_logits, aux


class Decoder(nn.Cell):
    def __init__(self, layers: List[TransformerLayer], hidden_size: int, eps: float,
                 precision: Precision):
        super().__init__()
        self.layers = nn.CellList(layers)
        self.final_layernorm = RMSNorm(hidden_size, eps, precision)
