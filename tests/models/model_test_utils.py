"""Helpers of the model tests: tiny configs and batches."""
import numpy as np
import mindspore as ms

from mindformers_core.config.model import ModelConfig


def tiny_gpt(**kw) -> ModelConfig:
    base = dict(model_type="gpt", vocab_size=32, hidden_size=16, num_layers=2,
                num_attention_heads=4, ffn_hidden_size=24, seq_length=8, initializer_range=0.2)
    base.update(kw)
    return ModelConfig.from_dict(base, "model")


def tiny_dsv3(**kw) -> ModelConfig:
    base = dict(model_type="deepseek_v3", vocab_size=32, hidden_size=16, num_layers=2,
                num_attention_heads=2, ffn_hidden_size=24, seq_length=8, q_lora_rank=8,
                kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4,
                first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=6, n_shared_experts=1, routed_scaling_factor=1.5,
                initializer_range=0.2)
    base.update(kw)
    return ModelConfig.from_dict(base, "model")


#: the model variants the forward / golden tests run: GPT (MHA, GQA, tied) and DeepSeek-V3
#: (with and without q-LoRA / shared experts)
CONFIGS = {
    "gpt": lambda: tiny_gpt(),
    "gpt_gqa": lambda: tiny_gpt(num_query_groups=2),
    "gpt_tied": lambda: tiny_gpt(tie_word_embeddings=True),
    "dsv3": lambda: tiny_dsv3(moe_aux_loss_coeff=0.01),
    "dsv3_no_q_lora": lambda: tiny_dsv3(q_lora_rank=None, n_shared_experts=0, norm_topk_prob=False),
}


def batch(cfg, b=2, s=6, seed=0):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, cfg.vocab_size, (b, s)).astype(np.int32)
    labels = rng.randint(0, cfg.vocab_size, (b, s)).astype(np.int32)
    mask = (rng.rand(b, s) > 0.3).astype(np.float32)
    return ids, labels, mask


def T(x):
    return ms.Tensor(x)


def assert_grads_match_fd(named_grads, P, objective, rng, coords_per_param=2, eps=1e-5):
    """Per (name, autograd gradient) pair: the largest-gradient coordinate plus random ones
    against central finite differences of ``objective(P)`` (float64 parameter dict ``P``,
    perturbed in place and restored). Returns the number of coordinates checked."""
    import pytest
    checked = 0
    for name, g in named_grads:
        flat_g = np.asarray(g, np.float64).reshape(-1)
        picks = [int(np.abs(flat_g).argmax())] + list(rng.randint(0, flat_g.size,
                                                                   coords_per_param - 1))
        for idx in picks:
            w = P[name]
            orig = w.reshape(-1)[idx]
            w.reshape(-1)[idx] = orig + eps
            up = objective(P)
            w.reshape(-1)[idx] = orig - eps
            down = objective(P)
            w.reshape(-1)[idx] = orig
            fd = (up - down) / (2 * eps)
            assert flat_g[idx] == pytest.approx(fd, rel=2e-3, abs=2e-5), (name, idx)
            checked += 1
    return checked


def objective_and_grads(model, ids, labels, mask):
    """(float loss / tokens + aux, trainable params, their gradients) of one batch."""
    def fn(a, b, c):
        loss, n, aux = model(a, b, c)
        return loss / n + aux, n

    params = model.trainable_params()
    (value, _), grads = ms.value_and_grad(fn, None, params, has_aux=True)(T(ids), T(labels),
                                                                          T(mask))
    return float(value.asnumpy()), params, grads


def loss_and_grads(model, cfg):
    """(loss / tokens + aux, numpy gradients of every trainable parameter) of one batch."""
    ids, labels, mask = batch(cfg, b=2, s=8, seed=3)

    def fn(a, b, c):
        loss, n, aux = model(a, b, c)
        return loss / n + aux
    value, grads = ms.value_and_grad(fn, None, model.trainable_params())(T(ids), T(labels), T(mask))
    return float(value.asnumpy()), [g.asnumpy() for g in grads]
