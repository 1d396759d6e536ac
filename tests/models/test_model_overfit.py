"""Both tiny models overfit one fixed batch below 0.1 nats/token with Adam."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import nn

from mindformers_core.models import build_model
from model_test_utils import T, tiny_dsv3, tiny_gpt


def _overfit(cfg, steps, lr=2e-2):
    model = build_model(cfg, seed=0)
    rng = np.random.RandomState(0)
    ids = rng.randint(0, cfg.vocab_size, (2, 16)).astype(np.int32)
    labels = rng.randint(0, cfg.vocab_size, (2, 16)).astype(np.int32)
    mask = np.ones((2, 16), np.float32)
    params = model.trainable_params()
    opt = nn.Adam(params, learning_rate=lr)

    def fn(a, b, c):
        loss, n, aux = model(a, b, c)
        return loss / n + aux, (loss, n)

    grad_fn = ms.value_and_grad(fn, None, params, has_aux=True)
    first = None
    for step in range(steps):
        (value, (loss, n)), grads = grad_fn(T(ids), T(labels), T(mask))
        opt(grads)
        model.update_expert_bias()
        per_token = float((loss / n).asnumpy())
        first = per_token if first is None else first
        if per_token < 0.1:
            return first, per_token, step
    return first, per_token, steps


@pytest.mark.parametrize("make", [tiny_gpt, tiny_dsv3], ids=["gpt", "dsv3"])
def test_tiny_model_overfits_fixed_batch(make):
    cfg = make(vocab_size=64, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
               initializer_range=0.02, seq_length=16)
    first, last, steps = _overfit(cfg, steps=300)
    assert first == pytest.approx(np.log(64), abs=0.3)
    assert last < 0.1, (first, last, steps)
