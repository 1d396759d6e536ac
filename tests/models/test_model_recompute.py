"""Recompute: the layer-selection rules (upstream's ``[0-3]`` ranges) with their messages, and
gradients / statistics of recomputed layers vs no recompute (MindSpore's Cell.recompute)."""
import numpy as np
import pytest

from mindformers_core.models.build import build_model
from mindformers_core.core.recompute import parse_layer_selection, recompute_layers

from model_test_utils import loss_and_grads, tiny_dsv3, tiny_gpt


@pytest.mark.parametrize("spec,want", [
    (True, [0, 1, 2, 3, 4, 5]), (False, []), (None, []), (2, [0, 1]), (0, []),
    (["0-3"], [0, 1, 2, 3]), ([5, "1-2"], [1, 2, 5]), ("[0-1, 4]", [0, 1, 4]),
    ("3", [3]), ([1, 1, "0-1"], [0, 1]),
])
def test_layer_selection(spec, want):
    assert parse_layer_selection(spec, 6) == want


@pytest.mark.parametrize("spec,msg", [
    (7, "a layer count must be in [0, 6], got 7"),
    (["0-6"], "layer 6 is out of range [0, 6)"),
    ([-1], "layer -1 is out of range [0, 6)"),
    (["3-1"], "cannot read layer entry '3-1'"),
    (["a-b"], "cannot read layer entry 'a-b'"),
    (["1-2-3"], "cannot read layer entry '1-2-3'"),
    ([1.5], "cannot read layer entry 1.5"),
    ({"a": 1}, "must be a bool, a layer count or a list of layers"),
])
def test_layer_selection_errors(spec, msg):
    with pytest.raises(ValueError) as e:
        parse_layer_selection(spec, 6)
    assert msg in str(e.value)


def test_recompute_layers_modes():
    assert recompute_layers("None", [0], 4) == [] and recompute_layers(None, None, 4) == []
    assert recompute_layers("full", None, 4) == [0, 1, 2, 3]
    assert recompute_layers("full", ["1-2"], 4) == [1, 2]
    # select recomputes parts of layers (test_model_selective_recompute.py), no whole layer
    assert recompute_layers("selective", None, 4) == [] == recompute_layers("select", [0], 4)
    with pytest.raises(ValueError, match="mode must be one of 'full', 'select', 'selective', "
                                         "'None', got 'x'"):
        recompute_layers("x", None, 4)


@pytest.mark.parametrize("make,kw,layers", [
    (tiny_gpt, {}, [1]),
    (tiny_dsv3, dict(num_nextn_predict_layers=1, moe_aux_loss_coeff=0.01), [0, 1]),
])
def test_recomputed_gradients_are_bit_identical(make, kw, layers):
    cfg = make(**kw)
    plain, rec = build_model(cfg, seed=1), build_model(cfg, seed=1)
    rec.set_recompute(layers)
    v0, g0 = loss_and_grads(plain, cfg)
    v1, g1 = loss_and_grads(rec, cfg)
    assert v0 == v1
    for x, y in zip(g1, g0):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(rec.get_max_attention_logits(), plain.get_max_attention_logits())
    if cfg.model_type == "deepseek_v3":   # the expert-bias update sees the same sign pattern
        plain.update_expert_bias()
        rec.update_expert_bias()
        for a, b in zip(plain.moe_layers().values(), rec.moe_layers().values()):
            np.testing.assert_array_equal(a.router.expert_bias.asnumpy(),
                                          b.router.expert_bias.asnumpy())


def test_recompute_needs_pynative_layers():
    model = build_model(tiny_gpt(), seed=0)
    model.set_jit("layer")
    with pytest.raises(ValueError, match="recompute runs the layers as Cells: it needs "
                                         "training.jit: none, got 'layer'"):
        model.set_recompute([0])
