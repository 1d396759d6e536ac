"""ExpertParallelReducer on one process (distributed/ep_reduce.py): every collective is the
identity, so it must give the plain reducer's results; and it refuses gradients it was not
bound to. The 2- and 4-rank behaviour is tested with msrun (test_ep_msrun.py)."""
import numpy as np
import pytest
from mindspore import Parameter, Tensor

from mindformers_core.distributed.collectives import GroupCommunicator
from mindformers_core.distributed.comm import Communicator
from mindformers_core.distributed.ep_reduce import ExpertParallelReducer
from mindformers_core.distributed.grad_reduce import DataParallelGradReducer
from mindformers_core.core.parallel_dims import make_mesh
from mindformers_core.distributed.shard_spec import ShardSpec
from mindformers_core.optim.clip_grad import global_grad_norm


def reducer():
    inner = DataParallelGradReducer(Communicator(0, 1))
    specs = {"experts.weight1": ShardSpec((4, 3, 2), 0, "ep", 1)}
    return ExpertParallelReducer(inner, GroupCommunicator(make_mesh(1), 0, "cpu"), specs)


def test_one_process_is_the_plain_reduction_and_norm():
    red = reducer()
    params = [Parameter(Tensor(np.zeros((4, 3, 2), np.float32)), "experts.weight1"),
              Parameter(Tensor(np.zeros((5,), np.float32)), "dense.weight")]
    red.bind_parameters(params)
    rng = np.random.default_rng(0)
    grads = [Tensor(rng.normal(size=(4, 3, 2)).astype(np.float32)),
             Tensor(rng.normal(size=(5,)).astype(np.float32))]
    out, loss_sum, tokens = red.reduce(grads, 3.5, 7.0)
    assert (loss_sum, tokens) == (3.5, 7.0)
    for got, want in zip(out, grads):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
    want = np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads))
    assert red.grad_norm(out) == pytest.approx(want, rel=1e-6)
    assert red.grad_norm(out) == pytest.approx(global_grad_norm(out), rel=1e-6)
    assert red.mean_over_ranks(0.25) == 0.25
    assert red.world_size == 1 and red.rank == 0


def test_gradients_need_the_bound_parameters():
    red = reducer()
    with pytest.raises(RuntimeError, match=r"^ExpertParallelReducer: bind_parameters\(optimizer"
                                           r"\.parameters\) must be called before the first "
                                           r"reduction \(got 1 gradients\)$"):
        red.reduce([Tensor(np.ones(2, np.float32))], 0.0, 1.0)
