"""Sequence-parallel boundaries and vocabulary-parallel embedding / cross-entropy (Megatron).

Under sequence parallelism the residual stream of a micro-batch is split over the tp group
along its flattened ``B*S`` tokens (rank k holds tokens ``[k T/tp, (k+1) T/tp)``,
``models/tp_plan.token_range``). Every rank's loss is the same number (the
vocabulary-parallel cross-entropy below is reduced over the group), so each boundary's backward
is the adjoint of its forward:

    GatherSequence      forward all_gather over tokens,     backward reduce_scatter
                        (entering a tensor-parallel region: each rank's heads / ffn units
                        contribute a part of the gradient of the gathered input)
    ScatterSequence     forward reduce_scatter over tokens, backward all_gather
                        (leaving it: the row-parallel outputs are partial sums)
    GatherReplicated    forward all_gather over tokens,     backward this rank's slice
    SplitSequence       forward this rank's slice,          backward all_gather
                        (a region every rank computes whole and identically, the MoE block:
                        its gradient is already complete on every rank)

MindSpore's own collectives would differentiate the forward collective instead, hence Cells
with their own ``bprop`` (as ``models/tensor_parallel.py``).

Vocabulary parallel (rank k holds rows ``[v0, v1)`` of the ``[V, H]`` table / output layer):

    embedding       rows of the ids in [v0, v1), zeros elsewhere; the sum over the group is the
                    full lookup (ScatterSequence does that sum and the token split at once)
    cross-entropy   m_t = max over the group of the local row maxima (a MAX through the
                    all_gather: the CPU AllReduce only sums; detached, it only shifts),
                    lse_t = log(AllReduce(sum_j exp(z_tj - m_t))),
                    nll_t = lse_t - AllReduce(z_t,label_t - m_t on the rank holding label_t)

so the full ``[T, V]`` logits are never gathered. The two AllReduces back-propagate the
identity (``ReduceFromGroup``): the loss is the same on every rank.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import mint, nn, ops

from ..distributed.collectives import GroupCommunicator
from .precision import Precision
from .tensor_parallel import ReduceFromGroup

__all__ = ["GatherSequence", "ScatterSequence", "GatherReplicated", "SplitSequence",
           "vocab_parallel_embed", "vocab_parallel_token_losses"]


class _GroupCell(nn.Cell):
    def __init__(self, comm: GroupCommunicator, group: str = "tp"):
        super().__init__()
        self.comm, self.group = comm, group
        self.size = len(comm.ranks(group))
        self.index = comm.mesh.local_rank(group, comm.rank)

    def local(self, x):
        n = x.shape[0] // self.size
        return x[self.index * n:(self.index + 1) * n]


class GatherSequence(_GroupCell):
    """[T/tp, ...] -> [T, ...]; backward reduce_scatter."""

    def construct(self, x):
        return self.comm.all_gather(x, self.group, 0)

    def bprop(self, x, out, dout):
        return (self.comm.reduce_scatter(dout, self.group, 0),)


class ScatterSequence(_GroupCell):
    """[T, ...] partial sums -> this rank's [T/tp, ...] of their sum; backward all_gather."""

    def construct(self, x):
        return self.comm.reduce_scatter(x, self.group, 0)

    def bprop(self, x, out, dout):
        return (self.comm.all_gather(dout, self.group, 0),)


class GatherReplicated(_GroupCell):
    """[T/tp, ...] -> [T, ...] into a region every rank computes whole; backward the slice."""

    def construct(self, x):
        return self.comm.all_gather(x, self.group, 0)

    def bprop(self, x, out, dout):
        return (self.local(dout),)


class SplitSequence(_GroupCell):
    """[T, ...] (identical on every rank) -> this rank's [T/tp, ...]; backward all_gather."""

    def construct(self, x):
        return self.local(x)

    def bprop(self, x, out, dout):
        return (self.comm.all_gather(dout, self.group, 0),)


def vocab_parallel_embed(ids, table, start: int, precision: Precision):
    """[T, H] rows of this rank's table ``[V/tp, H]`` (vocabulary rows from ``start``) for the
    ids it holds, zeros for the others (sum over the group = the full lookup)."""
    local = ids - start
    held = ops.logical_and(local >= 0, local < table.shape[0])
    rows = ops.gather(precision.cast(table), ops.where(held, local, 0), 0)
    return rows * held.astype(rows.dtype).reshape(-1, 1)


def vocab_parallel_token_losses(logits, labels, loss_mask, start: int, comm: GroupCommunicator,
                                reduce: ReduceFromGroup, group: str = "tp"):
    """(sum of loss_mask * CE, sum of loss_mask) from this rank's float32 logits [T, V/tp] of
    the vocabulary rows from ``start`` (module docstring); labels / mask [T]."""
    size = len(comm.ranks(group))
    local_max = ops.stop_gradient(ops.amax(logits, -1))
    gathered = comm.all_gather(local_max.reshape(1, -1), group, 0)
    shift = ops.stop_gradient(ops.amax(gathered.reshape(size, -1), 0)).reshape(-1, 1)
    z = logits - shift
    sum_exp = reduce(ops.exp(z).sum(-1))
    safe = ops.where(labels >= 0, labels, 0) - start
    held = ops.logical_and(safe >= 0, safe < logits.shape[1])
    picked = mint.gather(z, 1, ops.where(held, safe, 0).astype(ms.int64).reshape(-1, 1))
    target = reduce(picked.reshape(-1) * held.astype(ms.float32))
    nll = ops.log(sum_exp) - target
    mask = loss_mask.astype(ms.float32)
    return (nll * mask).sum(), mask.sum()
