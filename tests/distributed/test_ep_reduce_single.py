"""ExpertParallelReducer on one process (distributed/ep_reduce.py): every collective is the
identity, so its routes must give the plain reducer's results; and the reduction refuses
gradients that have no routes. The 2- and 4-rank behaviour is tested with msrun
(test_ep_msrun.py)."""
import numpy as np
import pytest
from mindspore import Parameter, Tensor

from mindformers_core.distributed.collectives import GroupCommunicator
from mindformers_core.distributed.comm import Communicator
from mindformers_core.distributed.ep_reduce import ExpertParallelReducer
from mindformers_core.distributed.grad_reduce import (DataParallelGradReducer, RouteComm,
                                                      gradient_norm, reduce_gradients)
from mindformers_core.distributed.grad_route import GradRoute
from mindformers_core.core.parallel_dims import make_mesh
from mindformers_core.distributed.shard_spec import ShardSpec
from mindformers_core.optim.clip_grad import global_grad_norm


def reducer():
    comm = Communicator(0, 1)
    inner = DataParallelGradReducer(comm)
    specs = {"experts.weight1": ShardSpec((4, 3, 2), 0, "ep", 1)}
    groups = GroupCommunicator(make_mesh(1), 0, "cpu")
    return ExpertParallelReducer(inner, groups, specs), RouteComm(comm, groups)


def test_one_process_is_the_plain_reduction_and_norm():
    red, comm = reducer()
    params = [Parameter(Tensor(np.zeros((4, 3, 2), np.float32)), "experts.weight1"),
              Parameter(Tensor(np.zeros((5,), np.float32)), "dense.weight")]
    routes = red.grad_routes(params)
    assert routes == [GradRoute()] * 2      # one rank: nothing to sum, each counted once
    rng = np.random.default_rng(0)
    grads = [Tensor(rng.normal(size=(4, 3, 2)).astype(np.float32)),
             Tensor(rng.normal(size=(5,)).astype(np.float32))]
    out, loss_sum, tokens = reduce_gradients(grads, routes, comm, red.token_group, 3.5, 7.0)
    assert (loss_sum, tokens) == (3.5, 7.0)
    for got, want in zip(out, grads):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
    want = np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads))
    assert gradient_norm(out, routes, comm.group_sum) == pytest.approx(want, rel=1e-6)
    assert gradient_norm(out, routes, comm.group_sum) == pytest.approx(global_grad_norm(out),
                                                                       rel=1e-6)
    assert red.mean_over_ranks(0.25) == 0.25
    assert red.world_size == 1 and red.rank == 0


def test_gradients_need_the_bound_routes():
    red, comm = reducer()
    msg = (r"^{}: 1 gradients for {} gradient routes: bind the optimizer's parameters first "
           r"\(ParallelRun\.bind_optimizer\)$")
    with pytest.raises(RuntimeError, match=msg.format("reduce_gradients", "no")):
        reduce_gradients([Tensor(np.ones(2, np.float32))], None, comm, red.token_group, 0.0, 1.0)
    with pytest.raises(RuntimeError, match=msg.format("gradient_norm", "2")):
        gradient_norm([Tensor(np.ones(2, np.float32))], [GradRoute()] * 2, comm.group_sum)
