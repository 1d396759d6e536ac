"""Every rank's picklable object on every rank, exactly, over the world group.

The object travels pickled as int32 words (MindSpore 2.10 CPU broadcasts int32 exactly, 80 MB
in one call checked; uint8 has no kernel and int64 arrives wrong): its byte count first as two
int32 (``2**30`` per unit of the first), then in chunks of :data:`CHUNK_WORDS` words, each rank
broadcasting its own in rank order. Used by the balanced checkpoint load
(checkpoint/balanced_load.py) and the pipeline checkpoint (pipeline_checkpoint.py).
"""
from __future__ import annotations

import pickle

import numpy as np

__all__ = ["CHUNK_WORDS", "to_words", "from_words", "split_count", "join_count",
           "all_gather_objects"]

#: int32 words per broadcast (256 MiB)
CHUNK_WORDS = 1 << 26
_UNIT = 1 << 30


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


def all_gather_objects(comm, obj, rank: int, world_size: int) -> list:
    """Every rank's ``obj``, in rank order, on every rank (``comm``: a GroupCommunicator)."""
    def bcast(x, src):
        return np.asarray(comm.broadcast(np.ascontiguousarray(x), "world", src), np.int32)

    raw = pickle.dumps(obj, protocol=4)
    parts = []
    for src in range(world_size):
        mine = src == rank
        n = join_count(bcast(split_count(len(raw) if mine else 0), src))
        words = to_words(raw) if mine else np.zeros((n + 3) // 4, np.int32)
        got = [bcast(words[i:i + CHUNK_WORDS], src) for i in range(0, words.size, CHUNK_WORDS)]
        parts.append(obj if mine else pickle.loads(
            from_words(np.concatenate(got) if got else words, n)))
    return parts
