"""Muon on sharded optimizer state: the two ``comm_strategy`` values of upstream MindFormers 2.1.

Each rank holds the momentum ``muon_m`` (and the master) of its dim-0 rows of every Muon
weight. The momentum update is element-wise, so each rank computes its rows of
``U = g + mu * m`` (Nesterov) locally. Newton-Schulz needs the whole matrix:

``allgather`` (default): one all-gather of every rank's U rows (one flat buffer for all
weights); every rank runs NS on every matrix (redundantly) and keeps its rows of the update.

``allgather_deredundency``: each 2-D weight has one *owner* rank, chosen by greedy balancing
of upstream's NS cost ``batch * (ns_steps * (2 L s^2 + s^3) + A B)`` over all ranks
(``shard_layout.assign_owners``). Only the owner orthogonalises it; the owners' full updates
then go back to every rank, which keeps its rows. Upstream gathers to the owner and scatters
the shards with P2P and falls back to all-gather / broadcast; MindSpore's CPU backend has no
send/recv (nor all-to-all), so here the gather is the all-gather of the U rows and the return
is one all-gather of each rank's owned updates (padded to the largest owner's total). NS FLOPs
per rank drop by about the number of ranks; bytes received rise by the returned updates
(``ns_flops`` and ``comm.stats`` report both; the bench prints them).

3-D grouped-expert weights are sharded on the expert dim, so each expert matrix is whole on
its rank: they are orthogonalised locally under both strategies (no communication).
Replicated weights (fewer rows than shards) are orthogonalised on every rank.

Both strategies give the single-process Muon update: the same U bits, the same NS, the
same scaling, and each rank applies its rows. The exchange itself is the generic
``shard_exchange.ShardedMuonExchange``, which ``zero.ZeroSharding.build`` gives the inner Muon
of its ``zero.ZeroOptimizer``; this module gives it ZeRO's rows as one :class:`ZeroRowsLevel`
(after any tensor-parallel level, see ``tp_sharding``). The wrapper reports the owners
(``ns_owner``, ``ns_owner_by_name``) and ``ns_flops_total``.
"""
from __future__ import annotations

import numpy as np

from .shard_layout import ShardLayout, shard_rows

__all__ = ["ZeroRowsLevel"]


class ZeroRowsLevel:
    """``shard_exchange.ShardLevel`` of ZeRO-1's dim-0 rows (``ShardLayout``) over the ranks
    of ``comm`` (a ``Communicator``-like object: ``rank``, ``world_size``, ``all_gather``).
    Members are the ``world_size`` ranks (owners are balanced over all of them, HSDP
    replicas included); the pieces come from shards ``0..S-1``. No send/recv: the
    all-gather paths are used."""

    model_sharded = False
    p2p = None

    def __init__(self, layout: ShardLayout, comm, name: str = "dp"):
        self.layout, self.comm, self.name = layout, comm, name
        self.size, self.index = layout.world_size, layout.rank

    def split_dim(self, i: int):
        return 0 if self.layout.is_sharded(i) else None

    def gather(self, items):
        return self.layout.unpack_gathered(self.comm.all_gather(self.layout.pack(items)),
                                           [i for i, _ in items])

    def gather_flat(self, buf):
        buf = np.ascontiguousarray(buf, np.float32)
        return np.asarray(self.comm.all_gather(buf)).reshape(self.size, buf.size)

    def _rows(self, d0: int, member: int):
        return shard_rows(d0, self.layout.num_shards, member % self.layout.num_shards)

    def part(self, i, whole, member):  # noqa: ARG002 - rows depend on the row count only
        start, stop = self._rows(whole.shape[0], member)
        return np.asarray(whole)[start:stop].copy()

    def part_shape(self, i, whole_shape, member):  # noqa: ARG002 - as part
        start, stop = self._rows(whole_shape[0], member)
        return (stop - start,) + tuple(whole_shape[1:])

    def join(self, i, parts):
        return np.concatenate([np.asarray(p) for p in parts[:self.layout.num_shards]], 0)
