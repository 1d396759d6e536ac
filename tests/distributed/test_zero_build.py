"""Sharding at construction (build_optimizer(..., shard_layout=ZeroSharding)): this rank's rows
of the plain optimizer's state, with no class swap; set-up only (a step needs the other ranks:
tests/distributed/test_dp_msrun.py)."""
import numpy as np
import pytest
import mindspore as ms

from mindformers_core.distributed.comm import Communicator
from mindformers_core.distributed.shard_layout import ShardLayout
from mindformers_core.distributed.zero import (ShardedMainParams, ZeroOptimizer, ZeroSharding,
                                               optimizer_state_bytes)
from mindformers_core.models.build import build_model
from mindformers_core.optim.build import build_optimizer

TINY = {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32, "num_layers": 2,
        "num_attention_heads": 2, "q_lora_rank": 8, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4, "v_head_dim": 8, "ffn_hidden_size": 64, "n_routed_experts": 2,
        "num_experts_per_tok": 1, "moe_intermediate_size": 16, "seq_length": 8,
        "params_dtype": "bfloat16"}


def _state(opt):
    return {f"{prefix}.{i}": t.astype(ms.float32).asnumpy()
            for prefix, slots in opt.state_slots.items() for i, t in enumerate(slots)
            if t is not None}


@pytest.mark.parametrize("opt_type", ["AdamW", "Muon"])
@pytest.mark.parametrize("rank", [0, 1])
def test_built_sharded_holds_this_ranks_rows_of_the_plain_state(opt_type, rank):
    section = {"type": opt_type}
    comm = Communicator(rank, 2)
    built = build_optimizer(section, build_model(dict(TINY), seed=0),
                            shard_layout=ZeroSharding(comm, -1))
    plain = build_optimizer(section, build_model(dict(TINY), seed=0))
    # a wrapper holding the plain class (never a subclass of it)
    assert isinstance(built, ZeroOptimizer) and type(built.inner) is type(plain)
    assert built.optimizer_name == f"Sharded{opt_type}"
    assert isinstance(built.masters, ShardedMainParams) and built.masters is built.inner.masters
    # the layout made independently from the parameter shapes
    layout = ShardLayout([p.shape for p in plain.parameters], 2, rank, 2)

    def rows(i, arr):
        return arr[slice(*layout.rows(i))] if layout.is_sharded(i) else arr

    a, b = _state(built), _state(plain)
    assert a.keys() == b.keys() and a
    for key in a:
        np.testing.assert_array_equal(a[key], rows(int(key.rsplit(".", 1)[1]), b[key]),
                                      err_msg=key)
    for i, (x, y) in enumerate(zip(built.main_params, plain.main_params)):
        np.testing.assert_array_equal(x.asnumpy(), rows(i, y.asnumpy()))
    assert optimizer_state_bytes(built) < 0.6 * optimizer_state_bytes(plain)
    # this rank's rows from the start: a sharded moment is not the parameter's shape
    shapes = [tuple(t.shape) for slots in built.state_slots.values() for t in slots
              if t is not None]
    full = [tuple(p.shape) for p in built.parameters]
    assert any(s not in full for s in shapes)


def test_one_shard_builds_the_plain_class_with_the_dp_max_reduction():
    comm = Communicator(0, 2)
    opt = build_optimizer({"type": "Muon"}, build_model(dict(TINY), seed=0),
                          shard_layout=ZeroSharding(comm, 1))
    assert type(opt).__name__ == "Muon" and opt.max_logits_reducer == comm.all_reduce_max


def test_shards_must_divide_the_world():
    with pytest.raises(ValueError, match=r"number of optimizer-state shards \(3\) must divide "
                                         r"the world size \(2\)"):
        ZeroSharding(Communicator(0, 2), 3)


@pytest.mark.parametrize("data_parallel", [None, 2])   # from the world / a stage's dp group
@pytest.mark.parametrize("strategy,shards", [("no_shard", 1), ("optim", 2)])
def test_the_data_parallel_reduction_keeps_no_shard_state_whole(monkeypatch, data_parallel,
                                                                strategy, shards):
    """The ZeRO-1 the data-parallel reduction builds (alone, under cp over dp x cp, and as a
    pipeline stage's, ``data_parallel``) reads the strategy: no_shard keeps one shard, the
    plain class, where it used to split the state over dp_shard."""
    from mindformers_core.config import load_config
    from mindformers_core.distributed.grad_reduce import DataParallelGradReducer
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "2")
    cfg = load_config("configs/markov_check.yaml", overrides=[
        f"parallelism.data_parallel_shard_strategy={strategy}"])
    sharding = DataParallelGradReducer(Communicator(0, 2), data_parallel=data_parallel) \
        .optimizer_sharding(cfg)
    assert sharding.num_shards == shards
