"""``checkpoint.load_balanced``: each rank file read and verified by one rank, then shared.

Upstream reads each replicated shard on one rank of its replicas and broadcasts it to the
others. Here the rank files of a sharded checkpoint are divided over the ranks of the run,
balanced by bytes (``checkpoint_plan.balanced_assignment``, the greedy of the balanced save);
each rank reads and verifies only its files, and broadcasts what it read over the world group
(the files' pieces, or the error of a file that failed) to every other rank. So every rank merges
the same tensors as an unbalanced load, bit for bit, or raises the same error (and, reading a
directory, skips the same damaged checkpoint). A single-process checkpoint, and the index, are
read by every rank.

What a rank read travels pickled, as int32 words (MindSpore 2.10 CPU broadcasts int32 exactly,
80 MB in one call checked; uint8 has no kernel and int64 arrives wrong), its byte count first as
two int32 (``2**30`` per unit of the first), then in chunks of :data:`CHUNK_WORDS` words.
"""
from __future__ import annotations

import pickle
from typing import Dict, List, Optional

import numpy as np

from .checkpoint_plan import balanced_assignment

__all__ = ["CHUNK_WORDS", "files_to_read", "to_words", "from_words", "split_count",
           "join_count", "WorldFileSharing", "file_sharing"]

#: int32 words per broadcast (256 MiB)
CHUNK_WORDS = 1 << 26
_UNIT = 1 << 30


def files_to_read(nbytes: List[int], rank: int, world: int) -> List[int]:
    """The indices of the rank files (of ``nbytes[i]`` bytes) that ``rank`` reads."""
    owner = balanced_assignment([(f"{i:08d}", int(n)) for i, n in enumerate(nbytes)], world)
    return [i for i in range(len(nbytes)) if owner[f"{i:08d}"] == rank]


def to_words(raw: bytes) -> np.ndarray:
    """``raw`` as int32 words, zero-padded to a whole word."""
    return np.frombuffer(raw + b"\0" * (-len(raw) % 4), np.int32)


def from_words(words: np.ndarray, nbytes: int) -> bytes:
    """The first ``nbytes`` bytes of ``words``."""
    return np.ascontiguousarray(words, np.int32).tobytes()[:nbytes]


def split_count(n: int) -> np.ndarray:
    """A byte count as two int32 (``hi * 2**30 + lo``)."""
    return np.array(divmod(int(n), _UNIT), np.int32)


def join_count(pair) -> int:
    return int(pair[0]) * _UNIT + int(pair[1])


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
        raw = pickle.dumps(part, protocol=4)
        parts = []
        for src in range(self.world_size):
            mine = src == self.rank
            n = join_count(self._bcast(split_count(len(raw) if mine else 0), src))
            words = to_words(raw) if mine else np.zeros((n + 3) // 4, np.int32)
            got = [self._bcast(words[i:i + CHUNK_WORDS], src)
                   for i in range(0, words.size, CHUNK_WORDS)]
            parts.append(part if mine else pickle.loads(
                from_words(np.concatenate(got) if got else words, n)))
        return parts

    def _bcast(self, x: np.ndarray, src: int) -> np.ndarray:
        return np.asarray(self._comm.broadcast(np.ascontiguousarray(x), "world", src), np.int32)


def file_sharing(load_balanced: bool, rank: int, world_size: int) -> Optional[WorldFileSharing]:
    """The sharing of a balanced load, or None (every rank reads every file)."""
    return WorldFileSharing(rank, world_size) if load_balanced and world_size > 1 else None
