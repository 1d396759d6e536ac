"""``model_type: qwen3`` in the `model:` section (config/model_types.py, config/model.py):
upstream's defaults, the user's keys over them, both spellings of the head dim, the checks."""
import os

import pytest
import yaml

from mindformers_core.config import ConfigError
from mindformers_core.config.model import ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: upstream MindFormers' Qwen3Config defaults (mindformers/models/qwen3/configuration_qwen3.py,
#: seq_length from its register_mf_model_parameter), in upstream's names
UPSTREAM_QWEN3 = {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                  "head_dim": 128, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                  "tie_word_embeddings": False, "rope_theta": 10000.0, "seq_length": 4096,
                  "initializer_range": 0.02}


def load(d):
    return ModelConfig.from_dict(d, "model")


def test_defaults_are_upstreams_qwen3():
    c = load({"model_type": "qwen3", "architectures": "Qwen3ForCausalLM"})
    got = {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
           "intermediate_size": c.resolved_ffn_hidden_size(), "num_hidden_layers": c.num_layers,
           "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.resolved_num_query_groups(),
           "head_dim": c.resolved_kv_channels(),
           "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.norm_epsilon,
           "tie_word_embeddings": c.tie_word_embeddings, "rope_theta": c.rope_theta,
           "seq_length": c.seq_length, "initializer_range": c.initializer_range}
    assert got == UPSTREAM_QWEN3
    assert c.resolved_qk_layernorm() and not c.resolved_multi_latent_attention()
    # the other model types keep the field defaults
    assert load({}).vocab_size == 256 and load({"model_type": "deepseek_v3"}).hidden_size == 64
    assert not load({}).resolved_qk_layernorm() and load({}).resolved_kv_channels() == 16


def test_users_keys_win_over_the_type_defaults():
    c = load({"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 2,
              "qk_layernorm": False, "num_hidden_layers": 2})
    assert (c.hidden_size, c.num_attention_heads, c.num_layers) == (64, 2, 2)
    assert not c.resolved_qk_layernorm()
    assert c.resolved_kv_channels() == 128 and c.resolved_num_query_groups() == 2
    assert c.vocab_size == 151936


def test_to_dict_writes_the_users_spelling_back():
    up = load({"model_type": "qwen3", "head_dim": 8, "num_hidden_layers": 2,
               "rms_norm_eps": 1e-5, "architectures": "Qwen3ForCausalLM"})
    d = up.to_dict()
    assert d["head_dim"] == 8 and "kv_channels" not in d
    assert d["num_hidden_layers"] == 2 and d["rms_norm_eps"] == 1e-5
    assert d["model_type"] == "qwen3" and d["architectures"] == "Qwen3ForCausalLM"
    assert d["qk_layernorm"] is None      # derived from model_type (ModelConfig built in code too)
    assert ModelConfig(model_type="qwen3").resolved_qk_layernorm()
    assert load(d) == up and load(d).to_dict() == d
    mine = load({"model_type": "qwen3", "kv_channels": 8}).to_dict()
    assert mine["kv_channels"] == 8 and "head_dim" not in mine


def test_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"^model\.head_dim: sets the same field as "
                                          r"'kv_channels'"):
        load({"head_dim": 8, "kv_channels": 8})
    with pytest.raises(ConfigError, match=r"^model\.kv_channels: must be even for rotary "
                                          r"embeddings, got 7"):
        load({"model_type": "qwen3", "kv_channels": 7})
    with pytest.raises(ConfigError, match=r"^model\.kv_channels: must be >= 1"):
        load({"kv_channels": 0})
    with pytest.raises(ConfigError, match=r"^model\.qk_layernorm: expected a bool"):
        load({"qk_layernorm": "yes"})
    with pytest.raises(ConfigError, match=r"^model\.architectures: 'LlamaForCausalLM' does not "
                                          r"describe model_type 'qwen3' \(expected one of "
                                          r"\['Qwen3ForCausalLM'\]\)"):
        load({"model_type": "qwen3", "architectures": "LlamaForCausalLM"})
    with pytest.raises(ConfigError, match=r"^model\.architectures: 'Qwen3ForCausalLM' does not "
                                          r"describe model_type 'gpt'"):
        load({"model_type": "gpt", "architectures": "Qwen3ForCausalLM"})
    with pytest.raises(ConfigError, match=r"^model\.model_type: .*'qwen3'"):
        load({"model_type": "qwen2"})


def test_explicit_head_dim_frees_hidden_from_the_head_count():
    c = load({"hidden_size": 30, "num_attention_heads": 4, "kv_channels": 8})
    assert c.resolved_kv_channels() == 8
    with pytest.raises(ConfigError, match=r"^model\.num_attention_heads: must divide "
                                          r"hidden_size \(30\), got 4"):
        load({"hidden_size": 30, "num_attention_heads": 4})


@pytest.mark.parametrize("name", ["master_train_config.yaml", "r1.9.0_train_config.yaml"])
def test_upstream_train_config_model_is_the_default_qwen3(name):
    with open(os.path.join(ROOT, "tests", "fixtures", "upstream_yaml", name)) as fh:
        section = yaml.safe_load(fh)["model"]
    c = load(section)
    assert c.model_type == "qwen3" and c.hidden_size == 4096 and c.resolved_qk_layernorm()
    assert c.to_dict()["architectures"] == "Qwen3ForCausalLM"
