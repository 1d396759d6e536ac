"""Context-parallel core attention: ``colossal`` (ring), ``ulysses`` and ``hybrid``.

Every method is a callable with the models' core-attention signature
``core(q, k, v, scale, mask_bias) -> (context, max_logits)`` on this rank's tokens of the
load-balanced split (``distributed/cp_layout.py``: cp rank i holds chunks i and 2cp-1-i of
2cp): q, k [B, N, S/cp, D], v [B, N, S/cp, Dv]. It returns this rank's context rows, exactly
those of ``models/layers.causal_attention`` on the full sequence, and gradients w.r.t. q, k, v
that are this rank's rows of the full sequence's.

    colossal  ring attention over the cp group (``distributed/ring_attention.py``)
    ulysses   all-to-all over the cp group: the sequence split becomes a head split
              ([B, N, S/cp, D] -> [B, N/cp, S, D]; q, k, v travel as one buffer), the tokens are
              put in global order, ``inner`` (the model's own core, e.g. ``causal_attention``)
              runs on the local heads with a full causal mask, and the inverse all-to-all brings
              the context back. The all-to-alls' backward is the inverse all-to-all.
    hybrid    ulysses inside groups of ``ulysses_degree`` consecutive cp ranks, ring attention
              across them (``cp_layout.hybrid_groups``): the all-to-all gives each ulysses
              group the [B, N/u, S/(cp/u), D] tokens of its ring position, ring attention runs
              over the ring group on them, the inverse all-to-all follows.

The masks come from the layout (causal over global positions), unless ``mask_bias`` is a
document mask: the whole ``[B, 1, S, S]`` bias in global positions (``models/documents.py``),
told apart by its last dim (``S`` = the local length times cp). colossal cuts each block's
part (``ring_attention``); ulysses hands it whole to ``inner`` (its tokens are then the whole
sequence in global order); hybrid hands it to the ring over the ulysses groups, whose
positions are global ones (``cp_layout.ulysses_order``).

``max_logits`` [N] on each rank, detached: colossal, the max over this rank's queries;
ulysses, the full sequence's (the local heads' maxima gathered over the group, so identical on
every rank); hybrid, the max over the queries of this rank's ring position
(its ulysses group's tokens). In every case the MAX over the cp group is the full sequence's.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np
from mindspore import Tensor, nn, ops

from . import cp_layout
from .collectives import GroupCommunicator
from .ring_attention import RingAttention

__all__ = ["METHODS", "AllToAll", "UlyssesAttention", "context_parallel_attention"]

METHODS = ("colossal", "ulysses", "hybrid")


class AllToAll(nn.Cell):
    """``comm.all_to_all(x, group, split_axis, concat_axis)``; backward the inverse all-to-all
    (a permutation of blocks: its adjoint is its inverse)."""

    def __init__(self, comm: GroupCommunicator, group: str, split_axis: int, concat_axis: int):
        super().__init__()
        self.comm, self.group = comm, group
        self.split_axis, self.concat_axis = split_axis, concat_axis

    def construct(self, x):
        return self.comm.all_to_all(x, self.group, self.split_axis, self.concat_axis)

    def bprop(self, x, out, dout):
        return (self.comm.all_to_all(dout, self.group, self.concat_axis, self.split_axis),)


class UlyssesAttention:
    """Ulysses over ``group`` (``degree`` members: its position ``g`` among the cp group's
    ulysses groups of ``cp`` ranks); ``inner(q, k, v, scale, mask_bias)`` runs on the local
    heads of ring position ``g``'s tokens. ``full_mask``: pass ``inner`` the full causal
    [B, N/u, S', S'] bias (a plain core); otherwise None (a ring core, which ignores it)."""

    def __init__(self, comm: GroupCommunicator, group: str, cp: int, ring_pos: int,
                 inner: Callable, full_mask: bool):
        self.comm, self.group, self.cp, self.ring_pos = comm, group, cp, ring_pos
        self.degree = len(comm.ranks(group))
        self.inner, self.full_mask = inner, full_mask
        self.to_heads = AllToAll(comm, group, 1, 2)
        self.to_seq = AllToAll(comm, group, 2, 1)
        self._orders: Dict[int, tuple] = {}
        self._masks: Dict[tuple, Tensor] = {}

    def _order(self, local: int):
        if local not in self._orders:
            order = cp_layout.ulysses_order(local * self.cp, self.cp, self.degree,
                                            self.ring_pos)
            self._orders[local] = (Tensor(order.astype(np.int32)),
                                   Tensor(np.argsort(order).astype(np.int32)))
        return self._orders[local]

    def _mask(self, shape) -> Optional[Tensor]:
        if not self.full_mask:
            return None
        if shape not in self._masks:
            s = shape[-1]
            bias = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, 0.0).astype(np.float32)
            self._masks[shape] = Tensor(np.ascontiguousarray(np.broadcast_to(bias, shape)))
        return self._masks[shape]

    def __call__(self, q, k, v, scale: float, mask_bias=None):
        b, n, local, dq = q.shape
        cp_layout.check_ulysses(self.cp, self.degree, n)
        dk = k.shape[-1]
        order, inverse = self._order(local)
        x = ops.gather(self.to_heads(ops.concat([q, k, v], -1)), order, 2)
        qh, kh, vh = x[..., :dq], x[..., dq:dq + dk], x[..., dq + dk:]
        seq = x.shape[2]
        documents = mask_bias is not None and mask_bias.shape[-1] == local * self.cp
        ctx, max_logits = self.inner(qh, kh, vh, scale, mask_bias if documents
                                     else self._mask((b, n // self.degree, seq, seq)))
        ctx = self.to_seq(ops.gather(ctx, inverse, 2))
        heads = self.comm.all_gather(ops.stop_gradient(max_logits), self.group, 0)
        return ctx, ops.stop_gradient(heads)


def context_parallel_attention(comm: GroupCommunicator, method: str, inner: Callable = None,
                               ulysses_degree: int = 1, group: str = "cp") -> Callable:
    """The core attention of ``method`` over the cp ``group`` of ``comm`` (module docstring).

    ``inner``: the model's own core for ulysses (required there, unused otherwise).
    ``ulysses_degree``: hybrid only (divides the cp size). Hybrid registers the axes
    ``{group}_ulysses`` and ``{group}_ring`` on ``comm`` (``GroupCommunicator.add_group``), so
    every rank calls this at the same point of the program.
    """
    if method not in METHODS:
        raise ValueError(f"context parallel method {method!r} is not one of {METHODS}")
    members = comm.ranks(group)
    cp = len(members)
    if method == "colossal":
        return RingAttention(comm, group)
    if method == "ulysses":
        if inner is None:
            raise ValueError("ulysses context parallel needs the model's core attention as "
                             "`inner`")
        return UlyssesAttention(comm, group, cp, 0, inner, full_mask=True)
    cp_layout.check_ulysses(cp, ulysses_degree)
    ulysses, ring = cp_layout.hybrid_groups(members, ulysses_degree, comm.rank)
    u_axis, r_axis = f"{group}_ulysses", f"{group}_ring"
    comm.add_group(u_axis, ulysses)
    comm.add_group(r_axis, ring)
    return UlyssesAttention(comm, u_axis, cp, ring.index(comm.rank),
                            RingAttention(comm, r_axis), full_mask=False)
