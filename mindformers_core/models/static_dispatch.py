"""Token dispatch with static shapes, computed in the graph: the routed block compiles.

``dispatch.make_plan`` lays the (token, slot) pairs out on the host (numpy), so the MoE layer
runs in PyNative. Here the same layout is built from tensor ops whose shapes depend on T, k
and E only, so ``mindspore.jit`` compiles the whole routed block, router included
(``training.jit: layer``, ``models/compiled.py``):

* the rank of pair p inside its expert's segment: the pairs routed to that expert before p
  (a cumulative sum of the one-hot selection: the stable expert order of ``make_plan``), or
  under a capacity with ``moe_token_drop_policy: probs`` the pairs of that expert with a
  larger gate weight (equal weights: lower pair index first), counted by one [Tk, Tk]
  comparison;
* kept = rank < capacity (dropless: always); expert e's kept pairs fill ceil(kept_e / b)
  blocks of b rows, or exactly one block of ``pad_to`` rows (the padded dispatch,
  ``use_pad_tokens``: the same blocks as ``make_plan(pad_to=...)``);
* a static number of blocks NB: E when padded, else floor((T k + E (b - 1)) / b), the most
  sum_e ceil(kept_e / b) can reach; unused blocks hold no pair.

The rows then go through ``dispatch.block_rows_ffn``, the batched-matmul kernel of the eager
block path (rows that hold no pair compute on token 0 and nothing reads them back, so the
loss and the gradients equal the eager dispatch's).

Block size b of the dropless layout (``static_block_rows``): ceil(T k / (4 E)), so the rows
are at most T k + E (b - 1) ~ 1.25 T k, and each block gathers its expert's weights
(NB ~ 5 E blocks).
"""
from __future__ import annotations

import math
from typing import Optional

import mindspore as ms
from mindspore import Tensor, ops

from .dispatch import block_rows_ffn, expert_capacity, padded_rows

__all__ = ["static_block_rows", "static_layout", "static_expert_ffn"]


def static_block_rows(num_pairs: int, num_experts: int) -> int:
    """Rows of one block of the dropless static layout (module docstring)."""
    return max(1, math.ceil(num_pairs / (4 * num_experts)))


def static_layout(num_tokens: int, top_k: int, num_experts: int,
                  capacity_factor: Optional[float], pad_tokens: bool):
    """(block rows b, number of blocks NB, capacity C or None) of a micro-batch's shape."""
    pairs = num_tokens * top_k
    if pad_tokens:
        pad = padded_rows(num_tokens, top_k, num_experts, capacity_factor)
        return pad, num_experts, pad
    capacity = None if capacity_factor is None else \
        expert_capacity(pairs, num_experts, capacity_factor)
    most = pairs if capacity is None else min(pairs, num_experts * capacity)
    b = static_block_rows(most, num_experts)
    return b, (most + num_experts * (b - 1)) // b, capacity


def _ranks(flat_onehot, gate_w, by_probs: bool):
    """Rank [Tk] of each pair inside its expert's segment (module docstring)."""
    if not by_probs:
        before = ops.cumsum(flat_onehot, 0) - flat_onehot                  # [Tk, E]
        return (before * flat_onehot).sum(-1)
    w = gate_w.reshape(-1)
    n = w.shape[0]
    pair = ops.arange(n).astype(ms.float32)
    same = ops.matmul(flat_onehot, flat_onehot.T)                           # [Tk, Tk]
    first = (w[None, :] > w[:, None]) | ((w[None, :] == w[:, None]) & (pair[None, :] < pair[:, None]))
    return (same * first.astype(ms.float32)).sum(-1)


def static_expert_ffn(x2d, gate_w, topk_idx, weight1, weight2, ffn: int,
                      capacity_factor: Optional[float] = None, drop_policy: str = "probs",
                      pad_tokens: bool = False):
    """``dispatch.expert_ffn`` from tensor ops of static shapes: (output [T, H], routed pairs
    per expert [E] float32 (before drops), dropped pairs (int32 scalar Tensor))."""
    t, k = topk_idx.shape
    e = weight1.shape[0]
    b, nb, capacity = static_layout(t, k, e, capacity_factor, pad_tokens)
    rows = nb * b
    flat = topk_idx.reshape(-1)
    onehot = ops.stop_gradient(ops.one_hot(flat, e, Tensor(1.0, ms.float32),
                                           Tensor(0.0, ms.float32)))        # [Tk, E]
    counts = onehot.sum(0)                                                  # [E]
    rank = _ranks(onehot, ops.stop_gradient(gate_w),
                  capacity is not None and drop_policy == "probs")
    if capacity is None:
        kept = ops.ones_like(rank) > 0
        kept_counts = counts
    else:
        kept = rank < capacity
        kept_counts = ops.minimum(counts, float(capacity))
    if pad_tokens:
        blocks = ops.ones_like(kept_counts)
    else:
        blocks = ops.ceil(kept_counts / b)
    first_block = ops.cumsum(blocks, 0) - blocks                            # [E]
    row = (onehot * first_block).sum(-1) * b + rank                         # [Tk]
    pair_row = ops.where(kept, row, float(rows)).astype(ms.int32)
    token = (ops.arange(t * k) // k).astype(ms.int32)
    # each kept pair owns its row; the dropped ones all land in the dump row (sliced off)
    row_token = ops.scatter_nd(pair_row.reshape(-1, 1), token, (rows + 1,))[:rows]
    if pad_tokens:
        block_expert = None
    else:
        ends = (first_block + blocks)[None, :]                              # [1, E]
        j = ops.arange(nb).astype(ms.float32)[:, None]
        block_expert = ops.minimum((ends <= j).astype(ms.int32).sum(-1), e - 1)
    out = block_rows_ffn(x2d, gate_w, kept.reshape(t, k), ops.minimum(pair_row, rows - 1),
                         row_token, block_expert, nb, b, weight1, weight2, ffn)
    dropped = (t * k - kept.astype(ms.int32).sum())
    return out, counts, dropped
