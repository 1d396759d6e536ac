"""convert_weights: round trips on tiny random weights, layouts against explicit indexing, and
an HF-style safetensors file that gives the native logits; DeepSeek-V3's rope rows against a
numpy reference of HF's interleaved RoPE; HF Qwen3 weights against a numpy Qwen3 forward."""
import numpy as np
import pytest
import mindspore as ms

from mindformers_core.config.model import ModelConfig
from mindformers_core.models import build_model
from mindformers_core.checkpoint.weight_names import (from_native, grouped_qkv_order,
                                                      rope_half_order, to_native)
from mindformers_core.tools.convert_weights import load_into_model, main, model_tensors

GPT = {"model_type": "gpt", "vocab_size": 64, "hidden_size": 32, "num_layers": 2,
       "num_attention_heads": 4, "num_query_groups": 2, "seq_length": 8}
#: Qwen3: per-head q/k norms, head_dim 12 != hidden / heads (8)
QWEN3 = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "num_layers": 2,
         "num_attention_heads": 4, "num_query_groups": 2, "kv_channels": 12,
         "ffn_hidden_size": 48, "seq_length": 8}
DS3 = {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32, "num_layers": 2,
       "num_attention_heads": 2, "seq_length": 8, "q_lora_rank": 16, "kv_lora_rank": 8,
       "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 4,
       "num_experts_per_tok": 2, "moe_intermediate_size": 8, "first_k_dense_replace": 1}


def cfg(d, **kw):
    return ModelConfig.from_dict({**d, **kw}, "model")


def random_weights(c, seed=0):
    model = build_model(c, seed=seed)
    rng = np.random.default_rng(seed)
    w = {k: rng.standard_normal(v.shape).astype(np.float32) * 0.2
         for k, v in model_tensors(model).items()}
    load_into_model(model, w)
    return model, w


CASES = [("gpt", GPT, {}), ("qwen3", QWEN3, {}), ("ds3", DS3, {}), ("ds3_no_qlora", DS3, {"q_lora_rank": None}),
         ("ds3_tied", DS3, {"tie_word_embeddings": True})]


@pytest.mark.parametrize("name,base,kw", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("fmt,concat", [("hf", True), ("mindformers", True),
                                        ("mindformers", False)])
def test_round_trip_is_exact(name, base, kw, fmt, concat):
    c = cfg(base, **kw)
    _, w = random_weights(c)
    other = from_native(w, fmt, c, concat)
    back = to_native(other, fmt, c, concat)
    assert sorted(back) == sorted(w)
    for k in w:
        np.testing.assert_array_equal(back[k], w[k], err_msg=k)


def test_hf_names_and_unfused_layouts():
    c = cfg(DS3)
    _, w = random_weights(c)
    hf = from_native(w, "hf", c)
    assert "model.embed_tokens.weight" in hf and "lm_head.weight" in hf
    assert "model.norm.weight" in hf
    fc1 = w["decoder.layers.0.mlp.linear_fc1.weight"]
    np.testing.assert_array_equal(hf["model.layers.0.mlp.gate_proj.weight"], fc1[0::2])
    np.testing.assert_array_equal(hf["model.layers.0.mlp.up_proj.weight"], fc1[1::2])
    w1 = w["decoder.layers.1.mlp.experts.weight1"]            # [E, H, 2F]
    np.testing.assert_array_equal(hf["model.layers.1.mlp.experts.3.gate_proj.weight"],
                                  w1[3, :, :8].T)
    np.testing.assert_array_equal(hf["model.layers.1.mlp.experts.3.up_proj.weight"],
                                  w1[3, :, 8:].T)
    np.testing.assert_array_equal(hf["model.layers.1.mlp.experts.2.down_proj.weight"],
                                  w["decoder.layers.1.mlp.experts.weight2"][2].T)
    np.testing.assert_array_equal(hf["model.layers.1.mlp.gate.e_score_correction_bias"],
                                  w["decoder.layers.1.mlp.router.expert_bias"])
    for key in ("self_attn.q_a_proj", "self_attn.q_a_layernorm", "self_attn.kv_a_layernorm",
                "self_attn.kv_b_proj", "self_attn.o_proj", "mlp.shared_experts.gate_proj",
                "post_attention_layernorm", "input_layernorm"):
        assert f"model.layers.1.{key}.weight" in hf, key
    g = cfg(GPT)
    _, wg = random_weights(g)
    hg = from_native(wg, "hf", g)
    qkv = wg["decoder.layers.0.self_attention.linear_qkv.weight"]   # [(4 + 2*2) * 8, 32]
    np.testing.assert_array_equal(hg["model.layers.0.self_attn.q_proj.weight"], qkv[:32])
    np.testing.assert_array_equal(hg["model.layers.0.self_attn.k_proj.weight"], qkv[32:48])
    np.testing.assert_array_equal(hg["model.layers.0.self_attn.v_proj.weight"], qkv[48:])


def test_mindformers_layouts():
    g = cfg(GPT)
    _, w = random_weights(g)
    mf = from_native(w, "mindformers", g)
    qkv = w["decoder.layers.0.self_attention.linear_qkv.weight"]
    got = mf["decoder.layers.0.self_attention.linear_qkv.weight"]
    d = 8
    # group 1: heads 2, 3 (q rows 16..31), then k group 1 (rows 40..47), v group 1 (56..63)
    np.testing.assert_array_equal(got[32:48], qkv[16:32])
    np.testing.assert_array_equal(got[48:56], qkv[32 + d:32 + 2 * d])
    np.testing.assert_array_equal(got[56:64], qkv[48 + d:48 + 2 * d])
    assert list(grouped_qkv_order(2, 1, 1)) == [0, 1, 2, 3]
    assert list(grouped_qkv_order(2, 2, 1)) == [0, 2, 4, 1, 3, 5]   # q0 k0 v0 q1 k1 v1
    c = cfg(DS3)
    _, w = random_weights(c)
    fused = from_native(w, "mindformers", c, qkv_concat=True)
    lq = w["decoder.layers.0.self_attention.linear_q_down_proj.weight"]
    lkv = w["decoder.layers.0.self_attention.linear_kv_down_proj.weight"]
    np.testing.assert_array_equal(fused["decoder.layers.0.self_attention.linear_qkv.weight"],
                                  np.concatenate([lq, lkv]))
    assert "decoder.layers.0.self_attention.linear_qb.weight" in fused
    assert "decoder.layers.0.self_attention.linear_kvb.weight" in fused
    assert "decoder.layers.0.self_attention.k_layernorm.weight" in fused
    mcore = from_native(w, "mindformers", c, qkv_concat=False)
    assert mcore["decoder.layers.1.mlp.experts.weight1"].shape == (4 * 32, 16)
    assert mcore["decoder.layers.1.mlp.experts.weight2"].shape == (4 * 8, 32)


def test_rope_half_order():
    assert list(rope_half_order(6, 6, 2, 4)) == [0, 1, 2, 4, 3, 5]
    assert list(rope_half_order(8, 4, 0, 4)) == [0, 2, 1, 3, 4, 6, 5, 7]


@pytest.mark.parametrize("base", [GPT, QWEN3, DS3], ids=["llama", "qwen3", "deepseek_v3"])
def test_hf_safetensors_file_gives_native_logits(tmp_path, base):
    from safetensors.numpy import save_file
    c = cfg(base)
    native_model, w = random_weights(c, seed=1)
    path = str(tmp_path / "model.safetensors")
    save_file({k: np.ascontiguousarray(v) for k, v in from_native(w, "hf", c).items()}, path)
    native_out = str(tmp_path / "native.safetensors")
    yaml_path = tmp_path / "run.yaml"
    yaml_path.write_text(
        "training: {steps: 1}\noptimizer: {type: AdamW}\n"
        "lr_scheduler: {type: ConstantWarmUpLR, learning_rate: 1.e-3, warmup_steps: 0}\n"
        f"model: {base!r}\n".replace("'", "").replace("None", "null"))
    assert main(["--config", str(yaml_path), "--from", "hf", "--input", path,
                 "--output", native_out]) == 0
    from safetensors.numpy import load_file
    loaded = build_model(c, seed=99)
    load_into_model(loaded, load_file(native_out))
    ids = ms.Tensor(np.random.default_rng(2).integers(0, 64, (2, 8)), ms.int32)
    np.testing.assert_array_equal(loaded.logits(ids).asnumpy(), native_model.logits(ids).asnumpy())


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope_interleaved(x, theta):
    """HF DeepSeek-V3 RoPE (rope_interleave): pairs (x[2i], x[2i+1]) rotate by t*theta^(-2i/d)."""
    s, d = x.shape[-2], x.shape[-1]
    ang = np.outer(np.arange(s), theta ** (-np.arange(0, d, 2) / d))
    cos, sin = np.cos(ang), np.sin(ang)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = b * cos + a * sin
    return out


def test_hf_deepseek_v3_attention_logits_match_numpy_reference():
    """Layer-0 MLA logits from HF-named weights with HF's interleaved RoPE (numpy, float64)
    equal the project's max logits after conversion: the rope-row permutation is right."""
    c = cfg(DS3)
    _, w = random_weights(c, seed=3)
    hf = {k: v.astype(np.float64) for k, v in from_native(w, "hf", c).items()}
    model = build_model(c, seed=5)
    load_into_model(model, to_native(from_native(w, "hf", c), "hf", c))
    ids = np.random.default_rng(4).integers(0, 64, (1, 8))
    model.reset_max_attention_logits()
    model.logits(ms.Tensor(ids, ms.int32))
    got = model.get_max_attention_logits()[0]
    p = "model.layers.0."
    eps, n, dn, dr = c.norm_epsilon, 2, 8, 4
    h = _rms(hf["model.embed_tokens.weight"][ids[0]], hf[p + "input_layernorm.weight"], eps)
    q = _rms(h @ hf[p + "self_attn.q_a_proj.weight"].T, hf[p + "self_attn.q_a_layernorm.weight"],
             eps) @ hf[p + "self_attn.q_b_proj.weight"].T
    q = q.reshape(8, n, dn + dr).transpose(1, 0, 2)
    kv_a = h @ hf[p + "self_attn.kv_a_proj_with_mqa.weight"].T
    c_kv = _rms(kv_a[:, :8], hf[p + "self_attn.kv_a_layernorm.weight"], eps)
    k_pe = _rope_interleaved(kv_a[:, 8:], c.rope_theta)
    kv = (c_kv @ hf[p + "self_attn.kv_b_proj.weight"].T).reshape(8, n, dn + 8).transpose(1, 0, 2)
    qq = np.concatenate([q[..., :dn], _rope_interleaved(q[..., dn:], c.rope_theta)], -1)
    kk = np.concatenate([kv[..., :dn], np.broadcast_to(k_pe, (n, 8, dr))], -1)
    scores = qq @ kk.transpose(0, 2, 1) / np.sqrt(dn + dr)
    scores = np.where(np.triu(np.ones((8, 8), bool), 1), -np.inf, scores)
    np.testing.assert_allclose(got, scores.max(axis=(1, 2)), rtol=1e-4)


def test_qwen3_names_hf_and_mindformers():
    c = cfg(QWEN3)
    _, w = random_weights(c)
    hf = from_native(w, "hf", c)
    a = "decoder.layers.1.self_attention."
    np.testing.assert_array_equal(hf["model.layers.1.self_attn.q_norm.weight"],
                                  w[a + "q_layernorm.weight"])
    np.testing.assert_array_equal(hf["model.layers.1.self_attn.k_norm.weight"],
                                  w[a + "k_layernorm.weight"])
    assert hf["model.layers.1.self_attn.q_proj.weight"].shape == (4 * 12, 32)
    assert hf["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 12, 32)
    assert hf["model.layers.1.self_attn.o_proj.weight"].shape == (32, 4 * 12)
    assert not [k for k in hf if "layernorm" in k and "self_attn" in k]
    # upstream MindFormers' GPT names the norms as this project does; qkv is grouped
    mf = from_native(w, "mindformers", c)
    np.testing.assert_array_equal(mf[a + "k_layernorm.weight"], w[a + "k_layernorm.weight"])
    qkv, got = w[a + "linear_qkv.weight"], mf[a + "linear_qkv.weight"]
    np.testing.assert_array_equal(got[:24], qkv[:24])             # group 0: heads 0, 1
    np.testing.assert_array_equal(got[24:36], qkv[48:60])         # its k
    np.testing.assert_array_equal(got[36:48], qkv[72:84])         # its v


def _rope_half(x, theta):
    """HF Qwen3 RoPE (rotate_half): x * cos + [-x2, x1] * sin over the last dim."""
    s, d = x.shape[-2], x.shape[-1]
    ang = np.outer(np.arange(s), theta ** (-np.arange(0, d, 2) / d))
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    return x * cos + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def _hf_qwen3_logits(W, c, ids):
    """Float64 logits of HF-named Qwen3 weights ``W`` (transformers' Qwen3 forward, written
    from its definition: q_norm / k_norm per head before RoPE, GQA, SwiGLU, untied head)."""
    eps, n, g, d = c.norm_epsilon, c.num_attention_heads, c.num_query_groups, c.kv_channels
    b, s = ids.shape
    h = W["model.embed_tokens.weight"][ids]
    mask = np.triu(np.ones((s, s), bool), 1)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        x = _rms(h, W[p + "input_layernorm.weight"], eps)

        def heads(name, count, norm=None):
            y = (x @ W[p + f"self_attn.{name}.weight"].T).reshape(b, s, count, d)
            y = y if norm is None else _rms(y, W[p + f"self_attn.{norm}.weight"], eps)
            return y.transpose(0, 2, 1, 3)

        q = _rope_half(heads("q_proj", n, "q_norm"), c.rope_theta)
        k = np.repeat(_rope_half(heads("k_proj", g, "k_norm"), c.rope_theta), n // g, axis=1)
        v = np.repeat(heads("v_proj", g), n // g, axis=1)
        scores = np.where(mask, -np.inf, q @ k.transpose(0, 1, 3, 2) / np.sqrt(d))
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        ctx = (probs / probs.sum(-1, keepdims=True)) @ v
        h = h + ctx.transpose(0, 2, 1, 3).reshape(b, s, n * d) @ W[p + "self_attn.o_proj.weight"].T
        x = _rms(h, W[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ W[p + "mlp.gate_proj.weight"].T, x @ W[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ W[p + "mlp.down_proj.weight"].T
    return _rms(h, W["model.norm.weight"], eps) @ W["lm_head.weight"].T


def test_hf_qwen3_weights_give_the_logits_of_a_numpy_qwen3_forward():
    """Random weights drawn in HF's Qwen3 layout (not from this project's), converted: the
    model's logits are those of the HF-named numpy forward."""
    c = cfg(QWEN3)
    names = from_native(model_tensors(build_model(c, seed=0)), "hf", c)
    rng = np.random.default_rng(7)
    hf = {k: (rng.standard_normal(v.shape) * 0.3 + (1.0 if k.endswith("norm.weight") else 0.0))
          .astype(np.float32) for k, v in names.items()}
    model = build_model(c, seed=5)
    load_into_model(model, to_native(hf, "hf", c))
    ids = np.random.default_rng(8).integers(0, 64, (2, 8))
    want = _hf_qwen3_logits({k: v.astype(np.float64) for k, v in hf.items()}, c, ids)
    np.testing.assert_allclose(model.logits(ms.Tensor(ids, ms.int32)).asnumpy(), want,
                               rtol=2e-4, atol=2e-5)
