"""``model.use_pad_tokens: True``: the padded MoE dispatch (models/dispatch.py, ep_dispatch.py).
Every expert computes a fixed number of rows, so the shapes depend on T and E only; the loss
and every gradient equal the unpadded dispatch's and the dense numpy reference's."""
import dataclasses

import numpy as np
import pytest
import mindspore as ms

from mindformers_core.config import ConfigError, load_config
from mindformers_core.models.dispatch import make_plan, padded_rows
from mindformers_core.models.ep_dispatch import make_ep_plan, padded_chunk, spread_plan
from ep_numpy_reference import F, H, all_to_all, reference, swiglu_expert
from moe_numpy_reference import moe_forward
from moe_test_utils import build_layer, inputs, layer_params, moe_cfg, objective

CAPACITY = [(None, "probs"), (1.0, "probs"), (0.75, "position")]


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _value_and_grads(layer, x, r):
    fn = ms.value_and_grad(objective(layer, r), grad_position=0, weights=layer.trainable_params())
    value, (gx, gw) = fn(ms.Tensor(x))
    return float(value.asnumpy()), gx.asnumpy(), {p.name: g.asnumpy()
                                                   for p, g in zip(layer.trainable_params(), gw)}


@pytest.mark.parametrize("cf,policy", CAPACITY)
def test_padded_layer_equals_unpadded_and_the_dense_reference(cf, policy):
    cfg = moe_cfg(moe_expert_capacity_factor=cf, moe_token_drop_policy=policy)
    plain = build_layer(cfg, seed=3)
    padded = build_layer(dataclasses.replace(cfg, use_pad_tokens=True), seed=3)
    assert padded.spec.pad_tokens and not plain.spec.pad_tokens
    x, r = inputs(seed=4)
    want_v, want_gx, want_gw = _value_and_grads(plain, x, r)
    got_v, got_gx, got_gw = _value_and_grads(padded, x, r)
    assert got_v == pytest.approx(want_v, rel=1e-6)
    assert _rel(got_gx, want_gx) < 1e-6
    for name, g in want_gw.items():
        assert _rel(got_gw[name], g) < 1e-6, name
    assert padded.dropped == plain.dropped
    np.testing.assert_array_equal(padded.tokens_per_expert.asnumpy(),
                                  plain.tokens_per_expert.asnumpy())
    # and the independent dense float64 reference
    b, s, h = x.shape
    res = moe_forward(layer_params(padded), "", cfg, x.reshape(b * s, h).astype(np.float64),
                      b, s)
    padded.reset_stats()
    out, _ = padded(ms.Tensor(x))
    assert _rel(out.asnumpy().reshape(b * s, h), res["out"]) < 1e-5
    assert padded.dropped == res["dropped"]
    if cf == 0.75:
        assert res["dropped"] > 0


@pytest.mark.parametrize("cf", [None, 1.0, 0.5])
def test_padded_plan_shape_does_not_depend_on_the_routing(cf):
    """One block per expert (empty ones too) of padded_rows rows, whatever the imbalance."""
    rng = np.random.default_rng(0)
    t, k, e = 12, 2, 4
    pad = padded_rows(t, k, e, cf)
    assert pad == (t if cf is None else min(t, int(np.ceil(t * k / e * cf))))
    routings = [np.argsort(-rng.normal(size=(t, e)) - skew * np.arange(e), 1)[:, :k]
                for skew in (0.0, 3.0, 10.0)]
    routings.append(np.tile([0, 1], (t, 1)))        # every token on experts 0 and 1
    for idx in routings:
        w = rng.random((t, k))
        plan = make_plan(idx, e, cf, "probs", w, pad_to=pad)
        assert plan.num_rows == e * pad and plan.block_rows == pad
        assert plan.block_expert.tolist() == list(range(e))
        # the same pairs are kept as without padding, each once
        ref = make_plan(idx, e, cf, "probs", w)
        assert np.array_equal(plan.kept, ref.kept) and plan.dropped == ref.dropped
        rows = plan.pair_row[plan.kept]
        assert len(set(rows.tolist())) == rows.size
        assert np.array_equal(plan.row_token[rows], np.flatnonzero(plan.kept) // k)
        # each kept row lies in its expert's block
        assert np.array_equal(rows // pad, idx.reshape(-1)[plan.kept])


def test_padded_plan_refuses_more_pairs_than_rows():
    with pytest.raises(ValueError, match=r"padded dispatch: an expert keeps 2 pairs, more than "
                                         r"its 1 padded rows"):
        make_plan(np.array([[0, 0]]), 2, pad_to=1)


@pytest.mark.parametrize("ep,e,k,cap", [(2, 4, 2, None), (4, 8, 3, None), (2, 4, 2, 0.75)])
def test_padded_exchange_is_static_and_exact(ep, e, k, cap):
    """ep simulated ranks: fixed chunks (padded_chunk) whatever the routing, each rank's local
    experts computed over the whole received buffer laid out by spread_plan, and the combined
    output equals the one-process sum over the kept pairs."""
    rng = np.random.default_rng(ep + e + k)
    t, el = 7, e // ep
    w1, w2 = rng.normal(size=(e, H, 2 * F)), rng.normal(size=(e, F, H))
    xs, topk, gates = [], [], []
    for r in range(ep):
        topk.append(np.argsort(-rng.normal(size=(t, e)) - 2.0 * r * np.arange(e), 1)[:, :k])
        gates.append(rng.random((t, k)))
        xs.append(rng.normal(size=(t, H)))
    locals_ = [make_plan(i, e, cap, "probs", g) for i, g in zip(topk, gates)]
    counts = np.stack([np.minimum(p.tokens_per_expert, p.capacity) for p in locals_])
    chunk = padded_chunk(t, k, e, ep, cap)
    plans = [make_ep_plan(p, counts, r, chunk) for r, p in enumerate(locals_)]
    assert all(p.chunk == chunk for p in plans)
    sends = [np.concatenate([x, np.zeros((1, H))])[np.where(p.send_pair < t * k,
                                                            p.send_pair // k, t)]
             for x, p in zip(xs, plans)]
    recv = all_to_all(sends, ep)
    pad = ep * padded_rows(t, k, e, cap)
    outs = []
    for r, (p, buf) in enumerate(zip(plans, recv)):
        inner = spread_plan(make_plan(p.recv_expert.reshape(-1, 1), el, pad_to=pad),
                            p.recv_rows, ep * chunk)
        assert inner.num_rows == el * pad and inner.num_tokens == ep * chunk
        y_rows = np.zeros((inner.num_rows, H))
        for row, tok in enumerate(inner.row_token):
            if tok < ep * chunk:
                ex = r * el + inner.block_expert[row // inner.block_rows]
                y_rows[row] = swiglu_expert(buf[tok], w1[ex], w2[ex])
        y = np.zeros_like(buf)
        y[inner.kept] = y_rows[inner.pair_row[inner.kept]]
        assert inner.kept.sum() == p.recv_rows.size
        outs.append(y)
    back = all_to_all(outs, ep)
    for r in range(ep):
        bz = np.concatenate([back[r], np.zeros((1, H))])
        got = (bz[plans[r].pair_slot].reshape(t, k, H) * gates[r][..., None]).sum(1)
        want = reference(xs[r], topk[r], gates[r], w1, w2, locals_[r].kept.reshape(t, k))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"padded exchange: \d+ pairs go to one rank, more "
                                         r"than the fixed chunk of 0 rows"):
        make_ep_plan(locals_[0], counts, 0, 0)


def test_use_pad_tokens_is_a_model_field():
    cfg = load_config({"model": {"model_type": "deepseek_v3", "use_pad_tokens": True}})
    assert cfg.model.use_pad_tokens is True
    assert load_config(cfg.to_dict()).model.use_pad_tokens is True
    with pytest.raises(ConfigError, match=r"^model\.use_pad_tokens: expected a bool"):
        load_config({"model": {"use_pad_tokens": 1}})
