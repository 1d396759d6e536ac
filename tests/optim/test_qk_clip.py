"""QK-Clip on a real MLA model: clipped heads end at <= tau, the rest and v / rope key untouched."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.models.build import build_model
from mindformers_core.optim.muon import Muon
from mindformers_core.optim.qk_clip import QKClipStats, qk_clip_step

CFG = {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32, "num_layers": 1,
       "num_attention_heads": 4, "q_lora_rank": 8, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
       "qk_rope_head_dim": 4, "v_head_dim": 8, "ffn_hidden_size": 64, "seq_length": 8,
       "initializer_range": 0.5}   # large weights: head max logits ~7..10
PRE = "decoder.layers.0.self_attention."
N, DN, DR, DV = 4, 8, 4, 8


def _track(model):
    ids = Tensor(np.random.default_rng(0).integers(0, 64, (2, 8)).astype(np.int32))
    model.reset_max_attention_logits()
    model(ids, ids, Tensor(np.ones((2, 8), np.float32)))
    return model.get_max_attention_logits()[0].astype(np.float64)


def _weights(model):
    return {p.name: p.astype(ms.float32).asnumpy().copy() for p in model.trainable_params()}


def _rows(period, lo, hi, heads):
    return np.concatenate([np.arange(h * period + lo, h * period + hi) for h in heads])


def _check_clipped(before, after, s, tau, q_name):
    clipped = [h for h in range(N) if s[h] > tau]
    kept = [h for h in range(N) if s[h] <= tau]
    q0, q1 = before[PRE + q_name], after[PRE + q_name]
    kv0, kv1 = before[PRE + "linear_kv_up_proj.weight"], after[PRE + "linear_kv_up_proj.weight"]
    for h in clipped:
        g = tau / s[h]
        nope, rope = _rows(DN + DR, 0, DN, [h]), _rows(DN + DR, DN, DN + DR, [h])
        np.testing.assert_allclose(q1[nope], q0[nope] * np.sqrt(g), rtol=1e-6)
        np.testing.assert_allclose(q1[rope], q0[rope] * g, rtol=1e-6)
        knope = _rows(DN + DV, 0, DN, [h])
        np.testing.assert_allclose(kv1[knope], kv0[knope] * np.sqrt(g), rtol=1e-6)
    if kept:
        q_rows = _rows(DN + DR, 0, DN + DR, kept)
        np.testing.assert_array_equal(q1[q_rows], q0[q_rows])
        np.testing.assert_array_equal(kv1[_rows(DN + DV, 0, DN, kept)], kv0[_rows(DN + DV, 0, DN, kept)])
    v = _rows(DN + DV, DN, DN + DV, range(N))
    np.testing.assert_array_equal(kv1[v], kv0[v])                       # v rows untouched
    for name in ("linear_kv_down_proj.weight", "linear_proj.weight"):  # rope key k_pe lives here
        np.testing.assert_array_equal(after[PRE + name], before[PRE + name])
    return clipped, kept


@pytest.mark.parametrize("q_lora_rank, q_name", [(8, "linear_q_up_proj.weight"),
                                                 (None, "linear_q_proj.weight")])
def test_clipped_heads_end_at_tau_and_the_rest_is_untouched(q_lora_rank, q_name):
    model = build_model(dict(CFG, q_lora_rank=q_lora_rank), seed=0)
    s = _track(model)
    tau = float(np.sort(s)[1] + np.sort(s)[2]) / 2       # two heads above, two below
    before = _weights(model)
    stats = qk_clip_step(model, tau, {p.name: p for p in model.trainable_params()})
    assert stats == QKClipStats(2, pytest.approx(s.max(), rel=1e-6))
    assert np.all(np.isneginf(model.get_max_attention_logits()))      # reset for the next step
    clipped, kept = _check_clipped(before, _weights(model), s, tau, q_name)
    s_new = _track(model)
    assert np.all(s_new[clipped] <= tau * 1.01) and np.all(s_new[clipped] >= tau * 0.99)
    np.testing.assert_allclose(s_new[kept], s[kept], rtol=1e-6)


def test_nothing_happens_at_or_below_tau():
    model = build_model(CFG, seed=0)
    s = _track(model)
    before = _weights(model)
    stats = qk_clip_step(model, float(s.max()), {p.name: p for p in model.trainable_params()})
    assert stats.num_clipped_heads == 0
    after = _weights(model)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])


def test_muon_step_clips_fp32_masters_then_copies_to_bf16_params():
    model = build_model(dict(CFG, params_dtype="bfloat16"), seed=0)
    params = model.trainable_params()
    s = _track(model)
    tau = float(np.sort(s)[1] + np.sort(s)[2]) / 2
    opt = Muon(params, model=model, lr=0.0, qk_clip_threshold=tau)
    masters0 = {k[len("main_param."):]: v for k, v in opt.state_dict().items()
                if k.startswith("main_param.")}
    opt.step([Tensor(np.zeros(p.shape, np.float32)) for p in params])   # lr 0: only the clip
    assert opt.last_qk_clip.num_clipped_heads == 2
    assert opt.last_qk_clip.max_logit == pytest.approx(s.max(), rel=1e-6)
    masters1 = {k[len("main_param."):]: v for k, v in opt.state_dict().items()
                if k.startswith("main_param.")}
    _check_clipped(masters0, masters1, s, tau, "linear_q_up_proj.weight")
    for p in params:   # the model holds bf16(master)
        np.testing.assert_array_equal(
            p.astype(ms.float32).asnumpy(),
            Tensor(masters1[p.name]).astype(ms.bfloat16).astype(ms.float32).asnumpy())
    s_new = _track(model)
    clipped = s > tau
    assert np.all(s_new[clipped] <= tau * 1.01)


def test_data_parallel_reduction_hook_sees_and_sets_the_logits():
    model = build_model(CFG, seed=0)
    s = _track(model)
    seen = []

    def reduce_max(local):          # as if another rank had tracked a larger logit on head 0
        seen.append(local.copy())
        out = local.copy()
        out[0, 0] = 2 * s.max()
        return out

    stats = qk_clip_step(model, float(s.max()), {p.name: p for p in model.trainable_params()},
                         reduce_max_logits=reduce_max)
    np.testing.assert_allclose(seen[0][0], s, rtol=1e-6)
    assert stats.num_clipped_heads == 1 and stats.max_logit == pytest.approx(2 * s.max(), rel=1e-6)
