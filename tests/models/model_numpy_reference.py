"""Independent float64 numpy forward of the GPT / DeepSeek-V3 models (test oracle).

Written from the formulas in the models' docstrings, not from their code: used for forward
equality, finite-difference gradient checks and explicit attention scores.
"""
from __future__ import annotations

import numpy as np

from moe_numpy_reference import moe_forward


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, theta):
    """x [..., S, d], rotate-half convention, positions 0..S-1."""
    s, d = x.shape[-2], x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = np.outer(np.arange(s), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


def silu(x):
    return x / (1 + np.exp(-x))


def attention(q, k, v, scale):
    """q, k [B, N, S, D]; returns context and the masked scaled scores (-inf above diagonal)."""
    s = q.shape[2]
    scores = np.einsum("bnid,bnjd->bnij", q, k) * scale
    scores = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, scores)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnij,bnjd->bnid", p, v), scores


def layer(P, cfg, h, pre, rec, bias=None):
    """One decoder layer (parameter prefix ``pre``) on h [B, S, H]: (h, aux or 0.0); fills
    ``rec`` with 'scores' and, for MoE, 'topk' / 'aux'. ``bias``: expert-bias override."""
    b, s = h.shape[:2]
    eps, theta, n = cfg.norm_epsilon, cfg.rope_theta, cfg.num_attention_heads
    mla = cfg.resolved_multi_latent_attention()
    aux = 0.0
    x = rms(h, P[pre + "input_layernorm.weight"], eps)
    a = pre + "self_attention."
    if mla:
        dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        if cfg.q_lora_rank is None:
            q = x @ P[a + "linear_q_proj.weight"].T
        else:
            cq = rms(x @ P[a + "linear_q_down_proj.weight"].T, P[a + "q_layernorm.weight"], eps)
            q = cq @ P[a + "linear_q_up_proj.weight"].T
        q = q.reshape(b, s, n, dn + dr).transpose(0, 2, 1, 3)
        kva = x @ P[a + "linear_kv_down_proj.weight"].T
        ckv = rms(kva[..., : cfg.kv_lora_rank], P[a + "kv_layernorm.weight"], eps)
        kpe = rope(kva[..., cfg.kv_lora_rank:][:, None], theta)
        kv = (ckv @ P[a + "linear_kv_up_proj.weight"].T).reshape(b, s, n, dn + dv).transpose(0, 2, 1, 3)
        qf = np.concatenate([q[..., :dn], rope(q[..., dn:], theta)], -1)
        kf = np.concatenate([kv[..., :dn], np.broadcast_to(kpe, (b, n, s, dr))], -1)
        ctx, scores = attention(qf, kf, kv[..., dn:], 1 / np.sqrt(dn + dr))
    else:
        g = cfg.resolved_num_query_groups()
        d = cfg.resolved_kv_channels()
        qkv = x @ P[a + "linear_qkv.weight"].T
        q = qkv[..., : n * d].reshape(b, s, n, d).transpose(0, 2, 1, 3)
        k = qkv[..., n * d:(n + g) * d].reshape(b, s, g, d).transpose(0, 2, 1, 3)
        v = qkv[..., (n + g) * d:].reshape(b, s, g, d).transpose(0, 2, 1, 3)
        if cfg.resolved_qk_layernorm():   # Qwen3: every head's q and k RMS-normed over d
            q = rms(q, P[a + "q_layernorm.weight"], eps)
            k = rms(k, P[a + "k_layernorm.weight"], eps)
        k, v = np.repeat(k, n // g, axis=1), np.repeat(v, n // g, axis=1)
        ctx, scores = attention(rope(q, theta), rope(k, theta), v, 1 / np.sqrt(d))
    rec["scores"] = scores
    h = h + ctx.transpose(0, 2, 1, 3).reshape(b, s, -1) @ P[a + "linear_proj.weight"].T
    x = rms(h, P[pre + "pre_mlp_layernorm.weight"], eps)
    m = pre + "mlp."
    if m + "router.weight" in P:
        x2 = x.reshape(b * s, -1)
        moe = moe_forward(P, m, cfg, x2, b, s, bias)
        if moe["aux"] is not None:
            rec["aux"] = moe["aux"]
            aux = rec["aux"]
        rec["topk"] = moe["topk"]
        h = h + moe["out"].reshape(b, s, -1)
    else:
        hh = x @ P[m + "linear_fc1.weight"].T
        h = h + (silu(hh[..., 0::2]) * hh[..., 1::2]) @ P[m + "linear_fc2.weight"].T
    return h, aux


def hidden(P, cfg, ids, record=None, bias_override=None):
    """Last hidden states [B, S, H] before the final norm and the summed aux loss."""
    h = P["embedding.word_embeddings.weight"][ids]
    aux_total = 0.0
    for i in range(cfg.num_layers):
        rec = {}
        h, aux = layer(P, cfg, h, f"decoder.layers.{i}.", rec,
                       None if bias_override is None else bias_override[i])
        aux_total += aux
        if record is not None:
            record.append(rec)
    return h, aux_total


def forward(P, cfg, ids, record=None, bias_override=None):
    """Logits [B, S, V] (float64). ``record`` (list) receives per-layer dicts with 'scores',
    'topk', 'aux', then {'aux_total'}. ``P``: name -> float64 array."""
    h, aux_total = hidden(P, cfg, ids, record, bias_override)
    h = rms(h, P["decoder.final_layernorm.weight"], cfg.norm_epsilon)
    out_w = P.get("output_layer.weight", P["embedding.word_embeddings.weight"])
    if record is not None:
        record.append({"aux_total": aux_total})
    return h @ out_w.T


def loss_sum(P, cfg, ids, labels, mask):
    """sum_t mask_t * CE(logits_t, labels_t) + aux (float64)."""
    rec = []
    logits = forward(P, cfg, ids, rec)
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, labels[..., None], -1)[..., 0]
    return float((nll * mask).sum()), float(rec[-1]["aux_total"])


def params_of(model):
    """name -> float64 numpy copy of every parameter."""
    import mindspore as ms
    return {p.name: p.astype(ms.float32).asnumpy().astype(np.float64) for p in model.get_parameters()}
