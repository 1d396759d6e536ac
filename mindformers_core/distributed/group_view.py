"""One named group of a :class:`~.collectives.GroupCommunicator` seen as a world
:class:`~.comm.Communicator` (rank and size inside the group).

The data-parallel machinery (``grad_reduce.DataParallelGradReducer``, ``zero.ZeroSharding``,
Muon's MAX of the QK-Clip logits) is written against the world ``Communicator``; under tensor
parallelism it runs unchanged on the ``dp`` group through this view: ``rank`` is the rank's
index in its dp group, ``world_size`` the dp size, and every collective stays inside the group
(ranks of one tp group, which hold other shards, never mix).
"""
from __future__ import annotations

from .collectives import GroupCommunicator
from .comm import Communicator

__all__ = ["GroupView"]


class GroupView(Communicator):
    """``Communicator`` over ``group`` of ``comm`` (SUM, all-gather along dim 0, broadcast;
    the MAX and the barrier are the base class's, built on those)."""

    def __init__(self, comm: GroupCommunicator, group: str):
        ranks = comm.ranks(group)
        super().__init__(ranks.index(comm.rank), len(ranks))
        self.group_comm, self.group, self.members = comm, group, ranks

    def all_reduce_sum(self, x):
        return self.group_comm.all_reduce(x, self.group)

    def all_gather(self, x):
        return self.group_comm.all_gather(x, self.group, 0)

    def broadcast(self, x, src: int):
        """``x`` of the group's member ``src`` (an index inside the group)."""
        return self.group_comm.broadcast(x, self.group, self.members[src])
