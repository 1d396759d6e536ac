"""Token dispatch for the routed experts: each expert computes only the tokens routed to it.

The (token, slot) pairs of a micro-batch, p = t * k + j for token t's j-th selected expert,
are laid out by ``make_plan`` (pure numpy):

* ``order``: the pairs sorted by expert (stable), so expert e owns the contiguous segment
  ``order[offsets[e]:offsets[e + 1]]``; inside a segment the pairs come in drop-priority order;
* capacity C (rows per expert): dropless (the default) C = the largest segment; with
  ``moe_expert_capacity_factor`` f, C = ceil(T k / E * f) and the pairs past C in a segment
  are dropped (they contribute nothing; ``dropped`` counts them). ``moe_token_drop_policy``
  orders a segment for that: ``probs`` keeps the largest gate weights, ``position`` the
  earliest pairs (ties and equal weights: lower pair index first);
* bucket layout: pair p of expert e at rank r < C sits at row e * C + r of an [E * C] bucket
  array (``pair_row``; E * C marks a dropped pair), ``bucket_token`` names the token of each
  row (T marks an empty row).

``expert_ffn`` is the one dispatch function; it picks the kernel the backend has:

* anywhere (CPU): gather the tokens into [E, C, H] buckets, two ``mint.bmm`` with the 3-D
  expert weights, gather each pair's output row back and sum with the gate weights. Measured
  on CPU (bench/bench_moe.py ``--options``) against a per-expert loop over gathered rows and
  against a scatter-add (segment-sum) combine: the loop costs one kernel per expert and is
  ~15x slower at E = 64, the segment-sum combine is within noise of the gather combine.
  Work and activation memory are O(E * C * F): O(T k F) for balanced routing, and never more
  than the dense E * T * F;
* Ascend, dropless: MindSpore's ``moe_token_permute`` -> grouped matmul (``gmm``, group sizes =
  tokens per expert) -> ``moe_token_unpermute`` with the gate weights. These kernels exist only
  on Ascend (CPU: "Not found op GmmV2", "MoeTokenPermute unregistered"), so that branch is not
  exercised by the CPU test suite.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor, mint, ops

DROP_POLICIES = ("probs", "position")


@dataclass(frozen=True)
class DispatchPlan:
    """Where every (token, slot) pair of one micro-batch goes (see the module docstring)."""
    num_tokens: int
    top_k: int
    num_experts: int
    capacity: int
    tokens_per_expert: np.ndarray   # [E] int64, routed pairs per expert before any drop
    order: np.ndarray               # [T k] int64 pair indices grouped by expert
    offsets: np.ndarray             # [E + 1] int64 segment starts in ``order``
    pair_row: np.ndarray            # [T k] int32 bucket row of each pair, E * C = dropped
    bucket_token: np.ndarray        # [E * C] int32 token of each bucket row, T = empty

    @property
    def kept(self) -> np.ndarray:
        return self.pair_row < self.num_experts * self.capacity

    @property
    def dropped(self) -> int:
        return int(self.pair_row.size - self.kept.sum())


def expert_capacity(num_pairs: int, num_experts: int, capacity_factor: float) -> int:
    """Rows per expert: ceil(num_pairs / num_experts * capacity_factor), at least 1."""
    return max(1, int(math.ceil(num_pairs / num_experts * capacity_factor)))


def make_plan(topk_idx: np.ndarray, num_experts: int, capacity_factor: Optional[float] = None,
              drop_policy: str = "probs", gate_weights: Optional[np.ndarray] = None) -> DispatchPlan:
    """The dispatch plan of selected experts ``topk_idx`` [T, k] (``gate_weights`` [T, k] is
    read only by the ``probs`` drop policy under a capacity)."""
    if drop_policy not in DROP_POLICIES:
        raise ValueError(f"moe_token_drop_policy must be one of {DROP_POLICIES}, got {drop_policy!r}")
    topk_idx = np.asarray(topk_idx)
    t, k = topk_idx.shape
    flat = topk_idx.reshape(-1).astype(np.int64)
    pairs = np.arange(flat.size)
    if capacity_factor is not None and drop_policy == "probs":
        w = np.asarray(gate_weights, np.float64).reshape(-1)
        order = np.lexsort((pairs, -w, flat))        # by expert, then weight desc, then pair
    else:
        order = np.argsort(flat, kind="stable")      # by expert, then pair
    counts = np.bincount(flat, minlength=num_experts).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    if capacity_factor is None:
        capacity = max(1, int(counts.max()))
    else:
        capacity = expert_capacity(flat.size, num_experts, capacity_factor)
    expert_of = flat[order]
    rank = np.arange(flat.size) - offsets[expert_of]
    rows = np.where(rank < capacity, expert_of * capacity + rank, num_experts * capacity)
    pair_row = np.empty(flat.size, np.int32)
    pair_row[order] = rows
    bucket_token = np.full(num_experts * capacity, t, np.int32)
    kept = rows < num_experts * capacity
    bucket_token[rows[kept]] = (order[kept] // k).astype(np.int32)
    return DispatchPlan(t, k, num_experts, capacity, counts, order, offsets, pair_row,
                        bucket_token)


def swiglu_halves(h, ffn: int):
    """silu(gate) * up for h [..., 2F] laid out as [gate (F) | up (F)]."""
    return ops.silu(h[..., :ffn]) * h[..., ffn:]


def padded_expert_ffn(x2d, gate_w, plan: DispatchPlan, weight1, weight2, ffn: int):
    """sum_j gate_w[t, j] * expert_{idx[t, j]}(x_t) over the kept pairs, [T, H] in x's dtype,
    with the experts run as one batched matmul over [E, C, H] buckets."""
    t, h = x2d.shape
    e, c = plan.num_experts, plan.capacity
    zero_row = mint.zeros((1, h), dtype=x2d.dtype)
    buckets = ops.gather(mint.cat([x2d, zero_row], 0), Tensor(plan.bucket_token), 0)
    hidden = mint.bmm(buckets.reshape(e, c, h), weight1)                      # [E, C, 2F]
    y = mint.bmm(swiglu_halves(hidden, ffn), weight2).reshape(e * c, h)       # [E C, H]
    y = mint.cat([y, mint.zeros((1, h), dtype=y.dtype)], 0)                   # row E C = dropped
    per_pair = ops.gather(y, Tensor(plan.pair_row), 0).reshape(t, plan.top_k, h)
    return (per_pair * gate_w.astype(per_pair.dtype)[..., None]).sum(1)


def grouped_matmul_expert_ffn(x2d, gate_w, topk_idx, counts, weight1, weight2, ffn: int):
    """Ascend: permute -> grouped matmul per expert segment -> unpermute with the gate weights.
    ``counts`` [E]: routed pairs per expert (the group sizes)."""
    from mindspore.ops.function.math_func import gmm
    permuted, sorted_indices = ops.moe_token_permute(x2d, topk_idx)
    group_sizes = counts.astype(ms.int64)
    hidden = gmm([permuted], [weight1], group_list=group_sizes, group_list_type=1)[0]
    y = gmm([swiglu_halves(hidden, ffn)], [weight2], group_list=group_sizes, group_list_type=1)[0]
    return ops.moe_token_unpermute(y, sorted_indices, probs=gate_w.astype(y.dtype))


def uses_grouped_matmul(capacity_factor: Optional[float]) -> bool:
    """True where the grouped-matmul kernels exist (Ascend) and no capacity is set."""
    return capacity_factor is None and ms.get_context("device_target") == "Ascend"


def expert_ffn(x2d, gate_w, topk_idx, weight1, weight2, ffn: int,
               capacity_factor: Optional[float] = None, drop_policy: str = "probs"):
    """Routed-expert output [T, H] for tokens x2d [T, H] (compute dtype), gate weights
    [T, k] and selected experts ``topk_idx`` [T, k]; returns (output, tokens_per_expert [E]
    float32 Tensor (routed pairs, before drops), dropped pairs (int))."""
    num_experts = weight1.shape[0]
    if uses_grouped_matmul(capacity_factor):
        onehot = ops.one_hot(topk_idx, num_experts, Tensor(1.0, ms.float32), Tensor(0.0, ms.float32))
        counts = ops.stop_gradient(onehot.sum((0, 1)))
        return grouped_matmul_expert_ffn(x2d, gate_w, topk_idx, counts, weight1, weight2, ffn), counts, 0
    probs = None
    if capacity_factor is not None and drop_policy == "probs":
        probs = ops.stop_gradient(gate_w).asnumpy()
    plan = make_plan(topk_idx.asnumpy(), num_experts, capacity_factor, drop_policy, probs)
    out = padded_expert_ffn(x2d, gate_w, plan, weight1, weight2, ffn)
    return out, Tensor(plan.tokens_per_expert.astype(np.float32)), plan.dropped
