"""Torch eager equivalents of the benchmarked models and optimizers (for ``bench_peer.py``).

Same architecture and FLOPs as ``mindformers_core.models`` in float32: RMSNorm, rotate-half
RoPE, causal softmax attention (GPT: MHA/GQA with fused qkv; DeepSeek-V3: MLA), SwiGLU, untied
output layer, summed token cross-entropy; the MoE runs every expert on every token like ours.
Optimizers: torch's fused AdamW, and a Muon (Newton-Schulz, 5 steps, on the 2-D hidden
matrices, AdamW on the rest) with QK-Clip's max-logit tracking. torch is the optional
``bench`` extra, never a dependency of the package.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq, dim, theta):
    inv = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    ang = torch.cat([ang, ang], -1)
    return ang.cos().float(), ang.sin().float()


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def attend(q, k, v, scale, mask):
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(mask, float("-inf"))
    max_logits = scores.detach().amax(dim=(0, 2, 3))
    return torch.softmax(scores, -1) @ v, max_logits


def _lin(i, o):
    return nn.Linear(i, o, bias=False)


class GPTAttention(nn.Module):
    def __init__(self, h, n, g):
        super().__init__()
        self.n, self.g, self.d = n, g, h // n
        self.qkv = _lin(h, (n + 2 * g) * self.d)
        self.proj = _lin(n * self.d, h)

    def forward(self, x, cos, sin, mask):
        b, s, _ = x.shape
        n, g, d = self.n, self.g, self.d
        q, k, v = self.qkv(x).split([n * d, g * d, g * d], -1)
        q = rope(q.view(b, s, n, d).transpose(1, 2), cos, sin)
        k = rope(k.view(b, s, g, d).transpose(1, 2), cos, sin)
        v = v.view(b, s, g, d).transpose(1, 2)
        if g != n:
            k = k.repeat_interleave(n // g, 1)
            v = v.repeat_interleave(n // g, 1)
        ctx, ml = attend(q, k, v, 1.0 / math.sqrt(d), mask)
        return self.proj(ctx.transpose(1, 2).reshape(b, s, n * d)), ml


class MLAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, self.n = cfg["hidden_size"], cfg["num_attention_heads"]
        self.dn, self.dr, self.dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        self.kvr = cfg["kv_lora_rank"]
        qr = cfg["q_lora_rank"]
        self.q_down, self.q_norm = _lin(h, qr), RMSNorm(qr, 1e-6)
        self.q_up = _lin(qr, self.n * (self.dn + self.dr))
        self.kv_down, self.kv_norm = _lin(h, self.kvr + self.dr), RMSNorm(self.kvr, 1e-6)
        self.kv_up = _lin(self.kvr, self.n * (self.dn + self.dv))
        self.proj = _lin(self.n * self.dv, h)

    def forward(self, x, cos, sin, mask):
        b, s, _ = x.shape
        n, dn, dr, dv = self.n, self.dn, self.dr, self.dv
        q = self.q_up(self.q_norm(self.q_down(x))).view(b, s, n, dn + dr).transpose(1, 2)
        kv_a = self.kv_down(x)
        kv = self.kv_up(self.kv_norm(kv_a[..., :self.kvr])).view(b, s, n, dn + dv).transpose(1, 2)
        k_pe = rope(kv_a[..., self.kvr:][:, None], cos, sin).expand(b, n, s, dr)
        q = torch.cat([q[..., :dn], rope(q[..., dn:], cos, sin)], -1)
        k = torch.cat([kv[..., :dn], k_pe], -1)
        ctx, ml = attend(q, k, kv[..., dn:], 1.0 / math.sqrt(dn + dr), mask)
        return self.proj(ctx.transpose(1, 2).reshape(b, s, n * dv)), ml


class SwiGLU(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.fc1, self.fc2 = _lin(h, 2 * f), _lin(f, h)

    def forward(self, x):
        gate, up = self.fc1(x).chunk(2, -1)
        return self.fc2(F.silu(gate) * up)


class DenseMoE(nn.Module):
    """Sigmoid top-k router; every expert on every token, weighted (like ours)."""

    def __init__(self, h, e, k, f, shared):
        super().__init__()
        self.k = k
        self.router = _lin(h, e)
        self.w1 = nn.Parameter(torch.randn(e, h, 2 * f) * 0.02)
        self.w2 = nn.Parameter(torch.randn(e, f, h) * 0.02)
        self.shared = SwiGLU(h, f * shared) if shared else None

    def forward(self, x):
        b, s, h = x.shape
        x2 = x.reshape(b * s, h)
        scores = torch.sigmoid(self.router(x2))
        w, idx = scores.topk(self.k, -1)
        w = w / w.sum(-1, keepdim=True)
        combine = torch.zeros_like(scores).scatter(1, idx, w)
        hid = torch.bmm(x2.expand(self.w1.shape[0], -1, -1), self.w1)
        gate, up = hid.chunk(2, -1)
        y = torch.bmm(F.silu(gate) * up, self.w2)
        out = (y * combine.t()[..., None]).sum(0)
        if self.shared is not None:
            out = out + self.shared(x2)
        return out.reshape(b, s, h)


class Layer(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        h = cfg["hidden_size"]
        self.norm1, self.norm2 = RMSNorm(h, 1e-6), RMSNorm(h, 1e-6)
        if cfg["model_type"] == "deepseek_v3":
            self.attn = MLAttention(cfg)
        else:
            n = cfg["num_attention_heads"]
            self.attn = GPTAttention(h, n, cfg.get("num_query_groups", n))
        if cfg["model_type"] == "deepseek_v3" and i >= cfg["first_k_dense_replace"]:
            self.mlp = DenseMoE(h, cfg["n_routed_experts"], cfg["num_experts_per_tok"],
                                cfg["moe_intermediate_size"], cfg["n_shared_experts"])
        else:
            self.mlp = SwiGLU(h, cfg["ffn_hidden_size"])

    def forward(self, x, cos, sin, mask):
        a, ml = self.attn(self.norm1(x), cos, sin, mask)
        x = x + a
        return x + self.mlp(self.norm2(x)), ml


class LM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, v = cfg["hidden_size"], cfg["vocab_size"]
        self.embed = nn.Embedding(v, h)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg["num_layers"]))
        self.norm = RMSNorm(h, 1e-6)
        self.out = _lin(h, v)
        d = cfg["qk_rope_head_dim"] if cfg["model_type"] == "deepseek_v3" \
            else h // cfg["num_attention_heads"]
        self.rope_dim, self.theta = d, cfg.get("rope_theta", 10000.0)
        self.max_logits = None
        for p in self.parameters():
            if p.ndim >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, labels, mask):
        b, s = ids.shape
        cos, sin = rope_tables(s, self.rope_dim, self.theta)
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
        x = self.embed(ids)
        mls = []
        for layer in self.layers:
            x, ml = layer(x, cos, sin, causal)
            mls.append(ml)
        self.max_logits = torch.stack(mls)
        logits = self.out(self.norm(x)).float()
        nll = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), reduction="none")
        return (nll * mask.view(-1)).sum()


def newton_schulz(g, steps=5, coeffs=(3.4445, -4.7750, 2.0315)):
    a, b, c = coeffs
    x = g / (g.norm() + 1e-7)
    transpose = x.shape[0] > x.shape[1]
    if transpose:
        x = x.t()
    for _ in range(steps):
        m = x @ x.t()
        x = a * x + (b * m + c * m @ m) @ x
    return x.t() if transpose else x


class Muon(torch.optim.Optimizer):
    """Muon on 2-D hidden matrices (momentum 0.95, Nesterov, update * 0.2 * sqrt(max(A, B)));
    the embedding, output layer, norms and 3-D experts use the fused AdamW passed in."""

    def __init__(self, matrices, lr, adamw):
        super().__init__(matrices, dict(lr=lr, momentum=0.95, wd=0.1))
        self.adamw = adamw

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("m", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                g = p.grad.add(buf, alpha=group["momentum"])
                u = newton_schulz(g) * (0.2 * math.sqrt(max(p.shape)))
                p.mul_(1 - group["lr"] * group["wd"]).add_(u, alpha=-group["lr"])
        self.adamw.step()


def build_optimizer(model: LM, kind: str, lr: float):
    if kind == "AdamW":
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01,
                                 fused=True)
    hidden = [p for n, p in model.named_parameters()
              if p.ndim == 2 and not n.startswith(("embed", "out"))]
    ids = {id(p) for p in hidden}
    rest = [p for p in model.parameters() if id(p) not in ids]
    return Muon(hidden, lr, torch.optim.AdamW(rest, lr=lr, betas=(0.95, 0.95), fused=True))


def train_step(model: LM, opt, micro_batches, max_norm=1.0) -> float:
    """One optimizer step over the micro-batches: summed token loss / tokens, clip, update."""
    total = float(sum(m[2].sum() for m in micro_batches))
    opt.zero_grad(set_to_none=True)
    loss = 0.0
    for ids, labels, mask in micro_batches:
        part = model(ids, labels, mask) / total
        part.backward()
        loss += float(part.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
    opt.step()
    return loss
