"""Max attention-logit tracking (QK-Clip input) and the MLA QK-Clip row scaling."""
import numpy as np
import pytest
import mindspore as ms

from mindformers_core.models import build_model
from model_test_utils import T, batch, tiny_dsv3, tiny_gpt
import model_numpy_reference as ref


def _explicit_max(model, cfg, ids):
    rec = []
    ref.forward(ref.params_of(model), cfg, ids, rec)
    return np.stack([r["scores"].max(axis=(0, 2, 3)) for r in rec[:-1]])


@pytest.mark.parametrize("make", [tiny_gpt, tiny_dsv3], ids=["gpt", "dsv3"])
def test_max_logits_equal_explicit_scores_and_are_recorded_inside_value_and_grad(make):
    cfg = make()
    model = build_model(cfg, seed=2)
    a, la, ma = batch(cfg, seed=1)
    b, lb, mb = batch(cfg, seed=2)

    def fn(x, y, z):
        loss, n, aux = model(x, y, z)
        return loss / n + aux, n

    grad_fn = ms.value_and_grad(fn, None, model.trainable_params(), has_aux=True)
    model.reset_max_attention_logits()
    grad_fn(T(a), T(la), T(ma))
    got = model.get_max_attention_logits()
    assert got.dtype == np.float32 and got.shape == (cfg.num_layers, cfg.num_attention_heads)
    want_a = _explicit_max(model, cfg, a)
    np.testing.assert_allclose(got, want_a, rtol=1e-4, atol=1e-5)
    # a second micro-batch: running max over both
    grad_fn(T(b), T(lb), T(mb))
    want = np.maximum(want_a, _explicit_max(model, cfg, b))
    np.testing.assert_allclose(model.get_max_attention_logits(), want, rtol=1e-4, atol=1e-5)
    # reset: nothing tracked -> -inf, then only the new batch
    model.reset_max_attention_logits()
    assert np.all(np.isneginf(model.get_max_attention_logits()))
    model.logits(T(b))
    np.testing.assert_allclose(model.get_max_attention_logits(), _explicit_max(model, cfg, b),
                               rtol=1e-4, atol=1e-5)


def test_masked_entries_are_excluded_from_the_max():
    # a huge logit between query 0 and a future key must not count
    cfg = tiny_gpt(num_layers=1, num_attention_heads=1, hidden_size=8)
    model = build_model(cfg, seed=0)
    ids = np.array([[1, 2, 3, 4]], np.int32)
    rec = []
    ref.forward(ref.params_of(model), cfg, ids, rec)
    scores = rec[0]["scores"]
    model.reset_max_attention_logits()
    model.logits(T(ids))
    got = model.get_max_attention_logits()[0, 0]
    assert got == pytest.approx(np.nanmax(np.where(np.isinf(scores), np.nan, scores)), rel=1e-5)


def test_set_max_attention_logits_replaces_values():
    model = build_model(tiny_gpt(), seed=0)
    vals = np.arange(8, dtype=np.float32).reshape(2, 4)
    model.set_max_attention_logits(vals)
    np.testing.assert_array_equal(model.get_max_attention_logits(), vals)
    np.testing.assert_array_equal(model.max_attention_logits_tensor().asnumpy(), vals)


@pytest.mark.parametrize("q_lora_rank", [8, None])
def test_qk_clip_layout_rows(q_lora_rank):
    cfg = tiny_dsv3(q_lora_rank=q_lora_rank, num_attention_heads=2, qk_nope_head_dim=4,
                    qk_rope_head_dim=2, v_head_dim=3)
    model = build_model(cfg, seed=0)
    layout = model.qk_clip_layout()
    assert [e["layer"] for e in layout] == [0, 1]
    e = layout[1]
    q_attr = "linear_q_up_proj" if q_lora_rank else "linear_q_proj"
    assert e["q_param"] == f"decoder.layers.1.self_attention.{q_attr}.weight"
    assert e["kv_param"] == "decoder.layers.1.self_attention.linear_kv_up_proj.weight"
    assert e["q_nope_rows"] == [[0, 1, 2, 3], [6, 7, 8, 9]]
    assert e["q_rope_rows"] == [[4, 5], [10, 11]]
    assert e["k_nope_rows"] == [[0, 1, 2, 3], [7, 8, 9, 10]]
    assert e["v_rows"] == [[4, 5, 6], [11, 12, 13]]
    names = {p.name: tuple(p.shape) for p in model.get_parameters()}
    assert names[e["q_param"]][0] == 12 and names[e["kv_param"]][0] == 14


def test_gpt_layout_empty_and_clip_noop():
    model = build_model(tiny_gpt(), seed=0)
    assert model.qk_clip_layout() == []
    before = {p.name: p.asnumpy().copy() for p in model.get_parameters()}
    model.logits(T(np.array([[1, 2, 3]], np.int32)))
    n, mx = model.apply_qk_clip_scaling(1e-6)
    assert n == 0 and mx == pytest.approx(model.get_max_attention_logits().max())
    for p in model.get_parameters():
        np.testing.assert_array_equal(p.asnumpy(), before[p.name])


@pytest.mark.parametrize("q_lora_rank", [8, None])
def test_qk_clip_scaling_brings_clipped_heads_to_threshold(q_lora_rank):
    cfg = tiny_dsv3(q_lora_rank=q_lora_rank, initializer_range=0.5)
    model = build_model(cfg, seed=3)
    ids, _, _ = batch(cfg, b=2, s=8)
    model.reset_max_attention_logits()
    model.logits(T(ids))
    s = model.get_max_attention_logits().astype(np.float64)
    tau = float(np.median(s))            # clips about half of the heads
    before = {p.name: p.asnumpy().copy() for p in model.get_parameters()}
    n_clipped, max_logit = model.apply_qk_clip_scaling(ms.Tensor([tau], ms.float32))
    assert n_clipped == int((s > tau).sum()) > 0
    assert max_logit == pytest.approx(s.max(), rel=1e-6)
    # layer 0 is changed, so only layer 0's logits are exactly predictable: S' = min(S, tau)
    model.reset_max_attention_logits()
    model.logits(T(ids))
    after = model.get_max_attention_logits()[0]
    np.testing.assert_allclose(after, np.minimum(s[0], tau), rtol=1e-4)
    # untouched: v rows, shared rope key (kv_down_proj), unclipped heads' rows
    e = model.qk_clip_layout()[0]
    kv = model.parameters_dict()[e["kv_param"]].asnumpy()
    for h in range(cfg.num_attention_heads):
        np.testing.assert_array_equal(kv[e["v_rows"][h]], before[e["kv_param"]][e["v_rows"][h]])
        gamma = min(1.0, tau / s[0, h])
        q = model.parameters_dict()[e["q_param"]].asnumpy()
        np.testing.assert_allclose(q[e["q_rope_rows"][h]], before[e["q_param"]][e["q_rope_rows"][h]] * gamma, rtol=1e-6)
        np.testing.assert_allclose(q[e["q_nope_rows"][h]], before[e["q_param"]][e["q_nope_rows"][h]] * np.sqrt(gamma), rtol=1e-6)
        np.testing.assert_allclose(kv[e["k_nope_rows"][h]], before[e["kv_param"]][e["k_nope_rows"][h]] * np.sqrt(gamma), rtol=1e-6)
    name = "decoder.layers.0.self_attention.linear_kv_down_proj.weight"
    np.testing.assert_array_equal(model.parameters_dict()[name].asnumpy(), before[name])


def test_qk_clip_scaling_on_a_separate_param_map_leaves_model_untouched():
    cfg = tiny_dsv3(initializer_range=0.5)
    model = build_model(cfg, seed=3)
    model.logits(T(batch(cfg)[0]))
    masters = {p.name: ms.Parameter(p.astype(ms.float32), name=p.name) for p in model.get_parameters()}
    before = {p.name: p.asnumpy().copy() for p in model.get_parameters()}
    n, _ = model.apply_qk_clip_scaling(0.0001, masters)
    assert n == 2 * cfg.num_attention_heads
    e = model.qk_clip_layout()[0]
    assert not np.array_equal(masters[e["q_param"]].asnumpy(), before[e["q_param"]])
    for p in model.get_parameters():
        np.testing.assert_array_equal(p.asnumpy(), before[p.name])


def test_qk_clip_on_plain_tensor_masters_and_on_bf16_params():
    cfg = tiny_dsv3(initializer_range=0.5, params_dtype="bfloat16")
    model = build_model(cfg, seed=3)
    model.logits(T(batch(cfg)[0]))
    e = model.qk_clip_layout()[0]
    masters = {p.name: p.astype(ms.float32) for p in model.get_parameters()}   # plain Tensors
    q0 = masters[e["q_param"]].asnumpy().copy()
    n, _ = model.apply_qk_clip_scaling(np.float32(1e-4), masters)
    assert n == 2 * cfg.num_attention_heads
    q1 = masters[e["q_param"]].asnumpy()
    gamma = 1e-4 / model.get_max_attention_logits()[0, 0]
    np.testing.assert_allclose(q1[e["q_rope_rows"][0]], q0[e["q_rope_rows"][0]] * gamma, rtol=1e-5)
    own = model.parameters_dict()[e["q_param"]]
    before = own.astype(ms.float32).asnumpy().copy()
    model.apply_qk_clip_scaling(1e-4)
    assert own.dtype == ms.bfloat16
    after = own.astype(ms.float32).asnumpy()
    np.testing.assert_allclose(after[e["q_rope_rows"][0]], before[e["q_rope_rows"][0]] * gamma,
                               rtol=1e-2, atol=1e-6)
