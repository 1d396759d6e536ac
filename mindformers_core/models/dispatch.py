"""Token dispatch for the routed experts: each expert computes only the tokens routed to it.

The (token, slot) pairs of a micro-batch, p = t * k + j for token t's j-th selected expert,
are laid out by ``make_plan`` (pure numpy):

* ``order``: the pairs sorted by expert (stable), so expert e owns the contiguous segment
  ``order[offsets[e]:offsets[e + 1]]``; inside a segment the pairs come in drop-priority order;
* capacity C: dropless (the default) keeps every pair; with ``moe_expert_capacity_factor`` f,
  C = ceil(T k / E * f) and the pairs past C in a segment are dropped (they contribute
  nothing; ``dropped`` counts them). ``moe_token_drop_policy`` orders a segment for that:
  ``probs`` keeps the largest gate weights, ``position`` the earliest pairs (equal weights:
  lower pair index first);
* blocks: each expert's kept pairs fill ceil(n_e / b) blocks of b rows (``block_size``: b =
  the largest segment, i.e. one block per expert, or the mean segment when that computes
  fewer rows). Rows <= T k + nb (b - 1) whatever the imbalance; ``pair_row`` is the row of
  each pair, ``row_token`` the token of each row;
* padded (``pad_to``, ``model.use_pad_tokens: True``, upstream's padded dispatch): one block
  per expert, empty ones included, of a fixed ``pad_to`` rows (:func:`padded_rows`: the
  capacity, or T when dropless, the most one expert can get since a token's k experts are
  distinct), so the shapes, [E, pad_to, H], depend on T and E only, never on the routing. The
  pad rows compute on token 0 and nothing reads them back, so the loss and the gradients equal
  the unpadded dispatch's; the cost is E * pad_to rows instead of about T k.

``expert_ffn`` is the one dispatch function; it picks the kernel the backend has:

* anywhere (the CPU path): gather the tokens into [nb, b, H] blocks, two batched matmuls with
  each block's expert weights (the 3-D weights as they are when one block per expert, else
  gathered per block), gather each pair's output row back and sum with the gate weights.
  Measured on CPU (bench/bench_moe.py ``--options``) against the dense form, a per-expert
  loop over gathered rows (one kernel pair per expert: the slowest at E = 64) and a
  scatter-add (segment-sum) combine (no faster than the gather combine). Work and activation
  memory are O(rows * F) = O(T k F);
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
from mindspore import Tensor, ops

DROP_POLICIES = ("probs", "position")


@dataclass(frozen=True)
class DispatchPlan:
    """Where every (token, slot) pair of one micro-batch goes (see the module docstring)."""
    num_tokens: int
    top_k: int
    num_experts: int
    capacity: int                   # most pairs an expert computes (the largest segment if dropless)
    tokens_per_expert: np.ndarray   # [E] int64, routed pairs per expert before any drop
    order: np.ndarray               # [T k] int64 pair indices grouped by expert
    offsets: np.ndarray             # [E + 1] int64 segment starts in ``order``
    block_rows: int                 # b, rows of one block
    block_expert: np.ndarray        # [nb] int32 expert of each block (ascending)
    pair_row: np.ndarray            # [T k] int32 row of each pair in the nb * b rows; nb * b = dropped
    row_token: np.ndarray           # [nb * b] int32 token of each row, T = empty

    @property
    def num_rows(self) -> int:
        return int(self.block_expert.size * self.block_rows)

    @property
    def kept(self) -> np.ndarray:
        return self.pair_row < self.num_rows

    @property
    def dropped(self) -> int:
        return int(self.pair_row.size - self.kept.sum())


def expert_capacity(num_pairs: int, num_experts: int, capacity_factor: float) -> int:
    """Rows per expert: ceil(num_pairs / num_experts * capacity_factor), at least 1."""
    return max(1, int(math.ceil(num_pairs / num_experts * capacity_factor)))


def block_size(kept_counts: np.ndarray) -> int:
    """Rows per block: the largest kept segment (one block per expert, the weights used as
    they are) or ceil(mean segment) (the large segments split, their weights gathered per
    block), whichever computes fewer rows; ties to the first."""
    num_experts = kept_counts.size
    largest = max(1, int(kept_counts.max()))
    mean = max(1, -(-int(kept_counts.sum()) // num_experts))
    rows = [b * int((-(-kept_counts // b)).sum()) for b in (largest, mean)]
    return largest if rows[0] <= rows[1] else mean


def padded_rows(num_tokens: int, top_k: int, num_experts: int,
                capacity_factor: Optional[float] = None) -> int:
    """Rows per expert of the padded dispatch: the capacity under a capacity factor, else
    ``num_tokens`` (each token sends an expert at most one of its k distinct pairs)."""
    if capacity_factor is None:
        return max(1, num_tokens)
    return min(max(1, num_tokens), expert_capacity(num_tokens * top_k, num_experts,
                                                   capacity_factor))


def make_plan(topk_idx: np.ndarray, num_experts: int, capacity_factor: Optional[float] = None,
              drop_policy: str = "probs", gate_weights: Optional[np.ndarray] = None,
              pad_to: Optional[int] = None) -> DispatchPlan:
    """The dispatch plan of selected experts ``topk_idx`` [T, k] (``gate_weights`` [T, k] is
    read only by the ``probs`` drop policy under a capacity); ``pad_to``: one block of that
    many rows per expert (the padded dispatch, module docstring)."""
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
    kept_counts = np.minimum(counts, capacity)
    if pad_to is None:
        b = block_size(kept_counts)
        blocks = -(-kept_counts // b)                                   # blocks per expert
    else:
        if int(kept_counts.max()) > pad_to:
            raise ValueError(f"padded dispatch: an expert keeps {int(kept_counts.max())} pairs, "
                             f"more than its {pad_to} padded rows (repeated experts in a "
                             "token's top-k?)")
        b, blocks = int(pad_to), np.ones(num_experts, np.int64)
    block_expert = np.repeat(np.arange(num_experts), blocks).astype(np.int32)
    first_row = np.concatenate([[0], np.cumsum(blocks * b)[:-1]])       # of each expert
    num_rows = int(blocks.sum() * b)
    expert_of = flat[order]
    rank = pairs - offsets[expert_of]
    rows = np.where(rank < capacity, first_row[expert_of] + rank, num_rows)
    pair_row = np.empty(flat.size, np.int32)
    pair_row[order] = rows
    row_token = np.full(num_rows, t, np.int32)
    kept = rows < num_rows
    row_token[rows[kept]] = (order[kept] // k).astype(np.int32)
    return DispatchPlan(t, k, num_experts, capacity, counts, order, offsets, b, block_expert,
                        pair_row, row_token)


def swiglu_halves(h, ffn: int):
    """silu(gate) * up for h [..., 2F] laid out as [gate (F) | up (F)]."""
    return ops.silu(h[..., :ffn]) * h[..., ffn:]


# the primitive's backward multiplies with transposed operands directly; mint.bmm's copies the
# transposed weight (measured 4.4x slower fwd+bwd at E = 64, 8 rows per expert)
_batch_matmul = ops.BatchMatMul()


def block_expert_ffn(x2d, gate_w, plan: DispatchPlan, weight1, weight2, ffn: int):
    """sum_j gate_w[t, j] * expert_{idx[t, j]}(x_t) over the kept pairs, [T, H] in x's dtype:
    the rows of each expert in blocks of ``plan.block_rows``, one batched matmul over the
    blocks with each block's expert weights (``block_rows_ffn``).

    Empty rows and dropped pairs need no zero row: an empty row computes on token 0 but no
    pair reads it back (so its gradient is exactly 0), and a dropped pair reads row 0 with
    its gate weight masked to 0."""
    t = x2d.shape[0]
    kept = plan.kept
    nb = plan.block_expert.size
    block_expert = None
    if nb != plan.num_experts or not (plan.block_expert == np.arange(nb)).all():
        block_expert = Tensor(plan.block_expert)
    src = np.where(plan.row_token < t, plan.row_token, 0).astype(np.int32)
    rows = np.where(kept, plan.pair_row, 0).astype(np.int32)
    mask = None if kept.all() else Tensor(kept.reshape(t, plan.top_k))
    return block_rows_ffn(x2d, gate_w, mask, Tensor(rows), Tensor(src), block_expert, nb,
                          plan.block_rows, weight1, weight2, ffn)


def block_rows_ffn(x2d, gate_w, kept, pair_row, row_token, block_expert, nb: int, b: int,
                   weight1, weight2, ffn: int):
    """The block kernel: tokens ``row_token`` [nb * b] gathered into [nb, b, H] blocks, two
    batched matmuls with each block's expert weights (``block_expert`` [nb], None: block e is
    expert e), each pair's row ``pair_row`` [T k] read back and summed with the gate weights
    (``kept`` [T, k] bool, None: every pair kept). Tensors in, so ``static_dispatch`` builds
    the same computation in a graph."""
    t, h = x2d.shape
    k = gate_w.shape[-1]
    if block_expert is not None:
        weight1, weight2 = ops.gather(weight1, block_expert, 0), ops.gather(weight2, block_expert, 0)
    x_blocks = ops.gather(x2d, row_token, 0).reshape(nb, b, h)
    hidden = _batch_matmul(x_blocks, weight1)                                    # [nb, b, 2F]
    y = _batch_matmul(swiglu_halves(hidden, ffn), weight2).reshape(nb * b, h)
    per_pair = ops.gather(y, pair_row, 0).reshape(t, k, h)
    w = gate_w.astype(per_pair.dtype)
    if kept is not None:
        w = w * kept.astype(w.dtype)
    return (per_pair * w[..., None]).sum(1)


def grouped_matmul_expert_ffn(x2d, gate_w, topk_idx, counts, weight1, weight2, ffn: int):
    """Ascend: permute -> grouped matmul per expert segment -> unpermute with the gate weights.
    ``counts`` [E]: routed pairs per expert (the group sizes)."""
    from mindspore.ops.function.math_func import gmm
    permuted, sorted_indices = ops.moe_token_permute(x2d, topk_idx)
    group_sizes = counts.astype(ms.int64)
    hidden = gmm([permuted], [weight1], group_list=group_sizes, group_list_type=1)[0]
    y = gmm([swiglu_halves(hidden, ffn)], [weight2], group_list=group_sizes, group_list_type=1)[0]
    return ops.moe_token_unpermute(y, sorted_indices, probs=gate_w.astype(y.dtype))


def uses_grouped_matmul(capacity_factor: Optional[float], pad_tokens: bool = False) -> bool:
    """True where the grouped-matmul kernels exist (Ascend), no capacity is set and the
    dispatch is not padded (the padded one is the block path, static shapes everywhere)."""
    return (capacity_factor is None and not pad_tokens
            and ms.get_context("device_target") == "Ascend")


def expert_ffn(x2d, gate_w, topk_idx, weight1, weight2, ffn: int,
               capacity_factor: Optional[float] = None, drop_policy: str = "probs",
               pad_tokens: bool = False):
    """Routed-expert output [T, H] for tokens x2d [T, H] (compute dtype), gate weights
    [T, k] and selected experts ``topk_idx`` [T, k]; returns (output, tokens_per_expert [E]
    float32 Tensor (routed pairs, before drops), dropped pairs (int)). ``pad_tokens``: the
    padded dispatch (module docstring)."""
    num_experts = weight1.shape[0]
    if uses_grouped_matmul(capacity_factor, pad_tokens):
        onehot = ops.one_hot(topk_idx, num_experts, Tensor(1.0, ms.float32), Tensor(0.0, ms.float32))
        counts = ops.stop_gradient(onehot.sum((0, 1)))
        return grouped_matmul_expert_ffn(x2d, gate_w, topk_idx, counts, weight1, weight2, ffn), counts, 0
    probs = None
    if capacity_factor is not None and drop_policy == "probs":
        probs = ops.stop_gradient(gate_w).asnumpy()
    t, k = topk_idx.shape
    pad_to = padded_rows(t, k, num_experts, capacity_factor) if pad_tokens else None
    plan = make_plan(topk_idx.asnumpy(), num_experts, capacity_factor, drop_policy, probs, pad_to)
    out = block_expert_ffn(x2d, gate_w, plan, weight1, weight2, ffn)
    return out, Tensor(plan.tokens_per_expert.astype(np.float32)), plan.dropped
