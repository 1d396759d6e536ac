"""The pure dispatch plan (models/dispatch.py): permutation, segments, capacity and drops,
checked against brute force; the padded-bucket expert computation against a per-pair loop."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import mindspore as ms

from mindformers_core.models.dispatch import (expert_capacity, expert_ffn, make_plan,
                                              block_expert_ffn, block_size,
                                              uses_grouped_matmul)


def _routing(t=12, e=5, k=2, seed=0):
    rng = np.random.RandomState(seed)
    idx = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    w = rng.rand(t, k).astype(np.float32)
    return idx, w


def test_order_groups_pairs_by_expert_in_pair_order():
    idx, _ = _routing()
    plan = make_plan(idx, 5)
    flat = idx.reshape(-1)
    for e in range(5):
        seg = plan.order[plan.offsets[e]:plan.offsets[e + 1]]
        np.testing.assert_array_equal(seg, np.flatnonzero(flat == e))   # ascending pair index
    np.testing.assert_array_equal(plan.tokens_per_expert, np.bincount(flat, minlength=5))
    assert plan.offsets[0] == 0 and plan.offsets[-1] == flat.size
    assert sorted(plan.order.tolist()) == list(range(flat.size))        # a permutation


def test_dropless_capacity_is_the_largest_segment_and_drops_nothing():
    idx, _ = _routing()
    plan = make_plan(idx, 5)
    assert plan.capacity == np.bincount(idx.reshape(-1)).max()
    assert plan.dropped == 0 and plan.kept.all()


@pytest.mark.parametrize("skew", [0.0, 3.0])
def test_rows_hold_each_pair_once_in_a_block_of_its_expert(skew):
    rng = np.random.RandomState(2)
    e, k, t = 16, 2, 40
    logits = rng.standard_normal((t, e)) + skew * np.arange(e) / e     # skew: late experts busy
    idx = np.argsort(-logits, 1, kind="stable")[:, :k].astype(np.int32)
    plan = make_plan(idx, e)
    rows, b = plan.pair_row, plan.block_rows
    assert len(set(rows.tolist())) == rows.size                        # distinct rows
    for p, row in enumerate(rows):
        assert plan.block_expert[row // b] == idx.reshape(-1)[p]
        assert plan.row_token[row] == p // k
    empty = np.setdiff1d(np.arange(plan.num_rows), rows)
    assert (plan.row_token[empty] == t).all()                          # padding rows
    assert (np.diff(plan.block_expert) >= 0).all()
    assert plan.num_rows <= t * k + plan.block_expert.size * (b - 1)
    assert plan.num_rows <= 2 * t * k + e              # activation rows O(T k), not O(E T)


def test_block_size_takes_the_layout_with_fewer_rows():
    assert block_size(np.array([141, 120, 130, 121])) == 141       # 564 rows vs 768 at b = 128
    assert block_size(np.array([32, 2, 2, 2, 2, 2, 2, 4])) == 6     # 78 rows vs 256 at b = 32
    assert block_size(np.array([3, 0, 3, 0])) == 3                  # ties: one block per expert


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.3])
def test_capacity_formula(factor):
    assert expert_capacity(24, 5, factor) == math.ceil(24 / 5 * factor)
    assert expert_capacity(1, 64, 0.01) == 1


@pytest.mark.parametrize("policy", ["probs", "position"])
def test_capacity_drops_follow_the_policy(policy):
    idx, w = _routing(t=20, e=4, k=2, seed=3)
    plan = make_plan(idx, 4, capacity_factor=0.6, drop_policy=policy, gate_weights=w)
    cap = math.ceil(40 / 4 * 0.6)
    assert plan.capacity == cap
    flat, wf = idx.reshape(-1), w.reshape(-1)
    want_kept = np.zeros(flat.size, bool)
    for e in range(4):
        pairs = list(np.flatnonzero(flat == e))
        if policy == "probs":
            pairs.sort(key=lambda p: (-wf[p], p))
        want_kept[pairs[:cap]] = True
    np.testing.assert_array_equal(plan.kept, want_kept)
    assert plan.dropped == int((~want_kept).sum()) > 0
    np.testing.assert_array_equal(plan.tokens_per_expert, np.bincount(flat, minlength=4))


def test_equal_weights_drop_the_later_pairs():
    idx = np.zeros((6, 1), np.int32)
    plan = make_plan(idx, 2, capacity_factor=1.0, drop_policy="probs",
                     gate_weights=np.ones((6, 1), np.float32))
    np.testing.assert_array_equal(plan.kept, [True, True, True, False, False, False])


def test_unknown_drop_policy_message():
    with pytest.raises(ValueError, match=r"moe_token_drop_policy must be one of \('probs', "
                                         r"'position'\), got 'random'"):
        make_plan(np.zeros((2, 1), np.int32), 2, 1.0, "random")


@pytest.mark.parametrize("case", ["one block per expert", "split blocks", "drops"])
def test_block_expert_ffn_equals_a_per_pair_loop(case):
    rng = np.random.RandomState(0)
    t, e, k, h, f = 9, 3, 2, 4, 3
    idx, w = _routing(t, e, k, seed=1)
    if case == "split blocks":
        idx[:, 0] = 0                                    # expert 0 takes every token
        idx[:, 1] = np.arange(t) % 2 + 1
    x = rng.standard_normal((t, h)).astype(np.float32)
    w1 = rng.standard_normal((e, h, 2 * f)).astype(np.float32)
    w2 = rng.standard_normal((e, f, h)).astype(np.float32)
    plan = make_plan(idx, e, capacity_factor=0.7 if case == "drops" else None,
                     drop_policy="position")
    assert (plan.block_expert.size > e) == (case == "split blocks")
    assert (plan.dropped > 0) == (case == "drops")
    got = block_expert_ffn(ms.Tensor(x), ms.Tensor(w), plan, ms.Tensor(w1), ms.Tensor(w2), f)
    want = np.zeros((t, h))
    for p in np.flatnonzero(plan.kept):
        ti, j = divmod(int(p), k)
        hh = x[ti] @ w1[idx[ti, j]]
        want[ti] += w[ti, j] * ((hh[:f] / (1 + np.exp(-hh[:f])) * hh[f:]) @ w2[idx[ti, j]])
    np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-5)


def test_cpu_uses_the_padded_path_and_reports_counts_and_drops():
    assert not uses_grouped_matmul(None)          # grouped matmul kernels are Ascend-only
    idx, w = _routing(t=10, e=4, k=2, seed=2)
    rng = np.random.RandomState(1)
    x = ms.Tensor(rng.standard_normal((10, 4)).astype(np.float32))
    w1 = ms.Tensor(rng.standard_normal((4, 4, 6)).astype(np.float32))
    w2 = ms.Tensor(rng.standard_normal((4, 3, 4)).astype(np.float32))
    out, counts, dropped = expert_ffn(x, ms.Tensor(w), ms.Tensor(idx), w1, w2, 3, 0.5, "probs")
    assert out.shape == (10, 4)
    np.testing.assert_array_equal(counts.asnumpy(), np.bincount(idx.reshape(-1), minlength=4))
    assert dropped == make_plan(idx, 4, 0.5, "probs", w).dropped > 0


@settings(max_examples=60, deadline=None)
@given(t=st.integers(1, 30), e=st.integers(1, 12), k=st.integers(1, 4), seed=st.integers(0, 999),
       factor=st.one_of(st.none(), st.floats(0.1, 2.0)), policy=st.sampled_from(["probs", "position"]),
       skew=st.floats(0.0, 4.0))
def test_plan_invariants(t, e, k, seed, factor, policy, skew):
    k = min(k, e)
    rng = np.random.RandomState(seed)
    logits = rng.standard_normal((t, e)) + skew * np.arange(e) / e
    idx = np.argsort(-logits, 1, kind="stable")[:, :k].astype(np.int32)
    w = rng.rand(t, k).astype(np.float32)
    plan = make_plan(idx, e, factor, policy, w)
    flat = idx.reshape(-1)
    kept_rows = plan.pair_row[plan.kept]
    assert len(set(kept_rows.tolist())) == kept_rows.size
    assert (plan.block_expert[kept_rows // plan.block_rows] == flat[plan.kept]).all()
    assert (plan.row_token[kept_rows] == np.flatnonzero(plan.kept) // k).all()
    kept_per_expert = np.bincount(flat[plan.kept], minlength=e)
    np.testing.assert_array_equal(kept_per_expert,
                                  np.minimum(np.bincount(flat, minlength=e), plan.capacity))
    assert plan.num_rows <= 2 * t * k + e
    if factor is None:
        assert plan.dropped == 0
