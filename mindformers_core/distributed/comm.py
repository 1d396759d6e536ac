"""Communication under msrun: initialisation, rank/world helpers and the world-group collectives.

A single process needs no communication init: :func:`init_distributed` only calls
``mindspore.communication.init()`` when the process was started by ``msrun`` with more than one
worker, and returns a :class:`Communicator` that is the identity on one rank.

Only the world group is used here; collectives over named sub-groups (tp, dp, ep) live in
``collectives.GroupCommunicator``. Measured on MindSpore 2.10 CPU: AllReduce (SUM only),
AllGather, Broadcast and barrier work on the world group; AllReduce MAX, ReduceScatter,
all_to_all and send/recv have no CPU kernel. MAX is an AllGather followed by a local max.
AllReduce SUM on ``create_group`` sub-groups is exact, interleaved with world-group traffic
(4 workers, tp {0,1} {2,3} and dp {0,2} {1,3}, 20 of 20 rounds, in each of: names derived from
the members; one name "tp" for different member sets with the creation order differing between
ranks; no sync between the three collectives of a round; and on 2 workers a sub-group with the
world's members).

Byte accounting (:class:`CommStats`, per rank, bytes *received*, the usual ring algorithms):

    all_reduce(n bytes)   2 * (W - 1) / W * n
    all_gather(n per rank) (W - 1) * n
    broadcast(n bytes)    n on every rank but the root, 0 on the root
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np

from ..launch_env import env_rank, env_world_size, is_msrun_scheduler, launched_by_msrun  # noqa: F401

__all__ = ["Communicator", "CommStats", "init_distributed", "get_communicator", "get_rank",
           "get_world_size", "is_distributed", "barrier"]

_COMM: Optional["Communicator"] = None


@dataclass
class CommStats:
    """Per-rank counters of collectives: calls and bytes received, by operation."""
    calls: Dict[str, int] = field(default_factory=dict)
    bytes: Dict[str, float] = field(default_factory=dict)

    def add(self, op: str, nbytes: float) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1
        self.bytes[op] = self.bytes.get(op, 0.0) + float(nbytes)

    @property
    def total_bytes(self) -> float:
        return float(sum(self.bytes.values()))

    def reset(self) -> None:
        self.calls.clear()
        self.bytes.clear()

    def to_dict(self) -> dict:
        return {"calls": dict(self.calls), "bytes": dict(self.bytes),
                "total_bytes": self.total_bytes}


class Communicator:
    """Collectives over the world group; numpy or Tensor in, same kind out.

    ``world_size == 1`` makes every operation the identity (no MindSpore communication).
    Inputs are never modified: each collective works on a fresh copy (MindSpore CPU
    collectives may write into their input buffer).
    """

    def __init__(self, rank: int = 0, world_size: int = 1):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"invalid rank {rank} for world size {world_size}")
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.stats = CommStats()
        self._ops: Dict[str, object] = {}

    # -- helpers ---------------------------------------------------------------------------------
    def _op(self, key: str, factory):
        if key not in self._ops:
            self._ops[key] = factory()
        return self._ops[key]

    @staticmethod
    def _as_tensor(x):
        import mindspore as ms
        if isinstance(x, np.ndarray):
            return ms.Tensor(np.ascontiguousarray(x).copy()), True
        return x.copy() if hasattr(x, "copy") else x, False

    # -- collectives -------------------------------------------------------------------------------
    def all_reduce_sum(self, x):
        """Element-wise SUM over ranks (same shape)."""
        if self.world_size == 1:
            return x.copy() if isinstance(x, np.ndarray) else x
        from mindspore import ops
        t, was_np = self._as_tensor(x)
        out = self._op("allreduce_sum", ops.AllReduce)(t)
        nbytes = _nbytes(x)
        self.stats.add("all_reduce", 2.0 * (self.world_size - 1) / self.world_size * nbytes)
        return out.asnumpy() if was_np else out

    def all_gather(self, x):
        """Rank-ordered concatenation along dim 0 of every rank's ``x`` (same shape on all)."""
        if self.world_size == 1:
            return x.copy() if isinstance(x, np.ndarray) else x
        from mindspore import ops
        t, was_np = self._as_tensor(x)
        out = self._op("allgather", ops.AllGather)(t)
        self.stats.add("all_gather", (self.world_size - 1) * _nbytes(x))
        return out.asnumpy() if was_np else out

    def broadcast(self, x, src: int):
        """``x`` of rank ``src`` on every rank (every rank passes a buffer of the same shape)."""
        if self.world_size == 1:
            return x.copy() if isinstance(x, np.ndarray) else x
        from mindspore import ops
        t, was_np = self._as_tensor(x)
        out = self._op(f"broadcast{src}", lambda: ops.Broadcast(int(src)))((t,))[0]
        if self.rank != src:
            self.stats.add("broadcast", _nbytes(x))
        return out.asnumpy() if was_np else out

    def all_reduce_max(self, x: np.ndarray) -> np.ndarray:
        """Element-wise MAX over ranks (AllGather + max: the CPU AllReduce only sums)."""
        arr = np.asarray(x)
        if self.world_size == 1:
            return arr.copy()
        gathered = self.all_gather(np.ascontiguousarray(arr, dtype=np.float32).reshape(1, -1))
        return gathered.reshape((self.world_size,) + arr.shape).max(axis=0).astype(arr.dtype)

    def barrier(self) -> None:
        """All ranks wait here (a 1-element all-reduce: the same transport as the collectives)."""
        if self.world_size > 1:
            self.all_reduce_sum(np.zeros(1, np.float32))


def _nbytes(x) -> float:
    if isinstance(x, np.ndarray):
        return float(x.nbytes)
    import math
    return float(math.prod(x.shape) * x.itemsize)


def init_distributed() -> Communicator:
    """The process-wide communicator; initialises MindSpore communication only when this
    process was started by msrun (a plain process needs no init: world 1). Idempotent.

    In msrun's scheduler process ``init()`` serves the cluster until the job ends; the process
    then exits with status 0 (it must not run the training itself)."""
    global _COMM
    if _COMM is not None:
        return _COMM
    if is_msrun_scheduler():
        from mindspore.communication import init
        init()
        sys.exit(0)
    if launched_by_msrun():   # also a 1-worker msrun job: its scheduler waits for us
        from mindspore.communication import get_group_size, get_rank as ms_get_rank, init
        init()
        rank, world = int(ms_get_rank()), int(get_group_size())
        if rank != env_rank():
            # msrun's RANK_ID and the collective rank must agree (the data shard uses the former)
            os.environ["RANK_ID"] = str(rank)
        _COMM = Communicator(rank, world)
    else:
        _COMM = Communicator(0, 1)
    return _COMM


def get_communicator() -> Communicator:
    """The communicator of :func:`init_distributed` (initialising it when needed)."""
    return init_distributed()


def get_rank() -> int:
    """This process's rank: the communicator's once initialised, else msrun's RANK_ID, else 0."""
    return _COMM.rank if _COMM is not None else env_rank()


def get_world_size() -> int:
    """World size: the communicator's once initialised, else msrun's MS_WORKER_NUM, else 1."""
    return _COMM.world_size if _COMM is not None else env_world_size()


def is_distributed() -> bool:
    return get_world_size() > 1


def barrier() -> None:
    """Wait for every rank (no-op on one process)."""
    if _COMM is not None:
        _COMM.barrier()
