"""Blockwise (online-softmax) causal attention vs the plain path: context, per-head max logits
and gradients (rel 1e-5), and the model wired through ``use_flash_attention``."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.config.model import ModelConfig
from mindformers_core.models.blockwise_attention import (attention_function,
                                                         blockwise_causal_attention)
from mindformers_core.models.build import build_model
from mindformers_core.models.layers import causal_attention

from model_test_utils import T, batch, tiny_dsv3, tiny_gpt


def _qkv(b, n, s, d, dv, seed=0):
    rng = np.random.RandomState(seed)
    return [Tensor((rng.standard_normal(shape) * 1.5).astype(np.float32))
            for shape in ((b, n, s, d), (b, n, s, d), (b, n, s, dv))]


def _mask(b, n, s):
    bias = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, 0.0).astype(np.float32)
    return Tensor(np.ascontiguousarray(np.broadcast_to(bias, (b, n, s, s))))


@pytest.mark.parametrize("block", [1, 5, 8, 16, 64])
def test_blockwise_matches_plain_context_max_logits_and_gradients(block):
    b, n, s, d, dv = 2, 3, 19, 8, 6
    q, k, v = _qkv(b, n, s, d, dv)
    mask, scale = _mask(b, n, s), 0.37
    ctx, ml = causal_attention(q, k, v, scale, mask)
    ctx_b, ml_b = blockwise_causal_attention(q, k, v, scale, block)
    np.testing.assert_allclose(ctx_b.asnumpy(), ctx.asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ml_b.asnumpy(), ml.asnumpy(), rtol=1e-6)
    w = Tensor(np.random.RandomState(1).standard_normal((b, n, s, dv)).astype(np.float32))

    def plain(q, k, v):
        return (causal_attention(q, k, v, scale, mask)[0] * w).sum()

    def blockwise(q, k, v):
        return (blockwise_causal_attention(q, k, v, scale, block)[0] * w).sum()

    g = ms.grad(plain, grad_position=(0, 1, 2))(q, k, v)
    g_b = ms.grad(blockwise, grad_position=(0, 1, 2))(q, k, v)
    for x, y in zip(g_b, g):
        np.testing.assert_allclose(x.asnumpy(), y.asnumpy(), rtol=1e-5, atol=1e-5)


def test_attention_function_selects_the_path():
    assert attention_function(False, "CPU") is causal_attention
    q, k, v = _qkv(1, 2, 7, 4, 4)
    fn = attention_function(True, "CPU", block_size=3)
    ctx, ml = fn(q, k, v, 0.5, _mask(1, 2, 7))
    want, want_ml = blockwise_causal_attention(q, k, v, 0.5, 3)
    np.testing.assert_array_equal(ctx.asnumpy(), want.asnumpy())
    np.testing.assert_array_equal(ml.asnumpy(), want_ml.asnumpy())


@pytest.mark.parametrize("make", [tiny_gpt, tiny_dsv3])
def test_model_with_flash_attention_matches_plain(make):
    cfg = make()
    ids, labels, mask = batch(cfg, b=2, s=8)
    plain, flash = build_model(cfg, seed=5), build_model(make(use_flash_attention=True), seed=5)
    assert flash.decoder.layers[0].self_attention.core_attention is not causal_attention
    for layer in flash.decoder.layers:   # several blocks at this tiny sequence length
        layer.self_attention.core_attention = attention_function(True, "CPU", block_size=3)

    def run(model):
        def fn(a, b_, c):
            loss, n, aux = model(a, b_, c)
            return loss / n + aux
        model.reset_max_attention_logits()
        value, grads = ms.value_and_grad(fn, None, model.trainable_params())(
            T(ids), T(labels), T(mask))
        return float(value.asnumpy()), [g.asnumpy() for g in grads], \
            model.get_max_attention_logits()

    v0, g0, m0 = run(plain)
    v1, g1, m1 = run(flash)
    assert v1 == pytest.approx(v0, rel=1e-5)
    np.testing.assert_allclose(m1, m0, rtol=1e-5)
    for x, y in zip(g1, g0):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_config_default_off():
    assert ModelConfig.from_dict({}, "model").use_flash_attention is False


@pytest.mark.parametrize("make", [tiny_gpt, tiny_dsv3])
def test_flash_attention_under_jit_layer_trains_in_pynative(make):
    """``training.jit: layer`` with the CPU blockwise attention: a recomputed query-block Cell
    inside a compiled layer graph fails in its backward (MindSpore 2.10, IndexError in
    recompute.py's bprop), so the runner keeps such a model in PyNative -- and the step's loss
    and gradients are the plain path's."""
    from mindformers_core.models.compiled import effective_mode
    cfg = make()
    ids, labels, mask = batch(cfg, b=2, s=8)
    plain, flash = build_model(cfg, seed=5), build_model(make(use_flash_attention=True), seed=5)
    assert effective_mode("layer", plain) == "layer"
    assert effective_mode("layer", flash) == "none"
    flash.set_jit("layer")

    def run(model):
        def fn(a, b_, c):
            loss, n, aux = model(a, b_, c)
            return loss / n + aux
        value, grads = ms.value_and_grad(fn, None, model.trainable_params())(
            T(ids), T(labels), T(mask))
        return float(value.asnumpy()), [g.asnumpy() for g in grads]

    v0, g0 = run(plain)
    v1, g1 = run(flash)
    assert v1 == pytest.approx(v0, rel=1e-5)
    for x, y in zip(g1, g0):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
