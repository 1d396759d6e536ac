"""One process: no communication init, identity reduction; sharding set-up without stepping."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor

from mindformers_core.distributed.comm import Communicator, init_distributed
from mindformers_core.distributed.grad_reduce import (DataParallelGradReducer, RouteComm,
                                                      reduce_gradients)
from mindformers_core.distributed.grad_route import GradRoute
from mindformers_core.distributed.zero import (ShardedMainParams, ZeroOptimizer, ZeroSharding,
                                               optimizer_state_bytes)
from mindformers_core.optim.adamw import AdamW


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for key in ("MS_ROLE", "MS_WORKER_NUM", "RANK_ID"):
        monkeypatch.delenv(key, raising=False)


def params(dtype=ms.float32):
    rng = np.random.default_rng(0)
    return [Parameter(Tensor(rng.normal(size=(6, 4)).astype(np.float32)).astype(dtype), name="w"),
            Parameter(Tensor(rng.normal(size=(5,)).astype(np.float32)).astype(dtype), name="b"),
            Parameter(Tensor(np.ones((1,), np.float32)).astype(dtype), name="s")]


def test_single_process_needs_no_communication_init():
    from mindspore.communication import GlobalComm
    comm = init_distributed()
    assert (comm.rank, comm.world_size) == (0, 1)
    assert not GlobalComm.INITED
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(comm.all_reduce_sum(x), x)
    np.testing.assert_array_equal(comm.all_gather(x), x)
    np.testing.assert_array_equal(comm.all_reduce_max(x), x)
    comm.barrier()
    assert comm.stats.total_bytes == 0


def test_communicator_rejects_bad_rank():
    with pytest.raises(ValueError, match="invalid rank 2 for world size 2"):
        Communicator(2, 2)


def test_reducer_is_exact_identity_on_one_rank():
    comm = Communicator(0, 1)
    red = DataParallelGradReducer(comm)
    g = [Tensor(np.ones((2, 2), np.float32)), None]
    routes = red.grad_routes([None, None])
    assert routes == [GradRoute()] * 2      # one rank: nothing to sum
    out, loss, n = reduce_gradients(g, routes, RouteComm(comm), red.token_group, 3.5, 7.0)
    assert out[0] is g[0] and out[1] is None and (loss, n) == (3.5, 7.0)
    assert red.global_token_count(11) == 11.0
    assert red.broadcast_flag(True) and not red.broadcast_flag(False)
    assert red.optimizer_sharding(None) is None     # one rank: the plain optimizer


def sharded_adamw(comm, num_shards=None, dtype=ms.float32, **kwargs):
    return ZeroSharding(comm, num_shards).build(AdamW, params(dtype), dict(lr=1e-3, **kwargs))


def test_one_shard_or_one_rank_builds_the_plain_optimizer():
    assert type(sharded_adamw(Communicator(0, 1))) is AdamW
    assert type(sharded_adamw(Communicator(0, 2), 1)) is AdamW


def test_shard_count_must_divide_the_world():
    with pytest.raises(ValueError, match=r"number of optimizer-state shards \(3\) must divide "
                                         r"the world size \(2\)"):
        sharded_adamw(Communicator(0, 2), 3)


def test_param_remainders_cannot_be_sharded():
    with pytest.raises(ValueError, match="store_param_remainders cannot be combined with "
                                         "optimizer-state sharding"):
        sharded_adamw(Communicator(0, 2), 2, ms.bfloat16, store_param_remainders=True)


@pytest.mark.parametrize("rank", [0, 1])
def test_sharded_state_holds_this_ranks_rows(rank):
    """Set-up only (a step needs the other rank): rows of moments and bf16 masters, the
    halved state memory, and load_state_dict taking this rank's rows of a full state."""
    plain = AdamW(params(ms.bfloat16), lr=1e-3)
    full_bytes = optimizer_state_bytes(plain)
    opt = sharded_adamw(Communicator(rank, 2), -1, ms.bfloat16)
    # the wrapper holds a plain AdamW (its class unchanged), its state this rank's rows
    assert isinstance(opt, ZeroOptimizer) and type(opt.inner) is AdamW
    assert opt.optimizer_name == "ShardedAdamW" and opt.parameters is opt.inner.parameters
    assert isinstance(opt.masters, ShardedMainParams)
    rows = {"w": (3 * rank, 3 * rank + 3), "b": (3 * rank, 3 * rank + 3 - rank)}
    assert tuple(opt.state_slots["adam_m"][0].shape) == (3, 4)
    assert tuple(opt.state_slots["adam_v"][1].shape) == (rows["b"][1] - rows["b"][0],)
    assert tuple(opt.state_slots["adam_m"][2].shape) == (1,)      # 1 row < 2 shards: replicated
    np.testing.assert_array_equal(opt.main_params[0].asnumpy(),
                                  plain.main_params[0].asnumpy()[slice(*rows["w"])])
    # m, v and the fp32 master: 12 bytes per element held; w 24 -> 12 elements, b 5 -> 3 or 2,
    # the 1-element s stays whole
    assert full_bytes == 12 * (24 + 5 + 1)
    assert optimizer_state_bytes(opt) == 12 * (12 + (3 - rank) + 1)
    sd = {"global_step": 4, "adam_m.w": np.arange(24, dtype=np.float32).reshape(6, 4),
          "main_param.b": np.arange(5, dtype=np.float32)}
    opt.load_state_dict(sd)
    assert opt.global_step == 4
    np.testing.assert_array_equal(opt.state_slots["adam_m"][0].asnumpy(),
                                  sd["adam_m.w"][slice(*rows["w"])])
    np.testing.assert_array_equal(opt.masters.master(1).asnumpy(),
                                  sd["main_param.b"][slice(*rows["b"])])
    with pytest.raises(ValueError, match=r"state_dict entry 'adam_v.w' has shape \(3, 4\), "
                                         r"expected \(6, 4\)"):
        opt.load_state_dict({"global_step": 1, "adam_v.w": np.zeros((3, 4), np.float32)})
