"""Muon's update matrices on sharded weights: one exchange for ZeRO rows, tensor-parallel shards
and both at once (the ``optim.muon.MuonExchange`` behind ``Muon._muon_update``).

A *level* (:class:`ShardLevel`) is one way of splitting parameters over the ranks of one group:
:class:`SpecLevel` splits them as ``ShardSpec`` says (any split dim, any named group of a
``GroupCommunicator``: tensor parallel, later FSDP), ``zero_muon.ZeroRowsLevel`` is ZeRO-1's
dim-0 rows (``shard_layout.ShardLayout``). Levels are listed outer to inner: a TP x ZeRO run has
``[tp SpecLevel, ZeRO rows of the TP shard]``. Levels whose shards *are* the model's parameters
(``model_sharded``, tensor parallel) come first; the others shard only optimizer state.

Per Muon weight the exchange uses the levels that split it along one of its two matrix dims
(a 3-D expert weight split on its expert dim is whole per expert: orthogonalised locally, no
communication). With ``U`` this rank's part of ``g + mu * m`` (element-wise, so local):

``allgather``: for each level, inner to outer, one all-gather of every weight's part (one flat
buffer per level); every rank then has the full ``U``, runs Newton-Schulz on the pieces of the
full shape and keeps its part of the scaled update (no communication back).

``allgather_deredundency``: each weight has one *owner*: a member of its outermost splitting
level's group, chosen by greedy balancing of upstream's NS cost over that group
(``shard_layout.assign_owners`` / ``ns_cost`` of the full shape's pieces); the inner levels are
all-gathered as above. Where the backend has send/recv (``collectives.CAPABILITIES``
``send_recv``), every other member sends its part to the owner, only the owner orthogonalises,
and it sends each member its part of the update back. Where it has not (CPU), the parts are
all-gathered (every rank has the full ``U``; only the owner orthogonalises) and the owners'
full updates come back in one all-gather per level (each member's owned updates, flat, padded
to the largest owner's total). Either way NS work per rank drops by about the group size.

Both strategies give the single-process update: the same full U bits, the same pieces and
scale (from the full shape), and each rank applies its part (weight decay and the fp32 master
are per shard). Only the batching of same-shape pieces into one NS call differs (a rank
orthogonalises a different set of matrices together), which can move the last bits
(tests/distributed/test_tp_muon_msrun.py: 0 on tp 2, <= 3e-7 relative on tp 2 x dp 2).

QK-Clip scales head rows of the q/kv weights the model holds: :meth:`full_masters` gathers
the levels that are not ``model_sharded`` (ZeRO rows) and leaves the tensor-parallel shard as
it is; the model reports max logits for its local heads only.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

import numpy as np
from mindspore import Parameter, Tensor

from .collectives import GroupCommunicator, is_native
from .shard_layout import assign_owners, ns_cost, ns_flops
from .shard_spec import ShardSpec, local_shape, shard, unshard

__all__ = ["ShardLevel", "PointToPoint", "SpecLevel", "ShardedMuonExchange", "STRATEGIES"]

STRATEGIES = ("allgather", "allgather_deredundency")


class PointToPoint(Protocol):
    """Send/receive between members of one group (indices in the group)."""

    def send(self, x: np.ndarray, member: int) -> None:
        ...

    def recv(self, like: np.ndarray, member: int) -> np.ndarray:
        ...


class ShardLevel(Protocol):
    """One split of parameters (by index) over the ranks of one group."""

    name: str               # the group, for messages
    size: int               # members of this rank's group
    index: int              # this rank's index in it
    model_sharded: bool     # the model's parameter is this level's part (tensor parallel)
    p2p: Optional[PointToPoint]   # native send/recv in the group, None where the backend has none

    def split_dim(self, i: int) -> Optional[int]:
        """The dim parameter i is split along at this level (None: whole on every member)."""

    def gather(self, items: Sequence[Tuple[int, np.ndarray]]) -> List[np.ndarray]:
        """The whole arrays (at this level) of ``items`` [(index, this rank's part)]: one
        collective over the group."""

    def gather_flat(self, buf: np.ndarray) -> np.ndarray:
        """``(size, n)``: every member's flat ``buf`` (equal sizes), in member order."""

    def part(self, i: int, whole: np.ndarray, member: int) -> np.ndarray:
        """Member ``member``'s part of parameter i's whole array."""

    def part_shape(self, i: int, whole_shape: tuple, member: int) -> tuple:
        """The shape of member ``member``'s part of a whole of ``whole_shape``."""

    def join(self, i: int, parts: Sequence[np.ndarray]) -> np.ndarray:
        """The whole array from every member's part (member order)."""


class _GroupP2P:
    """Send/recv of a ``GroupCommunicator`` between members of ``group``."""

    def __init__(self, comm: GroupCommunicator, group: str):
        self.comm, self.ranks = comm, comm.ranks(group)

    def send(self, x, member):
        self.comm.send(np.ascontiguousarray(x, np.float32), self.ranks[member])

    def recv(self, like, member):
        return self.comm.recv(np.zeros(np.shape(like), np.float32), self.ranks[member])


class SpecLevel:
    """Parameters split as their ``ShardSpec`` says over ``group`` of ``comm``.

    ``specs``: parameter index -> ShardSpec (only split ones; the others are whole). ``p2p``:
    None = send/recv where ``collectives.CAPABILITIES`` says the backend has them; True uses
    the communicator's send/recv anyway (on CPU its all-reduce rendezvous), False never."""

    def __init__(self, specs: Mapping[int, ShardSpec], comm: GroupCommunicator, group: str,
                 model_sharded: bool = True, p2p: Optional[bool] = None):
        self.name, self.comm, self.model_sharded = group, comm, bool(model_sharded)
        self.size = comm.mesh.size(group)
        self.index = comm.mesh.local_rank(group, comm.rank)
        self.specs: Dict[int, ShardSpec] = {}
        for i, spec in specs.items():
            if not spec.is_sharded:
                continue
            if spec.group != group:
                raise ValueError(f"parameter {i} is split over group {spec.group!r}, not "
                                 f"{group!r}")
            if spec.num_shards != self.size:
                raise ValueError(f"parameter {i} is split into {spec.num_shards} shards, but "
                                 f"the {group} group has {self.size} ranks")
            self.specs[i] = spec
        if p2p is None:
            p2p = is_native(comm.backend, "send_recv", self.size == comm.mesh.world)
        self.p2p: Optional[PointToPoint] = _GroupP2P(comm, group) if p2p and self.size > 1 \
            else None

    def split_dim(self, i: int) -> Optional[int]:
        spec = self.specs.get(i)
        return None if spec is None else spec.split_dim

    def gather(self, items):
        parts = [np.asarray(a, np.float32).reshape(-1) for _, a in items]
        gathered = self.gather_flat(np.concatenate(parts))
        out, off = [], 0
        for (i, _), flat in zip(items, parts):
            shape = local_shape(self.specs[i])
            out.append(self.join(i, [gathered[q, off:off + flat.size].reshape(shape)
                                     for q in range(self.size)]))
            off += flat.size
        return out

    def gather_flat(self, buf):
        buf = np.ascontiguousarray(buf, np.float32)
        return np.asarray(self.comm.all_gather(buf, self.name)).reshape(self.size, buf.size)

    def part(self, i, whole, member):
        return shard(self.specs[i], np.asarray(whole), member)

    def part_shape(self, i, whole_shape, member):  # noqa: ARG002 - equal shards
        return local_shape(self.specs[i])

    def join(self, i, parts):
        return unshard(self.specs[i], parts)


class ShardedMuonExchange:
    """``optim.muon.MuonExchange`` over ``levels`` (outer to inner; module docstring).

    Args:
        levels: the :class:`ShardLevel` s, model-sharded ones first.
        strategy: ``comm_strategy`` ('allgather' | 'allgather_deredundency').
        pieces: Muon parameter index -> NS piece shapes of its full shape (owner costs).
        ns_steps: Newton-Schulz iterations (owner costs and the FLOP counter).
        names: parameter names by index (``owner_by_name``).
        full_shapes: full (logical) shape of every parameter, by index.

    Counters: ``ns_flops_total`` (NS FLOPs run on this rank); ``owner`` (index -> owner's
    member index in its owner level's group), ``owner_level`` (index -> level index).
    """

    def __init__(self, levels: Sequence[ShardLevel], strategy: str,
                 pieces: Mapping[int, Sequence[tuple]], ns_steps: int, names: Sequence[str],
                 full_shapes: Sequence[Sequence[int]]):
        if strategy not in STRATEGIES:
            raise ValueError("comm_strategy must be 'allgather' or 'allgather_deredundency', "
                             f"got {strategy!r}.")
        seen_state_level = False
        for level in levels:
            if level.model_sharded and seen_state_level:
                raise ValueError(f"level {level.name!r} shards the model's parameters and must "
                                 "come before the levels that shard only optimizer state")
            seen_state_level = seen_state_level or not level.model_sharded
        self.levels, self.strategy, self.ns_steps = list(levels), strategy, int(ns_steps)
        self.names = list(names)
        n = len(self.names)
        #: per parameter: levels splitting a matrix dim (Muon weights) / any dim of the
        #: optimizer-state-only levels (QK-Clip's model view)
        self.matrix_levels: List[List[int]] = [[] for _ in range(n)]
        self.state_levels: List[List[int]] = [[] for _ in range(n)]
        #: per parameter and level: the shape of the whole at that level (this rank's chain)
        self.whole_at: List[List[tuple]] = []
        for i in range(n):
            shape = tuple(int(d) for d in full_shapes[i])
            self.whole_at.append([])
            for j, level in enumerate(self.levels):
                self.whole_at[i].append(shape)
                d = level.split_dim(i)
                if d is None:
                    continue
                shape = tuple(level.part_shape(i, shape, level.index))
                if i in pieces and d >= len(shape) - 2:
                    self.matrix_levels[i].append(j)
                if not level.model_sharded:
                    self.state_levels[i].append(j)
        self.owner_level: Dict[int, int] = {i: ls[0] for i, ls in enumerate(self.matrix_levels)
                                            if ls}
        self.owner: Dict[int, int] = {}
        for j, level in enumerate(self.levels):
            idx = sorted(i for i, lj in self.owner_level.items() if lj == j)
            costs = [ns_cost(pieces[i], self.ns_steps) for i in idx]
            self.owner.update(zip(idx, assign_owners(costs, level.size)))
        self.ns_flops_total = 0.0

    @classmethod
    def for_optimizer(cls, opt, levels: Sequence[ShardLevel]) -> "ShardedMuonExchange":
        """The exchange of Muon optimizer ``opt`` (its public API only) over ``levels``."""
        from ..optim.muon_split import piece_shapes
        pieces = {i: piece_shapes(opt.split_rule(i), opt.full_shape(i), p.name)
                  for i, (p, m) in enumerate(zip(opt.parameters, opt.muon_mask)) if m}
        return cls(levels, opt.comm_strategy, pieces, opt.ns_steps,
                   [p.name for p in opt.parameters],
                   [opt.full_shape(i) for i in range(len(opt.parameters))])

    @property
    def owner_by_name(self) -> Dict[str, int]:
        return {self.names[i]: r for i, r in self.owner.items()}

    def _owns(self, i: int) -> bool:
        j = self.owner_level[i]
        return self.owner[i] == self.levels[j].index

    def _p2p_here(self, i: int) -> bool:
        """Whether weight i's owner exchange goes by send/recv."""
        return self.strategy == "allgather_deredundency" and \
            self.levels[self.owner_level[i]].p2p is not None

    # -- MuonExchange -----------------------------------------------------------------------
    def full_updates(self, jobs, us):
        arrays: Dict[int, np.ndarray] = {}
        out: Dict[int, Tensor] = {}
        for k, (_, i, _) in enumerate(jobs):
            if self.matrix_levels[i]:
                arrays[k] = us[k].asnumpy()
            else:
                out[k] = us[k]        # whole per matrix here: orthogonalised locally
        for j in reversed(range(len(self.levels))):
            ks = [k for k in arrays if j in self.matrix_levels[jobs[k][1]]]
            to_owner = [k for k in ks if self.owner_level[jobs[k][1]] == j
                        and self._p2p_here(jobs[k][1])]
            collective = [k for k in ks if k not in to_owner]
            if collective:
                level = self.levels[j]
                fulls = level.gather([(jobs[k][1], arrays[k]) for k in collective])
                arrays.update(zip(collective, fulls))
            for k in to_owner:
                self._send_to_owner(j, jobs[k][1], k, arrays)
        for k, arr in arrays.items():
            i = jobs[k][1]
            if self.strategy == "allgather" or self._owns(i):
                out[k] = Tensor(arr)
        return out

    def _send_to_owner(self, j: int, i: int, k: int, arrays) -> None:
        level, owner = self.levels[j], self.owner[i]
        if level.index == owner:
            whole = self.whole_at[i][j]
            arrays[k] = level.join(i, [arrays[k] if q == owner else level.p2p.recv(
                np.zeros(level.part_shape(i, whole, q), np.float32), q)
                for q in range(level.size)])
        else:
            level.p2p.send(arrays[k], owner)
            del arrays[k]

    def on_newton_schulz(self, shapes) -> None:
        self.ns_flops_total += ns_flops(list(shapes), self.ns_steps)

    def local_updates(self, jobs, deltas):
        out: Dict[int, Tuple[np.ndarray, int]] = {}    # k -> (part, matrix levels done)
        # deredundency: the owners' updates back, level by level (outer to inner)
        if self.strategy == "allgather_deredundency":
            for j, level in enumerate(self.levels):
                ks = [k for k, (_, i, _) in enumerate(jobs)
                      if self.owner_level.get(i) == j]
                if level.p2p is not None:
                    for k in ks:
                        out[k] = self._send_back(j, jobs[k][1], deltas.get(k))
                elif ks:
                    out.update(self._return_collective(j, jobs, ks, deltas))
        result = []
        for k, (_, i, _) in enumerate(jobs):
            levels = self.matrix_levels[i]
            if not levels:
                result.append(deltas[k])
                continue
            if k in out:          # the owner level's part is already here (p2p) or whole
                arr, done = out[k]
            else:
                arr, done = deltas[k].asnumpy(), 0
            for j in levels[done:]:
                arr = self.levels[j].part(i, arr, self.levels[j].index)
            result.append(Tensor(np.ascontiguousarray(arr)))
        return result

    def _send_back(self, j: int, i: int, delta: Optional[Tensor]):
        """Owner: send every member its part; member: receive its part. ``(array, levels
        done)``: this rank's part at owner level ``j``."""
        level, owner = self.levels[j], self.owner[i]
        if level.index == owner:
            whole = delta.asnumpy()
            for q in range(level.size):
                if q != owner:
                    level.p2p.send(level.part(i, whole, q), q)
            return level.part(i, whole, owner), 1
        like = np.zeros(level.part_shape(i, self.whole_at[i][j], level.index), np.float32)
        return level.p2p.recv(like, owner), 1

    def _return_collective(self, j, jobs, ks, deltas):
        """One all-gather over ``level``'s group: member q contributes its owned full updates
        (flat, job order), padded to the largest owner's total; every rank gets all of them
        whole ``(array, 0)``."""
        level = self.levels[j]
        by_owner: Dict[int, List[int]] = {q: [] for q in range(level.size)}
        for k in ks:
            by_owner[self.owner[jobs[k][1]]].append(k)
        shapes = {k: self.whole_at[jobs[k][1]][j] for k in ks}
        sizes = {k: int(np.prod(shapes[k])) for k in ks}
        width = max(sum(sizes[k] for k in group) for group in by_owner.values())
        buf = np.zeros(width, np.float32)
        off = 0
        for k in by_owner[level.index]:
            buf[off:off + sizes[k]] = deltas[k].asnumpy().reshape(-1)
            off += sizes[k]
        gathered = level.gather_flat(buf)
        out = {}
        for q, group in by_owner.items():
            off = 0
            for k in group:
                out[k] = (gathered[q, off:off + sizes[k]].reshape(shapes[k]).copy(), 0)
                off += sizes[k]
        return out

    def full_masters(self, masters, indices):
        arrays = {i: masters.master(i).asnumpy() for i in indices if self.state_levels[i]}
        for j in reversed(range(len(self.levels))):
            idx = [i for i in arrays if j in self.state_levels[i]]
            if idx:
                arrays.update(zip(idx, self.levels[j].gather([(i, arrays[i]) for i in idx])))
        return [Parameter(Tensor(arrays[i]), name=f"qk_clip_full.{i}", requires_grad=False)
                if i in arrays else masters.master(i) for i in indices]

    def keep_rows(self, i, full, master) -> None:
        if not self.state_levels[i]:
            return
        arr = full.asnumpy()
        for j in self.state_levels[i]:
            arr = self.levels[j].part(i, arr, self.levels[j].index)
        master.set_data(Tensor(np.ascontiguousarray(arr)))
