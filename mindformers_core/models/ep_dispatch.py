"""Expert-parallel token dispatch: all-to-all of the routed (token, slot) pairs to the ranks
that hold their experts, the experts' compute there, and the all-to-all back (combine).

``ep`` ranks split the E routed experts into ``E / ep`` consecutive whole experts each (rank
``r`` holds experts ``[r * E/ep, (r + 1) * E/ep)``). Every rank routes its own tokens with the
full (replicated) router and drops pairs by the expert capacity locally, exactly as one process
does for a micro-batch of the same tokens (``dispatch.make_plan``); only the kept pairs travel.

**Counts first, then padded equal chunks.** The per-expert pair counts are data dependent.
MindSpore's ``AlltoAll`` (and the CPU emulation) moves equal chunks, so one small all-gather of
every rank's kept pairs per expert comes first (``K`` [ep, E]); then every rank knows the whole
exchange (pure, :func:`make_ep_plan`):

    C[s, d] = sum of K[s, e] over the experts e of rank d      pairs rank s sends to rank d
    M       = max(1, max_{s, d} C[s, d])                       rows of every chunk

Rank s's send buffer is ``[ep * M, H]``: chunk d holds the ``C[s, d]`` rows of the pairs to d,
sorted by expert (then drop priority, as ``make_plan``'s ``order``), zero-padded to M. After
the all-to-all, chunk s of the received buffer holds what s sent, so the receiver reads its
rows' experts from ``K[s]`` alone, with no expert ids on the wire. Padding to a fixed capacity
instead (``T k`` rows per chunk: every pair of a rank may pick one rank) would need no count
exchange but moves ``ep`` times more rows when balanced; the counts cost ``E`` floats per rank.
Because M depends on the data, the dispatch runs in PyNative only (no ``mindspore.jit``: the
shapes change from step to step), as the MoE layer's dispatch already does.

**Padded** (``model.use_pad_tokens: True``): the chunk is fixed instead, M = ``padded_chunk``
(T * min(k, E/ep) dropless: each of a rank's T tokens sends a rank at most min(k, E/ep) pairs;
under a capacity at most E/ep * capacity), and the receiver computes each local expert in one
block of a fixed ep * ``dispatch.padded_rows`` rows over the whole received buffer (pad rows
are dropped pairs), so every exchanged and computed shape depends on T, E and ep only. The
counts are still exchanged: they say which received row is which expert's.

The received rows are computed by ``dispatch.block_expert_ffn`` with each row's local expert and
a gate weight of 1 (exact), and go back by the reverse all-to-all into the positions they came
from; the source multiplies by its gate weights and sums over the k slots (the single-process
combine). The all-to-all along dim 0 with equal chunks is its own adjoint, so the backward of
both exchanges is the same all-to-all of the gradient (:class:`AllToAll`, custom ``bprop``):
each expert weight's gradient sums the tokens of every EP rank, and each token's gradient
returns to its source rank.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from .dispatch import DispatchPlan, block_expert_ffn, make_plan, padded_rows

__all__ = ["EPDispatchPlan", "make_ep_plan", "rank_of_expert", "AllToAll", "ep_expert_ffn",
           "padded_chunk", "spread_plan", "route_locally", "chunk_rows"]


def rank_of_expert(expert: np.ndarray, num_experts: int, ep: int) -> np.ndarray:
    """The EP rank that holds each expert (consecutive blocks of E / ep)."""
    if num_experts % ep:
        raise ValueError(f"num_experts({num_experts}) must be divisible by expert_parallel({ep})")
    return np.asarray(expert) // (num_experts // ep)


@dataclass(frozen=True)
class EPDispatchPlan:
    """One rank's side of the exchange (see the module docstring)."""
    ep: int
    rank: int                   # index in the ep group
    num_experts: int
    chunk: int                  # M rows per (source, destination) chunk
    counts: np.ndarray          # [ep, E] kept pairs per expert of every rank
    send_pair: np.ndarray       # [ep * M] pair index of each send row; num_pairs = padding
    pair_slot: np.ndarray       # [T k] send row of each pair; ep * M = dropped
    recv_rows: np.ndarray       # [R] rows of the received buffer that hold pairs, in order
    recv_expert: np.ndarray     # [R] local expert of each of them

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.ep

    @property
    def send_counts(self) -> np.ndarray:
        """[ep] pairs this rank sends to each rank (C[rank, :])."""
        return self.pair_counts()[self.rank]

    @property
    def recv_counts(self) -> np.ndarray:
        """[ep] rows this rank receives from each rank (C[:, rank])."""
        return self.pair_counts()[:, self.rank]

    def pair_counts(self) -> np.ndarray:
        """C [ep, ep]: pairs rank s sends to rank d."""
        return self.counts.reshape(self.ep, self.ep, self.experts_per_rank).sum(-1)


def padded_chunk(num_tokens: int, top_k: int, num_experts: int, ep: int,
                 capacity_factor: Optional[float] = None) -> int:
    """Rows of every chunk of the padded exchange (module docstring): the most pairs one rank
    can send another."""
    per_rank = num_experts // ep
    most = num_tokens * min(top_k, per_rank)
    if capacity_factor is not None:
        most = min(most, per_rank * padded_rows(num_tokens, top_k, num_experts, capacity_factor))
    return max(1, most)


def spread_plan(plan: DispatchPlan, slots: np.ndarray, num_tokens: int,
                top_k: int = 1) -> DispatchPlan:
    """``plan`` (of one pair per token, k = 1) with its pairs placed at ``slots`` of a
    ``num_tokens`` x ``top_k`` layout of (token, slot) pairs; every other slot is a dropped
    pair (it reads nothing back)."""
    slots = np.asarray(slots, np.int64)
    pair_row = np.full(num_tokens * top_k, plan.num_rows, np.int32)
    pair_row[slots] = plan.pair_row
    held = plan.row_token < plan.num_tokens
    row_token = np.full(plan.row_token.size, num_tokens, np.int32)
    row_token[held] = slots[plan.row_token[held]] // top_k
    return dataclasses.replace(plan, num_tokens=num_tokens, top_k=top_k, pair_row=pair_row,
                               row_token=row_token)


def route_locally(gate_w, topk_idx, num_experts: int, capacity_factor=None,
                  drop_policy: str = "probs") -> DispatchPlan:
    """This rank's ``dispatch.make_plan`` of its own pairs (drops by the capacity locally, as
    one process does for the same tokens)."""
    probs = None
    if capacity_factor is not None and drop_policy == "probs":
        probs = ops.stop_gradient(gate_w).asnumpy()
    return make_plan(topk_idx.asnumpy(), num_experts, capacity_factor, drop_policy, probs)


def chunk_rows(largest: int, chunk: Optional[int], what: str) -> int:
    """Rows of every chunk: the largest (source, destination) count, or the fixed ``chunk``
    of the padded exchange, which must hold it."""
    m = max(1, int(largest))
    if chunk is None:
        return m
    if chunk < m:
        raise ValueError(f"padded exchange: {m} {what} go to one rank, more than the fixed "
                         f"chunk of {chunk} rows")
    return int(chunk)


def make_ep_plan(local: DispatchPlan, counts: np.ndarray, rank: int,
                 chunk: Optional[int] = None) -> EPDispatchPlan:
    """The exchange of this rank's pairs ``local`` (its ``make_plan``) given every rank's kept
    pairs per expert ``counts`` [ep, E] (row ``rank`` must be this rank's); ``chunk``: a fixed
    M (the padded exchange), at least the largest C[s, d]."""
    counts = np.asarray(counts).astype(np.int64)
    ep, e = counts.shape
    el = e // ep
    kept_counts = np.minimum(local.tokens_per_expert, local.capacity)
    if not np.array_equal(counts[rank], kept_counts):
        raise ValueError(f"row {rank} of the exchanged counts {counts[rank].tolist()} is not "
                         f"this rank's kept pairs per expert {kept_counts.tolist()}")
    pair_counts = counts.reshape(ep, ep, el).sum(-1)
    m = chunk_rows(int(pair_counts.max()), chunk, "pairs")
    num_pairs = local.num_tokens * local.top_k
    kept = local.kept
    sent = local.order[kept[local.order]]                 # kept pairs, by expert
    dest = rank_of_expert(np.repeat(np.arange(e), kept_counts), e, ep)   # of each sent pair
    send_pair = np.full(ep * m, num_pairs, np.int64)
    pair_slot = np.full(num_pairs, ep * m, np.int64)
    for d in range(ep):
        pairs = sent[dest == d]
        rows = d * m + np.arange(pairs.size)
        send_pair[rows] = pairs
        pair_slot[pairs] = rows
    recv_rows = np.concatenate([s * m + np.arange(pair_counts[s, rank]) for s in range(ep)])
    recv_expert = np.concatenate([np.repeat(np.arange(el), counts[s, rank * el:(rank + 1) * el])
                                  for s in range(ep)])
    return EPDispatchPlan(ep, rank, e, m, counts, send_pair, pair_slot,
                          recv_rows.astype(np.int64), recv_expert.astype(np.int64))


class AllToAll(nn.Cell):
    """All-to-all along dim 0 over the ``ep`` group (equal chunks); its backward is the same
    all-to-all of the gradient (the exchange is its own adjoint)."""

    def __init__(self, comm, group: str = "ep"):
        super().__init__()
        self.comm, self.group = comm, group

    def construct(self, x):
        return self.comm.all_to_all(x, self.group, 0, 0)

    def bprop(self, x, out, dout):
        return (self.comm.all_to_all(dout, self.group, 0, 0),)


def _with_zero_row(x):
    return ops.concat([x, ops.zeros((1, x.shape[-1]), x.dtype)], 0)


def ep_expert_ffn(x2d, gate_w, topk_idx, weight1, weight2, ffn: int, comm, exchange: AllToAll,
                  capacity_factor=None, drop_policy: str = "probs", pad_tokens: bool = False):
    """The routed-expert output [T, H] of this rank's tokens, its experts being the local
    ``weight1`` [E/ep, H, 2F] / ``weight2`` [E/ep, F, H] of the ``ep`` group of ``comm``;
    returns (output, tokens_per_expert [E] float32 (this rank's routed pairs, before drops),
    dropped pairs), as ``dispatch.expert_ffn``; ``pad_tokens``: the padded exchange and
    compute (module docstring)."""
    ep = len(comm.ranks("ep"))
    rank = comm.mesh.local_rank("ep", comm.rank)
    num_experts = weight1.shape[0] * ep
    t, h = x2d.shape
    local = route_locally(gate_w, topk_idx, num_experts, capacity_factor, drop_policy)
    kept_counts = np.minimum(local.tokens_per_expert, local.capacity).astype(np.float32)
    counts = comm.all_gather(kept_counts.reshape(1, -1), "ep", 0)      # [ep, E], exact
    chunk = None
    if pad_tokens:
        chunk = padded_chunk(t, local.top_k, num_experts, ep, capacity_factor)
    plan = make_ep_plan(local, counts, rank, chunk)
    send_token = np.where(plan.send_pair < t * local.top_k, plan.send_pair // local.top_k, t)
    received = exchange(ops.gather(_with_zero_row(x2d), Tensor(send_token.astype(np.int32)), 0))
    if pad_tokens:
        # every received row in one static [E/ep, ep * padded_rows] block layout
        pad_to = ep * padded_rows(t, local.top_k, num_experts, capacity_factor)
        inner = make_plan(plan.recv_expert.reshape(-1, 1), plan.experts_per_rank, pad_to=pad_to)
        inner = spread_plan(inner, plan.recv_rows, ep * plan.chunk)
        ones = ops.ones((ep * plan.chunk, 1), ms.float32)
        out_rows = block_expert_ffn(received, ones, inner, weight1, weight2, ffn)
    elif plan.recv_rows.size:
        rows = ops.gather(received, Tensor(plan.recv_rows.astype(np.int32)), 0)
        inner = make_plan(plan.recv_expert.reshape(-1, 1), plan.experts_per_rank)
        ones = ops.ones((rows.shape[0], 1), ms.float32)
        y = block_expert_ffn(rows, ones, inner, weight1, weight2, ffn)
        back = np.full(ep * plan.chunk, plan.recv_rows.size, np.int32)
        back[plan.recv_rows] = np.arange(plan.recv_rows.size)
        out_rows = ops.gather(_with_zero_row(y), Tensor(back), 0)
    else:   # nothing routed here: the exchanges still run (every rank takes part)
        out_rows = received * 0
    returned = exchange(out_rows)
    per_pair = ops.gather(_with_zero_row(returned), Tensor(plan.pair_slot.astype(np.int32)), 0)
    per_pair = per_pair.reshape(t, local.top_k, h)
    w = gate_w.astype(per_pair.dtype)
    return ((per_pair * w[..., None]).sum(1), Tensor(local.tokens_per_expert.astype(np.float32)),
            local.dropped)
