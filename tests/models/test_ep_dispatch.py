"""The expert-parallel exchange plan (models/ep_dispatch.py) without msrun: ``ep`` simulated
ranks route their own tokens, the all-to-all is numpy's chunk transpose, and the combined
output of every rank must equal the single-process MoE output of its tokens (an independent
numpy reference: sum_j g_tj * expert_{e_tj}(x_t) over the kept pairs)."""
import numpy as np
import pytest

from mindformers_core.models.dispatch import make_plan
from mindformers_core.models.ep_dispatch import make_ep_plan, rank_of_expert

from ep_numpy_reference import F, H, all_to_all, reference, swiglu_expert


def simulate(tokens, topk, gates, w1, w2, ep, capacity_factor=None, policy="probs"):
    """Every rank's output through the plan, the exchange and its local experts only."""
    e = w1.shape[0]
    el = e // ep
    locals_ = [make_plan(t, e, capacity_factor, policy, g) for t, g in zip(topk, gates)]
    counts = np.stack([np.minimum(p.tokens_per_expert, p.capacity) for p in locals_])
    plans = [make_ep_plan(p, counts, r) for r, p in enumerate(locals_)]
    sends = []
    for x, p, lp in zip(tokens, plans, locals_):
        xz = np.concatenate([x, np.zeros((1, H))])
        sends.append(xz[np.where(p.send_pair < lp.num_tokens * lp.top_k,
                                 p.send_pair // lp.top_k, lp.num_tokens)])
    received = all_to_all(sends, ep)
    outs = []
    for r, (p, buf) in enumerate(zip(plans, received)):
        y = np.zeros_like(buf)
        for row, ex in zip(p.recv_rows, p.recv_expert):
            y[row] = swiglu_expert(buf[row], w1[r * el + ex], w2[r * el + ex])
        outs.append(y)
    returned = all_to_all(outs, ep)
    results = []
    for p, lp, back, g in zip(plans, locals_, returned, gates):
        bz = np.concatenate([back, np.zeros((1, H))])
        per_pair = bz[p.pair_slot].reshape(lp.num_tokens, lp.top_k, H)
        results.append((per_pair * g[..., None]).sum(1))
    return plans, locals_, results


def routed(rng, ranks, tokens, e, k, skew=0.0):
    topk, gates, xs = [], [], []
    for _ in range(ranks):
        logits = rng.normal(size=(tokens, e)) + skew * np.arange(e)
        topk.append(np.argsort(-logits, 1, kind="stable")[:, :k].astype(np.int32))
        gates.append(rng.random((tokens, k)))
        xs.append(rng.normal(size=(tokens, H)))
    return xs, topk, gates


@pytest.mark.parametrize("ep,e,k,cap,skew", [
    (2, 4, 2, None, 0.0), (4, 8, 2, None, 1.5), (2, 4, 1, 1.0, 0.0), (2, 6, 3, 0.5, 2.0),
    (4, 4, 2, 1.25, 3.0), (1, 4, 2, None, 0.0)])
def test_exchange_equals_one_process_per_rank(ep, e, k, cap, skew):
    rng = np.random.default_rng(ep * 100 + e * 10 + k)
    w1, w2 = rng.normal(size=(e, H, 2 * F)), rng.normal(size=(e, F, H))
    xs, topk, gates = routed(rng, ep, 7, e, k, skew)
    plans, locals_, outs = simulate(xs, topk, gates, w1, w2, ep, cap)
    for x, t, g, lp, out in zip(xs, topk, gates, locals_, outs):
        kept = lp.kept.reshape(t.shape)
        np.testing.assert_allclose(out, reference(x, t, g, w1, w2, kept), rtol=1e-12, atol=1e-12)
    if cap is not None:   # the capacity cases drop pairs on every rank (before the exchange)
        assert all(lp.dropped > 0 for lp in locals_)


def test_counts_chunks_and_slots():
    rng = np.random.default_rng(3)
    ep, e, k = 2, 4, 2
    w1, w2 = rng.normal(size=(e, H, 2 * F)), rng.normal(size=(e, F, H))
    xs, topk, gates = routed(rng, ep, 9, e, k, skew=2.0)
    plans, locals_, _ = simulate(xs, topk, gates, w1, w2, ep)
    c = plans[0].pair_counts()
    # C[s, d]: the pairs of rank s whose expert lives on rank d
    for s in range(ep):
        dest = rank_of_expert(topk[s].reshape(-1), e, ep)
        assert c[s].tolist() == [int((dest == d).sum()) for d in range(ep)]
    for r, p in enumerate(plans):
        assert p.chunk == max(1, int(c.max()))
        assert p.send_counts.tolist() == c[r].tolist()
        assert p.recv_counts.tolist() == c[:, r].tolist()
        assert p.recv_rows.size == p.recv_expert.size == c[:, r].sum()
        # every kept pair has one send row, and that row names it back
        num_pairs = locals_[r].num_tokens * k
        kept = np.flatnonzero(p.pair_slot < ep * p.chunk)
        assert np.array_equal(p.send_pair[p.pair_slot[kept]], kept)
        assert (p.send_pair == num_pairs).sum() == ep * p.chunk - kept.size
        # the received rows of source s carry that source's experts of this rank, ascending
        off = 0
        for s in range(ep):
            n = int(c[s, r])
            assert np.all(np.diff(p.recv_expert[off:off + n]) >= 0)
            assert p.recv_expert[off:off + n].tolist() == sorted(
                (topk[s].reshape(-1)[rank_of_expert(topk[s].reshape(-1), e, ep) == r]
                 - r * (e // ep)).tolist())
            off += n


def test_exchanged_counts_must_be_this_ranks():
    plan = make_plan(np.array([[0, 1], [1, 2]]), 4)
    with pytest.raises(ValueError, match=r"row 0 of the exchanged counts \[1, 1, 1, 0\] is not "
                                         r"this rank's kept pairs per expert \[1, 2, 1, 0\]"):
        make_ep_plan(plan, np.array([[1, 1, 1, 0], [0, 0, 0, 0]]), 0)
    with pytest.raises(ValueError, match=r"num_experts\(5\) must be divisible by "
                                         r"expert_parallel\(2\)"):
        rank_of_expert(np.arange(5), 5, 2)
