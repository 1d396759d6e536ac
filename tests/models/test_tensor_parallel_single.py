"""Tensor-parallel linears: the weight specs (pure) and one process, where the group is one rank
and both layers are the plain linear. Multi-rank forward/backward: test_group_comm_msrun.py."""
import numpy as np
import mindspore as ms
import pytest

from mindformers_core.distributed.collectives import GroupCommunicator
from mindformers_core.core.parallel_dims import make_mesh
from mindformers_core.distributed.shard_spec import local_shape
from mindformers_core.models.tensor_parallel import (ColumnParallelLinear, RowParallelLinear,
                                                     column_spec, row_spec)


def test_column_splits_outputs_and_row_splits_inputs():
    col, row = column_spec(6, 8, 2), row_spec(8, 6, 4)
    assert (col.full_shape, col.split_dim, col.group) == ((8, 6), 0, "tp")
    assert local_shape(col) == (4, 6)
    assert (row.full_shape, row.split_dim) == ((6, 8), 1) and local_shape(row) == (6, 2)
    with pytest.raises(ValueError, match=r"dim 0 of shape \(5, 6\) \(5\) is not divisible by "
                                         r"the tp group size 2"):
        column_spec(6, 5, 2)


def test_one_rank_is_the_plain_linear_forward_and_backward():
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((8, 6)), rng.standard_normal((5, 8))
    x, c = rng.standard_normal((3, 6)).astype(np.float32), rng.standard_normal((3, 5))
    gc = GroupCommunicator(make_mesh(1), 0, backend="cpu")
    col, row = ColumnParallelLinear(6, 8, gc), RowParallelLinear(8, 5, gc)
    col.load_full(w1)
    row.load_full(w2)

    def loss_fn(xt):
        return (row(col(xt)) * ms.Tensor(c.astype(np.float32))).sum()

    loss, (dx, (dw1, dw2)) = ms.value_and_grad(loss_fn, 0, [col.weight, row.weight])(
        ms.Tensor(x))
    h = x @ w1.T
    np.testing.assert_allclose(loss.asnumpy(), np.sum((h @ w2.T) * c), rtol=1e-5)
    np.testing.assert_allclose(dx.asnumpy(), (c @ w2) @ w1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw1.asnumpy(), (c @ w2).T @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw2.asnumpy(), c.T @ h, rtol=1e-5, atol=1e-5)
