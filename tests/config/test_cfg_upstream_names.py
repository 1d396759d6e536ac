"""`model:` in both naming schemes (config/compat/upstream_names.py) and upstream-only model keys."""
import os

import pytest

from mindformers_core.config import ConfigError
from mindformers_core.config.model import ModelConfig
from mindformers_core.config.run_config import load_config
from mindformers_core.config.compat.upstream_names import MODEL_ALIASES, UPSTREAM_ONLY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UPSTREAM = os.path.join(ROOT, "tests", "fixtures", "upstream_yaml")

UPSTREAM_DS3 = {"model_type": "deepseek_v3", "architectures": "DeepseekV3ForCausalLM",
                "num_hidden_layers": 3, "intermediate_size": 96, "rms_norm_eps": 1e-5,
                "hidden_act": "silu", "qk_layernorm": True, "moe_grouped_gemm": True,
                "max_position_embeddings": 64, "attention_dropout": 0.0}
PROJECT_DS3 = {"model_type": "deepseek_v3", "num_layers": 3, "ffn_hidden_size": 96,
               "norm_epsilon": 1e-5}


def load(d):
    return ModelConfig.from_dict(d, "model")


def test_both_schemes_give_one_canonical_config():
    up, mine = load(UPSTREAM_DS3), load(PROJECT_DS3)
    assert (up.num_layers, up.ffn_hidden_size, up.norm_epsilon) == (3, 96, 1e-5)
    for name in ("num_layers", "ffn_hidden_size", "norm_epsilon", "hidden_size", "vocab_size"):
        assert getattr(up, name) == getattr(mine, name)


def test_to_dict_writes_the_users_scheme_back_and_reloads_equal():
    up = load(UPSTREAM_DS3)
    d = up.to_dict()
    assert d["num_hidden_layers"] == 3 and "num_layers" not in d
    assert d["intermediate_size"] == 96 and "ffn_hidden_size" not in d
    assert d["rms_norm_eps"] == 1e-5 and "norm_epsilon" not in d
    assert d["architectures"] == "DeepseekV3ForCausalLM" and d["moe_grouped_gemm"] is True
    assert load(d) == up and load(d).to_dict() == d
    mine = load(PROJECT_DS3).to_dict()
    assert mine["num_layers"] == 3 and "num_hidden_layers" not in mine
    assert not set(UPSTREAM_ONLY) & set(mine)


def test_mixed_schemes_load():
    cfg = load({"num_hidden_layers": 3, "ffn_hidden_size": 96})
    assert (cfg.num_layers, cfg.ffn_hidden_size) == (3, 96)
    assert set(cfg.to_dict()) >= {"num_hidden_layers", "ffn_hidden_size"}


@pytest.mark.parametrize("upstream,mine", [("num_hidden_layers", "num_layers"),
                                           ("intermediate_size", "ffn_hidden_size"),
                                           ("rms_norm_eps", "norm_epsilon"),
                                           ("num_key_value_heads", "num_query_groups")])
def test_both_spellings_of_one_field_is_an_error(upstream, mine):
    value = 1e-5 if mine == "norm_epsilon" else 2
    with pytest.raises(ConfigError, match=rf"^model\.{upstream}: sets the same field as "
                                          rf"'{mine}' \(upstream and project spelling"):
        load({upstream: value, mine: value})


def test_aliases_target_declared_or_upstream_only_fields():
    fields = set(ModelConfig.field_names())
    for upstream, canonical in MODEL_ALIASES.items():
        assert upstream not in fields
        assert canonical in fields or canonical in UPSTREAM_ONLY


def test_unknown_key_hint_covers_both_schemes():
    with pytest.raises(ConfigError, match=r"^model\.num_hiden_layers: unknown key; .*did you "
                                          r"mean 'num_hidden_layers'\?"):
        load({"num_hiden_layers": 2})
    with pytest.raises(ConfigError, match=r"^model\.num_layer: unknown key; .*did you mean "
                                          r"'num_layers'\?"):
        load({"num_layer": 2})


@pytest.mark.parametrize("key,value,feature", [
    ("hidden_dropout", 0.1, "hidden dropout"),
    ("attention_dropout", 0.5, "attention dropout"),
    ("add_bias_linear", True, "biases in the linear layers"),
    ("gated_linear_unit", False, "a non-gated MLP"),
    ("hidden_act", "gelu", "an MLP activation other than SwiGLU"),
    ("softmax_compute_dtype", "bfloat16", "a non-float32 softmax"),
])
def test_feature_values_are_refused_naming_the_field(key, value, feature):
    assert key not in ModelConfig.field_names()   # a key that became a field leaves this list
    with pytest.raises(ConfigError, match=rf"^model\.{key}: {value!r} needs {feature}.*not "
                                          rf"implemented here; only the no-op value"):
        load({"model_type": "deepseek_v3", key: value})


def test_upstream_only_type_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"^model\.hidden_dropout: expected a number, got str"):
        load({"hidden_dropout": "none"})
    with pytest.raises(ConfigError, match=r"^model\.max_position_embeddings: must be >= 1"):
        load({"max_position_embeddings": 0})


def test_architectures_must_describe_model_type():
    assert load({"model_type": "gpt", "architectures": "LlamaForCausalLM"}).model_type == "gpt"
    with pytest.raises(ConfigError, match=r"^model\.architectures: 'Qwen3ForCausalLM' does not "
                                          r"describe model_type 'deepseek_v3'"):
        load({"model_type": "deepseek_v3", "architectures": "Qwen3ForCausalLM"})


def test_qk_layernorm_is_mla_latent_norm_or_per_head_qk_norm():
    assert load({"model_type": "deepseek_v3", "qk_layernorm": True}).resolved_qk_layernorm()
    assert load({"model_type": "deepseek_v3"}).resolved_qk_layernorm()
    with pytest.raises(ConfigError, match=r"^model\.qk_layernorm: False needs MLA without "
                                          r"latent norms"):
        load({"model_type": "deepseek_v3", "qk_layernorm": False})
    # standard attention: Qwen3's per-head q/k RMSNorm, off unless asked for (or qwen3)
    assert load({"model_type": "gpt", "qk_layernorm": True}).resolved_qk_layernorm()
    assert not load({"model_type": "gpt"}).resolved_qk_layernorm()



def test_scaling_factor_older_spelling():
    cfg = load({"scaling_factor": 40})
    assert cfg.to_dict()["scaling_factor"] == 40.0 and "rotary_scaling_factor" not in cfg.to_dict()
    with pytest.raises(ConfigError, match=r"^model\.scaling_factor: sets the same field as "
                                          r"'rotary_scaling_factor'"):
        load({"scaling_factor": 40, "rotary_scaling_factor": 40})


def test_upstream_file_round_trips_in_its_scheme():
    cfg = load_config(os.path.join(UPSTREAM, "master_monitor_test.yaml"))
    d = cfg.to_dict()
    assert d["model"]["num_hidden_layers"] == 2 and "num_layers" not in d["model"]
    assert "dataloader" in d["train_dataset"] and "monitor" in d
    assert "profiler" not in d and "callbacks" not in d     # not written by the user
    assert load_config(d) == cfg
    assert load_config(d).to_dict() == d


def test_override_sets_the_spelling_the_file_uses():
    base = {"training": {"steps": 10}, "optimizer": {"type": "AdamW"},
            "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3,
                             "warmup_steps": 0}}
    up = load_config({**base, "model": {"num_hidden_layers": 3}},
                     overrides=["model.num_layers=5"])
    assert up.model.num_layers == 5 and up.model.to_dict()["num_hidden_layers"] == 5
    mine = load_config({**base, "model": {"num_layers": 3}},
                       overrides=["model.num_hidden_layers=4"])
    assert mine.model.num_layers == 4 and "num_hidden_layers" not in mine.model.to_dict()
    fresh = load_config({**base, "model": {}}, overrides=["model.rms_norm_eps=1e-5"])
    assert fresh.model.to_dict()["rms_norm_eps"] == 1e-5
