"""`model:` section: defaults, derived values, presets, and every validation message."""
import os

import pytest

from mindformers_core.errors import ConfigError
from mindformers_core.config.model import ModelConfig
from mindformers_core.config.yaml_io import load_yaml_text


def load_yaml(path):
    with open(path) as f:
        return load_yaml_text(f.read())

PRESETS = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "model_presets")


def load(**kw):
    return ModelConfig.from_dict(kw, "model")


def test_defaults_and_derived_values():
    cfg = load()
    assert cfg.model_type == "gpt" and not cfg.resolved_multi_latent_attention()
    assert cfg.resolved_num_query_groups() == cfg.num_attention_heads
    assert cfg.resolved_ffn_hidden_size() == 4 * cfg.hidden_size
    ds = load(model_type="deepseek_v3")
    assert ds.resolved_multi_latent_attention()
    assert ds.resolved_moe_intermediate_size() == 2 * ds.hidden_size
    assert load(**ds.to_dict()) == ds


@pytest.mark.parametrize("name", ["tiny_gpt.yaml", "tiny_deepseek_v3.yaml", "deepseek_v3_671b.yaml"])
def test_presets_validate(name):
    data = load_yaml(os.path.join(PRESETS, name))
    cfg = ModelConfig.from_dict(data["model"], "model")
    if "deepseek" in name:
        assert cfg.resolved_multi_latent_attention()


def test_full_size_preset_numbers():
    cfg = ModelConfig.from_dict(load_yaml(os.path.join(PRESETS, "deepseek_v3_671b.yaml"))["model"], "model")
    assert (cfg.hidden_size, cfg.num_layers, cfg.n_routed_experts, cfg.num_experts_per_tok) == (7168, 61, 256, 8)
    assert cfg.params_dtype == "bfloat16" and cfg.moe_intermediate_size == 2048


@pytest.mark.parametrize("kw, match", [
    (dict(hidden_size=0), r"^model\.hidden_size: must be >= 1, got 0"),
    (dict(vocab_size=-1), r"^model\.vocab_size: must be >= 1"),
    (dict(num_layers=0), r"^model\.num_layers: must be >= 1"),
    (dict(q_lora_rank=0, model_type="deepseek_v3"), r"^model\.q_lora_rank: must be >= 1"),
    (dict(kv_lora_rank=0), r"^model\.kv_lora_rank: must be >= 1"),
    (dict(moe_intermediate_size=0), r"^model\.moe_intermediate_size: must be >= 1"),
    (dict(n_shared_experts=-1), r"^model\.n_shared_experts: must be >= 0"),
    (dict(initializer_range=0.0), r"^model\.initializer_range: must be > 0"),
    (dict(norm_epsilon=0.0), r"^model\.norm_epsilon: must be > 0"),
    (dict(rope_theta=-1.0), r"^model\.rope_theta: must be > 0"),
    (dict(routed_scaling_factor=0.0), r"^model\.routed_scaling_factor: must be > 0"),
    (dict(moe_router_bias_update_rate=-1e-3), r"^model\.moe_router_bias_update_rate: must be >= 0"),
    (dict(moe_aux_loss_coeff=-1.0), r"^model\.moe_aux_loss_coeff: must be >= 0"),
    (dict(hidden_size=64, num_attention_heads=5), r"^model\.num_attention_heads: must divide hidden_size \(64\), got 5"),
    (dict(hidden_size=12, num_attention_heads=4), r"^model\.hidden_size: hidden_size / num_attention_heads must be even"),
    (dict(num_attention_heads=4, num_query_groups=3), r"^model\.num_query_groups: must divide num_attention_heads \(4\), got 3"),
    (dict(model_type="deepseek_v3", qk_rope_head_dim=5), r"^model\.qk_rope_head_dim: must be even"),
    (dict(model_type="deepseek_v3", first_k_dense_replace=3, num_layers=2), r"^model\.first_k_dense_replace: must be in \[0, 2\], got 3"),
    (dict(model_type="deepseek_v3", n_routed_experts=2, num_experts_per_tok=3), r"^model\.num_experts_per_tok: must be <= n_routed_experts \(2\), got 3"),
    (dict(model_type="llama"),
     r"^model\.model_type: must be one of \['gpt', 'deepseek_v3', 'qwen3'\]"),
    (dict(params_dtype="fp8"), r"^model\.params_dtype: must be one of"),
    (dict(n_routed_expert=4), r"^model\.n_routed_expert: unknown key.*did you mean 'n_routed_experts'"),
])
def test_validation_messages_name_the_field(kw, match):
    with pytest.raises(ConfigError, match=match):
        load(**kw)


def test_build_model_accepts_dict_and_reports_config_errors():
    from mindformers_core.models import build_model
    with pytest.raises(ConfigError, match=r"^model\.hidden_size"):
        build_model({"hidden_size": 0})
    assert build_model({"num_layers": 1}).cfg.num_layers == 1
