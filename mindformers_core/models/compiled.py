"""``training.jit``: how the decoder layers run -- PyNative, or compiled with ``mindspore.jit``.

* ``none``: every op dispatched by PyNative.
* ``layer``: each layer's pure part is one ``mindspore.jit`` graph (compiled at the first call
  of each input shape): the whole layer when its MLP is dense, the two norms and the attention
  when it is a mixture of experts (the MoE runs in PyNative: its routing statistics are host
  state and sparse dispatch has data-dependent shapes, which a static graph cannot hold).
* ``model``: the whole forward (embedding, layers, readout, loss) as one graph; dense models
  only.

The graphs are pure: they take the layer's weights as graph inputs (a graph that captured the
Parameters as free variables would keep reading their old buffers once an optimizer replaces
their data with ``set_data``, MindSpore 2.10) and they return the per-head max attention
logits, which the model's Python folds into its running max -- QK-Clip sees the same values
under every mode. Gradients flow through the graphs' inputs under ``mindspore.value_and_grad``.
"""
from __future__ import annotations

from typing import Callable, List

import mindspore as ms

from ..config.training import check_jit_mode as check_mode_name


def check_jit_mode(mode: str, has_moe: bool) -> None:
    """Raise ValueError when ``mode`` is unknown or cannot apply to the model."""
    try:
        check_mode_name(mode)
    except ValueError as err:
        raise ValueError(f"jit {err}") from None
    if mode == "model" and has_moe:
        raise ValueError("jit: model compiles the whole forward as one static graph, which "
                         "cannot hold the MoE layers (host-side routing statistics, "
                         "data-dependent dispatch shapes); use jit: layer")


def _layer_runner(layer, mode: str) -> Callable:
    """callable(h, tables) -> (h, max_logits, aux) for one layer."""
    if mode == "none":
        return layer
    if layer.dense_mlp:
        def dense(h, tables, *ws):
            return layer.apply(h, tables, *ws)

        graph = ms.jit(dense)

        def run_dense(h, tables):
            h, max_logits = graph(h, tables, *layer.weights())
            return h, max_logits, None
        return run_dense

    def attention(h, tables, *ws):
        return layer.attention_block(h, tables, *ws)

    graph = ms.jit(attention)

    def run_moe(h, tables):
        h, x, max_logits = graph(h, tables, *layer.attention_weights())
        h, aux = layer.mlp_block(h, x, tables)
        return h, max_logits, aux
    return run_moe


class Runner:
    """Runs the decoder of a ``GPTModel`` under one ``training.jit`` mode."""

    def __init__(self, model, mode: str):
        check_jit_mode(mode, any(not layer.dense_mlp for layer in model.decoder.layers))
        self.mode = mode
        self._model = model
        self._layers = [_layer_runner(layer, mode) for layer in model.decoder.layers]
        self._graph = None
        if mode == "model":
            def forward(input_ids, labels, loss_mask, tables, *ws):
                return model.apply(input_ids, labels, loss_mask, tables, *ws)
            self._graph = ms.jit(forward)

    def layers(self, h, tables):
        """(h after the last layer, summed aux loss or None, [max_logits per layer])."""
        aux_total, max_logits = None, []
        for run in self._layers:
            h, ml, aux = run(h, tables)
            max_logits.append(ml)
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
        return h, aux_total, max_logits

    def model(self, input_ids, labels, loss_mask) -> tuple:
        """(loss_sum, n_tokens, max_logits [L, N]) of the compiled whole forward."""
        b, s = input_ids.shape
        return self._graph(input_ids, labels, loss_mask, self._model.static_tables(b, s),
                           *self._model.all_weights())
