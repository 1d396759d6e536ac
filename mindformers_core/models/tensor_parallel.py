"""Megatron column- and row-parallel linears over a tensor-parallel group.

Weights are ``[out_features, in_features]`` (the layout of ``layers.Linear``). With ``G`` ranks
in the group:

    column parallel   W split along dim 0 (outputs): rank k computes y_k = x W_k^T, its
                      ``out/G`` output features; the input x is replicated.
    row parallel      W split along dim 1 (inputs): rank k gets its ``in/G`` input features x_k
                      and y = AllReduce_G(x_k W_k^T).

Column followed by row (an MLP, attention's qkv then output) needs one all-reduce forward and
one backward. The gradients follow from a loss that is the same on every rank of the group:

    copy_to_group       forward identity,   backward AllReduce_G(dy)   (x feeds every shard)
    reduce_from_group   forward AllReduce_G, backward identity         (dy is already replicated)

MindSpore's own AllReduce would all-reduce the gradient as well, counting a replicated loss
``G`` times, hence the two Cells with their own ``bprop``.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Parameter, mint, nn

from ..distributed.collectives import GroupCommunicator
from ..distributed.shard_spec import ShardSpec, local_shape, shard

__all__ = ["column_spec", "row_spec", "CopyToGroup", "ReduceFromGroup", "ColumnParallelLinear",
           "RowParallelLinear"]


def column_spec(in_features: int, out_features: int, group_size: int,
                group: str = "tp") -> ShardSpec:
    """The weight's spec of a column-parallel linear (outputs split)."""
    return ShardSpec((out_features, in_features), 0, group, group_size)


def row_spec(in_features: int, out_features: int, group_size: int,
             group: str = "tp") -> ShardSpec:
    """The weight's spec of a row-parallel linear (inputs split)."""
    return ShardSpec((out_features, in_features), 1, group, group_size)


class CopyToGroup(nn.Cell):
    """Identity forward; the gradient is summed over the group."""

    def __init__(self, comm: GroupCommunicator, group: str = "tp"):
        super().__init__()
        self.comm, self.group = comm, group

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (self.comm.all_reduce(dout, self.group),)


class ReduceFromGroup(nn.Cell):
    """Sum over the group forward; the gradient passes unchanged."""

    def __init__(self, comm: GroupCommunicator, group: str = "tp"):
        super().__init__()
        self.comm, self.group = comm, group

    def construct(self, x):
        return self.comm.all_reduce(x, self.group)

    def bprop(self, x, out, dout):
        return (dout,)


class _ShardedLinear(nn.Cell):
    """This rank's shard of a linear's weight, with its :class:`ShardSpec`."""

    def __init__(self, spec: ShardSpec, comm: GroupCommunicator, group: str):
        super().__init__()
        self.spec = spec
        self.index = comm.mesh.local_rank(group, comm.rank)
        self.weight = Parameter(ms.Tensor(np.zeros(local_shape(spec), np.float32)), "weight")

    def load_full(self, full: np.ndarray) -> None:
        """Keep this rank's shard of the full ``[out, in]`` weight."""
        self.weight.set_data(ms.Tensor(shard(self.spec, np.asarray(full, np.float32),
                                             self.index)))


class ColumnParallelLinear(_ShardedLinear):
    """y_k = x W_k^T: this rank's ``out/G`` output features (not gathered)."""

    def __init__(self, in_features: int, out_features: int, comm: GroupCommunicator,
                 group: str = "tp"):
        super().__init__(column_spec(in_features, out_features, len(comm.ranks(group)), group),
                         comm, group)
        self.copy = CopyToGroup(comm, group)

    def construct(self, x):
        return mint.nn.functional.linear(self.copy(x), self.weight)


class RowParallelLinear(_ShardedLinear):
    """y = AllReduce(x_k W_k^T) from this rank's ``in/G`` input features."""

    def __init__(self, in_features: int, out_features: int, comm: GroupCommunicator,
                 group: str = "tp"):
        super().__init__(row_spec(in_features, out_features, len(comm.ranks(group)), group),
                         comm, group)
        self.reduce = ReduceFromGroup(comm, group)

    def construct(self, x):
        return self.reduce(mint.nn.functional.linear(x, self.weight))
