"""Parameter groups: default weight-decay routing, include/exclude rules, overrides merging,
conflicts, decoupled LR, determinism, the group table. Hand-built Megatron-named parameter sets
(GPT dense; DeepSeek-V3 MLA + MoE)."""
import io
import warnings

import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from mindformers_core.errors import ConfigError
from mindformers_core.optim.param_groups import (
    ParamKey, ParamPredicate, ParamWithNamePredicate, check_config_overrides_consistency,
    format_param_group_table, get_param_groups, get_standard_config_overrides, param_group_map)

H, F, V = 8, 16, 32


def make_params(spec):
    """[(name, shape)] -> [(name, Parameter)] with the given names (float32 zeros)."""
    return [(n, Parameter(Tensor(np.zeros(s, np.float32)), name=n)) for n, s in spec]


def gpt_spec(num_layers=2, h=H, f=F, v=V):
    spec = [("embedding.word_embeddings.weight", (v, h))]
    for i in range(num_layers):
        p = f"decoder.layers.{i}"
        spec += [(f"{p}.input_layernorm.weight", (h,)),
                 (f"{p}.self_attention.linear_qkv.weight", (3 * h, h)),
                 (f"{p}.self_attention.linear_qkv.bias", (3 * h,)),
                 (f"{p}.self_attention.linear_proj.weight", (h, h)),
                 (f"{p}.pre_mlp_layernorm.weight", (h,)),
                 (f"{p}.mlp.linear_fc1.weight", (2 * f, h)),
                 (f"{p}.mlp.linear_fc2.weight", (h, f))]
    spec += [("decoder.final_layernorm.weight", (h,)), ("output_layer.weight", (v, h))]
    return spec


def mla_moe_spec(h=H, experts=4, f=F, v=V):
    """DeepSeek-V3-like: layer 0 dense MLA, layer 1 MLA + MoE with grouped experts (model order)."""
    spec = [("embedding.word_embeddings.weight", (v, h))]
    for i in range(2):
        a = f"decoder.layers.{i}.self_attention"
        spec += [(f"decoder.layers.{i}.input_layernorm.weight", (h,)),
                 (f"{a}.linear_q_down_proj.weight", (12, h)),
                 (f"{a}.q_layernorm.weight", (12,)),
                 (f"{a}.linear_q_up_proj.weight", (2 * 24, 12)),
                 (f"{a}.linear_kv_down_proj.weight", (16 + 8, h)),
                 (f"{a}.kv_layernorm.weight", (16,)),
                 (f"{a}.linear_kv_up_proj.weight", (2 * 32, 16)),
                 (f"{a}.linear_proj.weight", (h, 2 * 16)),
                 (f"decoder.layers.{i}.pre_mlp_layernorm.weight", (h,))]
        if i == 0:
            spec += [("decoder.layers.0.mlp.linear_fc1.weight", (2 * f, h)),
                     ("decoder.layers.0.mlp.linear_fc2.weight", (h, f))]
    spec += [("decoder.layers.1.mlp.router.weight", (experts, h)),
             ("decoder.layers.1.mlp.experts.weight1", (experts, h, 2 * f)),
             ("decoder.layers.1.mlp.experts.weight2", (experts, f, h)),
             ("decoder.layers.1.mlp.shared_experts.linear_fc1.weight", (2 * f, h)),
             ("decoder.layers.1.mlp.shared_experts.linear_fc2.weight", (h, f)),
             ("decoder.final_layernorm.weight", (h,)), ("output_layer.weight", (v, h))]
    return spec


def build_cell(spec, frozen=()):
    """An nn.Cell whose trainable_params() carry exactly the dotted names of `spec`."""
    tree = {}
    for name, shape in spec:
        node = tree
        *path, leaf = name.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = shape

    def build(node):
        cell = nn.Cell()
        for key, value in node.items():
            if isinstance(value, dict):
                setattr(cell, key, build(value))
            else:
                setattr(cell, key, Parameter(Tensor(np.zeros(value, np.float32)), name=key))
        return cell
    cell = build(tree)
    for name in frozen:
        dict(cell.parameters_and_names())[name].requires_grad = False
    return cell


def groups_by_name(groups):
    return {p.name: g for g in groups for p in g["params"]}


def no_decay_reference(spec):
    """Upstream default: 1-D or `.bias` -> no decay; everything else decays."""
    return {n for n, s in spec if len(s) == 1 or n.endswith(".bias")}


ADAMW = {"type": "AdamW", "weight_decay": 0.01}


# --- default routing --------------------------------------------------------------------------

@pytest.mark.parametrize("spec_fn", [gpt_spec, mla_moe_spec])
def test_default_routing_matches_upstream_rule(spec_fn):
    spec = spec_fn()
    named = make_params(spec)
    groups = get_param_groups(named, ADAMW)
    by_name = groups_by_name(groups)
    assert sorted(by_name) == sorted(n for n, _ in spec)          # every parameter exactly once
    assert sum(len(g["params"]) for g in groups) == len(spec)
    expected_no_decay = no_decay_reference(spec)
    for name, _ in spec:
        g = by_name[name]
        if name in expected_no_decay:
            assert (g["weight_decay"], g["wd_mult"]) == (0.0, 0.0), name
        else:
            assert (g["weight_decay"], g["wd_mult"]) == (0.01, 1.0), name
        assert g["lr_mult"] == 1.0
    # two groups, ordered by first appearance: embedding (decay) first, then the first norm
    assert len(groups) == 2
    assert groups[0]["params"][0] is named[0][1]
    assert groups[1]["params"][0].name == "decoder.layers.0.input_layernorm.weight"
    # the caller's Parameter objects, in model order inside each group
    ids = {id(p) for _, p in named}
    assert all(id(p) in ids for g in groups for p in g["params"])
    order = [n for n, _ in spec]
    for g in groups:
        idx = [order.index(p.name) for p in g["params"]]
        assert idx == sorted(idx)


def test_cell_model_hooks_and_frozen_params():
    spec = gpt_spec(num_layers=1)
    cell = build_cell(spec, frozen=("decoder.layers.0.mlp.linear_fc2.weight",))
    cell.no_weight_decay = lambda: {"decoder.layers.0.self_attention.linear_proj.weight"}
    cell.no_weight_decay_keywords = lambda: ("word_embeddings",)
    groups = get_param_groups(cell, ADAMW)
    by_name = groups_by_name(groups)
    assert "decoder.layers.0.mlp.linear_fc2.weight" not in by_name        # frozen: skipped
    assert by_name["decoder.layers.0.self_attention.linear_proj.weight"]["weight_decay"] == 0.0
    assert by_name["embedding.word_embeddings.weight"]["weight_decay"] == 0.0
    assert by_name["output_layer.weight"]["weight_decay"] == 0.01
    assert by_name["decoder.layers.0.mlp.linear_fc1.weight"]["weight_decay"] == 0.01


def test_parameters_without_names_and_tied_duplicates():
    named = make_params(gpt_spec(num_layers=1))
    params = [p for _, p in named]
    params.append(params[0])                      # tied embedding listed twice
    groups = get_param_groups(params, ADAMW)
    assert sum(len(g["params"]) for g in groups) == len(named)


class _ObjConfig:
    type = "AdamW"
    weight_decay = 0.1
    weight_decay_include = None
    weight_decay_exclude = ["linear_proj"]
    decoupled_lr = None


def test_object_and_dict_configs_agree():
    named = make_params(gpt_spec())
    a = format_param_group_table(get_param_groups(named, _ObjConfig()))
    b = format_param_group_table(get_param_groups(named, {"type": "AdamW", "weight_decay": 0.1,
                                                          "weight_decay_exclude": ["linear_proj"]}))
    assert a == b
    assert "decoder.layers.0.self_attention.linear_proj.weight  8x8" in a


# --- include / exclude ------------------------------------------------------------------------

def test_include_beats_exclude_beats_defaults():
    named = make_params(gpt_spec(num_layers=1))
    cfg = {"weight_decay": 0.1,
           "weight_decay_include": ["*layernorm*", "decoder.layers.0.self_attention.linear_qkv.bias"],
           "weight_decay_exclude": ["*input_layernorm*", "linear_fc1", "output_layer.weight"]}
    by_name = groups_by_name(get_param_groups(named, cfg))
    wd = {n: g["weight_decay"] for n, g in by_name.items()}
    assert wd["decoder.layers.0.input_layernorm.weight"] == 0.1     # include and exclude: include wins
    assert wd["decoder.final_layernorm.weight"] == 0.1              # include over 1-D default
    assert wd["decoder.layers.0.self_attention.linear_qkv.bias"] == 0.1   # exact name include
    assert wd["decoder.layers.0.mlp.linear_fc1.weight"] == 0.0      # substring exclude
    assert wd["output_layer.weight"] == 0.0                         # exact exclude
    assert wd["decoder.layers.0.mlp.linear_fc2.weight"] == 0.1      # default


def test_substring_rule_and_case_sensitive_fnmatch():
    named = make_params([("a.special.weight", (4, 4)), ("b.plain.weight", (4, 4))])
    by_name = groups_by_name(get_param_groups(named, {"weight_decay_exclude": ["pecial"]}))
    assert by_name["a.special.weight"]["weight_decay"] == 0.0
    assert by_name["b.plain.weight"]["weight_decay"] == 0.01
    with pytest.warns(UserWarning, match=r"weight_decay_exclude: pattern '\*SPECIAL\*' matches no"):
        by_name = groups_by_name(get_param_groups(named, {"weight_decay_exclude": ["*SPECIAL*"]}))
    assert by_name["a.special.weight"]["weight_decay"] == 0.01


def test_unmatched_patterns_warn_naming_the_pattern():
    named = make_params(gpt_spec(num_layers=1))
    with pytest.warns(UserWarning) as record:
        get_param_groups(named, {"weight_decay_include": ["*nothing_here*"],
                                 "weight_decay_exclude": ["*norm*", "no_such_param"]})
    messages = [str(r.message) for r in record]
    assert any("weight_decay_include: pattern '*nothing_here*'" in m for m in messages)
    assert any("weight_decay_exclude: pattern 'no_such_param'" in m for m in messages)
    assert not any("'*norm*'" in m for m in messages)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # matched patterns: no warning at all
        get_param_groups(named, {"weight_decay_exclude": ["*norm*"]})


def test_rule_type_errors():
    named = make_params(gpt_spec(num_layers=1))
    with pytest.raises(TypeError, match=r"weight_decay_include should be a list of strings, but got <class 'str'>\."):
        get_param_groups(named, {"weight_decay_include": "*norm*"})
    with pytest.raises(TypeError, match=r"All items in weight_decay_exclude should be strings, but got <class 'int'>\."):
        get_param_groups(named, {"weight_decay_exclude": ["*norm*", 3]})


# --- Megatron wd extras -----------------------------------------------------------------------

def test_apply_wd_to_qk_layernorm_uses_megatron_predicate():
    spec = mla_moe_spec() + [("decoder.layers.0.self_attention.k_layernorm.weight", (8,))]
    by_name = groups_by_name(get_param_groups(make_params(spec), {"apply_wd_to_qk_layernorm": True}))
    a = "decoder.layers.0.self_attention"
    assert by_name[f"{a}.q_layernorm.weight"]["weight_decay"] == 0.01
    assert by_name[f"{a}.k_layernorm.weight"]["weight_decay"] == 0.01
    assert by_name[f"{a}.kv_layernorm.weight"]["weight_decay"] == 0.0   # 'kv_layernorm.' is not 'k_layernorm.'
    assert by_name["decoder.layers.0.input_layernorm.weight"]["weight_decay"] == 0.0


def test_rmsnorm_weight_decay_mult():
    spec = mla_moe_spec() + [("decoder.layers.0.self_attention.linear_qkv.bias", (8,))]
    cfg = {"weight_decay": 0.1, "rmsnorm_weight_decay_mult": 0.5, "apply_wd_to_qk_layernorm": True}
    groups = get_param_groups(make_params(spec), cfg)
    by_name = groups_by_name(groups)
    for name, shape in spec:
        g = by_name[name]
        if name.endswith("norm.weight"):                         # every RMSNorm gamma, q_layernorm too
            assert (g["wd_mult"], g["weight_decay"]) == (0.5, 0.1), name      # effective 0.05
        elif len(shape) == 1:
            assert g["weight_decay"] == 0.0, name
        else:
            assert g["weight_decay"] == 0.1, name
    assert len(groups) == 3
    rows = {l.split()[0]: l.split() for l in format_param_group_table(groups).splitlines()[1:len(spec) + 1]}
    assert rows["decoder.final_layernorm.weight"][4] == "0.05"          # the table shows the effective decay
    zero = groups_by_name(get_param_groups(make_params(spec), {"rmsnorm_weight_decay_mult": 0.0}))
    assert zero["decoder.final_layernorm.weight"]["weight_decay"] == 0.0


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_rmsnorm_weight_decay_mult_invalid(bad):
    with pytest.raises(ConfigError, match=r"optimizer.rmsnorm_weight_decay_mult: rmsnorm_weight_decay_mult "
                                          r"must be a finite nonnegative value"):
        get_param_groups(make_params(gpt_spec(1)), {"rmsnorm_weight_decay_mult": bad})


def test_decoupled_lr_for_embedding_and_output():
    spec = gpt_spec(num_layers=1)
    groups = get_param_groups(make_params(spec), {"decoupled_lr": 3e-4, "decoupled_min_lr": 3e-5})
    by_name = groups_by_name(groups)
    for name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        g = by_name[name]
        assert (g["max_lr"], g["min_lr"], g["weight_decay"]) == (3e-4, 3e-5, 0.01)
    assert all("max_lr" not in by_name[n] for n, _ in spec
               if n not in ("embedding.word_embeddings.weight", "output_layer.weight"))
    assert [g["name"] for g in groups] == ["max_lr=0.0003,min_lr=3e-05", "wd_mult=0", "default"]
    # attribute marker (Megatron's is_embedding_or_output_parameter) also selects
    named = make_params([("lm_head.weight", (V, H)), ("x.weight", (H, H))])
    named[0][1].is_embedding_or_output_parameter = True
    by_name = groups_by_name(get_param_groups(named, {"decoupled_lr": 1e-3}))
    assert by_name["lm_head.weight"]["max_lr"] == 1e-3 and "min_lr" not in by_name["lm_head.weight"]
    assert "max_lr" not in by_name["x.weight"]


def test_decoupled_min_lr_alone_is_an_error():
    with pytest.raises(ConfigError, match=r"optimizer.decoupled_min_lr: has no effect without optimizer.decoupled_lr"):
        get_standard_config_overrides({"decoupled_min_lr": 1e-5})


# --- overrides: merging, sharing, conflicts ---------------------------------------------------

def test_param_overrides_merge_with_standard_and_share_groups():
    spec = gpt_spec()
    cfg = {"weight_decay": 0.1, "param_overrides": [
        {"name": ["*linear_fc1*", "*linear_fc2*"], "ndim": 2, "lr_mult": 0.5},
        {"name": "*mlp.linear*", "lr_mult": 0.5},               # same value from a second key: fine
        {"ndim": 1, "betas": [0.9, 0.99], "eps": 1e-6},
    ]}
    groups = get_param_groups(make_params(spec), cfg)
    by_name = groups_by_name(groups)
    fc = by_name["decoder.layers.1.mlp.linear_fc2.weight"]
    assert (fc["lr_mult"], fc["weight_decay"], fc["wd_mult"]) == (0.5, 0.1, 1.0)
    assert by_name["decoder.layers.0.mlp.linear_fc1.weight"] is fc     # identical merges share a group
    norm = by_name["decoder.final_layernorm.weight"]
    assert (norm["wd_mult"], norm["betas"], norm["eps"], norm["lr_mult"]) == (0.0, (0.9, 0.99), 1e-6, 1.0)
    bias = by_name["decoder.layers.0.self_attention.linear_qkv.bias"]
    assert bias is norm
    assert by_name["embedding.word_embeddings.weight"] is by_name["output_layer.weight"]
    assert len(groups) == 3


def test_identical_merged_settings_share_one_group():
    named = make_params([("a.weight", (4, 4)), ("b.weight", (4, 4)), ("c.bias", (4,))])
    overrides = {ParamKey(name="a.*"): {"wd_mult": 1.0}, ParamKey(name="c.*"): {"lr_mult": 1}}
    groups = get_param_groups(named, {}, overrides)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.01   # {} == {wd_mult: 1} == {lr_mult: 1}


def test_conflicting_overrides_name_both_keys_and_the_parameter():
    named = make_params(gpt_spec(num_layers=1))
    cfg = {"param_overrides": [{"name": "*linear_fc1*", "lr_mult": 0.5},
                               {"name": "*mlp*", "ndim": 2, "lr_mult": 0.25}]}
    with pytest.raises(ValueError, match=(
            r"Conflicting overrides for parameter 'decoder.layers.0.mlp.linear_fc1.weight': lr_mult=0.5 from "
            r"ParamKey\(with_name_predicate=\[param_overrides\[0\]\(name=\['\*linear_fc1\*'\], ndim=None\)\]\) "
            r"and lr_mult=0.25 from ParamKey\(with_name_predicate=\[param_overrides\[1\]\(name=\['\*mlp\*'\], ndim=2\)\]\)")):
        get_param_groups(named, cfg)
    # explicit keys
    overrides = {ParamKey(name="*.bias"): {"wd_mult": 0.0}, ParamKey(attr="special"): {"wd_mult": 0.5}}
    named[3][1].special = True        # linear_qkv.bias
    with pytest.raises(ValueError, match=r"'decoder.layers.0.self_attention.linear_qkv.bias': wd_mult=0.0 from "
                                         r"ParamKey\(name=\['\*.bias'\]\) and wd_mult=0.5 from ParamKey\(attr=\['special'\]\)"):
        get_param_groups(named, ADAMW, overrides)


def test_lr_mult_with_max_lr_is_a_conflict():
    named = make_params(gpt_spec(num_layers=1))
    cfg = {"decoupled_lr": 1e-3, "param_overrides": [{"name": "output_layer.weight", "lr_mult": 2.0}]}
    with pytest.raises(ValueError, match=r"parameter 'output_layer.weight': lr_mult=2.0 from .*param_overrides\[0\].* "
                                         r"and max_lr=0.001 from ParamKey\(name=.*a group follows either"):
        get_param_groups(named, cfg)


def test_explicit_empty_overrides_mean_no_overrides():
    spec = gpt_spec(num_layers=1)
    groups = get_param_groups(make_params(spec), {"weight_decay": 0.1}, {})
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.1 and len(groups[0]["params"]) == len(spec)


def test_no_selector_data_leaks_into_groups():
    spec = mla_moe_spec()
    cfg = {"type": "Muon", "weight_decay": 0.1, "decoupled_lr": 1e-3, "mup": {"base_hidden_size": 4},
           "weight_decay_exclude": ["router"], "param_overrides": [{"ndim": 1, "betas": [0.9, 0.95]}]}
    groups = get_param_groups(make_params(spec), cfg, hidden_size=H)
    allowed = {"params", "lr_mult", "weight_decay", "wd_mult", "max_lr", "min_lr", "eps", "betas",
               "optimizer", "name"}

    def plain(value):
        if isinstance(value, (list, tuple)):
            return all(plain(v) for v in value)
        return isinstance(value, (float, str, Parameter)) and not isinstance(value, bool)
    for g in groups:
        assert set(g) <= allowed and type(g) is dict
        assert all(plain(v) for v in g.values()), g
        assert all(isinstance(p, Parameter) for p in g["params"])


def test_group_table_identical_across_constructions():
    spec = mla_moe_spec()
    cfg = {"type": "Muon", "weight_decay": 0.1, "mup": {"base_hidden_size": 4},
           "param_overrides": [{"name": "*router*", "wd_mult": 0.0}]}
    first = get_param_groups(make_params(spec), cfg, hidden_size=H)
    second = get_param_groups(build_cell(spec), cfg, hidden_size=H)      # fresh objects, Cell path
    t1, t2 = format_param_group_table(first), format_param_group_table(second)
    assert t1 == t2
    strip = lambda gs: [{k: v for k, v in g.items() if k != "params"} for g in gs]
    assert strip(first) == strip(second)
    assert param_group_map(first) == param_group_map(second)


# --- param_overrides validation ---------------------------------------------------------------

@pytest.mark.parametrize("entries, match", [
    ({"name": "x"}, r"optimizer.param_overrides: must be a list of entries, got dict"),
    (["x"], r"optimizer.param_overrides\[0\]: must be a mapping, got str"),
    ([{"name": "*", "lr_multt": 1.0}], r"optimizer.param_overrides\[0\].lr_multt: unknown key; valid keys: \['name', 'ndim', 'lr_mult'"),
    ([{"lr_mult": 2.0}], r"optimizer.param_overrides\[0\]: needs 'name' and/or 'ndim' to select parameters"),
    ([{"name": "*"}], r"optimizer.param_overrides\[0\]: sets nothing; give at least one of \['lr_mult'"),
    ([{"name": [], "lr_mult": 1.0}], r"optimizer.param_overrides\[0\].name: must be a glob string or a non-empty list"),
    ([{"name": [1], "lr_mult": 1.0}], r"optimizer.param_overrides\[0\].name: must be a glob string"),
    ([{"ndim": -1, "lr_mult": 1.0}], r"optimizer.param_overrides\[0\].ndim: must be a non-negative integer, got -1"),
    ([{"ndim": True, "lr_mult": 1.0}], r"optimizer.param_overrides\[0\].ndim: must be a non-negative integer, got True"),
    ([{"ndim": 2, "lr_mult": -1.0}], r"optimizer.param_overrides\[0\]: lr_mult=-1.0 must be >= 0\."),
    ([{"ndim": 2, "eps": 0.0}], r"optimizer.param_overrides\[0\]: eps=0.0 must be > 0\."),
    ([{"ndim": 2, "max_lr": 1e-4, "min_lr": 1e-3}], r"optimizer.param_overrides\[0\]: min_lr=0.001 must be <= max_lr=0.0001\."),
    ([{"ndim": 2, "betas": [0.9]}], r"optimizer.param_overrides\[0\]: betas=\[0.9\] must be two numbers in \[0, 1\)\."),
    ([{"ndim": 2, "weight_decay": float("nan")}], r"optimizer.param_overrides\[0\]: weight_decay=nan must be a finite number\."),
    ([{"ndim": 2, "optimizer": "adafactor"}], r"optimizer.param_overrides\[0\]: optimizer='adafactor' is not one of \['adamw', 'muon', 'sgd', 'lion'\]\."),
    ([{"ndim": 2, "optimizer": "muon"}], r"optimizer.param_overrides\[0\]: optimizer='muon' cannot be used with this optimizer type; allowed: \['adamw'\]\."),
])
def test_param_overrides_errors(entries, match):
    with pytest.raises(ConfigError, match=match):
        get_param_groups(make_params(gpt_spec(1)), {"type": "AdamW", "param_overrides": entries})


def test_param_override_matching_nothing_warns():
    with pytest.warns(UserWarning, match=r"optimizer.param_overrides\[0\]\(name=\['\*nope\*'\], ndim=2\) matches no trainable"):
        get_param_groups(make_params(gpt_spec(1)), {"param_overrides": [{"name": "*nope*", "ndim": 2, "lr_mult": 2}]})


# --- explicit overrides consistency -----------------------------------------------------------

@pytest.mark.parametrize("overrides, exc, match", [
    ([1], TypeError, r"config_overrides must be a dict of ParamKey -> ParamGroupOverride, but got list\."),
    ({"*.bias": {"wd_mult": 0.0}}, TypeError, r"config_overrides keys must be ParamKey, but got str: '\*.bias'\."),
    ({ParamKey(name="*"): [("wd_mult", 0.0)]}, TypeError, r"override for ParamKey\(name=\['\*'\]\) must be a dict, but got list\."),
    ({ParamKey(name="*"): {"lr": 1.0}}, ValueError, r"ParamKey\(name=\['\*'\]\): lr is not an override field; valid fields: \['lr_mult'"),
    ({ParamKey(name="*"): {"wd_mult": -1}}, ValueError, r"ParamKey\(name=\['\*'\]\): wd_mult=-1 must be >= 0\."),
    ({ParamKey(name="*"): {"lr_mult": True}}, ValueError, r"lr_mult=True must be a finite number\."),
    ({ParamKey(name="*"): {"betas": (0.9, 1.0)}}, ValueError, r"betas=\(0.9, 1.0\) must be two numbers in \[0, 1\)\."),
    ({ParamKey(name="*"): {"optimizer": "lion"}}, ValueError, r"optimizer='lion' cannot be used with this optimizer type; allowed: \['adamw'\]\."),
])
def test_check_config_overrides_consistency_errors(overrides, exc, match):
    with pytest.raises(exc, match=match):
        check_config_overrides_consistency(ADAMW, overrides)
    with pytest.raises(exc, match=match):
        get_param_groups(make_params(gpt_spec(1)), ADAMW, overrides)


def test_check_config_overrides_consistency_accepts_valid():
    assert check_config_overrides_consistency(ADAMW, None) is True
    ok = {ParamKey(name="*"): {"lr_mult": 2, "wd_mult": 0.0, "betas": [0.9, 0.99], "eps": 1e-6,
                               "max_lr": 1e-3, "min_lr": 0.0, "weight_decay": 0.0, "optimizer": "AdamW"}}
    assert check_config_overrides_consistency(ADAMW, ok) is True
    assert check_config_overrides_consistency({"type": "Muon"}, {ParamKey(name="*"): {"optimizer": "adamw"}})
    assert check_config_overrides_consistency({"type": "SGD"}, {ParamKey(name="*"): {"optimizer": "sgd"}})


# --- ParamKey semantics: predicates compare by name ------------------------------------------------------

def test_predicates_hash_and_compare_by_name_only():
    a = ParamPredicate(name="s1", fn=lambda p: len(p.shape) == 1)
    b = ParamPredicate(name="s1", fn=lambda p: False)
    assert a == b and {a, b} == {a}
    w = ParamWithNamePredicate(name="s1_not_qkln", fn=lambda p, n: (
        len(p.shape) == 1 or n.endswith(".bias")) and not ("q_layernorm." in n or "k_layernorm." in n))
    v = Parameter(Tensor(np.zeros(10, np.float32)), name="x")
    assert a(v) and w(v, "interesting.bias") and not w(v, "interesting.q_layernorm.bias")
    assert ParamKey(predicate=a) == ParamKey(predicate=b)
    assert hash(ParamKey(name=["a", "b"])) == hash(ParamKey(name=("a", "b")))   # lists normalised


def test_param_key_any_match_counts():
    p2 = Parameter(Tensor(np.zeros((2, 3), np.float32)), name="m")
    p1 = Parameter(Tensor(np.zeros(3, np.float32)), name="v")
    p1.flagged = True
    key = ParamKey(name=("*.bias", "decoder.*.weight"), attr="flagged",
                   predicate=ParamPredicate("is_3d", lambda p: len(p.shape) == 3),
                   with_name_predicate=(ParamWithNamePredicate("embed", lambda p, n: "embed" in n),))
    assert key.matches(p2, "decoder.layers.0.linear.weight")     # fnmatch
    assert key.matches(p2, "x.bias")
    assert not key.matches(p2, "Decoder.layers.0.linear.weight")  # case-sensitive
    assert key.matches(p1, "anything")                            # attribute
    assert key.matches(p2, "embedding.word_embeddings.weight")    # with-name predicate
    assert not key.matches(p2, "output_layer.weight")
    assert not ParamKey().matches(p2, "x")
    assert key.describe() == ("ParamKey(name=['*.bias', 'decoder.*.weight'], attr=['flagged'], "
                              "predicate=[is_3d], with_name_predicate=[embed])")


# --- table ------------------------------------------------------------------------------------

def test_format_param_group_table_columns_and_file(tmp_path):
    spec = gpt_spec(num_layers=1)
    groups = get_param_groups(make_params(spec), {"decoupled_lr": 1e-3, "weight_decay": 0.1})
    buf = io.StringIO()
    path = tmp_path / "groups.txt"
    text = format_param_group_table(groups, file=buf)
    assert format_param_group_table(groups, file=str(path)) == text == buf.getvalue() == path.read_text()
    lines = text.splitlines()
    assert lines[0].split() == ["name", "shape", "group", "lr", "weight_decay", "optimizer"]
    rows = {l.split()[0]: l.split() for l in lines[1:len(spec) + 1]}
    assert rows["embedding.word_embeddings.weight"] == ["embedding.word_embeddings.weight", "32x8", "0",
                                                        "max_lr=0.001", "0.1", "-"]
    assert rows["decoder.layers.0.input_layernorm.weight"][1:] == ["8", "1", "lr_mult=1", "0", "-"]
    assert rows["decoder.layers.0.mlp.linear_fc1.weight"][1:] == ["32x8", "2", "lr_mult=1", "0.1", "-"]
    assert "group 1 (wd_mult=0): 4 params" in text
