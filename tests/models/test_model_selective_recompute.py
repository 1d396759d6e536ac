"""Selective recompute (``recompute: {mode: select, select_module: ...}``): the selection rule
(core/recompute.py) with its messages, and the gradients of models whose attention, attention
core or MLP is recomputed vs no recompute (bit-identical), including flash attention and MoE."""
import numpy as np
import pytest

from mindformers_core.core.recompute import SELECTIVE_PARTS, selected_modules
from mindformers_core.models.build import build_model
from mindformers_core.models.transformer_layer import RecomputedCore

from model_test_utils import loss_and_grads, tiny_dsv3, tiny_gpt


@pytest.mark.parametrize("select, want", [
    ({"layers.*.self_attention.*": ["0-1"]}, {0: ("self_attention",), 1: ("self_attention",)}),
    ({"layers.*.mlp.*": [1]}, {1: ("mlp",)}),
    ({"layers.*.self_attention.core_attention": ["0-2"], "layers.2.mlp": True},
     {0: ("self_attention.core_attention",), 1: ("self_attention.core_attention",),
      2: ("self_attention.core_attention", "mlp")}),
    # an outer part wins over a part inside it
    ({"*core_attention": [0], "layers.0.self_attention": [0]}, {0: ("self_attention",)}),
    ({"layers.*": [2]}, {2: ("self_attention", "mlp")}),
    # a pattern restricted to other layers selects nothing there: no entry
    ({"layers.1.mlp": [1], "layers.0.mlp": [0]}, {0: ("mlp",), 1: ("mlp",)}),
])
def test_selection(select, want):
    assert selected_modules("select", select, 3) == want
    assert selected_modules("selective", select, 3) == want
    assert selected_modules("full", select, 3) == {} == selected_modules("None", select, 3)


@pytest.mark.parametrize("mode, select, msg", [
    ("select", None, "mode 'select' needs select_module: a mapping of module patterns to layers"),
    ("select", {}, "mode 'select' needs select_module"),
    ("select", {"layers.*.moe.*": [0]}, "'layers.*.moe.*' selects no recomputable part of layers "
                                        "[0]; a decoder layer's parts are ['layers.<i>.self_"),
    ("select", {"layers.1.mlp": [0]}, "'layers.1.mlp' selects no recomputable part of layers [0]"),
    ("select", {"layers.*.mlp": ["0-5"]}, "'layers.*.mlp': layer 3 is out of range [0, 3)"),
    ("select", {"": [0]}, "a module pattern must be a non-empty string, got ''"),
    ("partial", {}, "mode must be one of 'full', 'select', 'selective', 'None', got 'partial'"),
])
def test_selection_errors(mode, select, msg):
    with pytest.raises(ValueError) as e:
        selected_modules(mode, select, 3)
    assert msg in str(e.value)


@pytest.mark.parametrize("make, kw", [
    (tiny_gpt, {}),
    (tiny_gpt, dict(use_flash_attention=True)),
    (tiny_dsv3, dict(moe_aux_loss_coeff=0.01)),
])
@pytest.mark.parametrize("parts", [(p,) for p in SELECTIVE_PARTS]
                         + [("self_attention.core_attention", "mlp")])
def test_selectively_recomputed_gradients_are_bit_identical(make, kw, parts):
    cfg = make(**kw)
    plain, rec = build_model(cfg, seed=1), build_model(cfg, seed=1)
    rec.set_recompute([], {0: parts, 1: parts})
    v0, g0 = loss_and_grads(plain, cfg)
    v1, g1 = loss_and_grads(rec, cfg)
    assert v0 == v1
    assert len(g0) == len(g1)
    for x, y in zip(g1, g0):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(rec.get_max_attention_logits(), plain.get_max_attention_logits())


def test_parts_are_wrapped_as_recomputed_cells():
    model = build_model(tiny_dsv3(), seed=0)
    model.set_recompute([], {0: ("self_attention.core_attention",), 1: ("self_attention", "mlp")})
    first, second = model.decoder.layers
    assert isinstance(first.self_attention.core_attention, RecomputedCore)
    assert not isinstance(second.self_attention.core_attention, RecomputedCore)
    with pytest.raises(ValueError, match="cannot recompute part 'router' of a decoder layer"):
        first.recompute_parts(("router",))


def test_selective_recompute_needs_pynative_layers():
    model = build_model(tiny_gpt(), seed=0)
    model.set_jit("layer")
    with pytest.raises(ValueError, match="recompute runs the layers as Cells: it needs "
                                         "training.jit: none, got 'layer'"):
        model.set_recompute([], {0: ("mlp",)})


@pytest.mark.parametrize("parts, core_runs, mlp_runs", [
    ((), 2, 2),                                        # one forward per layer
    (("self_attention.core_attention",), 4, 2),        # the backward reruns the core only
    (("self_attention",), 4, 2),
    (("mlp",), 2, 4),
])
def test_the_backward_reruns_exactly_the_selected_parts(parts, core_runs, mlp_runs):
    cfg = tiny_gpt()
    model = build_model(cfg, seed=1)
    runs = {"core": 0, "mlp": 0}
    for layer in model.decoder.layers:
        def core(*args, fn=layer.self_attention.core_attention):
            runs["core"] += 1
            return fn(*args)

        def mlp(*args, fn=layer.mlp.apply):
            runs["mlp"] += 1
            return fn(*args)
        layer.self_attention.core_attention = core
        layer.mlp.apply = mlp
    model.set_recompute([], {0: parts, 1: parts} if parts else {})
    loss_and_grads(model, cfg)
    assert runs == {"core": core_runs, "mlp": mlp_runs}
