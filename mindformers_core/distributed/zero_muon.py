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
same scaling, and each rank applies its rows.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
from mindspore import Parameter, Tensor

from ..optim.muon_split import piece_shapes
from .shard_layout import assign_owners, ns_cost, ns_flops

__all__ = ["ZeroMuonMixin", "ShardedExchange"]


class ShardedExchange:
    """``optim.muon.MuonExchange`` over dim-0 row shards (see the module docstring): the one
    Muon update path of ``Muon._muon_update`` runs unchanged on top of it.

    ``gathered[i]``: parameter i is a row-sharded 2-D Muon weight (its U is all-gathered);
    ``owner[i]``: the rank that orthogonalises it under ``allgather_deredundency``."""

    def __init__(self, layout, comm, strategy: str, gathered: List[bool], owner: Dict[int, int],
                 shapes: List[tuple]):
        self.layout, self.comm, self.strategy = layout, comm, strategy
        self.gathered, self.owner, self.shapes = gathered, owner, shapes

    def _gather_rows(self, items) -> List[np.ndarray]:
        """Full arrays of ``items`` [(parameter index, this rank's rows)], one all-gather."""
        return self.layout.unpack_gathered(self.comm.all_gather(self.layout.pack(items)),
                                           [i for i, _ in items])

    def gather(self, jobs, us):
        """Phase 1: the full U of every row-sharded 2-D weight (one all-gather)."""
        full = list(us)
        gather_k = [k for k, (_, i, _) in enumerate(jobs) if self.gathered[i]]
        if gather_k:
            fulls = self._gather_rows([(jobs[k][1], us[k].asnumpy()) for k in gather_k])
            for k, arr in zip(gather_k, fulls):
                full[k] = Tensor(arr)
        return full

    def ns_here(self, i: int) -> bool:
        """Phase 2: all weights (allgather) or the owned ones (allgather_deredundency)."""
        if not self.gathered[i] or self.strategy == "allgather":
            return True
        return self.owner[i] == self.comm.rank

    def complete(self, jobs, deltas):
        """Phase 3 (deredundency): the owners' updates back to every rank (one all-gather)."""
        gather_k = [k for k, (_, i, _) in enumerate(jobs) if self.gathered[i]]
        if self.strategy == "allgather_deredundency" and gather_k:
            deltas = dict(deltas)
            deltas.update(self._return_updates(jobs, gather_k, deltas))
        return deltas

    def local_rows(self, i: int, delta: Tensor) -> Tensor:
        """Phase 4: this rank's rows of a gathered weight's update."""
        if self.gathered[i]:
            start, stop = self.layout.rows(i)
            return delta[start:stop]
        return delta

    def full_masters(self, masters, indices):
        """QK-Clip scales whole head rows: the full fp32 masters of the row-sharded q/kv
        weights (one all-gather of their rows), the others as they are."""
        sharded = [i for i in indices if self.layout.is_sharded(i)]
        fulls = dict(zip(sharded, self._gather_rows(
            [(i, masters.master(i).asnumpy()) for i in sharded]))) if sharded else {}
        return [Parameter(Tensor(fulls[i]), name=f"qk_clip_full.{i}", requires_grad=False)
                if i in fulls else masters.master(i) for i in indices]

    def keep_rows(self, i: int, full, master) -> None:
        if self.layout.is_sharded(i):
            start, stop = self.layout.rows(i)
            master.set_data(Tensor(full.asnumpy()[start:stop].copy()))

    def _return_updates(self, jobs, gather_k, deltas) -> Dict[int, Tensor]:
        """Every owner's full updates on every rank: rank q contributes its owned updates
        (flat, job order), padded to the largest owner's total."""
        comm = self.comm
        by_owner: Dict[int, List[int]] = {q: [] for q in range(comm.world_size)}
        for k in gather_k:
            by_owner[self.owner[jobs[k][1]]].append(k)
        sizes = {k: int(np.prod(self.shapes[jobs[k][1]])) for k in gather_k}
        width = max(sum(sizes[k] for k in ks) for ks in by_owner.values())
        buf = np.zeros(width, np.float32)
        off = 0
        for k in by_owner[comm.rank]:
            buf[off:off + sizes[k]] = deltas[k].asnumpy().reshape(-1)
            off += sizes[k]
        gathered = comm.all_gather(buf).reshape(comm.world_size, width)
        out = {}
        for q, ks in by_owner.items():
            off = 0
            for k in ks:
                out[k] = Tensor(gathered[q, off:off + sizes[k]].reshape(self.shapes[jobs[k][1]])
                                .copy())
                off += sizes[k]
        return out


class ZeroMuonMixin:
    """In front of ``ZeroMixin`` and ``Muon`` (see ``zero.sharded_class``): sets up the
    sharded exchange of Muon's update rows (public Muon API only)."""

    def _zero_setup(self) -> None:
        """Owner rank per Muon weight (used by allgather_deredundency), the counters and the
        sharded exchange."""
        layout = self._zero_layout
        mask = self.muon_mask
        shapes = [self.param_shape(i) for i in range(len(self.parameters))]   # full shapes
        self._zero_gathered = [bool(m) and layout.is_sharded(i) and len(shapes[i]) == 2
                               for i, m in enumerate(mask)]
        self._zero_pieces = [piece_shapes(self.split_rule(i), shapes[i], p.name) if m else []
                             for i, (p, m) in enumerate(zip(self.parameters, mask))]
        costs = [ns_cost(self._zero_pieces[i], self.ns_steps) if g else 0.0
                 for i, g in enumerate(self._zero_gathered)]
        idx = [i for i, g in enumerate(self._zero_gathered) if g]
        owners = assign_owners([costs[i] for i in idx], layout.world_size)
        self.ns_owner: Dict[int, int] = dict(zip(idx, owners))
        self.ns_flops_total = 0.0     # NS FLOPs this rank ran since construction
        self.exchange = ShardedExchange(layout, self._zero_comm, self.comm_strategy,
                                        self._zero_gathered, self.ns_owner, shapes)

    @property
    def ns_owner_by_name(self) -> Dict[str, int]:
        return {self.parameters[i].name: r for i, r in self.ns_owner.items()}

    def on_newton_schulz(self, shapes) -> None:
        self.ns_flops_total += sum(ns_flops([shape], self.ns_steps) for shape in shapes)
