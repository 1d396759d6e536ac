"""``moe_token_dispatcher_type: alltoall_deredundancy`` (models/ep_dedup.py): each token goes
once to each EP rank it is routed to. Simulated ranks (numpy exchange) against the
one-process sum over the kept pairs, and the MindSpore path on one process (ep 1, every
collective the identity) against the plain dispatch in loss and every gradient. The 2-rank run
is tests/distributed/test_ep_msrun.py's ``adamw_dedup`` case."""
import dataclasses

import numpy as np
import pytest
import mindspore as ms

from mindformers_core.config import ConfigError, load_config
from mindformers_core.models.dispatch import make_plan
from mindformers_core.models.ep_dedup import make_dedup_plan, unique_per_destination
from mindformers_core.models.ep_dispatch import AllToAll, make_ep_plan
from moe_test_utils import build_layer, inputs, moe_cfg, objective

from ep_numpy_reference import F, H, all_to_all, reference, swiglu_expert


@pytest.mark.parametrize("ep,e,k,cap,pad", [(2, 4, 2, None, False), (2, 4, 3, None, False),
                                            (4, 8, 4, None, False), (2, 6, 3, 0.75, False),
                                            (2, 4, 2, None, True), (1, 4, 2, None, False)])
def test_each_token_is_sent_once_per_rank_and_the_combine_is_exact(ep, e, k, cap, pad):
    rng = np.random.default_rng(10 * ep + e + k)
    t, el = 9, e // ep
    w1, w2 = rng.normal(size=(e, H, 2 * F)), rng.normal(size=(e, F, H))
    topk = [np.argsort(-rng.normal(size=(t, e)) - 1.5 * r * np.arange(e), 1)[:, :k]
            for r in range(ep)]
    gates = [rng.random((t, k)) for _ in range(ep)]
    xs = [rng.normal(size=(t, H)) for _ in range(ep)]
    locals_ = [make_plan(i, e, cap, "probs", g) for i, g in zip(topk, gates)]
    unique = np.stack([unique_per_destination(p, ep) for p in locals_])
    plans = [make_dedup_plan(p, unique, r, t if pad else None) for r, p in enumerate(locals_)]
    m = plans[0].chunk
    assert m == (t if pad else max(1, int(unique.max())))
    for r, (p, lp) in enumerate(zip(plans, locals_)):
        # rows sent = the distinct tokens per destination; pairs sent by ep_dispatch = kept pairs
        assert (p.send_token < t).sum() == unique[r].sum() <= lp.kept.sum()
        for d in range(ep):
            dests = topk[r] // el
            want = {i for i in range(t) for j in range(k)
                    if dests[i, j] == d and lp.kept.reshape(t, k)[i, j]}
            sent = p.send_token[d * m:(d + 1) * m]
            assert sorted(sent[sent < t].tolist()) == sorted(want)
    sends = [np.concatenate([x, np.zeros((1, H))])[p.send_token] for x, p in zip(xs, plans)]
    sides = [np.concatenate([g.reshape(-1), [0.0]])[p.send_pair] for g, p in zip(gates, plans)]
    masks = [(p.send_pair < t * k) for p in plans]
    recv, recv_gate, recv_mask = all_to_all(sends, ep), all_to_all(sides, ep), all_to_all(masks, ep)
    outs = []
    for r in range(ep):
        y = np.zeros_like(recv[r])
        for row in range(ep * m):
            for le in np.flatnonzero(recv_mask[r][row]):
                ex = r * el + le
                y[row] += recv_gate[r][row, le] * swiglu_expert(recv[r][row], w1[ex], w2[ex])
        outs.append(y)
    back = all_to_all(outs, ep)
    for r in range(ep):
        bz = np.concatenate([back[r], np.zeros((1, H))])
        got = bz[plans[r].token_slot].sum(1)
        want = reference(xs[r], topk[r], gates[r], w1, w2, locals_[r].kept.reshape(t, k))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_fewer_rows_than_the_pair_exchange_when_tokens_share_a_rank():
    """k = 4 of 8 experts on 2 ranks: every token has pairs on both ranks, about 2 per rank."""
    rng = np.random.default_rng(1)
    ep, e, k, t = 2, 8, 4, 16
    idx = [np.argsort(-rng.normal(size=(t, e)), 1)[:, :k] for _ in range(ep)]
    locals_ = [make_plan(i, e) for i in idx]
    counts = np.stack([np.minimum(p.tokens_per_expert, p.capacity) for p in locals_])
    unique = np.stack([unique_per_destination(p, ep) for p in locals_])
    pair_chunk = make_ep_plan(locals_[0], counts, 0).chunk
    dedup_chunk = make_dedup_plan(locals_[0], unique, 0).chunk
    assert dedup_chunk <= t < pair_chunk
    with pytest.raises(ValueError, match=r"row 0 of the exchanged unique-token counts"):
        make_dedup_plan(locals_[0], unique[::-1] + 1, 0)
    with pytest.raises(ValueError, match=r"padded exchange: \d+ tokens go to one rank, more "
                                         r"than the fixed chunk of 1 rows"):
        make_dedup_plan(locals_[0], unique, 0, 1)


def _grads(layer, x, r):
    fn = ms.value_and_grad(objective(layer, r), grad_position=0, weights=layer.trainable_params())
    value, (gx, gw) = fn(ms.Tensor(x))
    return float(value.asnumpy()), gx.asnumpy(), [g.asnumpy() for g in gw]


@pytest.mark.parametrize("pad,cap", [(False, None), (True, None), (False, 0.75)])
def test_mindspore_path_on_one_rank_equals_the_plain_dispatch(pad, cap):
    from mindformers_core.distributed.collectives import GroupCommunicator
    from mindformers_core.core.parallel_dims import make_mesh
    cfg = moe_cfg(moe_expert_capacity_factor=cap, use_pad_tokens=pad,
                  moe_token_drop_policy="position" if cap else "probs")
    plain = build_layer(cfg, seed=7)
    dedup = build_layer(dataclasses.replace(cfg, moe_token_dispatcher_type="alltoall_deredundancy"),
                        seed=7)
    assert dedup.experts.deredundant and not plain.experts.deredundant
    comm = GroupCommunicator(make_mesh(1), 0, "cpu")
    dedup.experts.ep_comm, dedup.experts.exchange = comm, AllToAll(comm, "ep")
    x, r = inputs(seed=8)
    want, got = _grads(plain, x, r), _grads(dedup, x, r)
    assert got[0] == pytest.approx(want[0], rel=1e-6)
    for a, b in zip([got[1]] + got[2], [want[1]] + want[2]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert dedup.dropped == plain.dropped
    np.testing.assert_array_equal(dedup.tokens_per_expert.asnumpy(),
                                  plain.tokens_per_expert.asnumpy())


def test_dispatcher_type_in_either_section():
    cfg = load_config({"model": {"model_type": "deepseek_v3"},
                       "parallelism": {"moe_token_dispatcher_type": "alltoall_deredundancy"}})
    assert cfg.model.moe_token_dispatcher_type == "alltoall_deredundancy"
    assert load_config(cfg.to_dict()).to_dict() == cfg.to_dict()
    cfg = load_config({"model": {"moe_token_dispatcher_type": "alltoall_deredundancy"}})
    assert cfg.parallelism.moe_token_dispatcher_type == "alltoall"   # the model's is read
    with pytest.raises(ConfigError, match=r"^parallelism\.moe_token_dispatcher_type: "
                                          r"'alltoall_deredundancy' disagrees with "
                                          r"model\.moe_token_dispatcher_type: 'alltoall'; "
                                          r"write one of them"):
        load_config({"model": {"moe_token_dispatcher_type": "alltoall"},
                     "parallelism": {"moe_token_dispatcher_type": "alltoall_deredundancy"}})
    with pytest.raises(ConfigError, match=r"^parallelism\.moe_token_dispatcher_type: must be "
                                          r"one of \['alltoall', 'alltoall_deredundancy'\]"):
        load_config({"parallelism": {"moe_token_dispatcher_type": "allgather"}})
