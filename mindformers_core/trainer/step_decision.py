"""What a step does with its gradients, as a pure function of the global gradient norm.

``decide_step`` returns a :class:`StepDecision`; the trainer acts on it (logs, counts, raises,
clips, steps). In order:

1. a non-finite norm under dynamic loss scaling is an fp16 overflow: skip (the scaler lowers
   its scale);
2. another non-finite norm stops the run unless ``training.use_skip_step_on_nan``; with it the
   step is skipped;
3. a norm above ``optimizer.grad_norm_skip_threshold`` skips the step;
4. otherwise the update is applied, clipped by ``optim.clip_grad.clip_coefficient``.

Every kind of skip counts toward ``training.max_consecutive_skipped_steps``: reaching it (> 0)
consecutive skipped updates stops the run, whatever made them skip (a run that applies no
update must not end with exit 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..optim.clip_grad import clip_coefficient

__all__ = ["StepDecision", "decide_step", "OVERFLOW", "NONFINITE", "THRESHOLD", "SKIP_LIMIT"]

OVERFLOW, NONFINITE, THRESHOLD = "overflow", "nonfinite", "threshold"
SKIP_LIMIT = "skip_limit"


@dataclass(frozen=True)
class StepDecision:
    #: None: apply the update; else why it is skipped (OVERFLOW, NONFINITE, THRESHOLD)
    skip: Optional[str]
    #: the run must stop: NONFINITE (not skippable) or SKIP_LIMIT (too many in a row)
    error: Optional[str] = None
    #: gradient scale of an applied update (None: not clipped)
    clip_coef: Optional[float] = None

    @property
    def applied(self) -> bool:
        return self.skip is None and self.error is None


def decide_step(norm: float, *, max_norm: Optional[float], skip_threshold: float = math.inf,
                dynamic_loss_scaling: bool = False, use_skip_step_on_nan: bool = False,
                consecutive_skipped: int = 0,
                max_consecutive_skipped: int = 0) -> StepDecision:
    """The decision for a step whose global gradient norm is ``norm`` (see the module
    docstring); ``consecutive_skipped`` is the count before this step."""
    if not math.isfinite(norm):
        if dynamic_loss_scaling:
            skip = OVERFLOW
        elif not use_skip_step_on_nan:
            return StepDecision(None, error=NONFINITE)
        else:
            skip = NONFINITE
    elif norm > skip_threshold:
        skip = THRESHOLD
    else:
        return StepDecision(None, clip_coef=clip_coefficient(norm, max_norm))
    limit_hit = 0 < max_consecutive_skipped <= consecutive_skipped + 1
    return StepDecision(skip, error=SKIP_LIMIT if limit_hit else None)
