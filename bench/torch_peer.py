"""Torch eager equivalents of the benchmarked models and optimizers (for ``bench_peer.py``).

Same architecture and FLOPs as ``mindformers_core.models`` in float32: RMSNorm, rotate-half
RoPE, causal softmax attention (GPT: MHA/GQA with fused qkv; DeepSeek-V3: MLA), SwiGLU, untied
output layer, summed token cross-entropy. The DeepSeek-V3 MoE (``models/moe.py``'s math: sigmoid
router, expert bias used for selection only and updated once per step from the step's loads,
normalised top-k gate weights, the sequence aux loss) comes in two dispatches: ``sparse`` sorts
the (token, expert) pairs by expert and runs one matmul pair per expert (what a torch user
writes), ``dense`` runs every expert on every token (faster at tiny sizes, where the per-op
cost dominates). Optimizers: torch's fused AdamW, and a Muon with Newton-Schulz of the same
coefficients and scale as ours (5 steps of (3.4445, -4.7750, 2.0315), update * 0.2 *
sqrt(max(A, B)) per piece, the pieces of ``optim/muon_split.py``: MLA q/kv split by head part,
the experts' gate and up halves; a 3-D expert weight runs as one batched NS over its experts),
AdamW on the rest, with QK-Clip's max-logit tracking. torch is the optional ``bench`` extra,
never a dependency of the package.
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


class RoutedMoE(nn.Module):
    """Sigmoid top-k router with expert bias (selection only), normalised gate weights, the
    sequence aux loss; ``sparse``: sorted-token dispatch (one matmul pair per expert),
    ``dense``: every expert on every token, weighted. ``forward(x) -> (y, aux)``."""

    def __init__(self, cfg, dispatch="sparse"):
        super().__init__()
        h, e = cfg["hidden_size"], cfg["n_routed_experts"]
        f, shared = cfg["moe_intermediate_size"], cfg["n_shared_experts"]
        self.k, self.e, self.f, self.dispatch = cfg["num_experts_per_tok"], e, f, dispatch
        self.coeff = cfg.get("moe_aux_loss_coeff", 0.0)
        self.scaling = cfg.get("routed_scaling_factor", 1.0)
        self.rate = cfg.get("moe_router_bias_update_rate", 1e-3) \
            if cfg.get("moe_router_enable_expert_bias") else 0.0
        self.router = _lin(h, e)
        self.register_buffer("expert_bias", torch.zeros(e))
        self.register_buffer("load", torch.zeros(e))
        self.w1 = nn.Parameter(torch.randn(e, h, 2 * f) * 0.02)
        self.w2 = nn.Parameter(torch.randn(e, f, h) * 0.02)
        self.shared = SwiGLU(h, f * shared) if shared else None

    def forward(self, x):
        b, s, h = x.shape
        x2 = x.reshape(b * s, h)
        scores = torch.sigmoid(self.router(x2))
        idx = (scores.detach() + self.expert_bias).topk(self.k, -1).indices
        w = scores.gather(1, idx)
        w = w / w.sum(-1, keepdim=True) * self.scaling
        counts = torch.bincount(idx.reshape(-1), minlength=self.e)
        self.load += counts
        out = self._sparse(x2, idx, w, counts) if self.dispatch == "sparse" \
            else self._dense(x2, idx, w)
        if self.shared is not None:
            out = out + self.shared(x2)
        aux = None
        if self.coeff > 0:
            probs = scores / scores.sum(-1, keepdim=True)
            per_seq = F.one_hot(idx, self.e).view(b, s * self.k, self.e).sum(1).float()
            aux = self.coeff * ((per_seq * (self.e / (self.k * s)))
                                * probs.view(b, s, self.e).mean(1)).sum(-1).mean()
        return out.reshape(b, s, h), aux

    def _sparse(self, x2, idx, w, counts):
        order = idx.reshape(-1).argsort(stable=True)
        token = order // self.k
        xs, ys, start = x2[token], [], 0
        for ex, c in enumerate(counts.tolist()):
            if c:
                gate, up = (xs[start:start + c] @ self.w1[ex]).chunk(2, -1)
                ys.append((F.silu(gate) * up) @ self.w2[ex])
                start += c
        y = torch.cat(ys) * w.reshape(-1)[order, None]
        return torch.zeros_like(x2).index_add(0, token, y)

    def _dense(self, x2, idx, w):
        combine = torch.zeros(x2.shape[0], self.e).scatter(1, idx, w)
        hid = torch.bmm(x2.expand(self.e, -1, -1), self.w1)
        gate, up = hid.chunk(2, -1)
        y = torch.bmm(F.silu(gate) * up, self.w2)
        return (y * combine.t()[..., None]).sum(0)

    @torch.no_grad()
    def update_expert_bias(self):
        """Aux-loss-free balancing, once per optimizer step (``router.expert_bias_step``)."""
        if self.rate:
            self.expert_bias += self.rate * torch.sign(self.load.mean() - self.load)
        self.load.zero_()


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
            self.mlp = RoutedMoE(cfg, cfg.get("torch_moe", "sparse"))
        else:
            self.mlp = SwiGLU(h, cfg["ffn_hidden_size"])

    def forward(self, x, cos, sin, mask):
        a, ml = self.attn(self.norm1(x), cos, sin, mask)
        x = x + a
        y = self.mlp(self.norm2(x))
        y, aux = y if isinstance(y, tuple) else (y, None)
        return x + y, ml, aux


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
        mls, aux = [], None
        for layer in self.layers:
            x, ml, a = layer(x, cos, sin, causal)
            mls.append(ml)
            if a is not None:
                aux = a if aux is None else aux + a
        self.max_logits = torch.stack(mls)
        logits = self.out(self.norm(x)).float()
        nll = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), reduction="none")
        return (nll * mask.view(-1)).sum(), aux

    def update_expert_bias(self):
        for m in self.modules():
            if isinstance(m, RoutedMoE):
                m.update_expert_bias()


NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz(g, steps=5, coeffs=NS_COEFFS):
    """Quintic NS of g [..., A, B] (a 3-D g: one batched iteration over its first dim)."""
    a, b, c = coeffs
    x = g / (g.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    transpose = x.shape[-2] > x.shape[-1]
    if transpose:
        x = x.mT
    for _ in range(steps):
        m = x @ x.mT
        x = a * x + (b * m + c * m @ m) @ x
    return x.mT if transpose else x


def _head_split(u, n, first):
    """[n * (first + rest), C] -> the rows of each head's first part and of its rest."""
    v = u.view(n, -1, u.shape[-1])
    return [v[:, :first].reshape(-1, u.shape[-1]), v[:, first:].reshape(-1, u.shape[-1])]


def _head_join(parts, n, first):
    a, b = (x.view(n, -1, x.shape[-1]) for x in parts)
    return torch.cat([a, b], 1).reshape(-1, a.shape[-1])


class Muon(torch.optim.Optimizer):
    """Muon (momentum 0.95, Nesterov, decoupled decay, update * 0.2 * sqrt(max(A, B)) per
    piece) on the hidden matrices and the 3-D experts; the embedding, output layer and norms
    use the fused AdamW passed in. ``pieces``: param -> (split, join) of its NS pieces."""

    def __init__(self, matrices, lr, adamw, pieces):
        super().__init__(matrices, dict(lr=lr, momentum=0.95, wd=0.1))
        self.adamw, self.pieces = adamw, pieces

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("m", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                g = p.grad.add(buf, alpha=group["momentum"])
                split, join = self.pieces.get(id(p), (lambda t: [t], lambda ts: ts[0]))
                u = join([newton_schulz(x) * (0.2 * math.sqrt(max(x.shape[-2:])))
                          for x in split(g)])
                p.mul_(1 - group["lr"] * group["wd"]).add_(u, alpha=-group["lr"])
        self.adamw.step()


def _muon_pieces(model: LM) -> dict:
    """The NS pieces of ``optim/muon_split.py`` for the MLA and expert weights."""
    pieces = {}
    for m in model.modules():
        if isinstance(m, MLAttention):
            n = m.n
            pieces[id(m.q_up.weight)] = (lambda u, n=n, d=m.dn: _head_split(u, n, d),
                                         lambda ts, n=n, d=m.dn: _head_join(ts, n, d))
            pieces[id(m.kv_up.weight)] = (lambda u, n=n, d=m.dn: _head_split(u, n, d),
                                          lambda ts, n=n, d=m.dn: _head_join(ts, n, d))
            pieces[id(m.kv_down.weight)] = (lambda u, k=m.kvr: [u[:k], u[k:]],
                                            lambda ts: torch.cat(ts, 0))
        elif isinstance(m, RoutedMoE):
            pieces[id(m.w1)] = (lambda u, f=m.f: [u[..., :f], u[..., f:]],
                                lambda ts: torch.cat(ts, -1))
        elif isinstance(m, SwiGLU):
            f = m.fc2.weight.shape[1]
            pieces[id(m.fc1.weight)] = (lambda u, f=f: [u[:f], u[f:]],
                                        lambda ts: torch.cat(ts, 0))
    return pieces


def build_optimizer(model: LM, kind: str, lr: float):
    if kind == "AdamW":
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01,
                                 fused=True)
    hidden = [p for n, p in model.named_parameters()
              if p.ndim >= 2 and not n.startswith(("embed", "out"))]
    ids = {id(p) for p in hidden}
    rest = [p for p in model.parameters() if id(p) not in ids]
    return Muon(hidden, lr, torch.optim.AdamW(rest, lr=lr, betas=(0.95, 0.95), fused=True),
                _muon_pieces(model))


def train_step(model: LM, opt, micro_batches, max_norm=1.0) -> float:
    """One optimizer step over the micro-batches: summed token loss / tokens (+ the mean aux
    loss), clip, update, then the expert-bias step from the step's loads."""
    total = float(sum(m[2].sum() for m in micro_batches))
    opt.zero_grad(set_to_none=True)
    loss = 0.0
    for ids, labels, mask in micro_batches:
        nll, aux = model(ids, labels, mask)
        part = nll / total
        # the trainer's objective (trainer/accumulate.py): token mean + mean aux loss
        (part if aux is None else part + aux / len(micro_batches)).backward()
        loss += float(part.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
    opt.step()
    model.update_expert_bias()
    return loss
