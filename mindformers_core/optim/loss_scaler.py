"""Loss scaling for fp16 training (Megatron ``grad_scaler.py`` semantics).

Static: ``loss_scale`` set -> the scale never changes.
Dynamic (``loss_scale`` None): start at ``initial_loss_scale``; after each step call
``update(found_inf)``:

* overflow (inf/NaN in the unscaled grads): the growth counter resets and the hysteresis
  counter drops by one; once it reaches 0 the scale is multiplied by ``backoff_factor`` (0.5),
  never below ``min_loss_scale`` (the hysteresis counter stays at 0, so each further overflow
  backs off again until a growth);
* ``loss_scale_window`` consecutive clean steps: scale *= ``growth_factor`` (2) and the
  hysteresis counter is refilled.

The trainer multiplies the loss by ``scale``, then unscales the gradients with
:func:`unscale_and_check` and skips the optimizer step when it reports an overflow.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import mindspore as ms
from mindspore import Tensor, ops

__all__ = ["ConstantLossScaler", "DynamicLossScaler", "build_loss_scaler", "unscale_and_check"]


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    return float(value)


class ConstantLossScaler:
    """A fixed loss scale (``optimizer.loss_scale``)."""

    def __init__(self, loss_scale: float):
        self.scale = _positive("loss_scale", loss_scale)

    def update(self, found_inf: bool) -> None:
        """A static scale ignores overflows (the step is still skipped by the trainer)."""

    def state_dict(self) -> dict:
        return {"scale": self.scale}

    def load_state_dict(self, sd: dict) -> None:
        self.scale = float(sd["scale"])


class DynamicLossScaler:
    """Dynamic loss scale with growth window and hysteresis (see the module docstring)."""

    def __init__(self, initial_loss_scale: float = 2.0 ** 32, min_loss_scale: float = 1.0,
                 loss_scale_window: float = 1000, hysteresis: int = 2,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5):
        self.scale = _positive("initial_loss_scale", initial_loss_scale)
        self.min_scale = _positive("min_loss_scale", min_loss_scale)
        if self.min_scale > self.scale:
            raise ValueError(f"min_loss_scale ({self.min_scale}) must be <= initial_loss_scale "
                             f"({self.scale})")
        self.growth_interval = int(_positive("loss_scale_window", loss_scale_window))
        if isinstance(hysteresis, bool) or not isinstance(hysteresis, int) or hysteresis < 1:
            raise ValueError(f"hysteresis must be an integer >= 1, got {hysteresis!r}")
        self.hysteresis = hysteresis
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_tracker = 0
        self.hysteresis_tracker = hysteresis

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.growth_tracker = 0
                self.hysteresis_tracker = self.hysteresis
                self.scale = self.scale * self.growth_factor

    def state_dict(self) -> dict:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker,
                "hysteresis_tracker": self.hysteresis_tracker}

    def load_state_dict(self, sd: dict) -> None:
        self.scale = float(sd["scale"])
        self.growth_tracker = int(sd["growth_tracker"])
        self.hysteresis_tracker = int(sd["hysteresis_tracker"])


def build_loss_scaler(opt_cfg):
    """``loss_scale`` set -> ConstantLossScaler; else DynamicLossScaler from the config's
    ``initial_loss_scale``, ``min_loss_scale``, ``loss_scale_window``, ``hysteresis``."""
    get = (lambda k, d=None: opt_cfg.get(k, d)) if isinstance(opt_cfg, dict) else \
        (lambda k, d=None: getattr(opt_cfg, k, d))
    if get("loss_scale") is not None:
        return ConstantLossScaler(get("loss_scale"))
    return DynamicLossScaler(get("initial_loss_scale", 2.0 ** 32), get("min_loss_scale", 1.0),
                             get("loss_scale_window", 1000), get("hysteresis", 2))


def unscale_and_check(grads: Sequence[Optional[Tensor]], scale: float
                      ) -> Tuple[List[Optional[Tensor]], bool]:
    """(fp32 grads / scale, found_inf). One finiteness reduction and one host sync."""
    inv = 1.0 / float(scale)
    out = [None if g is None else g.astype(ms.float32) * inv for g in grads]
    flags = [ops.isfinite(g).all() for g in out if g is not None]
    found_inf = bool(flags) and not bool(ops.stack(flags).all().asnumpy())
    return out, found_inf
