"""Collectives over named groups of the mesh (tp, cp, dp, pp, ep, edp, world), by backend.

Which operation is MindSpore's own collective on which backend is decided here and only here
(:data:`CAPABILITIES`): ``"any"`` = native on every group, ``"world"`` = native on the world
group only, ``None`` = no kernel. Measured on MindSpore 2.10 CPU, 4 msrun workers:

    ops.AllReduce SUM on create_group sub-groups   exact, interleaved with world traffic
    ops.AllReduce MAX                              "AllReduce only support reduce sum on CPU"
    ops.AllGather / ops.Broadcast on a sub-group   "AllGather only support mccl_world_group on
                                                   CPU, but got tp_0_1" (Broadcast alike)
    ReduceScatter, AlltoAll, Send/Receive          "Unsupported op [ReduceScatter] on CPU" ...
    mint.distributed.send after init()             "The group hccl_world_group does not exist"
                                                   (and the matching recv returns, unsynchronised)

(tests/distributed/cpu_collectives_probe.py reproduces each line.)

Where an operation is not native it is emulated from the group's AllReduce SUM, which is exact
for these because only zeros are added:

    all_gather      all_reduce of a (G, ...) zero buffer holding this rank's x at its index
    broadcast       all_reduce of x on the source, zeros elsewhere
    reduce_scatter  all_reduce, then this rank's slice
    all_to_all      all_gather of the inputs, then this rank's chunk of each
    send / recv     all_reduce over the 2-rank group {src, dst}, zeros from the receiver
                    (both ranks call at the same time: it is a rendezvous)

Byte accounting, per rank, bytes *received* by the usual ring algorithms, ``G`` = group size,
``n`` = bytes of this rank's input (``stats``: the operation asked for, whatever the backend):

    all_reduce       2 * (G - 1) / G * n
    all_gather       (G - 1) * n
    reduce_scatter   (G - 1) / G * n
    all_to_all       (G - 1) / G * n
    broadcast        n on every rank but the source, 0 on the source
    recv / send      n on the receiver, 0 on the sender

``transport`` counts the native collectives actually issued, with the same formulas (an
emulated all_gather of n bytes is an all_reduce of ``G * n``: ``2 * (G - 1) * n`` received).
A group of one rank is the identity and counts nothing.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np

from .comm import CommStats
from ..core.parallel_dims import AXES, Mesh, group_name

__all__ = ["CAPABILITIES", "OPS", "is_native", "detect_backend", "GroupCommunicator",
           "logical_bytes"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")

CAPABILITIES: Dict[str, Dict[str, Optional[str]]] = {
    "ascend": {op: "any" for op in OPS},
    "cpu": {"all_reduce": "any", "all_gather": "world", "broadcast": "world",
            "reduce_scatter": None, "all_to_all": None, "send_recv": None},
}


def is_native(backend: str, op: str, on_world: bool) -> bool:
    """Whether ``op`` runs as MindSpore's own collective on ``backend`` for this group."""
    if backend not in CAPABILITIES:
        raise ValueError(f"no collective capability table for backend {backend!r}; "
                         f"known: {sorted(CAPABILITIES)}")
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; expected one of {OPS}")
    where = CAPABILITIES[backend][op]
    return where == "any" or (where == "world" and on_world)


def detect_backend() -> str:
    import mindspore as ms
    return str(ms.get_context("device_target")).lower()


def logical_bytes(op: str, group_size: int, nbytes: float, receives: bool = True) -> float:
    """Bytes this rank receives for ``op`` over ``group_size`` ranks (module docstring)."""
    g = group_size
    if op == "all_reduce":
        return 2.0 * (g - 1) / g * nbytes
    if op == "all_gather":
        return float((g - 1) * nbytes)
    if op in ("reduce_scatter", "all_to_all"):
        return (g - 1) / g * nbytes
    if op in ("broadcast", "recv", "send"):
        return float(nbytes) if receives else 0.0
    raise ValueError(f"unknown collective {op!r}")


def _nbytes(t) -> float:
    return float(math.prod(t.shape) * t.itemsize)


class GroupCommunicator:
    """Collectives over this rank's groups of ``mesh``; numpy or Tensor in, same kind out.

    Every group this rank belongs to is created at construction, in the order of
    :data:`~mindformers_core.core.parallel_dims.AXES`, under a name derived from its members
    (identical on every member). A group equal to the world uses the world group. ``group`` in
    every method is an axis name; ranks (``src``, ``dst``) are global ranks.
    """

    def __init__(self, mesh: Mesh, rank: int, backend: Optional[str] = None):
        self.mesh = mesh
        self.rank = int(rank)
        self.backend = backend if backend is not None else detect_backend()
        is_native(self.backend, "all_reduce", True)   # an unknown backend fails here
        self.stats = CommStats()
        self.transport = CommStats()
        self._names: Dict[Tuple[int, ...], str] = {}
        self._prims: Dict[tuple, object] = {}
        self._extra: Dict[str, Tuple[int, ...]] = {}
        for axis in AXES:
            self._group_name(axis, mesh.group_of(axis, self.rank))

    # -- groups ----------------------------------------------------------------------------------
    def ranks(self, group: str) -> Tuple[int, ...]:
        if group in self._extra:
            return self._extra[group]
        return self.mesh.group_of(group, self.rank)

    def add_group(self, axis: str, ranks) -> Tuple[int, ...]:
        """Name this rank's group along an axis the mesh does not have (the context-parallel
        sub-groups of ``distributed/cp_layout.hybrid_groups``); afterwards ``axis`` works as
        ``group`` in every method. Every rank calls it at the same point of the program with
        the members of its own group (the group is created here, as in the constructor).
        Adding an axis again with the same members is a no-op."""
        members = tuple(sorted(int(r) for r in ranks))
        if axis in AXES:
            raise ValueError(f"add_group: {axis!r} is a mesh axis; extra axes need another "
                             f"name")
        if self.rank not in members or not all(0 <= r < self.mesh.world for r in members):
            raise ValueError(f"add_group: the {axis} group {members} must hold this rank "
                             f"{self.rank} and only ranks of the world of {self.mesh.world}")
        if self._extra.get(axis, members) != members:
            raise ValueError(f"add_group: axis {axis!r} already names the group "
                             f"{self._extra[axis]}, not {members}")
        self._group_name(axis, members)
        self._extra[axis] = members
        return members

    def _group_name(self, axis: str, ranks: Tuple[int, ...]) -> str:
        if ranks not in self._names:
            if len(ranks) == self.mesh.world:
                from mindspore.communication import GlobalComm
                self._names[ranks] = GlobalComm.WORLD_COMM_GROUP
            elif len(ranks) == 1:
                self._names[ranks] = ""
            else:
                from mindspore.communication import create_group
                name = group_name(axis, ranks)
                create_group(name, list(ranks))
                self._names[ranks] = name
        return self._names[ranks]

    def _prim(self, key: tuple, factory):
        if key not in self._prims:
            self._prims[key] = factory()
        return self._prims[key]

    def _native(self, op: str, ranks: Tuple[int, ...]) -> bool:
        return is_native(self.backend, op, len(ranks) == self.mesh.world)

    # -- the one native primitive every emulation uses -------------------------------------------
    def _sum(self, t, ranks: Tuple[int, ...], axis: str):
        from mindspore import ops
        name = self._group_name(axis, ranks)
        out = self._prim(("all_reduce", name), lambda: ops.AllReduce(ops.ReduceOp.SUM, name))(t)
        self.transport.add("all_reduce", logical_bytes("all_reduce", len(ranks), _nbytes(t)))
        return out

    def _stacked_gather(self, t, ranks, axis: str):
        """``(G, *t.shape)``: member ``j``'s ``t`` at index ``j``."""
        from mindspore import ops
        g, i = len(ranks), ranks.index(self.rank)
        if self._native("all_gather", ranks):
            name = self._group_name(axis, ranks)
            out = self._prim(("all_gather", name), lambda: ops.AllGather(name))(t.expand_dims(0))
            self.transport.add("all_gather", logical_bytes("all_gather", g, _nbytes(t)))
            return out
        z = ops.zeros((1,) + tuple(t.shape), t.dtype)
        buf = ops.concat([z] * i + [t.expand_dims(0)] + [z] * (g - 1 - i), 0)
        return self._sum(buf, ranks, axis)

    # -- collectives -------------------------------------------------------------------------------
    def all_reduce(self, x, group: str = "world"):
        """Element-wise SUM over the group (same shape)."""
        return self._run("all_reduce", x, group, lambda t, r: self._sum(t, r, group))

    def group_sum(self, group: str, x: float) -> float:
        """The SUM of one float over the group (``grad_route.combine_sq_norms``'s
        ``group_sum``: a norm's squares)."""
        return float(self.all_reduce(np.array([x], np.float32), group)[0])

    def any_flag(self, flag: bool, group: str = "world") -> bool:
        """True on every member when any member raised ``flag``."""
        return self.group_sum(group, 1.0 if flag else 0.0) > 0

    def all_gather(self, x, group: str, axis: int = 0):
        """Members' ``x`` concatenated along ``axis`` in group order (equal shapes)."""
        from mindspore import ops

        def go(t, ranks):
            parts = self._stacked_gather(t, ranks, group)
            return ops.concat([parts[j] for j in range(len(ranks))], axis)
        return self._run("all_gather", x, group, go)

    def reduce_scatter(self, x, group: str, axis: int = 0):
        """The SUM over the group, split in G equal chunks along ``axis``: this rank's chunk."""
        from mindspore import ops

        def go(t, ranks):
            g, i = len(ranks), ranks.index(self.rank)
            if t.shape[axis] % g:
                raise ValueError(f"reduce_scatter: dim {axis} of shape {tuple(t.shape)} is not "
                                 f"divisible by the {group} group size {g}")
            if self._native("reduce_scatter", ranks):
                name = self._group_name(group, ranks)
                prim = self._prim(("reduce_scatter", name),
                                  lambda: ops.ReduceScatter(ops.ReduceOp.SUM, name))
                out = prim(ops.stack(ops.split(t, t.shape[axis] // g, axis), 0))[0]
                self.transport.add("reduce_scatter", logical_bytes("reduce_scatter", g,
                                                                   _nbytes(t)))
                return out
            return ops.split(self._sum(t, ranks, group), t.shape[axis] // g, axis)[i]
        return self._run("reduce_scatter", x, group, go)

    def broadcast(self, x, group: str, src: int):
        """Global rank ``src``'s ``x`` on every member (every member passes the same shape)."""
        from mindspore import ops

        def go(t, ranks):
            if src not in ranks:
                raise ValueError(f"broadcast: source rank {src} is not in the {group} group "
                                 f"{ranks} of rank {self.rank}")
            if self._native("broadcast", ranks):
                name = self._group_name(group, ranks)
                out = self._prim(("broadcast", name, src),
                                 lambda: ops.Broadcast(int(src), name))((t,))[0]
                self.transport.add("broadcast", logical_bytes("broadcast", len(ranks),
                                                              _nbytes(t), self.rank != src))
                return out
            return self._sum(t if self.rank == src else ops.zeros_like(t), ranks, group)
        return self._run("broadcast", x, group, go, receives=self.rank != src)

    def all_to_all(self, x, group: str, split_axis: int = 0, concat_axis: int = 0):
        """Chunk ``j`` of ``x`` (G equal chunks along ``split_axis``) goes to member ``j``; the
        received chunks are concatenated along ``concat_axis`` in member order."""
        from mindspore import ops

        def go(t, ranks):
            g, i = len(ranks), ranks.index(self.rank)
            if t.shape[split_axis] % g:
                raise ValueError(f"all_to_all: dim {split_axis} of shape {tuple(t.shape)} is not "
                                 f"divisible by the {group} group size {g}")
            c = t.shape[split_axis] // g
            if self._native("all_to_all", ranks):
                name = self._group_name(group, ranks)
                prim = self._prim(("all_to_all", name, split_axis, concat_axis),
                                  lambda: ops.AlltoAll(g, split_axis, concat_axis, name))
                self.transport.add("all_to_all", logical_bytes("all_to_all", g, _nbytes(t)))
                return prim(t)
            parts = self._stacked_gather(t, ranks, group)
            return ops.concat([ops.split(parts[j], c, split_axis)[i] for j in range(g)],
                              concat_axis)
        return self._run("all_to_all", x, group, go)

    def send(self, x, dst: int) -> None:
        """Send ``x`` to global rank ``dst`` (which calls :meth:`recv` with ``src`` = this rank
        at the same time)."""
        self._pair("send", x, dst, sending=True)

    def recv(self, like, src: int):
        """Receive from global rank ``src`` a tensor shaped and typed like ``like``."""
        return self._pair("recv", like, src, sending=False)

    # -- plumbing ----------------------------------------------------------------------------------
    def _pair(self, op: str, x, peer: int, sending: bool):
        from mindspore import ops
        if peer == self.rank or not 0 <= peer < self.mesh.world:
            raise ValueError(f"{op}: peer rank {peer} must be another rank of the world of "
                             f"{self.mesh.world} (this rank is {self.rank})")
        t, was_np = _to_tensor(x)
        ranks = tuple(sorted((self.rank, peer)))
        self.stats.add(op, logical_bytes(op, 2, _nbytes(t), receives=not sending))
        if self._native("send_recv", ranks):
            from mindspore.mint import distributed as dist
            if sending:
                dist.send(t, peer)
                return None
            dist.recv(t, peer)
            out = t
        else:
            out = self._sum(t if sending else ops.zeros_like(t), ranks, "p2p")
        if sending:
            return None
        return out.asnumpy() if was_np else out

    def _run(self, op: str, x, group: str, go, receives: bool = True):
        ranks = self.ranks(group)
        if len(ranks) == 1:
            return x.copy() if isinstance(x, np.ndarray) else x
        t, was_np = _to_tensor(x)
        out = go(t, ranks)
        self.stats.add(op, logical_bytes(op, len(ranks), _nbytes(t), receives))
        return out.asnumpy() if was_np else out


def _to_tensor(x):
    """A Tensor that no collective may write into the caller's buffer through."""
    import mindspore as ms
    if isinstance(x, np.ndarray):
        return ms.Tensor(np.ascontiguousarray(x).copy()), True
    return x.copy(), False
