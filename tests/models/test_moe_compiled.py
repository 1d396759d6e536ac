"""The MoE layer under ``training.jit: layer``: the whole layer, router and static-shape
dispatch included (models/static_dispatch.py), is one graph; it computes what PyNative does
(loss, aux loss, every gradient), and the host statistics it hands back (routed pairs per
expert, dropped pairs, aux loss) drive the same expert-bias update."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.models import build_model
from mindformers_core.models.dispatch import expert_ffn
from mindformers_core.models.static_dispatch import static_expert_ffn, static_layout
from model_test_utils import T, batch, tiny_dsv3

# dropless (default), a capacity with each drop policy, the padded dispatch with and without
CASES = {
    "dropless": {},
    "capacity_probs": {"moe_expert_capacity_factor": 0.3, "moe_token_drop_policy": "probs"},
    "capacity_position": {"moe_expert_capacity_factor": 0.3,
                          "moe_token_drop_policy": "position"},
    "padded": {"use_pad_tokens": True},
    "padded_capacity": {"use_pad_tokens": True, "moe_expert_capacity_factor": 1.0},
}


def _cfg(**kw):
    return tiny_dsv3(num_layers=3, moe_router_enable_expert_bias=True,
                     moe_router_bias_update_rate=0.05, moe_aux_loss_coeff=1e-2, **kw)


def _loss_and_grads(model, ids, labels, mask):
    params = model.trainable_params()

    def f(i, l, m):
        loss_sum, n, aux = model(i, l, m)
        return loss_sum / n + aux
    loss, grads = ms.value_and_grad(f, grad_position=None, weights=params)(
        T(ids), T(labels), T(mask))
    return float(loss.asnumpy()), {p.name: g.asnumpy() for p, g in zip(params, grads)}


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_moe_layer_equals_pynative(case, monkeypatch):
    from mindformers_core.models import compiled as compiled_module
    monkeypatch.setattr(compiled_module, "COMPILE_MOE", True)
    cfg = _cfg(**CASES[case])
    eager, compiled = build_model(cfg, seed=3), build_model(cfg, seed=3, jit="layer")
    assert compiled.jit_mode == "layer"
    moe_layers = [i for i in range(cfg.num_layers) if i >= cfg.first_k_dense_replace]
    assert all(compiled.decoder.layers[i].mlp.static_ok for i in moe_layers)
    for step in range(2):     # the second step after an expert-bias update (set_data)
        ids, labels, mask = batch(cfg, b=2, s=8, seed=10 + step)
        got_loss, got = _loss_and_grads(compiled, ids, labels, mask)
        want_loss, want = _loss_and_grads(eager, ids, labels, mask)
        assert got_loss == pytest.approx(want_loss, rel=1e-5)
        for name, w in want.items():
            np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-6, err_msg=name)
        for i in moe_layers:
            mc, me = compiled.decoder.layers[i].mlp, eager.decoder.layers[i].mlp
            np.testing.assert_array_equal(mc.tokens_per_expert.asnumpy(),
                                          me.tokens_per_expert.asnumpy())
            assert mc.dropped == me.dropped and mc.num_forwards == me.num_forwards
            np.testing.assert_allclose(mc.aux_sum.asnumpy(), me.aux_sum.asnumpy(), rtol=1e-5)
            np.testing.assert_array_equal(mc.last_topk.asnumpy(), me.last_topk.asnumpy())
        np.testing.assert_allclose(compiled.get_max_attention_logits(),
                                   eager.get_max_attention_logits(), rtol=1e-5)
        if "capacity" in case:
            assert any(compiled.decoder.layers[i].mlp.dropped > 0 for i in moe_layers)
        for model in (eager, compiled):
            model.update_expert_bias()
    bias = [compiled.decoder.layers[i].mlp.router.expert_bias.asnumpy() for i in moe_layers]
    assert any(np.abs(b).sum() > 0 for b in bias)      # the bias moved and routing read it
    for i, b in zip(moe_layers, bias):
        np.testing.assert_array_equal(b, eager.decoder.layers[i].mlp.router.expert_bias.asnumpy())


@pytest.mark.parametrize("capacity,policy,pad", [(None, "probs", False), (None, "probs", True),
                                                 (0.5, "probs", False), (0.5, "position", False),
                                                 (0.5, "probs", True), (1.0, "position", True)])
def test_static_dispatch_equals_the_host_plan(capacity, policy, pad):
    """``static_expert_ffn`` (tensor ops) against ``expert_ffn`` (the numpy plan) on an
    imbalanced routing with equal gate weights (the tie order) and drops."""
    rng = np.random.default_rng(0)
    t, k, e, h, f = 24, 2, 4, 8, 6
    idx = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    idx[:10] = [0, 1]
    w = rng.random((t, k)).astype(np.float32)
    w[:6] = 0.5
    args = (Tensor(rng.standard_normal((t, h)).astype(np.float32)), Tensor(w), Tensor(idx),
            Tensor(rng.standard_normal((e, h, 2 * f)).astype(np.float32)),
            Tensor(rng.standard_normal((e, f, h)).astype(np.float32)), f, capacity, policy, pad)
    want, want_counts, want_dropped = expert_ffn(*args)
    got, counts, dropped = static_expert_ffn(*args)
    # the two sum the same float32 products in other orders (other blocks); outputs reach |15|,
    # where one ulp is ~1e-6, so a few ulps of the largest partial sum is the bound (a wrong row
    # or gate weight is off by O(1)); the BLAS kernel chosen for this CPU sets the exact ulps
    np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-6, atol=2e-5)
    np.testing.assert_array_equal(counts.asnumpy(), want_counts.asnumpy())
    assert int(dropped.asnumpy()) == want_dropped and (want_dropped > 0) == (capacity is not None)


def test_static_layout_bounds_the_rows():
    # dropless: b = ceil(Tk / 4E), NB = floor((Tk + E (b - 1)) / b) >= sum_e ceil(c_e / b)
    assert static_layout(1024, 2, 16, None, False) == (32, 79, None)
    # padded: one block of T (dropless) or the capacity per expert
    assert static_layout(1024, 2, 16, None, True) == (1024, 16, 1024)
    assert static_layout(1024, 2, 16, 1.0, True) == (128, 16, 128)
