"""The deredundant expert-parallel dispatch (``moe_token_dispatcher_type:
alltoall_deredundancy``): a token routed to several experts of one EP rank is sent to that rank
once, and comes back once.

``ep_dispatch`` sends one row per kept (token, slot) pair. Here rank s sends rank d one row per
token with at least one kept pair on d (U[s, d] tokens), plus a small float32 side buffer
[gate weights | routed mask] of ``E / ep`` columns each for those rows; the receiver runs each
row through every local expert it is routed to and returns one row, the gate-weighted sum over
them; the source adds the rows that come back from each rank:

    out_t = sum_d  sum_{j: expert(t, j) on d, kept}  g_tj * expert_{e_tj}(x_t)

the same terms as the pair dispatch (exact up to the order of the float additions). Chunks
are equal (``AlltoAll``): M = max(1, max_{s, d} U[s, d]) rows, known on every rank from the
same all-gather of counts as ``ep_dispatch`` (each rank's E kept pairs per expert, then its ep
unique tokens per destination). With ``use_pad_tokens`` the chunk is fixed to T (a rank's T
tokens) and each local expert computes one block of ep * ``dispatch.padded_rows`` rows, so
no shape depends on the routing.

Payload: the x exchange moves ep * M rows of H values each way instead of ep * M_pairs, and the
side buffer adds 2 E/ep floats per row, so the logical bytes (``CommStats``) shrink whenever
tokens pick several experts of one rank and H is larger than 2 E/ep (bench/bench_ep_dedup.py
measures it). The gate weights travel in the side buffer, so their gradient returns to the
source through the exchange's backward (``ep_dispatch.AllToAll``), as the tokens' does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import mindspore as ms
from mindspore import Tensor, ops

from .dispatch import DispatchPlan, block_expert_ffn, make_plan, padded_rows
from .ep_dispatch import AllToAll, chunk_rows, route_locally, spread_plan

__all__ = ["DedupPlan", "make_dedup_plan", "dedup_expert_ffn", "DEREDUNDANT"]

#: the ``moe_token_dispatcher_type`` value of this dispatch
DEREDUNDANT = "alltoall_deredundancy"


@dataclass(frozen=True)
class DedupPlan:
    """One rank's side of the deredundant exchange (module docstring)."""
    ep: int
    rank: int
    chunk: int                  # M rows per (source, destination) chunk
    send_token: np.ndarray      # [ep * M] token of each send row; T = padding
    send_pair: np.ndarray       # [ep * M, E/ep] pair index of each (row, local expert); T k = none
    token_slot: np.ndarray      # [T, ep] send row of token t to rank d; ep * M = not sent


def unique_per_destination(local: DispatchPlan, ep: int) -> np.ndarray:
    """[ep] tokens of ``local`` with at least one kept pair on each EP rank."""
    el = local.num_experts // ep
    pairs = np.flatnonzero(local.kept)
    expert = local_expert_of(local)[pairs]
    dest, token = expert // el, pairs // local.top_k
    return np.array([np.unique(token[dest == d]).size for d in range(ep)], np.int64)


def local_expert_of(local: DispatchPlan) -> np.ndarray:
    """[T k] expert of each pair (from the plan's expert-sorted order and offsets)."""
    expert = np.empty(local.order.size, np.int64)
    for e in range(local.num_experts):
        expert[local.order[local.offsets[e]:local.offsets[e + 1]]] = e
    return expert


def make_dedup_plan(local: DispatchPlan, unique: np.ndarray, rank: int,
                    chunk: int = None) -> DedupPlan:
    """The exchange of this rank's kept pairs ``local`` given every rank's unique tokens per
    destination ``unique`` [ep, ep] (row ``rank`` must be this rank's); ``chunk``: a fixed M
    (the padded exchange), at least the largest entry."""
    unique = np.asarray(unique).astype(np.int64)
    ep = unique.shape[0]
    mine = unique_per_destination(local, ep)
    if not np.array_equal(unique[rank], mine):
        raise ValueError(f"row {rank} of the exchanged unique-token counts "
                         f"{unique[rank].tolist()} is not this rank's {mine.tolist()}")
    m = chunk_rows(int(unique.max()), chunk, "tokens")
    t, k, e = local.num_tokens, local.top_k, local.num_experts
    el = e // ep
    expert = local_expert_of(local)
    send_token = np.full(ep * m, t, np.int64)
    send_pair = np.full((ep * m, el), t * k, np.int64)
    token_slot = np.full((t, ep), ep * m, np.int64)
    kept = np.flatnonzero(local.kept)
    for d in range(ep):
        pairs = kept[expert[kept] // el == d]
        tokens = np.unique(pairs // k)
        rows = d * m + np.arange(tokens.size)
        send_token[rows] = tokens
        token_slot[tokens, d] = rows
        where = np.searchsorted(tokens, pairs // k)
        send_pair[d * m + where, expert[pairs] - d * el] = pairs
    return DedupPlan(ep, rank, m, send_token, send_pair, token_slot)


def _with_zero_row(x):
    return ops.concat([x, ops.zeros((1, x.shape[-1]), x.dtype)], 0)


def dedup_expert_ffn(x2d, gate_w, topk_idx, weight1, weight2, ffn: int, comm,
                     exchange: AllToAll, capacity_factor=None, drop_policy: str = "probs",
                     pad_tokens: bool = False):
    """``ep_dispatch.ep_expert_ffn`` through the deredundant exchange (module docstring):
    (output [T, H], tokens_per_expert [E] float32, dropped pairs)."""
    ep = len(comm.ranks("ep"))
    rank = comm.mesh.local_rank("ep", comm.rank)
    t, h = x2d.shape
    el = weight1.shape[0]
    local = route_locally(gate_w, topk_idx, el * ep, capacity_factor, drop_policy)
    k = local.top_k
    kept_counts = np.minimum(local.tokens_per_expert, local.capacity)
    row = np.concatenate([kept_counts, unique_per_destination(local, ep)]).astype(np.float32)
    gathered = comm.all_gather(row.reshape(1, -1), "ep", 0)               # [ep, E + ep], exact
    unique = np.rint(np.asarray(gathered.asnumpy() if hasattr(gathered, "asnumpy")
                                else gathered)[:, -ep:]).astype(np.int64)
    plan = make_dedup_plan(local, unique, rank, max(1, t) if pad_tokens else None)
    rows = ep * plan.chunk
    received = exchange(ops.gather(_with_zero_row(x2d), Tensor(plan.send_token.astype(np.int32)),
                                   0))
    # side buffer: each row's gate weight and routed mask for every local expert of its rank
    flat_gate = ops.concat([gate_w.reshape(-1).astype(ms.float32), ops.zeros((1,), ms.float32)])
    gate = ops.gather(flat_gate, Tensor(plan.send_pair.reshape(-1).astype(np.int32)), 0)
    routed = Tensor((plan.send_pair < t * k).astype(np.float32))
    side = exchange(ops.concat([gate.reshape(rows, el), routed], 1))
    recv_gate, recv_mask = side[:, :el], ops.stop_gradient(side[:, el:]).asnumpy() > 0.5
    slots = np.flatnonzero(recv_mask.reshape(-1))
    pad_to = ep * padded_rows(t, k, local.num_experts, capacity_factor) if pad_tokens else None
    if slots.size or pad_to is not None:
        inner = make_plan((slots % el).reshape(-1, 1), el, pad_to=pad_to)
        inner = spread_plan(inner, slots, rows, top_k=el)
        y = block_expert_ffn(received, recv_gate, inner, weight1, weight2, ffn)   # [rows, H]
    else:   # nothing routed here: the exchanges still run (every rank takes part)
        y = received * 0
    returned = exchange(y)
    per_dest = ops.gather(_with_zero_row(returned),
                          Tensor(plan.token_slot.reshape(-1).astype(np.int32)), 0)
    return (per_dest.reshape(t, ep, h).sum(1),
            Tensor(local.tokens_per_expert.astype(np.float32)), local.dropped)
