"""Forward pass against the independent float64 numpy reference; loss contract; causal mask."""
import numpy as np
import pytest
import mindspore as ms

from mindformers_core.models import build_model
from model_test_utils import CONFIGS, T, batch, tiny_dsv3, tiny_gpt
import model_numpy_reference as ref



@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_and_loss_match_numpy_reference(name):
    cfg = CONFIGS[name]()
    model = build_model(cfg, seed=3)
    ids, labels, mask = batch(cfg)
    logits = model.logits(T(ids)).asnumpy()
    P = ref.params_of(model)
    np.testing.assert_allclose(logits, ref.forward(P, cfg, ids), rtol=2e-4, atol=2e-5)
    loss, n, aux = model(T(ids), T(labels), T(mask))
    want_loss, want_aux = ref.loss_sum(P, cfg, ids, labels, mask)
    assert loss.dtype == ms.float32 and loss.shape == ()
    assert loss.asnumpy() == pytest.approx(want_loss, rel=1e-4)
    assert n.asnumpy() == pytest.approx(mask.sum())
    assert aux.asnumpy() == pytest.approx(want_aux, rel=1e-4, abs=1e-7)
    if name == "dsv3":
        assert want_aux > 0


@pytest.mark.parametrize("name", ["gpt", "dsv3"])
def test_causal_mask_future_token_does_not_change_earlier_logits(name):
    cfg = CONFIGS[name]()
    model = build_model(cfg, seed=1)
    ids, _, _ = batch(cfg, b=1, s=8)
    changed = ids.copy()
    changed[0, 5] = (ids[0, 5] + 7) % cfg.vocab_size
    a = model.logits(T(ids)).asnumpy()
    c = model.logits(T(changed)).asnumpy()
    np.testing.assert_array_equal(a[:, :5], c[:, :5])
    assert np.abs(a[:, 5:] - c[:, 5:]).max() > 1e-4   # later positions do see it


def test_masked_positions_do_not_count_and_negative_labels_are_allowed_there():
    cfg = tiny_gpt()
    model = build_model(cfg, seed=0)
    ids, labels, mask = batch(cfg)
    mask[0, :] = 0
    other = labels.copy()
    other[0, :] = -100
    a = model(T(ids), T(labels), T(mask))[0].asnumpy()
    b = model(T(ids), T(other), T(mask))[0].asnumpy()
    assert a == b


def test_same_seed_bit_identical_whatever_mindspore_rng_and_seed_changes_weights():
    ms.set_seed(1)
    a = {p.name: p.asnumpy() for p in build_model(tiny_dsv3(), seed=5).get_parameters()}
    ms.set_seed(999)
    b = {p.name: p.asnumpy() for p in build_model(tiny_dsv3(), seed=5).get_parameters()}
    c = {p.name: p.asnumpy() for p in build_model(tiny_dsv3(), seed=6).get_parameters()}
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert any(not np.array_equal(a[k], c[k]) for k in a)


def test_seed_none_uses_global_mindspore_seed():
    ms.set_seed(11)
    a = build_model(tiny_gpt()).output_layer.weight.asnumpy()
    b = build_model(tiny_gpt(), seed=11).output_layer.weight.asnumpy()
    np.testing.assert_array_equal(a, b)


def test_init_statistics_follow_initializer_range():
    cfg = tiny_gpt(hidden_size=64, ffn_hidden_size=256, vocab_size=512, initializer_range=0.05)
    model = build_model(cfg, seed=0)
    P = {p.name: p.asnumpy() for p in model.get_parameters()}
    assert np.std(P["embedding.word_embeddings.weight"]) == pytest.approx(0.05, rel=0.05)
    # residual-output projections: sigma / sqrt(2 * num_layers)
    assert np.std(P["decoder.layers.0.mlp.linear_fc2.weight"]) == pytest.approx(0.05 / 2, rel=0.05)
    np.testing.assert_array_equal(P["decoder.final_layernorm.weight"], 1.0)
