"""QK-Clip (MuonClip) driven from the optimizer, after the update and before masters -> model.

Per MLA layer and head h with tracked max logit S_h (max over the step's micro-batches, batch
and positions of q.k * softmax_scale) and threshold tau:

    gamma_h = min(1, tau / S_h)
    q_nope rows of h  *= sqrt(gamma_h)      q_rope rows of h *= gamma_h
    k_nope rows of h  *= sqrt(gamma_h)      v rows, shared rope key k_pe: unchanged

so every q.k logit of head h scales by exactly gamma_h (q_nope.k_nope by sqrt*sqrt, q_rope.k_pe
by gamma * 1) and the head's max logit becomes <= tau. Heads with S_h <= tau are untouched.

The row layout and the row scaling belong to the model (`model.qk_clip_layout()`,
`model.apply_qk_clip_scaling(tau, param_map)`, see models/qk_clip.py); this module decides when
it runs and on what: the fp32 masters (name -> master), so a bf16 model never loses the
rescaling to rounding, and it reports what happened for the per-step log.

Data parallel: the tracked maxima must be the max over all ranks before clipping (upstream
all-reduces with MAX over the dp x cp group). `reduce_max_logits`, when given, maps the local
[num_layers, num_heads] array to the global one; it is written back with
`model.set_max_attention_logits` before clipping.

Tensor parallel: each rank holds its heads' rows of the q/kv weights (contiguous head blocks)
and tracks its local heads' logits [num_layers, num_heads / tp]; it clips those rows only,
which is the unsharded result restricted to them (``distributed.tp_sharding``; the reduction
is then over the data-parallel group only).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Protocol, runtime_checkable

import numpy as np

__all__ = ["QKClipStats", "QKClipModel", "qk_clip_step"]


@runtime_checkable
class QKClipModel(Protocol):
    """A model that names the q/kv weights QK-Clip rescales (``models/qk_clip.py``)."""

    def qk_clip_layout(self) -> list:
        """Per layer: which q/kv weight rows belong to which head."""


@dataclass(frozen=True)
class QKClipStats:
    """What one QK-Clip pass did: heads rescaled, and the largest tracked logit (-inf if none)."""
    num_clipped_heads: int
    max_logit: float


def qk_clip_step(model, threshold: float, master_map: Dict[str, object],
                 reduce_max_logits: Optional[Callable[[np.ndarray], np.ndarray]] = None,
                 reset: bool = True) -> QKClipStats:
    """Rescale the q/k rows of `master_map` (parameter name -> fp32 master) in place.

    Args:
        model: MLA model exposing `apply_qk_clip_scaling`, `get_max_attention_logits`,
            `set_max_attention_logits`, `reset_max_attention_logits`.
        threshold: tau > 0.
        master_map: the tensors to scale, keyed by the model's parameter names.
        reduce_max_logits: data-parallel MAX reduction of the tracked logits (None: one rank).
        reset: start a new running max afterwards (the next step tracks afresh).
    Returns:
        QKClipStats(num_clipped_heads, max_logit).
    """
    if reduce_max_logits is not None:
        model.set_max_attention_logits(reduce_max_logits(model.get_max_attention_logits()))
    num_clipped, max_logit = model.apply_qk_clip_scaling(float(threshold), master_map)
    if reset:
        model.reset_max_attention_logits()
    return QKClipStats(int(num_clipped), float(max_logit))
