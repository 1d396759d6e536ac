"""Muon on tensor-parallel shards, one process (no collectives run): pieces and scale from the
full shape, the NS owners, QK-Clip on local rows vs numpy on the full weights, and every error
message of the sharding, the levels and the exchange."""
import math
import os
import sys

import numpy as np
import pytest
from mindspore import Parameter, Tensor

from mindformers_core.distributed.collectives import GroupCommunicator
from mindformers_core.core.parallel_dims import make_mesh
from mindformers_core.distributed.shard_exchange import ShardedMuonExchange, SpecLevel
from mindformers_core.distributed.shard_spec import ShardSpec, local_shape, shard, unshard
from mindformers_core.distributed.group_view import GroupView
from mindformers_core.distributed.tp_sharding import (LocalHeadLogits,
                                                      TensorParallelSharding,
                                                      check_shard_specs, local_heads)
from mindformers_core.models import build_model
from mindformers_core.optim.build import optimizer_kwargs
from mindformers_core.optim.muon import Muon
from mindformers_core.optim.qk_clip import qk_clip_step

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tp_muon_case as C  # noqa: E402

M = C.MODEL
N, DN, DR, DV = (M["num_attention_heads"], M["qk_nope_head_dim"], M["qk_rope_head_dim"],
                 M["v_head_dim"])
Q_UP = "decoder.layers.0.self_attention.linear_q_up_proj.weight"
KV_UP = "decoder.layers.0.self_attention.linear_kv_up_proj.weight"
FC1 = "decoder.layers.0.mlp.linear_fc1.weight"


def tp2_comm(rank):
    """A tp-2 communicator of rank ``rank`` (the tp group is the world: nothing is created)."""
    return GroupCommunicator(make_mesh(2, tp=2), rank, backend="cpu")


def local_muon(rank, strategy="allgather_deredundency", **extra):
    """Muon over rank ``rank``'s shards of the case model, built by TensorParallelSharding."""
    model = build_model(M, seed=7)
    specs = C.tp_specs(model, 2)
    params = [Parameter(Tensor(shard(specs[p.name], p.asnumpy(), rank) if p.name in specs
                               else p.asnumpy()), name=p.name) for p in model.trainable_params()]
    kwargs = optimizer_kwargs({k: v for k, v in dict(C.MUON, comm_strategy=strategy).items()
                               if k != "lr"})
    kwargs.update(model=model, **extra)
    sharding = TensorParallelSharding(specs, tp2_comm(rank))
    return sharding.build(Muon, [{"params": params}], kwargs), specs, model


def test_pieces_and_scale_use_the_full_shape():
    opt, specs, _ = local_muon(0)
    i = opt.index_of(Q_UP)
    assert tuple(opt.parameters[i].shape) == (N // 2 * (DN + DR), M["q_lora_rank"])
    assert opt.full_shape(i) == (N * (DN + DR), M["q_lora_rank"])
    assert opt.piece_shapes_of(Q_UP) == [(N * DN, 16), (N * DR, 16)]
    assert opt.piece_shapes_of(KV_UP) == [(N * DN, 16), (N * DV, 16)]
    f = M["ffn_hidden_size"]
    assert opt.piece_shapes_of(FC1) == [(f, 32), (f, 32)]   # interleaved gate/up of 2F rows
    # replicated weights keep their own shape
    down = "decoder.layers.0.self_attention.linear_kv_down_proj.weight"
    assert opt.piece_shapes_of(down) == [(M["kv_lora_rank"], 32), (DR, 32)]


def test_owners_are_balanced_and_the_same_on_both_ranks():
    ex = [local_muon(r)[0].exchange for r in (0, 1)]
    assert ex[0].owner_by_name == ex[1].owner_by_name
    opt, specs, _ = local_muon(0)
    split_muon = {n for n in specs if n in opt.muon_param_names}
    assert set(ex[0].owner_by_name) == split_muon
    # greedy LPT on upstream's cost of the FULL pieces, written out here
    def cost(name):
        total = 0.0
        for a, b in opt.piece_shapes_of(name):
            big, small = max(a, b), min(a, b)
            total += opt.ns_steps * (2.0 * big * small ** 2 + small ** 3) + a * b
        return total
    load = [0.0, 0.0]
    for name in sorted(split_muon, key=lambda n: (-cost(n), opt.index_of(n))):
        q = 0 if load[0] <= load[1] else 1
        assert ex[0].owner_by_name[name] == q
        load[q] += cost(name)
    assert abs(load[0] - load[1]) <= max(cost(n) for n in split_muon)


def numpy_clip(q, kv, s, tau):
    """QK-Clip of full q/kv weights with per-head max logits s (numpy, closed form)."""
    q, kv = q.astype(np.float64).copy(), kv.astype(np.float64).copy()
    for h in range(len(s)):
        if s[h] > tau:
            g = tau / s[h]
            q[h * (DN + DR):h * (DN + DR) + DN] *= math.sqrt(g)
            q[h * (DN + DR) + DN:(h + 1) * (DN + DR)] *= g
            kv[h * (DN + DV):h * (DN + DV) + DN] *= math.sqrt(g)
    return q, kv


def test_qk_clip_on_local_rows_equals_the_unsharded_result():
    model = build_model(M, seed=7)
    specs = C.tp_specs(model, 2)
    weights = {p.name: p.asnumpy() for p in model.trainable_params()}
    logits = C.full_max_logits(M["num_layers"], N, 0)
    tau = C.THRESHOLD
    assert (logits > tau).any() and (logits <= tau).any()
    shards = {}
    for rank in (0, 1):
        local = {n: Parameter(Tensor(shard(specs[n], weights[n], rank)), name=n)
                 for n in specs if "linear_q_up_proj" in n or "linear_kv_up_proj" in n}
        model.set_max_attention_logits(logits[:, rank * N // 2:(rank + 1) * N // 2])
        stats = qk_clip_step(model, tau, local)
        assert stats.num_clipped_heads == int((logits[:, rank * 2:rank * 2 + 2] > tau).sum())
        for n, p in local.items():
            shards.setdefault(n, []).append(p.asnumpy())
    for layer in range(M["num_layers"]):
        pre = f"decoder.layers.{layer}.self_attention."
        q, kv = numpy_clip(weights[pre + "linear_q_up_proj.weight"],
                           weights[pre + "linear_kv_up_proj.weight"], logits[layer], tau)
        for name, want in (("linear_q_up_proj.weight", q), ("linear_kv_up_proj.weight", kv)):
            got = unshard(specs[pre + name], shards[pre + name])
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=pre + name)


def test_local_heads_from_the_split_q_weight():
    model = build_model(M, seed=7)
    tc = model.get_gpt_transformer_config()
    assert local_heads(tc, C.tp_specs(model, 2)) == N // 2
    assert local_heads(tc, {}) == N
    opt = local_muon(1)[0]
    assert opt.max_logits_reducer.local_heads == N // 2


def test_local_head_logits_are_checked():
    reducer = LocalHeadLogits(2, GroupView(tp2_comm(0), "dp"))
    np.testing.assert_array_equal(reducer(np.ones((2, 2))), np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"max attention logits have shape \(2, 4\); a "
                                         r"tensor-parallel rank tracks \[layers, 2\]"):
        reducer(np.ones((2, 4)))


# -- error paths ------------------------------------------------------------------------------
def _params():
    return [Parameter(Tensor(np.zeros((4, 6), np.float32)), name="w")]


@pytest.mark.parametrize("spec, msg", [
    (ShardSpec((8, 6), 0, "dp", 2), "'w' is split over group 'dp'; tensor-parallel sharding "
                                    "takes 'tp' splits only"),
    (ShardSpec((16, 6), 0, "tp", 4), "'w' is split into 4 shards, but the tp group has 2 ranks"),
    (ShardSpec((8, 12), 1, "tp", 2), r"'w' has shape \(4, 6\), but its ShardSpec's local shape "
                                     r"is \(8, 6\)"),
])
def test_check_shard_specs_messages(spec, msg):
    with pytest.raises(ValueError, match=msg):
        check_shard_specs({"w": spec}, _params(), 2)


def test_check_shard_specs_unknown_name_and_replicated():
    with pytest.raises(ValueError, match="shard_specs names 'v', which is not a parameter the "
                                         "optimizer updates"):
        check_shard_specs({"v": ShardSpec((8, 6), 0, "tp", 2)}, _params(), 2)
    assert check_shard_specs({"w": ShardSpec((4, 6))}, _params(), 2) == {}


def test_spec_level_messages():
    comm = tp2_comm(0)
    with pytest.raises(ValueError, match="parameter 3 is split over group 'dp', not 'tp'"):
        SpecLevel({3: ShardSpec((8, 6), 0, "dp", 2)}, comm, "tp")
    with pytest.raises(ValueError, match="parameter 1 is split into 4 shards, but the tp group "
                                         "has 2 ranks"):
        SpecLevel({1: ShardSpec((8, 6), 0, "tp", 4)}, comm, "tp")
    assert SpecLevel({}, comm, "tp").p2p is None          # CPU: no send/recv (CAPABILITIES)
    assert SpecLevel({}, comm, "tp", p2p=True).p2p is not None


def test_exchange_messages():
    tp = SpecLevel({0: ShardSpec((8, 6), 0, "tp", 2)}, tp2_comm(0), "tp")
    with pytest.raises(ValueError, match="comm_strategy must be 'allgather' or "
                                         "'allgather_deredundency', got 'p2p'."):
        ShardedMuonExchange([tp], "p2p", {0: [(8, 6)]}, 5, ["w"], [(8, 6)])

    rows = SpecLevel({}, tp2_comm(0), "tp", model_sharded=False)
    with pytest.raises(ValueError, match="level 'tp' shards the model's parameters and must "
                                         "come before the levels that shard only optimizer"):
        ShardedMuonExchange([rows, tp], "allgather", {0: [(8, 6)]}, 5, ["w"], [(8, 6)])


def test_muon_full_shapes_messages():
    model = build_model(M, seed=7)
    params = [Parameter(Tensor(p.asnumpy()), name=p.name) for p in model.trainable_params()]
    kwargs = optimizer_kwargs({k: v for k, v in C.MUON.items() if k != "lr"})
    with pytest.raises(ValueError, match="full_shapes names 'nope', which is not a parameter "
                                         "of this optimizer"):
        Muon(params, model=model, full_shapes={"nope": (2, 2)}, **kwargs)
    with pytest.raises(ValueError, match=r"full shape \(50, 16\) of '.*linear_q_up_proj.weight' "
                                         r"does not hold its shard \(48, 16\) a whole number"):
        Muon(params, model=model, full_shapes={Q_UP: (50, 16)}, **kwargs)


# -- the trainer's path: the tp reducer builds the optimizer from model.shard_specs() ----------
@pytest.fixture
def world2(monkeypatch):
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "2")


def test_tp_reducer_builds_muon_and_adamw_through_tensor_parallel_sharding(world2, tmp_path):
    from mindformers_core.distributed.tp_reduce import TensorParallelGradReducer
    from mindformers_core.models.tp_model import apply_tensor_parallel
    from mindformers_core.optim.adamw import AdamW
    from mindformers_core.optim.build import build_optimizer
    from tp_case import TP, dsv3_config, dsv3_muon
    from mindformers_core.distributed.setup import GradReduction
    reducer = TensorParallelGradReducer(tp2_comm(1))
    # what the run's layout calls on it (shards the model, combines the QK-Clip report)
    assert isinstance(reducer, GradReduction)
    assert reducer.mean_over_ranks(0.5) == 0.5         # one dp replica
    cfg = dsv3_muon("allgather_deredundency")(str(tmp_path), TP)
    with pytest.raises(RuntimeError, match=r"^TensorParallelGradReducer\.optimizer_sharding "
                                           r"needs the sharded model: call bind_model\(model\) "
                                           r"first$"):
        reducer.optimizer_sharding(cfg)
    model = apply_tensor_parallel(build_model(cfg.model, seed=7, jit="none"), tp2_comm(1))
    reducer.bind_model(model)
    opt = build_optimizer(cfg.optimizer, model, shard_layout=reducer.optimizer_sharding(cfg))
    assert type(opt) is Muon and opt.comm_strategy == "allgather_deredundency"
    q_up = "decoder.layers.0.self_attention.linear_q_up_proj.weight"
    i = opt.index_of(q_up)
    assert opt.full_shape(i) == model.shard_specs()[q_up].full_shape
    assert opt.full_shape(i)[0] == 2 * opt.parameters[i].shape[0]
    assert opt.max_logits_reducer.local_heads == cfg.model.num_attention_heads // 2
    assert set(opt.exchange.owner_by_name) <= set(model.shard_specs())
    adamw_cfg = dsv3_config(str(tmp_path), TP)
    opt = build_optimizer(adamw_cfg.optimizer, model,
                          shard_layout=reducer.optimizer_sharding(adamw_cfg))
    assert type(opt) is AdamW      # dp 1: no ZeRO; per-shard state
    j = opt.index_of(q_up)
    assert opt.get_state("adam_m", j).shape == opt.parameters[j].shape == \
        local_shape(model.shard_specs()[q_up])


def test_qk_clip_report_combines_over_a_group():
    from mindformers_core.distributed.qk_clip_stats import combine_qk_stats
    from mindformers_core.optim.qk_clip import QKClipStats
    comm = tp2_comm(0)          # its dp group has one member: no collective runs
    assert combine_qk_stats(comm, "dp", None) is None
    assert combine_qk_stats(comm, "dp", QKClipStats(3, 0.25)) == QKClipStats(3, 0.25)
    assert combine_qk_stats(comm, "dp", QKClipStats(0, float("-inf"))) == \
        QKClipStats(0, float("-inf"))
