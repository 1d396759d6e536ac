"""MoE routing: top-k selection, token counts, expert-bias balancing, aux loss."""
import numpy as np
import pytest
import mindspore as ms

from mindformers_core.models import build_model
from model_test_utils import T, batch, tiny_dsv3
import model_numpy_reference as ref


def test_topk_selection_and_counts_match_reference():
    cfg = tiny_dsv3(n_routed_experts=6, num_experts_per_tok=3, num_layers=3)
    model = build_model(cfg, seed=4)
    ids, labels, mask = batch(cfg, b=2, s=7)
    model.reset_moe_stats()
    model(T(ids), T(labels), T(mask))
    rec = []
    ref.forward(ref.params_of(model), cfg, ids, rec)
    counts = model.get_tokens_per_expert()
    assert sorted(counts) == [1, 2]                       # first_k_dense_replace = 1
    for i, moe in model.moe_layers().items():
        top = moe.last_topk.asnumpy()
        assert top.shape == (14, 3)
        assert all(len(set(row)) == 3 for row in top)     # k distinct experts per token
        np.testing.assert_array_equal(np.sort(top, 1), np.sort(rec[i]["topk"], 1))
        want = np.bincount(rec[i]["topk"].reshape(-1), minlength=6)
        np.testing.assert_array_equal(counts[i], want)
        assert counts[i].sum() == 14 * 3
    # counts accumulate over forwards until reset
    model(T(ids), T(labels), T(mask))
    np.testing.assert_array_equal(model.get_tokens_per_expert()[1], 2 * counts[1])
    model.reset_moe_stats()
    assert model.get_tokens_per_expert()[1].sum() == 0


def test_expert_bias_changes_selection_not_gate_values():
    cfg = tiny_dsv3()
    model = build_model(cfg, seed=0)
    ids, labels, mask = batch(cfg)
    router = model.moe_layers()[1].router
    router.expert_bias.set_data(T(np.array([100.0, 100.0, 0.0, 0.0], np.float32)))
    model(T(ids), T(labels), T(mask))
    counts = model.get_tokens_per_expert()[1]
    np.testing.assert_array_equal(counts, [12, 12, 0, 0])   # every token picks experts 0 and 1
    P = ref.params_of(model)
    np.testing.assert_allclose(model.logits(T(ids)).asnumpy(), ref.forward(P, cfg, ids),
                               rtol=2e-4, atol=2e-5)   # reference: bias only selects


def _imbalance(load):
    return float(load.max() - load.min())


def test_expert_bias_update_moves_load_toward_balance():
    cfg = tiny_dsv3(n_routed_experts=4, num_experts_per_tok=1, moe_router_bias_update_rate=0.02,
                    num_layers=2)
    model = build_model(cfg, seed=7)
    rng = np.random.RandomState(0)
    ids = rng.randint(0, cfg.vocab_size, (4, 8)).astype(np.int32)
    lm = np.ones((4, 8), np.float32)
    router = model.moe_layers()[1].router
    # start strongly unbalanced: expert 0 preferred
    router.expert_bias.set_data(T(np.array([0.3, 0.0, 0.0, 0.0], np.float32)))
    model.reset_moe_stats()
    model(T(ids), T(ids), T(lm))
    first = model.get_tokens_per_expert()[1]
    before_bias = router.expert_bias.asnumpy().copy()
    model.update_expert_bias()
    step = router.expert_bias.asnumpy() - before_bias
    np.testing.assert_allclose(step, 0.02 * np.sign(first.mean() - first), atol=1e-7)
    assert model.get_tokens_per_expert()[1].sum() == 0    # counts reset by the update
    for _ in range(30):
        model(T(ids), T(ids), T(lm))
        last = model.get_tokens_per_expert()[1]
        model.update_expert_bias()
    assert _imbalance(first) >= 12, first
    assert _imbalance(last) < _imbalance(first) / 2, last


def test_expert_bias_update_disabled_is_noop():
    cfg = tiny_dsv3(moe_router_enable_expert_bias=False)
    model = build_model(cfg, seed=0)
    ids, labels, mask = batch(cfg)
    model(T(ids), T(labels), T(mask))
    model.update_expert_bias()
    np.testing.assert_array_equal(model.moe_layers()[1].router.expert_bias.asnumpy(), 0.0)


def test_gpt_has_no_moe_and_zero_aux():
    from model_test_utils import tiny_gpt
    model = build_model(tiny_gpt(), seed=0)
    ids, labels, mask = batch(model.cfg)
    assert model(T(ids), T(labels), T(mask))[2].asnumpy() == 0.0
    assert model.get_tokens_per_expert() == {}
    model.update_expert_bias()   # no-op, no error


def test_value_and_grad_runs_the_forward_once_for_the_counts():
    cfg = tiny_dsv3()
    model = build_model(cfg, seed=0)
    ids, labels, mask = batch(cfg, b=2, s=5)

    def fn(a, b, c):
        loss, n, aux = model(a, b, c)
        return loss / n + aux, n

    model.reset_moe_stats()
    ms.value_and_grad(fn, None, model.trainable_params(), has_aux=True)(T(ids), T(labels), T(mask))
    assert model.get_tokens_per_expert()[1].sum() == 2 * 5 * cfg.num_experts_per_tok
