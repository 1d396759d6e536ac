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
    """What the ranks of a run read, shared over the world group (``FileSharing``) of the
    run's communicator (a ``GroupCommunicator``, distributed/setup.py)."""

    def __init__(self, comm):
        self.rank, self.world_size = int(comm.rank), int(comm.mesh.world)
        self._comm = comm

    def files_to_read(self, nbytes: List[int]) -> List[int]:
        return files_to_read(nbytes, self.rank, self.world_size)

    def gather(self, part: Dict[int, object]) -> List[Dict[int, object]]:
        """Every rank's ``part``, in rank order: each rank broadcasts its own."""
        return all_gather_objects(self._comm, part, self.rank, self.world_size)


def file_sharing(load_balanced: bool, comm=None) -> Optional[WorldFileSharing]:
    """The sharing of a balanced load over ``comm`` (the run's communicator; None on one
    process), or None (every rank reads every file)."""
    return WorldFileSharing(comm) if load_balanced and comm is not None else None
