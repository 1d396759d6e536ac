"""muP in the model (seeds 003/004): readout multiplier 1/w on the logits, hidden-matrix init
std / sqrt(w), and w in (None, 1) bit-identical to the plain model."""
import math

import numpy as np
import pytest

from mindformers_core.models import build_model
from mindformers_core.models.init import init_value, is_mup_hidden_matrix

from model_test_utils import T, batch, tiny_dsv3, tiny_gpt


def params(model):
    return {p.name: p.asnumpy() for p in model.get_parameters()}


def copy_params(src, dst):
    values = params(src)
    for p in dst.get_parameters():
        p.set_data(T(values[p.name]).astype(p.dtype))


@pytest.mark.parametrize("w", [None, 1.0, 1])
def test_width_mult_one_is_bit_identical_to_no_mup(w):
    cfg = tiny_gpt()
    plain, mup = build_model(cfg, seed=3), build_model(cfg, seed=3, mup_width_mult=w)
    assert mup.readout_multiplier is None
    a, b = params(plain), params(mup)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    ids, labels, mask = batch(cfg)
    np.testing.assert_array_equal(plain.logits(T(ids)).asnumpy(), mup.logits(T(ids)).asnumpy())
    for x, y in zip(plain(T(ids), T(labels), T(mask)), mup(T(ids), T(labels), T(mask))):
        np.testing.assert_array_equal(x.asnumpy(), y.asnumpy())


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("make,w,tie", [(tiny_gpt, 4.0, False), (tiny_gpt, 3.0, True),
                                        (tiny_dsv3, 2.0, False)])
def test_logits_scale_by_one_over_width_mult_with_the_same_weights(make, w, tie):
    cfg = make(tie_word_embeddings=tie)
    mup = build_model(cfg, seed=1, mup_width_mult=w)
    plain = build_model(cfg, seed=1)
    copy_params(mup, plain)                     # same weights, no readout multiplier
    assert mup.readout_multiplier == 1.0 / w
    ids, labels, mask = batch(cfg)
    base = plain.logits(T(ids)).asnumpy()
    got = mup.logits(T(ids)).asnumpy()
    # one float32 multiply by fl(1/w): exact for w = 2, 4; within an ulp otherwise
    np.testing.assert_array_equal(got, base * np.float32(1.0 / w))
    # the loss is the cross-entropy of the scaled logits (numpy reference, float64)
    loss_sum, n_tokens, _ = mup(T(ids), T(labels), T(mask))
    logp = _log_softmax(base.astype(np.float64) / w)
    ref = -(np.take_along_axis(logp, labels[..., None].astype(np.int64), -1)[..., 0] * mask).sum()
    np.testing.assert_allclose(float(loss_sum.asnumpy()), ref, rtol=1e-5)
    assert float(n_tokens.asnumpy()) == mask.sum()


@pytest.mark.parametrize("make", [tiny_gpt, tiny_dsv3])
def test_hidden_matrix_init_std_scales_by_one_over_sqrt_width_mult(make):
    cfg, w = make(), 4.0
    a, b = params(build_model(cfg, seed=5)), params(build_model(cfg, seed=5, mup_width_mult=w))
    hidden = [n for n in a if is_mup_hidden_matrix(n, a[n].shape)]
    # the classes of optim.mup: every weight matrix but the embedding / output layer
    assert "decoder.layers.0.mlp.linear_fc1.weight" in hidden
    assert not any("word_embeddings" in n or "output_layer" in n for n in hidden)
    if make is tiny_dsv3:
        assert "decoder.layers.1.mlp.experts.weight1" in hidden        # 3-D grouped experts
    for name in a:
        factor = 1.0 / math.sqrt(w) if name in hidden else 1.0
        np.testing.assert_allclose(b[name], a[name] * factor, rtol=1e-6, atol=0, err_msg=name)


def test_init_std_is_initializer_range_over_sqrt_width_mult():
    """Sample std of a large hidden matrix: sigma / sqrt(w), so variance ~ 1/fan_in relative
    to the base width; the residual-output projections keep their extra 1/sqrt(2L)."""
    sigma, layers, w = 0.02, 4, 8.0
    fc1 = init_value("decoder.layers.0.mlp.linear_fc1.weight", (512, 256), 0, sigma, layers, w)
    proj = init_value("decoder.layers.0.self_attention.linear_proj.weight", (256, 512), 0, sigma,
                      layers, w)
    out = init_value("output_layer.weight", (512, 256), 0, sigma, layers, w)
    assert fc1.std() == pytest.approx(sigma / math.sqrt(w), rel=0.02)
    assert proj.std() == pytest.approx(sigma / math.sqrt(2 * layers) / math.sqrt(w), rel=0.02)
    assert out.std() == pytest.approx(sigma, rel=0.02)


@pytest.mark.parametrize("bad", [0, -2.0, float("nan"), float("inf"), True, "2"])
def test_bad_width_mult_is_rejected(bad):
    with pytest.raises(ValueError, match="mup_width_mult must be a finite positive number"):
        build_model(tiny_gpt(), seed=0, mup_width_mult=bad)
