"""Memory planner (core/memory_plan.py) for ``model_type: qwen3``: the q/k head norms and the
explicit head dim, by hand; upstream's default Qwen3 size; the tensor-parallel split."""
from mindformers_core.config.model import ModelConfig
from mindformers_core.core import memory_plan as mp
from mindformers_core.core.memory_plan import ActivationSettings, Layout, param_counts


def qwen3(**kw):
    base = {"model_type": "qwen3", "vocab_size": 16, "hidden_size": 8, "num_layers": 2,
            "num_attention_heads": 2, "num_query_groups": 1, "head_dim": 6,
            "ffn_hidden_size": 16, "seq_length": 4}
    return ModelConfig.from_dict({**base, **kw}, "model")


def test_tiny_qwen3_param_count_by_hand():
    # per layer: norms 2*8 + q/k gains 2*6 = 28; attention (2*6 + 2*1*6)*8 + 8*2*6 = 288;
    # MLP 3*16*8 = 384; embedding 128 + output 128 + final norm 8
    counts = param_counts(qwen3())
    assert [layer.norms for layer in counts.layers] == [28, 28]
    assert counts.layers[0].attention == 288
    assert counts.total == 128 + 128 + 8 + 2 * (28 + 288 + 384)
    assert param_counts(qwen3(qk_layernorm=False)).total == counts.total - 2 * 12


def test_upstream_default_qwen3_size():
    """Upstream's Qwen3Config defaults: V 151936, h 4096, 32 layers of 32 heads (32 kv heads)
    of dim 128, intermediate 22016, untied."""
    c = ModelConfig.from_dict({"model_type": "qwen3"}, "model")
    per_layer = 2 * 4096 + 2 * 128 + 4 * 4096 * 4096 + 3 * 22016 * 4096
    assert param_counts(c).total == 32 * per_layer + 2 * 151936 * 4096 + 4096
    assert param_counts(c).total > 12e9


def test_q_k_norm_activations_and_tensor_parallel_split():
    b, s, n, g, d = 2, 4, 2, 1, 6
    st = ActivationSettings(micro_batch=b)
    on = mp.layer_activation_bytes(qwen3(), Layout(), st, moe=False)["attention"]
    off = mp.layer_activation_bytes(qwen3(qk_layernorm=False), Layout(), st, moe=False)
    assert off["attention"] == b * s * d * 4 * ((n + 2 * g) + 5 * n) + b * n * s * s * 4
    assert on - off["attention"] == b * s * d * (n + g) * 8
    # the q/k gains are replicated over tp like the other norms
    layer = param_counts(qwen3(num_query_groups=2)).layers[0]
    assert layer.per_rank(tp=2, ep=1) == 28 + layer.attention // 2 + layer.mlp // 2
