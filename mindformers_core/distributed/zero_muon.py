"""Muon on sharded optimizer state: the two ``comm_strategy`` values (reference §5).

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
from ..optim.qk_clip import qk_clip_step
from .shard_layout import assign_owners, ns_cost, ns_flops

__all__ = ["ZeroMuonMixin", "ShardedExchange"]


class ShardedExchange:
    """``optim.muon.MuonExchange`` over dim-0 row shards (see the module docstring): the one
    Muon update path of ``Muon._muon_update`` runs unchanged on top of it."""

    def __init__(self, opt):
        self.opt = opt
        self.layout, self.comm = opt._zero_layout, opt._zero_comm

    def gather(self, jobs, us):
        """Phase 1: the full U of every row-sharded 2-D weight (one all-gather)."""
        full = list(us)
        gather_k = [k for k, (_, i, _) in enumerate(jobs) if self.opt._zero_gathered[i]]
        if gather_k:
            items = [(jobs[k][1], us[k].asnumpy()) for k in gather_k]
            fulls = self.layout.unpack_gathered(self.comm.all_gather(self.layout.pack(items)),
                                                [i for i, _ in items])
            for k, arr in zip(gather_k, fulls):
                full[k] = Tensor(arr)
        return full

    def ns_here(self, i: int) -> bool:
        """Phase 2: all weights (allgather) or the owned ones (allgather_deredundency)."""
        opt = self.opt
        if not opt._zero_gathered[i] or opt.comm_strategy == "allgather":
            return True
        return opt.ns_owner[i] == self.comm.rank

    def complete(self, jobs, deltas):
        """Phase 3 (deredundency): the owners' updates back to every rank (one all-gather)."""
        gather_k = [k for k, (_, i, _) in enumerate(jobs) if self.opt._zero_gathered[i]]
        if self.opt.comm_strategy == "allgather_deredundency" and gather_k:
            deltas = dict(deltas)
            deltas.update(self._return_updates(jobs, gather_k, deltas))
        return deltas

    def local_rows(self, i: int, delta: Tensor) -> Tensor:
        """Phase 4: this rank's rows of a gathered weight's update."""
        if self.opt._zero_gathered[i]:
            start, stop = self.layout.rows(i)
            return delta[start:stop]
        return delta

    def _return_updates(self, jobs, gather_k, deltas) -> Dict[int, Tensor]:
        """Every owner's full updates on every rank: rank q contributes its owned updates
        (flat, job order), padded to the largest owner's total."""
        comm, params, owner = self.comm, self.opt.parameters, self.opt.ns_owner
        by_owner: Dict[int, List[int]] = {q: [] for q in range(comm.world_size)}
        for k in gather_k:
            by_owner[owner[jobs[k][1]]].append(k)
        sizes = {k: int(np.prod(params[jobs[k][1]].shape)) for k in gather_k}
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
                shape = tuple(params[jobs[k][1]].shape)
                out[k] = Tensor(gathered[q, off:off + sizes[k]].reshape(shape).copy())
                off += sizes[k]
        return out


class ZeroMuonMixin:
    """In front of ``ZeroMixin`` and ``Muon`` (see ``zero.sharded_class``)."""

    def _zero_setup(self) -> None:
        """Owner rank per Muon weight (used by allgather_deredundency), the counters and the
        sharded exchange of the update rows."""
        layout = self._zero_layout
        self._zero_gathered = [bool(m) and layout.is_sharded(i) and len(p.shape) == 2
                               for i, (p, m) in enumerate(zip(self.parameters, self._is_muon))]
        self._zero_pieces = [piece_shapes(self._rules[i], p.shape, p.name) if m else []
                             for i, (p, m) in enumerate(zip(self.parameters, self._is_muon))]
        costs = [ns_cost(self._zero_pieces[i], self.ns_steps) if g else 0.0
                 for i, g in enumerate(self._zero_gathered)]
        idx = [i for i, g in enumerate(self._zero_gathered) if g]
        owners = assign_owners([costs[i] for i in idx], layout.world_size)
        self.ns_owner: Dict[int, int] = dict(zip(idx, owners))
        self.ns_flops_total = 0.0     # NS FLOPs this rank ran since construction
        self.exchange = ShardedExchange(self)

    @property
    def ns_owner_by_name(self) -> Dict[str, int]:
        return {self.parameters[i].name: r for i, r in self.ns_owner.items()}

    def on_newton_schulz(self, shapes) -> None:
        self.ns_flops_total += sum(ns_flops([shape], self.ns_steps) for shape in shapes)

    def _apply_qk_clip(self):
        """QK-Clip scales whole head rows: run it on full fp32 masters of the q/kv weights
        (one all-gather of their rows), then keep this rank's rows."""
        if not self._qk_names:
            return None
        layout, comm = self._zero_layout, self._zero_comm
        index = {p.name: i for i, p in enumerate(self.parameters)}
        sharded = [n for n in self._qk_names if n in index and layout.is_sharded(index[n])]
        full_map: Dict[str, Parameter] = {}
        if sharded:
            items = [(index[n], self._masters.master(index[n]).asnumpy()) for n in sharded]
            fulls = layout.unpack_gathered(comm.all_gather(layout.pack(items)),
                                           [i for i, _ in items])
            for n, arr in zip(sharded, fulls):
                full_map[n] = Parameter(Tensor(arr), name=f"qk_clip_full.{n}", requires_grad=False)
        param_map = {p.name: p for p in self.model.get_parameters()} \
            if any(n not in index for n in self._qk_names) else {}
        for n in self._qk_names:
            if n in index:
                param_map[n] = full_map[n] if n in full_map else self._masters.master(index[n])
        stats = qk_clip_step(self.model, self.qk_clip_threshold, param_map,
                             self.max_logits_reducer)
        if stats.num_clipped_heads:
            for n in self._qk_names:
                if n not in index:
                    continue
                i = index[n]
                master = self._masters.master(i)
                if n in full_map:
                    start, stop = layout.rows(i)
                    master.set_data(Tensor(full_map[n].asnumpy()[start:stop].copy()))
                self._masters.store(i, master)
        return stats
