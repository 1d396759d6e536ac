"""Dense float64 numpy reference of the DeepSeek-V3 MoE layer (every expert on every token,
combined with a [T, E] weight matrix), written from the formulas, not from the model code.

``moe_forward(P, m, cfg, x2, b, s)``: P name -> array, ``m`` the layer prefix (``...mlp.``),
``cfg`` a ModelConfig, x2 [T, H] (T = b * s). Returns a dict: out [T, H], aux (float or None),
topk [T, k], counts [E] (routed pairs before drops), dropped, combine [T, E].
"""
import math

import numpy as np


def silu(x):
    return x / (1 + np.exp(-x))


def scores_of(logits, scoring_func):
    if scoring_func == "sigmoid":
        return 1 / (1 + np.exp(-logits))
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def lowest_index_topk(row, k):
    """k largest of a 1-D row; ties to the lower index (stable sort of the negated row)."""
    return np.argsort(-row, kind="stable")[:k]


def select(key, k, n_group=None, topk_group=None):
    t, e = key.shape
    top = np.zeros((t, k), np.int64)
    for i in range(t):
        row = key[i].copy()
        if n_group is not None and topk_group is not None:
            size = e // n_group
            groups = row.reshape(n_group, size)
            gscore = np.array([np.sort(g)[::-1][:min(2, size)].sum() for g in groups])
            keep = lowest_index_topk(gscore, topk_group)
            for g in range(n_group):
                if g not in keep:
                    row[g * size:(g + 1) * size] = -np.inf
        top[i] = lowest_index_topk(row, k)
    return top


def moe_forward(P, m, cfg, x2, b, s, bias=None):
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    t = x2.shape[0]
    sc = scores_of(x2 @ P[m + "router.weight"].T, cfg.scoring_func)
    bias = P[m + "router.expert_bias"] if bias is None else bias
    top = select(sc + bias, k, cfg.n_group, cfg.topk_group)
    w = np.take_along_axis(sc, top, -1)
    if cfg.norm_topk_prob:
        w = w / w.sum(-1, keepdims=True)
    w = w * cfg.routed_scaling_factor
    keep = np.ones((t, k), bool)
    if cfg.moe_expert_capacity_factor is not None:
        cap = max(1, math.ceil(t * k / e * cfg.moe_expert_capacity_factor))
        for ex in range(e):
            pairs = [(ti, j) for ti in range(t) for j in range(k) if top[ti, j] == ex]
            if cfg.moe_token_drop_policy == "probs":
                pairs.sort(key=lambda p: (-w[p], p[0] * k + p[1]))
            for p in pairs[cap:]:
                keep[p] = False
    combine = np.zeros((t, e))
    for ti in range(t):
        for j in range(k):
            if keep[ti, j]:
                combine[ti, top[ti, j]] += w[ti, j]
    f = P[m + "experts.weight2"].shape[1]
    out = np.zeros_like(x2)
    for ex in range(e):                               # dense: every expert on every token
        hh = x2 @ P[m + "experts.weight1"][ex]
        out += combine[:, ex:ex + 1] * ((silu(hh[:, :f]) * hh[:, f:]) @ P[m + "experts.weight2"][ex])
    if m + "shared_experts.linear_fc1.weight" in P:
        hh = x2 @ P[m + "shared_experts.linear_fc1.weight"].T
        out += (silu(hh[:, 0::2]) * hh[:, 1::2]) @ P[m + "shared_experts.linear_fc2.weight"].T
    cnt = np.zeros((b, e))
    for ti in range(t):
        for j in range(k):
            cnt[ti // s, top[ti, j]] += 1
    aux = None
    kind = cfg.moe_router_load_balancing_type
    if kind != "none" and cfg.moe_aux_loss_coeff > 0:
        pp = sc / sc.sum(-1, keepdims=True)
        if kind == "seq_aux_loss":
            aux = cfg.moe_aux_loss_coeff * ((cnt * e / (k * s)) * pp.reshape(b, s, e).mean(1)).sum(-1).mean()
        else:
            aux = cfg.moe_aux_loss_coeff * ((cnt.sum(0) * e / (k * t)) * pp.mean(0)).sum()
    return {"out": out, "aux": aux, "topk": top, "counts": cnt.sum(0),
            "dropped": int((~keep).sum()), "combine": combine}
