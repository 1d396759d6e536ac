"""``training.jit``: how the decoder layers run -- PyNative, or compiled with ``mindspore.jit``.

* ``none``: every op dispatched by PyNative.
* ``layer``: each layer's pure part is one ``mindspore.jit`` graph (compiled at the first call
  of each input shape): the whole layer, dense or mixture of experts. A MoE layer's graph
  runs the router, the static-shape dispatch of ``static_dispatch`` and the experts
  (``MoE.static_apply``) and returns the routing statistics (selected experts, routed pairs
  per expert, dropped pairs, aux loss), which the Python side adds to the layer's host
  statistics (``MoE.record``: the expert-bias update and the load metrics read them); the
  expert bias, updated by ``set_data`` between steps, is a graph input like the weights.
  Where the static dispatch does not apply (``MoE.static_ok``: experts split over ranks, the
  Ascend grouped matmul) the graph holds the two norms and the attention and the MoE runs in
  PyNative. The head (final norm, output layer, loss) is one more graph. The embedding
  lookup stays PyNative.
* ``model``: the whole forward (embedding, layers, readout, loss) as one graph; dense models
  only.

The graphs are pure: they take the layer's weights as graph inputs (a graph that captured the
Parameters as free variables would keep reading their old buffers once an optimizer replaces
their data with ``set_data``, MindSpore 2.10) and they return the per-head max attention
logits, which the model's Python folds into its running max -- QK-Clip sees the same values
under every mode. Gradients flow through the graphs' inputs under ``mindspore.value_and_grad``.

The graphs are built from the functions' bytecode (``capture_mode="bytecode"``, chosen by
``core.memory_jit.jit_capture_mode``) where the interpreter allows it (CPython < 3.12 under
MindSpore 2.10), else from their source (``"ast"``). Both give the same numbers at the same
step time, but under ``value_and_grad`` an ast-built layer keeps about twice the activations
PyNative keeps for its backward, a bytecode-built one about 1.4x (CPU; mid GPT peak RSS above
the framework baseline 860 -> 590 MiB, docs/performance.md). ``"trace"`` is not used: it
replays the graph traced at the first call with that call's weights (every later layer gets
wrong gradients, MindSpore 2.10).

A bytecode graph keeps the gradient pattern of its first differentiated call: a compiled
model first differentiated w.r.t. a subset of its weights (e.g. ``ms.grad(..., weights=
[embedding])``) returns wrong gradients for the other weights when later differentiated w.r.t.
all of them (MindSpore 2.10; forward-only calls before are harmless). The trainer always
differentiates every trainable weight; code that differentiates a subset first should build
the model with ``jit: none``. Across models the graphs are never shared (``compile_pure``).
"""
from __future__ import annotations

import itertools
import types
from typing import Callable

import mindspore as ms

from ..config.training import check_jit_mode as check_mode_name
from ..core.memory_jit import jit_capture_mode
from ..distributed.model_runner import RunnerDefaults, run_layer_steps


#: Whether ``layer`` compiles the MoE layers too (``MoE.static_apply``). Off: a run resumed
#: from a checkpoint then differs from the uninterrupted one by ~1e-7 from its first step on
#: (tests/trainer/test_trainer.py::test_moe_muon_resume_is_bit_exact_and_updates_expert_bias
#: fails with it on), and compiling the MoE measured no faster (docs/performance.md); the
#: compiled block itself is tested against PyNative in tests/models/test_moe_compiled.py.
COMPILE_MOE = False


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


_COMPILED = itertools.count()


def compile_pure(fn: Callable) -> Callable:
    """``fn`` compiled with ``mindspore.jit`` under this interpreter's ``capture_mode``.

    A bytecode graph is cached on the function's code object, and MindSpore 2.10 reuses it for
    another closure of the same code whose inputs have the same shapes, even when that one
    needs other gradients (another model's layers after a pass that differentiated only the
    embedding got wrong weight gradients). So every call gets its own copy of the code."""
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{next(_COMPILED)}")
    own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__,
                             fn.__closure__)
    return ms.jit(own, capture_mode=jit_capture_mode())


#: tensors of ``layers.attention_tables`` (cos_q, sin_q, cos_k, sin_k, rot, mask). The layer
#: graphs take them as separate inputs, like the weights: a tuple of Tensors would be a
#: compile-time constant, which MindSpore warns about at every compile, printing every table.
NUM_TABLES = 6


def _layer_graphs(template, moe_template=None) -> tuple:
    """(dense graph, attention graph, MoE layer graph or None) compiled from the templates'
    pure functions (``moe_template``: a MoE layer).

    Every layer of a model has the same structure and constants (head counts, eps), only the
    weights differ, and those are graph inputs, so one function serves all layers. (MindSpore
    2.10 still compiles it once per layer: ``jit`` keys its cache by the ids of Parameter
    arguments.)
    """
    def dense(h, *args):
        return template.apply(h, args[:NUM_TABLES], *args[NUM_TABLES:])

    def attention(h, *args):
        return template.attention_block(h, args[:NUM_TABLES], *args[NUM_TABLES:])

    moe = None
    if moe_template is not None:
        na = len(moe_template.attention_weights())

        def moe_layer(h, *args):
            tables = args[:NUM_TABLES]
            ws = args[NUM_TABLES:]
            h, x, max_logits = moe_template.attention_block(h, tables, *ws[:na])
            b, _, s, _ = tables[0].shape   # cos_q: this rank's rows (the mask may be whole)
            y, aux, idx, counts, dropped = moe_template.mlp.static_apply(
                x.reshape(b, s, x.shape[-1]), *ws[na:])
            return h + y.reshape(x.shape), max_logits, aux, idx, counts, dropped

        moe = compile_pure(moe_layer)
    return compile_pure(dense), compile_pure(attention), moe


def _layer_runner(layer, mode: str, graphs) -> Callable:
    """callable(h, tables) -> (h, max_logits, aux) for one layer."""
    if mode == "none":
        return layer
    dense, attention, moe_graph = graphs
    if layer.dense_mlp:
        def run_dense(h, tables):
            h, max_logits = dense(h, *tables, *layer.weights())
            return h, max_logits, None
        return run_dense

    def run_moe(h, tables):
        moe = layer.mlp
        if COMPILE_MOE and moe_graph is not None and moe.static_ok:
            h, max_logits, aux, idx, counts, dropped = moe_graph(
                h, *tables, *layer.attention_weights(), moe.router.expert_bias, *moe.weights())
            aux = aux if moe.has_aux else None
            moe.record(idx, counts, dropped, aux)
            return h, max_logits, aux
        h, x, max_logits = attention(h, *tables, *layer.attention_weights())
        h, aux = layer.mlp_block(h, x, tables)
        return h, max_logits, aux
    return run_moe


def effective_mode(mode: str, model) -> str:
    """The mode that runs for ``model``: PyNative (``none``) when

    * its compute dtype is float16 (MindSpore 2.10 CPU returns the gradients of a float16
      graph's Parameter inputs misaligned -- the RMSNorm gain gets the shape of a linear
      weight's gradient -- so a compiled fp16 layer would train wrongly);
    * its attention is the CPU blockwise one (``use_flash_attention`` off Ascend): each query
      block is a recomputed Cell, and a recomputed Cell inside a ``mindspore.jit`` graph fails
      in its backward (MindSpore 2.10: ``IndexError`` in ``common/recompute.py``'s bprop;
      tests/models/test_model_blockwise_attention.py runs a training step under ``layer``).
    """
    if model.precision.compute == ms.float16:
        return "none"
    if model.cfg.use_flash_attention and ms.get_context("device_target") != "Ascend":
        return "none"
    return mode


class Runner(RunnerDefaults):
    """Runs the decoder of a ``GPTModel`` under one ``training.jit`` mode (the
    ``distributed.model_runner.ModelRunner`` interface: whole weights, whole logits)."""

    def __init__(self, model, mode: str):
        layers = model.decoder_layers()
        check_jit_mode(mode, any(not layer.dense_mlp for layer in layers))
        mode = effective_mode(mode, model)
        self.mode = mode
        self._model = model
        dense = [layer for layer in layers if layer.dense_mlp]
        moes = [layer for layer in layers if not layer.dense_mlp]
        # the dense graph needs a dense template; the attention graph fits any layer
        graphs = _layer_graphs(dense[0] if dense else layers[0], moes[0] if moes else None) \
            if mode == "layer" else None
        # under "model" the layers run eagerly outside the loss graph (logits, hidden_states)
        layer_mode = "layer" if mode == "layer" else "none"
        self._layers = [_layer_runner(layer, layer_mode, graphs) for layer in layers]
        self._graph = None
        self._head = model.head
        if mode == "layer":
            def head(h, labels, loss_mask, *ws):
                return model.head(h, labels, loss_mask, *ws)
            self._head = compile_pure(head)
        if mode == "model":
            def forward(input_ids, labels, loss_mask, tables, *ws):
                return model.apply(input_ids, labels, loss_mask, tables, *ws)
            self._graph = compile_pure(forward)

    def embed(self, input_ids):
        """[B*S, H] embedded tokens."""
        return self._model.embed_tokens(input_ids, self._model.embedding.word_embeddings.weight)

    def layers(self, h, tables, indices=None):
        """(h after the last layer, summed aux loss or None, [max_logits per layer]); only the
        decoder layers ``indices`` (in order) when given (a pipeline stage's)."""
        return run_layer_steps(self._layers, h, tables, indices)

    def head(self, h, labels, loss_mask) -> tuple:
        """(loss_sum, n_tokens) of the last hidden states [T, H], labels and mask [T]."""
        return self._head(h, labels, loss_mask, *self._model.output_weights())

    def model(self, input_ids, labels, loss_mask) -> tuple:
        """(loss_sum, n_tokens, max_logits [L, N]) of the compiled whole forward."""
        return self._graph(input_ids, labels, loss_mask, self._model.tables_for(input_ids),
                           *self._model.all_weights())
