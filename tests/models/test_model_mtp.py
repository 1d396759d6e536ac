"""Multi-token prediction: loss vs an independent float64 numpy reference, gradients vs finite
differences of that reference, inference exclusion, optimizer routing / QK-Clip rows, config."""
import numpy as np
import pytest

from mindformers_core.errors import ConfigError
from mindformers_core.config.model import ModelConfig
from mindformers_core.models.build import build_model
from mindformers_core.optim.muon_routing import muon_routing

import model_numpy_reference as ref
from model_test_utils import (T, assert_grads_match_fd, batch, objective_and_grads,
                              tiny_dsv3, tiny_gpt)


def _ce(logits, labels, mask):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, np.maximum(labels, 0)[..., None], -1)[..., 0]
    return (nll * mask).sum()


def mtp_reference(P, cfg, ids, labels, mask):
    """scaling * mean_k CE of token t_{i+k+1} from depth k (DeepSeek-V3 sec. 2.2), float64."""
    h, _ = ref.hidden(P, cfg, ids)
    eps, s = cfg.norm_epsilon, ids.shape[1]
    table = P["embedding.word_embeddings.weight"]
    out_w = P.get("output_layer.weight", table)
    losses, aux = [], 0.0
    for k in range(1, cfg.num_nextn_predict_layers + 1):
        pre = f"mtp.layers.{k - 1}."
        ids_k, lab_k = np.roll(ids, -k, 1), np.roll(labels, -k, 1)
        mask_k = np.roll(mask, -k, 1)
        mask_k[:, s - k:] = 0   # no token t_{i+k+1} inside the sequence
        x = np.concatenate([ref.rms(table[ids_k], P[pre + "enorm.weight"], eps),
                            ref.rms(h, P[pre + "hnorm.weight"], eps)], -1)
        h, a = ref.layer(P, cfg, x @ P[pre + "eh_proj.weight"].T, pre + "transformer_layer.", {})
        aux += a
        logits = ref.rms(h, P[pre + "final_layernorm.weight"], eps) @ out_w.T
        losses.append(_ce(logits, lab_k, mask_k) / max(mask_k.sum(), 1.0))
    return cfg.mtp_loss_scaling_factor * float(np.mean(losses)), aux


def _objective(P, cfg, ids, labels, mask):
    loss, aux = ref.loss_sum(P, cfg, ids, labels, mask)
    mtp, mtp_aux = mtp_reference(P, cfg, ids, labels, mask)
    return loss / mask.sum() + aux + mtp + mtp_aux


CASES = [
    (tiny_gpt, dict(num_nextn_predict_layers=2, mtp_loss_scaling_factor=0.3)),
    (tiny_gpt, dict(num_nextn_predict_layers=1, tie_word_embeddings=True)),
    (tiny_dsv3, dict(num_nextn_predict_layers=1, mtp_loss_scaling_factor=0.5,
                     moe_aux_loss_coeff=0.05)),
]


@pytest.mark.parametrize("make,kw", CASES)
def test_mtp_loss_matches_reference_and_main_path_unchanged(make, kw):
    cfg = make(**kw)
    model = build_model(cfg, seed=2)
    plain = build_model(make(**{k: v for k, v in kw.items() if "mtp" not in k
                                and "nextn" not in k}), seed=2)
    ids, labels, mask = batch(cfg, b=2, s=6, seed=2)
    loss, n, aux = model(T(ids), T(labels), T(mask))
    loss0, n0, aux0 = plain(T(ids), T(labels), T(mask))
    assert float(loss.asnumpy()) == float(loss0.asnumpy()) and float(n.asnumpy()) == float(n0.asnumpy())
    P = ref.params_of(model)
    want, want_aux = mtp_reference(P, cfg, ids, labels, mask)
    (got,) = model.pop_mtp_losses()
    assert got == pytest.approx(want, rel=1e-5)
    assert float(aux.asnumpy()) == pytest.approx(float(aux0.asnumpy()) + want + want_aux, rel=1e-5)
    assert model.pop_mtp_losses() == [] and plain.pop_mtp_losses() == []
    # inference (logits, generation) never runs the depth modules
    np.testing.assert_array_equal(model.logits(T(ids)).asnumpy(), plain.logits(T(ids)).asnumpy())
    assert model.pop_mtp_losses() == []


@pytest.mark.parametrize("make,kw", CASES)
def test_mtp_gradients_match_finite_differences(make, kw):
    cfg = make(**kw)
    model = build_model(cfg, seed=4)
    ids, labels, mask = batch(cfg, b=2, s=5, seed=4)
    value, params, grads = objective_and_grads(model, ids, labels, mask)
    P = ref.params_of(model)
    assert value == pytest.approx(_objective(P, cfg, ids, labels, mask), rel=1e-5)
    named = [(p.name, g.asnumpy()) for p, g in zip(params, grads)
             if p.name.startswith(("mtp.", "decoder.layers.1.")) or "word_embeddings" in p.name
             or "output_layer" in p.name]
    checked = assert_grads_match_fd(named, P, lambda P: _objective(P, cfg, ids, labels, mask),
                                    np.random.RandomState(0))
    assert checked >= 2 * sum(p.name.startswith("mtp.") for p in params) > 0


def test_mtp_weights_routed_like_decoder_weights_and_tracked_for_qk_clip():
    cfg = tiny_dsv3(num_nextn_predict_layers=1)
    model = build_model(cfg, seed=0)
    muon, adamw = muon_routing([(p.name, p) for p in model.trainable_params()])
    assert "mtp.layers.0.eh_proj.weight" in muon
    assert "mtp.layers.0.transformer_layer.self_attention.linear_q_up_proj.weight" in muon
    assert "mtp.layers.0.enorm.weight" in adamw and "embedding.word_embeddings.weight" in adamw
    layout = model.qk_clip_layout()
    assert [e["layer"] for e in layout] == [0, 1, 2]
    assert layout[2]["q_param"] == \
        "mtp.layers.0.transformer_layer.self_attention.linear_q_up_proj.weight"
    names = {p.name for p in model.get_parameters()}
    assert layout[2]["q_param"] in names and layout[2]["kv_param"] in names
    ids, labels, mask = batch(cfg)
    model.reset_max_attention_logits()
    model(T(ids), T(labels), T(mask))
    ml = model.get_max_attention_logits()
    assert ml.shape == (3, cfg.num_attention_heads) and np.isfinite(ml).all()
    model.reset_max_attention_logits()
    model.logits(T(ids))          # inference: the MTP row stays empty
    assert np.isneginf(model.get_max_attention_logits()[2]).all()


def test_mtp_moe_counts_and_updates_its_expert_bias_like_the_decoder():
    cfg = tiny_dsv3(num_nextn_predict_layers=1, moe_router_bias_update_rate=0.1)
    model = build_model(cfg, seed=3)
    moe = model.moe_layers()
    assert sorted(moe) == [1, 2]          # decoder layer 1 and the depth as row L + 0 = 2
    assert moe[2] is model.mtp.layers[0].transformer_layer.mlp
    ids, labels, mask = batch(cfg, b=2, s=6, seed=3)
    model(T(ids), T(labels), T(mask))
    loads = model.get_tokens_per_expert()
    # every token of the depth's input was routed to k = 2 experts
    assert loads[2].sum() == 2 * 6 * cfg.num_experts_per_tok
    before = moe[2].router.expert_bias.asnumpy().copy()
    model.update_expert_bias()
    after = moe[2].router.expert_bias.asnumpy()
    # bias_e += rate * sign(mean(load) - load_e)
    np.testing.assert_allclose(after - before, 0.1 * np.sign(loads[2].mean() - loads[2]),
                               rtol=1e-6, atol=1e-7)


def test_jit_model_mode_rejects_mtp():
    model = build_model(tiny_gpt(num_nextn_predict_layers=1), seed=0)
    with pytest.raises(ValueError, match="training.jit: model does not cover multi-token"):
        model.set_jit("model")


def test_config_fields():
    cfg = ModelConfig.from_dict({}, "model")
    assert (cfg.num_nextn_predict_layers, cfg.mtp_loss_scaling_factor) == (0, 0.1)
    for key, value in (("num_nextn_predict_layers", -1), ("mtp_loss_scaling_factor", -0.5)):
        with pytest.raises(ConfigError) as e:
            ModelConfig.from_dict({key: value}, "model")
        assert f"model.{key}" in str(e.value)


def test_a_depth_run_with_its_weights_as_arguments_is_its_forward():
    """``MTPLayer.run_with`` (what an FSDP unit runs on the gathered weights) on
    ``weights()`` equals the depth's own forward, dense and MoE."""
    for cfg in (tiny_gpt(num_nextn_predict_layers=1), tiny_dsv3(num_nextn_predict_layers=1)):
        model = build_model(cfg, seed=0)
        depth = model.mtp.layers[0]
        ids, _, _ = batch(cfg, b=2, s=6)
        tables = model.static_tables(2, 6)
        rng = np.random.default_rng(0)
        h = T(rng.standard_normal((12, cfg.hidden_size)).astype(np.float32))
        emb = model.embed_ids(T(ids))
        want = depth(h, emb, tables)
        got = depth.run_with(h, emb, tables, *depth.weights())
        assert len(got) == len(want) == 3
        for g, w in zip(got[:2], want[:2]):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-6, atol=1e-6)
        assert (got[2] is None) == (want[2] is None)
        if got[2] is not None:
            np.testing.assert_allclose(got[2].asnumpy(), want[2].asnumpy(), rtol=1e-6)
