"""Router math (models/router.py) against closed forms and numpy, and the config rules of the
router options (config/moe.py) with their messages."""
import numpy as np
import pytest
import mindspore as ms

from mindformers_core.errors import ConfigError
from mindformers_core.models import router as rt
from model_test_utils import tiny_dsv3
import moe_numpy_reference as ref

T = ms.Tensor


def test_sort_ties_keep_index_order_on_this_backend():
    """The tie-break rests on this: a descending sort keeps equal values in index order."""
    rng = np.random.RandomState(0)
    key = np.round(rng.rand(500, 64), 1).astype(np.float32)        # many ties
    got = rt.topk_lowest_index(T(key), 8).asnumpy()
    np.testing.assert_array_equal(got, np.argsort(-key, 1, kind="stable")[:, :8])


def test_scores():
    z = np.array([[0.0, 1.0, -2.0]], np.float32)
    np.testing.assert_allclose(rt.router_scores(T(z), "sigmoid").asnumpy(), 1 / (1 + np.exp(-z)),
                               rtol=1e-6)
    np.testing.assert_allclose(rt.router_scores(T(z), "softmax").asnumpy(),
                               np.exp(z) / np.exp(z).sum(), rtol=1e-5)
    with pytest.raises(ValueError, match="scoring_func must be one of .* got 'relu'"):
        rt.router_scores(T(z), "relu")


def test_group_limited_selection_closed_form():
    # groups of 2: {0,1} scores .9+.1 = 1.0, {2,3} .6+.5 = 1.1 -> group 1 wins although
    # expert 0 has the largest single score
    key = np.array([[0.9, 0.1, 0.6, 0.5]], np.float32)
    assert rt.select_experts(T(key), None, 2, 2, 1).asnumpy().tolist() == [[2, 3]]
    assert rt.select_experts(T(key), None, 2).asnumpy().tolist() == [[0, 2]]
    # a group of one expert is scored by that expert alone
    assert rt.select_experts(T(key), None, 1, 4, 1).asnumpy().tolist() == [[0]]


@pytest.mark.parametrize("groups", [(None, None), (4, 2), (8, 3), (2, 1)])
def test_selection_matches_numpy(groups):
    rng = np.random.RandomState(1)
    scores = rng.rand(40, 16).astype(np.float32)
    bias = (rng.standard_normal(16) * 0.1).astype(np.float32)
    got = rt.select_experts(T(scores), T(bias), 4, *groups).asnumpy()
    np.testing.assert_array_equal(got, ref.select(scores + bias, 4, *groups))


def test_bias_selects_but_gate_weights_come_from_the_scores():
    scores = np.array([[0.2, 0.9, 0.4, 0.1]], np.float32)
    bias = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
    idx = rt.select_experts(T(scores), T(bias), 2)
    assert idx.asnumpy().tolist() == [[0, 1]]
    w = rt.gate_weights(T(scores), idx, True, 2.5).asnumpy()
    np.testing.assert_allclose(w, [[2.5 * 0.2 / 1.1, 2.5 * 0.9 / 1.1]], rtol=1e-6)
    w = rt.gate_weights(T(scores), idx, False, 1.0).asnumpy()
    np.testing.assert_allclose(w, [[0.2, 0.9]], rtol=1e-6)


def test_aux_losses_closed_form():
    # 2 sequences of 2 tokens, E = 2, k = 1; counts per sequence [[2, 0], [1, 1]]
    scores = np.array([[0.6, 0.2], [0.5, 0.5], [0.1, 0.3], [0.8, 0.2]], np.float32)
    counts = np.array([[2, 0], [1, 1]], np.float32)
    p = scores / scores.sum(-1, keepdims=True)
    seq = 0.5 * np.mean([(counts[b] * 2 / 2 * p[2 * b:2 * b + 2].mean(0)).sum() for b in range(2)])
    glob = 0.5 * (counts.sum(0) * 2 / 4 * p.mean(0)).sum()
    got = rt.aux_loss(T(scores), T(counts), 2, 2, 1, "seq_aux_loss", 0.5)
    np.testing.assert_allclose(float(got.asnumpy()), seq, rtol=1e-6)
    got = rt.aux_loss(T(scores), T(counts), 2, 2, 1, "aux_loss", 0.5)
    np.testing.assert_allclose(float(got.asnumpy()), glob, rtol=1e-6)
    assert rt.aux_loss(T(scores), T(counts), 2, 2, 1, "none", 0.5) is None
    assert rt.aux_loss(T(scores), T(counts), 2, 2, 1, "seq_aux_loss", 0.0) is None
    with pytest.raises(ValueError, match="moe_router_load_balancing_type must be one of"):
        rt.aux_loss(T(scores), T(counts), 2, 2, 1, "global_aux_loss", 0.5)


def test_expert_bias_step():
    new = rt.expert_bias_step(np.zeros(4, np.float32), np.array([5, 1, 3, 3], np.float32), 0.01)
    np.testing.assert_array_equal(new, np.array([-0.01, 0.01, 0.0, 0.0], np.float32))
    assert new.dtype == np.float32


# ----------------------------------------------------------------------- config rules
def test_router_option_defaults():
    cfg = tiny_dsv3()
    assert (cfg.n_group, cfg.topk_group, cfg.scoring_func) == (None, None, "sigmoid")
    assert cfg.moe_router_load_balancing_type == "seq_aux_loss"
    assert (cfg.moe_expert_capacity_factor, cfg.moe_token_drop_policy) == (None, "probs")
    assert cfg.resolved_shared_expert_intermediate_size() == 6          # 1 x moe_intermediate
    assert tiny_dsv3(n_shared_experts=2).resolved_shared_expert_intermediate_size() == 12
    assert tiny_dsv3(n_shared_experts=0).resolved_shared_expert_intermediate_size() == 0
    assert tiny_dsv3(moe_shared_expert_intermediate_size=5, n_shared_experts=0) \
        .resolved_shared_expert_intermediate_size() == 5


@pytest.mark.parametrize("kw,path,msg", [
    (dict(topk_group=1), "model.n_group",
     "When using group limited routing, moe_router_num_groups must be specified."),
    (dict(n_group=3, topk_group=1), "model.n_group",
     "num_moe_experts (4) should be divisible by moe_router_num_groups (3)."),
    (dict(n_group=2, topk_group=3), "model.topk_group",
     "moe_router_group_topk (3) should be smaller than moe_router_num_groups (2)."),
    (dict(n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=1),
     "model.num_experts_per_tok",
     "num_experts_per_tok (3) must be <= topk_group * n_routed_experts / n_group (2), the "
     "experts a token may still choose from."),
    (dict(n_group=0), "model.n_group", None),
    (dict(topk_group=0, n_group=2), "model.topk_group", None),
    (dict(moe_shared_expert_intermediate_size=0), "model.moe_shared_expert_intermediate_size", None),
    (dict(moe_expert_capacity_factor=0.0), "model.moe_expert_capacity_factor", None),
    (dict(scoring_func="relu"), "model.scoring_func", None),
    (dict(moe_router_load_balancing_type="sinkhorn"), "model.moe_router_load_balancing_type", None),
    (dict(moe_token_drop_policy="random"), "model.moe_token_drop_policy", None),
])
def test_router_option_errors(kw, path, msg):
    with pytest.raises(ConfigError) as info:
        tiny_dsv3(**kw)
    assert info.value.path == path
    if msg is not None:
        assert info.value.detail == msg
