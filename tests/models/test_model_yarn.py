"""YaRN RoPE scaling: tables vs an independent numpy reference, closed-form limits and values,
the model wiring, and the config fields' checks."""
import math

import numpy as np
import pytest

from mindformers_core.errors import ConfigError
from mindformers_core.config.model import ModelConfig
from mindformers_core.models import yarn
from mindformers_core.models.build import build_model
from mindformers_core.models.layers import rotary_tables

from model_test_utils import T, batch, tiny_dsv3, tiny_gpt


def _boundary(beta, dim, theta, original):
    """Fractional pair index i where the pair's rotations over the original context,
    original * theta^(-2i/dim) / (2 pi), equal beta (bisection, the paper's r(i) = beta)."""
    lo, hi = -50.0, 50.0   # r(i) decreases in i
    for _ in range(200):
        mid = (lo + hi) / 2
        r = original * theta ** (-2 * mid / dim) / (2 * math.pi)
        lo, hi = (mid, hi) if r > beta else (lo, mid)
    return (lo + hi) / 2


def _reference(seq, dim, theta, factor, original, beta_fast, beta_slow, mscale, mscale_all):
    low = max(math.floor(_boundary(beta_fast, dim, theta, original)), 0)
    high = min(math.ceil(_boundary(beta_slow, dim, theta, original)), dim - 1)
    if high == low:
        high += 0.001
    freqs = []
    for i in range(dim // 2):
        f = 1.0 / theta ** (2 * i / dim)
        w = min(max((i - low) / (high - low), 0.0), 1.0)   # 1: fully interpolated
        freqs.append((1 - w) * f + w * f / factor)

    def m(s, a):
        return 1.0 if s <= 1 else 0.1 * a * math.log(s) + 1.0
    gain = m(factor, mscale) / m(factor, mscale_all)
    cos, sin = np.empty((seq, dim)), np.empty((seq, dim))
    for t in range(seq):
        for i, f in enumerate(freqs):
            for j in (i, i + dim // 2):
                cos[t, j] = math.cos(t * f) * gain
                sin[t, j] = math.sin(t * f) * gain
    return cos, sin


@pytest.mark.parametrize("args", [
    (16, 64, 10000.0, 40.0, 4096, 32.0, 1.0, 1.0, 1.0),       # DeepSeek-V3's rope settings
    (12, 8, 10000.0, 4.0, 64, 32.0, 1.0, 0.707, 0.0),
    (10, 16, 500.0, 8.0, 8, 4.0, 2.0, 1.0, 0.5),
])
def test_tables_match_numpy_reference(args):
    cos, sin = yarn.yarn_rotary_tables(*args)
    rcos, rsin = _reference(*args)
    np.testing.assert_allclose(cos, rcos, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(sin, rsin, rtol=1e-6, atol=1e-7)


def test_deepseek_v3_closed_form_values():
    # dim 64, theta 1e4, original 4096, beta 32 / 1: the published correction range (10, 23)
    assert yarn.find_correction_range(32, 1, 64, 10000.0, 4096) == (10, 23)
    m = 0.1 * math.log(40.0) + 1.0
    assert yarn.yarn_get_mscale(40.0, 1.0) == pytest.approx(m, rel=1e-15)
    assert yarn.yarn_softmax_scale_multiplier(40.0, 1.0) == pytest.approx(m * m, rel=1e-15)
    assert yarn.yarn_get_mscale(1.0, 5.0) == 1.0 and yarn.yarn_get_mscale(0.5, 5.0) == 1.0
    inv = yarn.yarn_inv_freq(64, 10000.0, 40.0, 4096, 32, 1)
    base = yarn.rope_inv_freq(64, 10000.0)
    np.testing.assert_array_equal(inv[:10], base[:10])          # high frequencies kept
    np.testing.assert_allclose(inv[23:], base[23:] / 40.0, rtol=1e-15)   # low ones / factor


def test_linear_ramp_equal_bounds():
    np.testing.assert_allclose(yarn.linear_ramp(2, 2, 4), [0, 0, 0, 1])   # (i-2)/0.001


@pytest.mark.parametrize("dim,seq", [(8, 12), (64, 5)])
def test_factor_one_is_plain_rope(dim, seq):
    cos, sin = yarn.yarn_rotary_tables(seq, dim, 10000.0, 1.0, 4, 32.0, 1.0, 1.0, 1.0)
    pcos, psin = rotary_tables(seq, dim, 10000.0)
    np.testing.assert_array_equal(cos, pcos)
    np.testing.assert_array_equal(sin, psin)
    assert yarn.yarn_softmax_scale_multiplier(1.0, 1.0) == 1.0


@pytest.mark.parametrize("make", [tiny_gpt, tiny_dsv3])
def test_model_factor_one_equals_rope_model(make):
    ids, labels, mask = batch(make())
    plain = build_model(make(), seed=3)
    y1 = build_model(make(position_embedding_type="yarn", rotary_scaling_factor=1.0,
                          mscale_all_dim=1.0), seed=3)
    y40 = build_model(make(position_embedding_type="yarn", rotary_scaling_factor=40.0,
                           mscale_all_dim=1.0, max_position_embeddings=4), seed=3)
    a = plain.logits(T(ids)).asnumpy()
    np.testing.assert_array_equal(y1.logits(T(ids)).asnumpy(), a)
    assert np.abs(y40.logits(T(ids)).asnumpy() - a).max() > 1e-4


def test_model_softmax_scale_and_tables_use_yarn():
    cfg = tiny_dsv3(position_embedding_type="yarn", rotary_scaling_factor=40.0, mscale=1.0,
                    mscale_all_dim=0.5, max_position_embeddings=4)
    model = build_model(cfg, seed=0)
    attn = model.decoder.layers[0].self_attention
    m = 0.1 * 0.5 * math.log(40.0) + 1.0
    assert attn.softmax_scale == pytest.approx(m * m / math.sqrt(4 + 4), rel=1e-12)
    cos_q = model.static_tables(2, 6)[0].asnumpy()
    rcos, _ = _reference(6, 4, cfg.rope_theta, 40.0, 4, 32.0, 1.0, 1.0, 0.5)
    np.testing.assert_allclose(cos_q[1, 1], rcos, rtol=1e-6, atol=1e-7)


def test_config_fields_defaults_and_round_trip():
    cfg = ModelConfig.from_dict({}, "model")
    assert (cfg.position_embedding_type, cfg.rotary_scaling_factor, cfg.beta_fast, cfg.beta_slow,
            cfg.mscale, cfg.mscale_all_dim, cfg.max_position_embeddings) == (
                "rope", 1.0, 32.0, 1.0, 1.0, 0.0, None)
    y = ModelConfig.from_dict({"position_embedding_type": "yarn", "rotary_scaling_factor": 40.0,
                               "max_position_embeddings": 4096}, "model")
    assert ModelConfig.from_dict(y.to_dict(), "model") == y


@pytest.mark.parametrize("key,value,msg", [
    ("rotary_scaling_factor", 0.0, "rotary_scaling_factor"),
    ("beta_fast", -1.0, "beta_fast"),
    ("beta_slow", 0.0, "beta_slow"),
    ("mscale", -0.1, "mscale"),
    ("mscale_all_dim", -1.0, "mscale_all_dim"),
    ("max_position_embeddings", 0, "max_position_embeddings"),
    ("position_embedding_type", "alibi", "position_embedding_type"),
])
def test_config_errors_name_the_field(key, value, msg):
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_dict({key: value}, "model")
    assert f"model.{msg}" in str(e.value)
