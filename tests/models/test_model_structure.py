"""Parameter names (Megatron-style, docs/architecture.md "Models"), 2-D / 3-D shapes, and the optimizer metadata."""
import mindspore as ms
from mindspore import nn

from mindformers_core.models import GPTTransformerConfig, build_model
from model_test_utils import tiny_dsv3, tiny_gpt


def shapes(model):
    return {p.name: tuple(p.shape) for p in model.get_parameters()}


def test_gpt_names_and_shapes_gqa():
    cfg = tiny_gpt(num_query_groups=2)       # H=16, heads 4 (d=4), groups 2, F=24, V=32
    model = build_model(cfg, seed=0)
    assert isinstance(model, nn.Cell)
    want = {"embedding.word_embeddings.weight": (32, 16),
            "decoder.final_layernorm.weight": (16,),
            "output_layer.weight": (32, 16)}
    for i in range(2):
        L = f"decoder.layers.{i}."
        want.update({
            L + "input_layernorm.weight": (16,),
            L + "self_attention.linear_qkv.weight": ((4 + 2 * 2) * 4, 16),
            L + "self_attention.linear_proj.weight": (16, 16),
            L + "pre_mlp_layernorm.weight": (16,),
            L + "mlp.linear_fc1.weight": (48, 16),
            L + "mlp.linear_fc2.weight": (16, 24),
        })
    assert shapes(model) == want
    assert sorted(p.name for p in model.trainable_params()) == sorted(want)  # all trainable


def test_tied_embeddings_has_no_output_layer():
    names = shapes(build_model(tiny_gpt(tie_word_embeddings=True), seed=0))
    assert "output_layer.weight" not in names and "embedding.word_embeddings.weight" in names


def test_deepseek_v3_names_and_shapes():
    cfg = tiny_dsv3()   # H=16, heads 2, q_lora 8, kv_lora 8, dn=dr=dv=4, E=4, moe F=6, dense F=24
    got = shapes(build_model(cfg, seed=0))
    a = "decoder.layers.{}.self_attention."
    for i in range(2):
        assert got[a.format(i) + "linear_q_down_proj.weight"] == (8, 16)
        assert got[a.format(i) + "q_layernorm.weight"] == (8,)
        assert got[a.format(i) + "linear_q_up_proj.weight"] == (2 * 8, 8)
        assert got[a.format(i) + "linear_kv_down_proj.weight"] == (8 + 4, 16)
        assert got[a.format(i) + "kv_layernorm.weight"] == (8,)
        assert got[a.format(i) + "linear_kv_up_proj.weight"] == (2 * 8, 8)
        assert got[a.format(i) + "linear_proj.weight"] == (16, 2 * 4)
    assert got["decoder.layers.0.mlp.linear_fc1.weight"] == (48, 16)      # dense first layer
    m = "decoder.layers.1.mlp."
    assert got[m + "router.weight"] == (4, 16)
    assert got[m + "router.expert_bias"] == (4,)
    assert got[m + "experts.weight1"] == (4, 16, 12)                      # [E, H, 2F]
    assert got[m + "experts.weight2"] == (4, 6, 16)                       # [E, F, H]
    assert got[m + "shared_experts.linear_fc1.weight"] == (12, 16)
    assert got[m + "shared_experts.linear_fc2.weight"] == (16, 6)
    assert "decoder.layers.1.mlp.linear_fc1.weight" not in got
    three_d = sorted(n for n, s in got.items() if len(s) == 3)
    assert three_d == [m + "experts.weight1", m + "experts.weight2"]


def test_no_q_lora_uses_linear_q_proj():
    got = shapes(build_model(tiny_dsv3(q_lora_rank=None), seed=0))
    assert got["decoder.layers.0.self_attention.linear_q_proj.weight"] == (16, 16)
    assert not any("q_down" in n or "q_layernorm" in n for n in got)


def test_transformer_config_metadata():
    ds = build_model(tiny_dsv3(), seed=0)
    tc = ds.get_gpt_transformer_config()
    assert isinstance(tc, GPTTransformerConfig)
    assert tc.multi_latent_attention is True and ds.is_legacy_model() is False
    assert (tc.num_attention_heads, tc.q_lora_rank, tc.kv_lora_rank, tc.qk_head_dim,
            tc.qk_pos_emb_head_dim, tc.v_head_dim, tc.hidden_size, tc.num_layers) == (2, 8, 8, 4, 4, 4, 16, 2)
    assert (tc.num_moe_experts, tc.moe_router_topk, tc.moe_ffn_hidden_size) == (4, 2, 6)
    gpt = build_model(tiny_gpt(), seed=0)
    tc = gpt.get_gpt_transformer_config()
    assert tc.multi_latent_attention is False and gpt.is_legacy_model() is False
    assert tc.kv_channels == 4 and tc.num_moe_experts is None

