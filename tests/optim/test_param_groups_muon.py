"""Muon routing (docs/muon.md, "Which parameter goes where") as a pure helper and as `optimizer` tags on the param groups."""
import numpy as np
import pytest
from mindspore import Parameter, Tensor

from mindformers_core.optim.muon_routing import DEFAULT_ADAMW_INCLUDE, muon_routing
from mindformers_core.optim.param_groups import format_param_group_table, get_param_groups

MLA_MOE = [
    ("embedding.word_embeddings.weight", (32, 8)),
    ("decoder.layers.0.input_layernorm.weight", (8,)),
    ("decoder.layers.0.self_attention.linear_q_down_proj.weight", (12, 8)),
    ("decoder.layers.0.self_attention.q_layernorm.weight", (12,)),
    ("decoder.layers.0.self_attention.linear_q_up_proj.weight", (48, 12)),
    ("decoder.layers.0.self_attention.linear_kv_down_proj.weight", (24, 8)),
    ("decoder.layers.0.self_attention.kv_layernorm.weight", (16,)),
    ("decoder.layers.0.self_attention.linear_kv_up_proj.weight", (64, 16)),
    ("decoder.layers.0.self_attention.linear_proj.weight", (8, 32)),
    ("decoder.layers.0.pre_mlp_layernorm.weight", (8,)),
    ("decoder.layers.0.mlp.router.weight", (4, 8)),
    ("decoder.layers.0.mlp.experts.weight1", (4, 8, 32)),
    ("decoder.layers.0.mlp.experts.weight2", (4, 16, 8)),
    ("decoder.layers.0.mlp.shared_experts.linear_fc1.weight", (32, 8)),
    ("decoder.layers.0.mlp.shared_experts.linear_fc1.bias", (32,)),
    ("decoder.final_layernorm.weight", (8,)),
    ("output_layer.weight", (32, 8)),
]
MATRICES = [n for n, s in MLA_MOE if len(s) in (2, 3)]
VECTORS = [n for n, s in MLA_MOE if len(s) == 1]


def make_params(spec):
    return [(n, Parameter(Tensor(np.zeros(s, np.float32)), name=n)) for n, s in spec]


def test_default_routing():
    muon, adamw = muon_routing(make_params(MLA_MOE))
    assert DEFAULT_ADAMW_INCLUDE == ("*word_embeddings*", "*output_layer*")
    assert muon == [n for n in MATRICES if n not in ("embedding.word_embeddings.weight", "output_layer.weight")]
    assert adamw == [n for n, _ in MLA_MOE if n not in muon]        # input order kept
    # plain parameters (names from .name) route the same way
    assert muon_routing([p for _, p in make_params(MLA_MOE)]) == (muon, adamw)


def test_adamw_include_replaces_defaults_fnmatch_only():
    named = make_params(MLA_MOE)
    muon, adamw = muon_routing(named, adamw_include="*router*")           # bare string = one pattern
    assert "decoder.layers.0.mlp.router.weight" in adamw
    assert "embedding.word_embeddings.weight" in muon and "output_layer.weight" in muon   # defaults replaced
    muon, _ = muon_routing(named, adamw_include=["word_embeddings"])     # no substring rule here
    assert "embedding.word_embeddings.weight" in muon
    muon, adamw = muon_routing(named, adamw_include=[])
    assert muon == MATRICES and adamw == VECTORS


@pytest.mark.parametrize("bad", [["*x*", 3], [None], 5, {"*x*"}])
def test_adamw_include_must_be_glob_strings(bad):
    with pytest.raises(ValueError, match=r"^adamw_include must be a list of glob strings\.$"):
        muon_routing(make_params(MLA_MOE), adamw_include=bad)


def test_3d_non_expert_and_4d_weights_are_rejected():
    bad3 = make_params([("decoder.layers.0.mlp.conv.weight", (2, 3, 4))])
    msg = ("Muon only supports 3D weights from grouped experts (`*.experts.weight1/weight2`, "
           "`*.experts.weight`), "
           "but got param='decoder.layers.0.mlp.conv.weight', shape=(2, 3, 4)")
    with pytest.raises(ValueError) as err:
        muon_routing(bad3)
    assert str(err.value) == msg
    bad4 = make_params([("x.weight", (2, 3, 4, 5))])
    with pytest.raises(ValueError) as err:
        muon_routing(bad4)
    assert str(err.value) == ("Muon only supports 2D weights and grouped 3D expert weights, "
                              "but got param='x.weight', shape=(2, 3, 4, 5)")
    # routed to AdamW explicitly: no error
    assert muon_routing(bad3 + bad4, adamw_include=["*conv*", "x.*"]) == ([], ["decoder.layers.0.mlp.conv.weight", "x.weight"])
    # exact names `experts.weight1/2` are grouped experts too; a look-alike suffix is not
    assert muon_routing(make_params([("experts.weight2", (2, 3, 4))]))[0] == ["experts.weight2"]
    # a 3-D `experts.weight` (one matrix per expert) goes to Muon as upstream routes it
    assert muon_routing(make_params([("decoder.layers.1.mlp.experts.weight", (2, 3, 4)),
                                     ("experts.weight", (2, 3, 4))]))[0] == [
        "decoder.layers.1.mlp.experts.weight", "experts.weight"]
    with pytest.raises(ValueError, match="grouped experts"):
        muon_routing(make_params([("a.myexperts.weight", (2, 3, 4))]))
    with pytest.raises(ValueError, match="grouped experts"):
        muon_routing(make_params([("a.myexperts.weight1", (2, 3, 4))]))


def test_muon_config_tags_groups_with_update_rule():
    named = make_params(MLA_MOE)
    groups = get_param_groups(named, {"type": "Muon", "weight_decay": 0.1})
    kind = {p.name: g["optimizer"] for g in groups for p in g["params"]}
    wd = {p.name: g["weight_decay"] for g in groups for p in g["params"]}
    muon, adamw = muon_routing(named)
    assert [n for n, _ in MLA_MOE if kind[n] == "muon"] == muon
    assert [n for n, _ in MLA_MOE if kind[n] == "adamw"] == adamw
    # embedding / output: AdamW branch WITH decay (2-D); vectors: no decay
    assert wd["embedding.word_embeddings.weight"] == wd["output_layer.weight"] == 0.1
    assert all(wd[n] == 0.0 for n in VECTORS)
    assert all(wd[n] == 0.1 for n in MATRICES)
    assert [(g["optimizer"], g["weight_decay"]) for g in groups] == [("adamw", 0.1), ("adamw", 0.0), ("muon", 0.1)]
    table = format_param_group_table(groups)
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[1:len(MLA_MOE) + 1]}
    assert rows["decoder.layers.0.mlp.experts.weight1"] == ["4x8x32", "2", "lr_mult=1", "0.1", "muon"]
    assert rows["output_layer.weight"] == ["32x8", "0", "lr_mult=1", "0.1", "adamw"]


def test_muon_config_errors_surface_at_group_building():
    named = make_params(MLA_MOE + [("decoder.layers.0.mlp.conv.weight", (2, 3, 4))])
    with pytest.raises(ValueError, match=r"Muon only supports 3D weights from grouped experts .* "
                                         r"param='decoder.layers.0.mlp.conv.weight', shape=\(2, 3, 4\)"):
        get_param_groups(named, {"type": "Muon"})
    with pytest.raises(ValueError, match=r"^adamw_include must be a list of glob strings\.$"):
        get_param_groups(make_params(MLA_MOE), {"type": "Muon", "adamw_include": [1]})


def test_user_override_fighting_the_routing_is_a_conflict():
    cfg = {"type": "Muon", "param_overrides": [{"name": "*linear_proj*", "optimizer": "adamw"}]}
    with pytest.raises(ValueError, match=r"parameter 'decoder.layers.0.self_attention.linear_proj.weight': "
                                         r"optimizer='adamw' from .*param_overrides\[0\].* and optimizer='muon' from "
                                         r"ParamKey\(with_name_predicate=\[muon_routing:muon\]\)"):
        get_param_groups(make_params(MLA_MOE), cfg)
    # agreeing with the routing is fine; adamw_include is the way to move a matrix to AdamW
    cfg = {"type": "Muon", "adamw_include": ["*linear_proj*"],
           "param_overrides": [{"name": "*linear_proj*", "optimizer": "adamw", "lr_mult": 0.5}]}
    groups = get_param_groups(make_params(MLA_MOE), cfg)
    g = [g for g in groups if any(p.name.endswith("linear_proj.weight") for p in g["params"])][0]
    assert (g["optimizer"], g["lr_mult"]) == ("adamw", 0.5)
