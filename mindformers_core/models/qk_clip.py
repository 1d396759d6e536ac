"""QK-Clip row layout of MLA projections and the per-head rescaling (upstream MindFormers' Muon QK-Clip: docs/muon.md).

Weights are [out_features, in_features]; a "row" is an output feature. For layer i:

* ``q_param`` (``...self_attention.linear_q_up_proj.weight``, or ``linear_q_proj`` when
  ``q_lora_rank`` is None): head h's q_nope rows ``h*(dn+dr) + [0, dn)`` and q_rope rows
  ``h*(dn+dr) + [dn, dn+dr)``.
* ``kv_param`` (``...self_attention.linear_kv_up_proj.weight``): head h's k_nope rows
  ``h*(dn+dv) + [0, dn)``, v rows ``h*(dn+dv) + [dn, dn+dv)``.

With S_h the tracked max logit and tau the threshold, gamma_h = min(1, tau / S_h); q_nope and
k_nope rows of head h are multiplied by sqrt(gamma_h), q_rope rows by gamma_h (so the q.k
logits of the head scale by gamma_h); v rows and the shared rope key (in
``linear_kv_down_proj``) are untouched.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
import mindspore as ms
from mindspore import Tensor


def mla_layer_layout(layer: int, prefix: str, q_attr: str, num_heads: int, dn: int, dr: int,
                     dv: int) -> dict:
    """The QK-Clip layout dict of one MLA layer (row indices as Python lists)."""
    qp, kp = dn + dr, dn + dv
    return {
        "layer": layer,
        "q_param": f"{prefix}.{q_attr}.weight",
        "q_nope_rows": [list(range(h * qp, h * qp + dn)) for h in range(num_heads)],
        "q_rope_rows": [list(range(h * qp + dn, (h + 1) * qp)) for h in range(num_heads)],
        "kv_param": f"{prefix}.linear_kv_up_proj.weight",
        "k_nope_rows": [list(range(h * kp, h * kp + dn)) for h in range(num_heads)],
        "v_rows": [list(range(h * kp + dn, (h + 1) * kp)) for h in range(num_heads)],
    }


def clip_factors(max_logits: np.ndarray, threshold: float) -> np.ndarray:
    """gamma = min(1, tau / S) elementwise (1 where S <= tau, including -inf/untracked)."""
    s = np.asarray(max_logits, np.float64)
    gamma = np.ones_like(s)
    over = s > threshold
    gamma[over] = threshold / s[over]
    return gamma


def row_scales(entry: dict, gamma: np.ndarray, q_rows: int, kv_rows: int):
    """Per-row multipliers (float32) of the q and kv weights of one layer."""
    q_scale = np.ones(q_rows, np.float64)
    kv_scale = np.ones(kv_rows, np.float64)
    for h, g in enumerate(gamma):
        if g < 1.0:
            q_scale[entry["q_nope_rows"][h]] = np.sqrt(g)
            q_scale[entry["q_rope_rows"][h]] = g
            kv_scale[entry["k_nope_rows"][h]] = np.sqrt(g)
    return q_scale.astype(np.float32), kv_scale.astype(np.float32)


def _scale_rows(param, scale: np.ndarray) -> None:
    """param[r, :] *= scale[r], computed in float32, written back in param's dtype."""
    new = (param.astype(ms.float32) * Tensor(scale[:, None])).astype(param.dtype)
    if hasattr(param, "set_data"):
        param.set_data(new)
    else:
        param.copy_(new)


def apply_qk_clip(layout: List[dict], max_logits: np.ndarray, threshold: float,
                  param_map: Dict[str, object]) -> int:
    """Rescale the rows of ``param_map`` tensors per ``layout``; returns the clipped head count."""
    clipped = 0
    for entry in layout:
        gamma = clip_factors(max_logits[entry["layer"]], threshold)
        n = int((gamma < 1.0).sum())
        if n == 0:
            continue
        clipped += n
        q, kv = param_map[entry["q_param"]], param_map[entry["kv_param"]]
        q_scale, kv_scale = row_scales(entry, gamma, q.shape[0], kv.shape[0])
        _scale_rows(q, q_scale)
        _scale_rows(kv, kv_scale)
    return clipped


def threshold_value(threshold) -> float:
    """Accept a Python number, numpy value or a one-element Tensor (upstream passes Tensor([tau]))."""
    if isinstance(threshold, Tensor):
        threshold = threshold.asnumpy()
    return float(np.asarray(threshold, np.float64).reshape(-1)[0])
