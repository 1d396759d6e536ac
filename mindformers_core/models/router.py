"""DeepSeek-V3 router math: scores, (group-limited) top-k, gate weights, auxiliary losses.

Pure functions of MindSpore tensors; ``moe.MoE`` wires them. With logits z = x W_r^T [T, E]
(float32):

* scores s = sigmoid(z) (``scoring_func: sigmoid``) or softmax(z) over all E experts
  (``softmax``; the softmax comes before the top-k, as in DeepSeek-V2/V3);
* selection key = s + expert_bias (the bias only selects; it never enters a gate value);
* group-limited routing (``n_group`` G, ``topk_group`` g): the E experts are split into G
  contiguous groups of E/G; a group's score is the sum of its two largest keys (its only key
  when a group holds one expert); only the experts of the g best groups stay eligible;
* the k selected experts are the k largest eligible keys. **Ties** go to the lower index
  (expert or group), so routing is a function of the values alone and two runs are
  bit-identical (``topk_lowest_index``);
* gate weights g_j = s_{idx_j}, divided by sum_j g_j when ``norm_topk_prob``, times
  ``routed_scaling_factor``.

Auxiliary losses (alpha = ``moe_aux_loss_coeff``, counts c from the selected experts,
p_t = s_t / sum_e s_t,e):

* ``seq_aux_loss`` (DeepSeek-V3): alpha * mean_b sum_e f_b,e P_b,e with
  f_b,e = E / (k S) * c_b,e (tokens of sequence b) and P_b,e = mean over the S positions of b;
* ``aux_loss`` (GShard / Switch): alpha * sum_e f_e P_e over the T tokens of the micro-batch,
  f_e = E / (k T) * c_e, P_e = mean_t p_t,e;
* ``none``: no loss.
The counts are constants (no gradient); the loss trains the router through P.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, mint, ops

SCORING_FUNCS = ("sigmoid", "softmax")
LOAD_BALANCING_TYPES = ("seq_aux_loss", "aux_loss", "none")


def router_scores(logits, scoring_func: str):
    """Float32 scores [T, E] of router logits [T, E]."""
    z = logits.astype(ms.float32)
    if scoring_func == "sigmoid":
        return ops.sigmoid(z)
    if scoring_func == "softmax":
        return mint.softmax(z, -1)
    raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")


def topk_lowest_index(key, k: int):
    """Indices [T, k] (int32) of the k largest entries of each row of ``key``, in descending
    order; equal values are ordered by index (lower first).

    Built on a descending sort whose ties keep index order (checked on CPU by the tests);
    ``ops.topk`` does not order ties by index on CPU (for [.5, .5, .5, .2], k=2 it gives 1, 2).
    """
    _, idx = ops.sort(key, axis=-1, descending=True)
    return idx[..., :k].astype(ms.int32)


def group_limited_key(key, n_group: int, topk_group: int):
    """``key`` [T, E] with the experts outside each token's ``topk_group`` best groups set to
    -inf. A group's score is the sum of its two largest keys (its only key if it has one)."""
    t, e = key.shape
    grouped = key.reshape(t, n_group, e // n_group)
    top = min(2, e // n_group)
    best, _ = ops.sort(grouped, axis=-1, descending=True)
    group_score = best[..., :top].sum(-1)                                # [T, G]
    chosen = topk_lowest_index(group_score, topk_group)                  # [T, g]
    eligible = ops.one_hot(chosen, n_group, Tensor(1.0, ms.float32),
                           Tensor(0.0, ms.float32)).sum(1) > 0           # [T, G]
    eligible = eligible[..., None].broadcast_to(grouped.shape).reshape(t, e)
    return ops.masked_fill(key, ~eligible, float("-inf"))


def select_experts(scores, expert_bias, top_k: int, n_group=None, topk_group=None):
    """Selected experts [T, k] (int32, best first) from scores [T, E] plus the selection bias;
    group-limited when both ``n_group`` and ``topk_group`` are set. No gradient."""
    key = ops.stop_gradient(scores)
    if expert_bias is not None:
        key = key + ops.stop_gradient(expert_bias).astype(key.dtype)
    if n_group is not None and topk_group is not None:
        key = group_limited_key(key, n_group, topk_group)
    return topk_lowest_index(key, top_k)


def gate_weights(scores, topk_idx, norm_topk_prob: bool, routed_scaling_factor: float):
    """Gate weights [T, k] (float32, differentiable in ``scores``) of the selected experts."""
    w = mint.gather(scores, 1, topk_idx.astype(ms.int64))
    if norm_topk_prob:
        w = w / (w.sum(-1, keepdims=True) + 1e-20)
    if routed_scaling_factor != 1.0:
        w = w * routed_scaling_factor
    return w


def aux_loss(scores, expert_counts, batch: int, seq: int, top_k: int, load_balancing_type: str,
             coeff: float):
    """The load-balancing loss (float32 scalar Tensor), or None for ``none`` / coeff 0.

    ``expert_counts`` [B, E]: selected (token, expert) pairs per sequence (a constant)."""
    if load_balancing_type == "none" or coeff == 0:
        return None
    e = scores.shape[-1]
    probs = scores / scores.sum(-1, keepdims=True)                       # [T, E]
    counts = ops.stop_gradient(expert_counts.astype(ms.float32))
    if load_balancing_type == "seq_aux_loss":
        f = counts * (e / (top_k * seq))                                 # [B, E]
        p = probs.reshape(batch, seq, e).mean(1)
        return coeff * (f * p).sum(-1).mean()
    if load_balancing_type == "aux_loss":
        t = batch * seq
        f = counts.sum(0) * (e / (top_k * t))                            # [E]
        return coeff * (f * probs.mean(0)).sum()
    raise ValueError(f"moe_router_load_balancing_type must be one of {LOAD_BALANCING_TYPES}, "
                     f"got {load_balancing_type!r}")


def expert_bias_step(bias: np.ndarray, load: np.ndarray, rate: float) -> np.ndarray:
    """Aux-loss-free balancing: bias_e + rate * sign(mean(load) - load_e) (float32), with
    ``load`` the routed tokens per expert of a whole optimizer step."""
    load = np.asarray(load, np.float32)
    step = np.float32(rate) * np.sign(load.mean() - load).astype(np.float32)
    return np.asarray(bias, np.float32) + step
