"""Names against upstream PyNative DeepSeek-V3 (MindFormers, mla_qkv_concat): the expert bias
at ``decoder.layers.N.mlp.expert_bias`` and the MTP layer's attention under the fused
``linear_qkv`` / ``linear_qb`` / ``linear_kvb`` / ``k_layernorm`` names. An upstream-named state
dict, built by hand from a tiny DeepSeek-V3 with one MTP layer, converts to this project's
weights exactly, and back."""
import numpy as np
import pytest

from mindformers_core.checkpoint.weight_names import from_native, to_native
from mindformers_core.config import load_config
from mindformers_core.models import build_model
from mindformers_core.tools.convert_weights import load_into_model, model_tensors


@pytest.fixture(scope="module")
def tiny():
    cfg = load_config("configs/muon_deepseek_v3_tiny.yaml",
                      overrides=["model.num_nextn_predict_layers=1"]).model
    model = build_model(cfg, seed=0)
    rng = np.random.default_rng(0)
    w = {k: rng.standard_normal(v.shape).astype(np.float32)
         for k, v in model_tensors(model).items()}
    return cfg, model, w


def upstream_names(w):
    """The state dict as upstream's PyNative DeepSeek-V3 names it (written out here by hand,
    independently of the converter's tables)."""
    out = {}
    attn_layers = sorted({k.split("self_attention.")[0] for k in w if "self_attention." in k})
    for layer in attn_layers:
        a = layer + "self_attention."
        out[a + "linear_qkv.weight"] = np.concatenate(
            [w[a + "linear_q_down_proj.weight"], w[a + "linear_kv_down_proj.weight"]], axis=0)
        out[a + "linear_qb.weight"] = w[a + "linear_q_up_proj.weight"]
        out[a + "linear_kvb.weight"] = w[a + "linear_kv_up_proj.weight"]
        out[a + "k_layernorm.weight"] = w[a + "kv_layernorm.weight"]
        out[a + "q_layernorm.weight"] = w[a + "q_layernorm.weight"]
        out[a + "linear_proj.weight"] = w[a + "linear_proj.weight"]
    for k, v in w.items():
        if "self_attention." in k:
            continue
        out[k.replace("mlp.router.expert_bias", "mlp.expert_bias")] = v
    return out


def test_upstream_pynative_names_convert_exactly_both_ways(tiny):
    cfg, model, w = tiny
    up = upstream_names(w)
    assert "decoder.layers.1.mlp.expert_bias" in up
    assert "mtp.layers.0.transformer_layer.self_attention.linear_qkv.weight" in up
    assert "mtp.layers.0.transformer_layer.mlp.expert_bias" in up
    native = to_native(up, "mindformers", cfg)
    assert sorted(native) == sorted(w)
    for k in w:
        np.testing.assert_array_equal(native[k], w[k], err_msg=k)
    load_into_model(model, native)    # the names are the model's: no KeyError
    back = from_native(w, "mindformers", cfg)
    assert sorted(back) == sorted(up)
    for k in up:
        np.testing.assert_array_equal(back[k], up[k], err_msg=k)


def test_this_projects_expert_bias_name_is_read_too(tiny):
    cfg, _, w = tiny
    up = upstream_names(w)
    up["decoder.layers.1.mlp.router.expert_bias"] = up.pop("decoder.layers.1.mlp.expert_bias")
    native = to_native(up, "mindformers", cfg)
    np.testing.assert_array_equal(native["decoder.layers.1.mlp.router.expert_bias"],
                                  w["decoder.layers.1.mlp.router.expert_bias"])
