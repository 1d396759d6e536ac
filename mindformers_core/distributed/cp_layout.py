"""Context-parallel layout math: which tokens a rank holds, the ring schedule, the sub-groups.

Pure (numpy only). docs/context_parallel.md describes the methods that use it.

**Load-balanced causal split** (Megatron's context parallel, upstream MindFormers): a sequence
of ``S`` tokens (``S`` divisible by ``2 * cp``) is cut into ``2 * cp`` equal chunks of
``S / (2 cp)`` tokens; context-parallel rank ``i`` holds chunks ``i`` and ``2 cp - 1 - i``,
in that order (``S / cp`` tokens). Under a causal mask an early chunk has little work and a late
one much; pairing them gives every rank the same amount.

**Ring schedule** (ring attention over ``n`` ranks, position ``p`` in the ring): K/V blocks move
one position forward per step, so at step ``t`` position ``p`` holds the K/V of position
``(p - t) mod n`` (:func:`ring_source`). Of the four (query chunk, key chunk) pairs of a step,
:func:`ring_blocks` lists those not masked out: ``full`` (the key chunk is before the query
chunk), ``causal`` (the same chunk: the diagonal, lower-triangular). Step 0 has three blocks
(two diagonal, one full), every later step two full ones, on every rank: no rank idles.

**Phase order of one ring shift** (a send/recv pair is a rendezvous of both ranks): the edge
``p -> p+1`` has colour ``p mod 2``, except the closing edge ``n-1 -> 0`` of an odd ring, which
has colour 2. Each colour is a matching (no rank on two edges of one colour), and every rank
issues its two operations (send on its out-edge, receive on its in-edge) in colour order, so
all ranks walk one global order of the edges: no cycle of waits, no deadlock
(:func:`ring_phases`).

**Hybrid sub-groups**: the cp group (its members in cp-rank order) is cut into ulysses groups
of ``u`` consecutive cp ranks; the ranks at the same place in each ulysses group form a ring
group. Ulysses group ``g`` then holds (after its all-to-all) the tokens of ring position ``g``
of the same load-balanced split with ``n = cp / u`` ring positions (:func:`ulysses_order`).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

__all__ = ["FULL", "CAUSAL", "MASKED", "check_split", "rank_chunks", "local_positions",
           "split_sequence", "gather_sequence", "ring_source", "block_kind", "ring_blocks",
           "edge_colour", "ring_phases", "check_ulysses", "hybrid_groups", "ulysses_order"]

FULL, CAUSAL, MASKED = "full", "causal", "masked"


def check_split(seq_length: int, cp: int) -> int:
    """The chunk length ``S / (2 cp)``; ``ValueError`` unless ``2 cp`` divides ``S``."""
    if cp < 1:
        raise ValueError(f"context parallel size must be a positive integer, but got {cp}")
    if seq_length % (2 * cp) or seq_length <= 0:
        raise ValueError(f"sequence length {seq_length} is not divisible by 2 * context "
                         f"parallel size = {2 * cp} (the load-balanced causal split)")
    return seq_length // (2 * cp)


def rank_chunks(cp: int, rank: int) -> Tuple[int, int]:
    """The two chunks (of ``2 cp``) context-parallel rank ``rank`` holds, in its order."""
    if not 0 <= rank < cp:
        raise ValueError(f"context parallel rank {rank} is outside 0..{cp - 1}")
    return rank, 2 * cp - 1 - rank


def local_positions(seq_length: int, cp: int, rank: int) -> np.ndarray:
    """int64 [S / cp]: the global token positions of this rank's tokens, in its order (the rows
    of the RoPE / YaRN tables it needs)."""
    c = check_split(seq_length, cp)
    return np.concatenate([np.arange(k * c, (k + 1) * c) for k in rank_chunks(cp, rank)])


def split_sequence(x: np.ndarray, cp: int, rank: int, axis: int = 1) -> np.ndarray:
    """This rank's part of ``x`` (the sequence along ``axis``): [B, S, ...] -> [B, S/cp, ...]."""
    x = np.asarray(x)
    return np.take(x, local_positions(x.shape[axis], cp, rank), axis=axis)


def gather_sequence(parts: Sequence[np.ndarray], axis: int = 1) -> np.ndarray:
    """The full sequence from every rank's part (``parts[i]``: cp rank ``i``'s), in global
    order: the inverse of :func:`split_sequence`."""
    cp = len(parts)
    seq = sum(np.shape(p)[axis] for p in parts)
    pos = np.concatenate([local_positions(seq, cp, i) for i in range(cp)])
    return np.take(np.concatenate(parts, axis), np.argsort(pos), axis=axis)


def ring_source(pos: int, step: int, size: int) -> int:
    """The ring position whose K/V block position ``pos`` holds at ``step``."""
    return (pos - step) % size


def block_kind(q_chunk: int, k_chunk: int) -> str:
    """``full`` when every key of ``k_chunk`` is visible to every query of ``q_chunk``,
    ``causal`` on the diagonal, ``masked`` when no key is visible."""
    if k_chunk < q_chunk:
        return FULL
    return CAUSAL if k_chunk == q_chunk else MASKED


def ring_blocks(pos: int, step: int, size: int) -> List[Tuple[int, int, str]]:
    """``(query half, key half, kind)`` of the blocks position ``pos`` computes at ``step``
    (half 0 / 1: the first / second chunk of the local tokens); masked-out blocks are left out."""
    q_chunks = rank_chunks(size, pos)
    k_chunks = rank_chunks(size, ring_source(pos, step, size))
    out = []
    for a, qc in enumerate(q_chunks):
        for b, kc in enumerate(k_chunks):
            kind = block_kind(qc, kc)
            if kind != MASKED:
                out.append((a, b, kind))
    return out


def edge_colour(src: int, size: int) -> int:
    """The phase of the ring edge ``src -> src + 1`` (module docstring)."""
    return 2 if size % 2 and src == size - 1 else src % 2


def ring_phases(pos: int, size: int) -> List[Tuple[str, int]]:
    """The order in which position ``pos`` issues one ring shift: ``("send", pos + 1)`` and
    ``("recv", pos - 1)`` (ring positions), sorted by the colour of their edge."""
    if size < 2:
        return []
    nxt, prev = (pos + 1) % size, (pos - 1) % size
    ops_ = [(edge_colour(pos, size), ("send", nxt)), (edge_colour(prev, size), ("recv", prev))]
    return [op for _, op in sorted(ops_)]


def check_ulysses(cp: int, degree: int, heads: int = None) -> None:
    """``ValueError`` unless ``degree`` divides ``cp`` (and ``heads`` when given)."""
    if degree < 1 or cp % degree:
        raise ValueError(f"ulysses degree {degree} does not divide the context parallel size "
                         f"{cp}")
    if heads is not None and heads % degree:
        raise ValueError(f"{heads} attention heads are not divisible by the ulysses degree "
                         f"{degree}")


def hybrid_groups(cp_members: Sequence[int], degree: int,
                  rank: int) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """``(ulysses group, ring group)`` of global rank ``rank`` in the cp group ``cp_members``
    (global ranks in cp-rank order): ``degree`` consecutive cp ranks / the ranks at the same
    place in every ulysses group."""
    members = tuple(int(r) for r in cp_members)
    check_ulysses(len(members), degree)
    g, m = divmod(members.index(rank), degree)
    return members[g * degree:(g + 1) * degree], members[m::degree]


def ulysses_order(seq_length: int, cp: int, degree: int, group: int) -> np.ndarray:
    """int64 [S * degree / cp]: the index (along the sequence) that puts the tokens ulysses
    group ``group`` gathers (its members' parts concatenated in member order) into the order of
    ring position ``group`` of ``cp / degree`` (chunks in global order, the ring's layout)."""
    check_ulysses(cp, degree)
    pos = np.concatenate([local_positions(seq_length, cp, group * degree + m)
                          for m in range(degree)])
    return np.argsort(pos, kind="stable")
