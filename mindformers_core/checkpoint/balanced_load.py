"""``checkpoint.load_balanced``: each rank file read and verified by one rank, then shared.

Upstream reads each replicated shard on one rank of its replicas and broadcasts it to the
others. Here the rank files of a sharded checkpoint are divided over the ranks of the run,
balanced by bytes (``checkpoint_plan.balanced_assignment``, the greedy of the balanced save);
each rank reads and verifies only its files, and broadcasts what it read over the world group
(the files' pieces, or the error of a file that failed) to every other rank. So every rank merges
the same tensors as an unbalanced load, bit for bit, or raises the same error (and, reading a
directory, skips the same damaged checkpoint). A single-process checkpoint, and the index, are
read by every rank.

What a rank read travels as distributed/object_exchange.py sends objects.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from ..distributed.object_exchange import all_gather_objects
from .plan import balanced_assignment

__all__ = ["files_to_read", "WorldFileSharing", "file_sharing"]


def files_to_read(nbytes: List[int], rank: int, world: int) -> List[int]:
    """The indices of the rank files (of ``nbytes[i]`` bytes) that ``rank`` reads."""
    owner = balanced_assignment([(f"{i:08d}", int(n)) for i, n in enumerate(nbytes)], world)
    return [i for i in range(len(nbytes)) if owner[f"{i:08d}"] == rank]


class WorldFileSharing:
    """What the ranks of a run read, shared over the world group (``FileSharing``)."""

    def __init__(self, rank: int, world_size: int):
        from ..distributed.collectives import GroupCommunicator
        from ..distributed.groups import make_mesh
        self.rank, self.world_size = int(rank), int(world_size)
        self._comm = GroupCommunicator(make_mesh(self.world_size), self.rank)

    def files_to_read(self, nbytes: List[int]) -> List[int]:
        return files_to_read(nbytes, self.rank, self.world_size)

    def gather(self, part: Dict[int, object]) -> List[Dict[int, object]]:
        """Every rank's ``part``, in rank order: each rank broadcasts its own."""
        return all_gather_objects(self._comm, part, self.rank, self.world_size)


def file_sharing(load_balanced: bool, rank: int, world_size: int) -> Optional[WorldFileSharing]:
    """The sharing of a balanced load, or None (every rank reads every file)."""
    return WorldFileSharing(rank, world_size) if load_balanced and world_size > 1 else None
