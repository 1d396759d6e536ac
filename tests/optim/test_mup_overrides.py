"""muP overrides (`optim/mup.py` `get_mup_config_overrides`): widths 256 -> 1024, width_mult 4."""
import types

import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from mindformers_core.errors import ConfigError
from mindformers_core.optim.mup import get_mup_config_overrides, mup_width_mult
from mindformers_core.optim.param_groups import get_param_groups

BASE, WIDTH = 256, 1024          # proxy width and target width: width_mult = 4
# Hand-classified (independent of the code's rule): hidden = both dims grow with width.
HIDDEN = ["decoder.layers.0.self_attention.linear_qkv.weight",
          "decoder.layers.0.self_attention.linear_proj.weight",
          "decoder.layers.0.mlp.linear_fc1.weight",
          "decoder.layers.0.mlp.linear_fc2.weight",
          "decoder.layers.1.mlp.experts.weight1"]
VECTOR_LIKE = ["embedding.word_embeddings.weight",
               "decoder.layers.0.input_layernorm.weight",
               "decoder.layers.0.self_attention.linear_qkv.bias",
               "decoder.layers.0.pre_mlp_layernorm.weight",
               "decoder.final_layernorm.weight",
               "output_layer.weight"]
SHAPES = {"embedding.word_embeddings.weight": (32, 8),
          "decoder.layers.0.input_layernorm.weight": (8,),
          "decoder.layers.0.self_attention.linear_qkv.weight": (24, 8),
          "decoder.layers.0.self_attention.linear_qkv.bias": (24,),
          "decoder.layers.0.self_attention.linear_proj.weight": (8, 8),
          "decoder.layers.0.pre_mlp_layernorm.weight": (8,),
          "decoder.layers.0.mlp.linear_fc1.weight": (32, 8),
          "decoder.layers.0.mlp.linear_fc2.weight": (8, 16),
          "decoder.layers.1.mlp.experts.weight1": (4, 8, 32),
          "decoder.final_layernorm.weight": (8,),
          "output_layer.weight": (32, 8)}


def make_params():
    return [(n, Parameter(Tensor(np.zeros(s, np.float32)), name=n)) for n, s in SHAPES.items()]


def per_param(groups, field, default=None):
    return {p.name: g.get(field, default) for g in groups for p in g["params"]}


def mup_cfg(type_, **extra):
    return {"type": type_, "weight_decay": 0.1, "eps": 1e-8, "mup": {"base_hidden_size": BASE}, **extra}


def test_width_mult_from_hidden_size_and_model():
    assert mup_width_mult(WIDTH, {"base_hidden_size": BASE}) == 4.0
    assert mup_width_mult(WIDTH, types.SimpleNamespace(base_hidden_size=BASE)) == 4.0
    assert mup_width_mult(WIDTH, None) == 1.0

    class Model(nn.Cell):
        def get_gpt_transformer_config(self):
            return types.SimpleNamespace(hidden_size=WIDTH)
    assert mup_width_mult(Model(), {"base_hidden_size": BASE}) == 4.0
    assert mup_width_mult(types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=512)),
                          {"base_hidden_size": BASE}) == 2.0


@pytest.mark.parametrize("cfg, match", [
    ({}, r"optimizer.mup.base_hidden_size: required when optimizer.mup is set"),
    ({"base_hidden_size": 0}, r"optimizer.mup.base_hidden_size: must be a positive integer, got 0"),
    ({"base_hidden_size": 256.0}, r"optimizer.mup.base_hidden_size: must be a positive integer, got 256.0"),
    ({"base_hidden_size": True}, r"optimizer.mup.base_hidden_size: must be a positive integer, got True"),
    ({"base_hidden_size": 256, "base_width": 2}, r"optimizer.mup.base_width: unknown key; valid keys: \['base_hidden_size'\]"),
])
def test_width_mult_errors(cfg, match):
    with pytest.raises(ConfigError, match=match):
        mup_width_mult(WIDTH, cfg)


def test_width_mult_needs_a_hidden_size():
    with pytest.raises(ValueError, match=r"optimizer.mup: cannot read hidden_size from the model"):
        mup_width_mult(object(), {"base_hidden_size": BASE})
    with pytest.raises(ValueError, match=r"optimizer.mup needs the model's hidden_size: pass a model or hidden_size="):
        get_param_groups(make_params(), mup_cfg("AdamW"))
    with pytest.raises(ValueError, match=r"mup_width_mult must be a finite positive number, got 0"):
        get_mup_config_overrides({}, 0, "adam")


@pytest.mark.parametrize("type_", ["AdamW", "Adam"])
def test_adam_hidden_lr_and_eps_divided(type_):
    groups = get_param_groups(make_params(), mup_cfg(type_), hidden_size=WIDTH)
    lr, eps, wd = per_param(groups, "lr_mult"), per_param(groups, "eps"), per_param(groups, "weight_decay")
    for n in HIDDEN:
        assert lr[n] == 0.25 and eps[n] == pytest.approx(2.5e-9, rel=1e-12), n
        assert wd[n] == 0.1
    for n in VECTOR_LIKE:
        assert lr[n] == 1.0 and eps[n] is None, n
    assert sorted(HIDDEN + VECTOR_LIKE) == sorted(SHAPES)


def test_sgd_vector_like_lr_multiplied():
    groups = get_param_groups(make_params(), mup_cfg("SGD"), hidden_size=WIDTH)
    lr, eps = per_param(groups, "lr_mult"), per_param(groups, "eps")
    assert all(lr[n] == 4.0 for n in VECTOR_LIKE)
    assert all(lr[n] == 1.0 for n in HIDDEN)
    assert all(e is None for e in eps.values())


def test_lion_hidden_lr_divided_no_eps():
    groups = get_param_groups(make_params(), mup_cfg("Lion"), hidden_size=WIDTH)
    lr, eps = per_param(groups, "lr_mult"), per_param(groups, "eps")
    assert all(lr[n] == 0.25 for n in HIDDEN) and all(lr[n] == 1.0 for n in VECTOR_LIKE)
    assert all(e is None for e in eps.values())


def test_muon_excludes_matrices_it_manages():
    # Muon runs every hidden matrix here (defaults send embedding/output to AdamW): no muP change.
    groups = get_param_groups(make_params(), mup_cfg("Muon"), hidden_size=WIDTH)
    assert set(per_param(groups, "lr_mult").values()) == {1.0}
    # a hidden matrix moved to the AdamW branch gets the hidden rule (lr / 4, no eps)
    cfg = mup_cfg("Muon", adamw_include=["*word_embeddings*", "*output_layer*", "*linear_proj*"])
    groups = get_param_groups(make_params(), cfg, hidden_size=WIDTH)
    lr, kind, eps = per_param(groups, "lr_mult"), per_param(groups, "optimizer"), per_param(groups, "eps")
    assert lr["decoder.layers.0.self_attention.linear_proj.weight"] == 0.25
    assert kind["decoder.layers.0.self_attention.linear_proj.weight"] == "adamw"
    assert all(lr[n] == 1.0 for n in SHAPES if n != "decoder.layers.0.self_attention.linear_proj.weight")
    assert all(e is None for e in eps.values())


@pytest.mark.parametrize("type_", ["SGD", "AdamW"])
def test_decoupled_lr_is_not_overridden(type_):
    groups = get_param_groups(make_params(), mup_cfg(type_, decoupled_lr=1e-3, decoupled_min_lr=1e-5),
                              hidden_size=WIDTH)
    lr, max_lr = per_param(groups, "lr_mult"), per_param(groups, "max_lr")
    for n in ("embedding.word_embeddings.weight", "output_layer.weight"):
        assert (lr[n], max_lr[n]) == (1.0, 1e-3)
    expected = 4.0 if type_ == "SGD" else 1.0
    assert lr["decoder.final_layernorm.weight"] == expected


def test_width_mult_one_adds_nothing():
    assert get_mup_config_overrides({"eps": 1e-8}, 1.0, "adam") == {}
    groups = get_param_groups(make_params(), {"mup": {"base_hidden_size": BASE}}, hidden_size=BASE)
    assert len(groups) == 2 and set(per_param(groups, "lr_mult").values()) == {1.0}


def test_override_values_and_key_names():
    (key, override), = get_mup_config_overrides({"eps": 1e-6}, 4.0, "adamw").items()
    assert override == {"lr_mult": 0.25, "eps": 2.5e-7}
    assert key.describe() == "ParamKey(with_name_predicate=[mup_hidden_adam(w=4)])"
    (key, override), = get_mup_config_overrides({}, 4.0, "sgd").items()
    assert override == {"lr_mult": 4.0}
    (key, override), = get_mup_config_overrides({}, 2.0, "lion").items()
    assert override == {"lr_mult": 0.5}


def test_user_lr_override_conflicting_with_mup_is_rejected():
    cfg = mup_cfg("AdamW", param_overrides=[{"name": "*linear_fc1*", "lr_mult": 0.5}])
    with pytest.raises(ValueError, match=r"parameter 'decoder.layers.0.mlp.linear_fc1.weight': lr_mult=0.25 from "
                                         r"ParamKey\(with_name_predicate=\[mup_hidden_adam\(w=4\)\]\) and lr_mult=0.5"):
        get_param_groups(make_params(), cfg, hidden_size=WIDTH)
