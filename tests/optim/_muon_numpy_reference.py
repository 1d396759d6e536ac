"""Independent float64 numpy reference of one Muon optimizer step (docs/muon.md,
"The update").

Written from the formulas, not from the implementation: pieces are cut with numpy slicing
(strided rows for the interleaved fc1), Newton-Schulz is the textbook transpose-when-tall form.
"""
import fnmatch

import numpy as np


def newton_schulz(x, schedule, eps=1e-7):
    x = np.asarray(x, np.float64)
    tall = x.shape[-2] > x.shape[-1]
    X = np.swapaxes(x, -1, -2) if tall else x
    X = X / np.maximum(np.linalg.norm(X, axis=(-2, -1), keepdims=True), eps)
    for a, b, c in schedule:
        A = X @ np.swapaxes(X, -1, -2)
        X = a * X + (b * A + c * A @ A) @ X
    return np.swapaxes(X, -1, -2) if tall else X


def pieces_of(name, u, cfg, split=True):
    """List of (slicer, piece) where slicer(full, piece_value) writes the piece back."""
    dn, dr, dv = cfg.qk_head_dim, cfg.qk_pos_emb_head_dim, cfg.v_head_dim
    n = cfg.num_attention_heads

    if u.ndim == 3:
        if name.endswith("experts.weight1"):
            f = u.shape[-1] // 2
            return [(np.s_[..., :f], u[..., :f]), (np.s_[..., f:], u[..., f:])]
        return [(np.s_[...], u)]
    if not split:
        return [(np.s_[...], u)]
    if fnmatch.fnmatch(name, "*linear_q_up_proj.weight") or fnmatch.fnmatch(name, "*linear_q_proj.weight"):
        period = dn + dr
        a = np.concatenate([np.arange(h * period, h * period + dn) for h in range(n)])
        b = np.concatenate([np.arange(h * period + dn, (h + 1) * period) for h in range(n)])
        return [(a, u[a]), (b, u[b])]
    if fnmatch.fnmatch(name, "*linear_kv_up_proj.weight"):
        period = dn + dv
        a = np.concatenate([np.arange(h * period, h * period + dn) for h in range(n)])
        b = np.concatenate([np.arange(h * period + dn, (h + 1) * period) for h in range(n)])
        return [(a, u[a]), (b, u[b])]
    if fnmatch.fnmatch(name, "*linear_kv_down_proj.weight"):
        k = cfg.kv_lora_rank
        return [(np.s_[:k], u[:k]), (np.s_[k:], u[k:])]
    if fnmatch.fnmatch(name, "*linear_fc1.weight"):
        return [(np.s_[0::2], u[0::2]), (np.s_[1::2], u[1::2])]
    return [(np.s_[...], u)]


class NumpyMuon:
    """Muon + AdamW branch in float64 on {name: array}."""

    def __init__(self, params, muon_names, cfg, schedule, lr_mult_adamw=1.0, momentum=0.95,
                 nesterov=True, rms=0.2, eps=1e-7, betas=(0.95, 0.95), adam_eps=1e-8, wd=0.1,
                 split=True):
        self.p = {k: np.asarray(v, np.float64).copy() for k, v in params.items()}
        self.muon = set(muon_names)
        self.cfg, self.schedule = cfg, schedule
        self.mu, self.nesterov, self.rms, self.eps = momentum, nesterov, rms, eps
        self.b1, self.b2 = betas
        self.adam_eps, self.wd, self.adamw_mult, self.split = adam_eps, wd, lr_mult_adamw, split
        self.m = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.t = 0

    def step(self, grads, lr, wd_of=None):
        self.t += 1
        for name, g in grads.items():
            g = np.asarray(g, np.float64)
            wd = self.wd if wd_of is None else wd_of(name)
            p = self.p[name]
            if name in self.muon:
                self.m[name] = self.mu * self.m[name] + g
                u = g + self.mu * self.m[name] if self.nesterov else self.m[name]
                delta = np.zeros_like(u)
                for where, piece in pieces_of(name, u, self.cfg, self.split):
                    A, B = piece.shape[-2:]
                    ns = newton_schulz(piece, self.schedule, self.eps)
                    delta[where] = lr * np.sqrt(max(A, B)) * self.rms * ns
                self.p[name] = p * (1 - lr * wd) - delta
            else:
                lra = lr * self.adamw_mult
                p = p * (1 - lra * wd)
                self.m[name] = self.b1 * self.m[name] + (1 - self.b1) * g
                self.v[name] = self.b2 * self.v[name] + (1 - self.b2) * g * g
                bc1, bc2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
                denom = np.sqrt(self.v[name]) / np.sqrt(bc2) + self.adam_eps
                self.p[name] = p - (lra / bc1) * self.m[name] / denom
