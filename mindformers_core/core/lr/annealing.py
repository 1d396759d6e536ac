"""CosineAnnealingLR and CosineAnnealingWarmRestarts (SGDR): MindFormers 2.1.0's periodic
schedules, which take ``base_lr`` (not ``learning_rate``) and have no warmup.

Like every schedule here, ``lr_at`` returns the float64 closed form or, where float32 rounding
shows beyond the compatibility tolerance (a cosine argument ``pi * s / t_max`` rounded at a
large phase, ``1 + cos`` near -1), upstream's float32 value (:func:`~.base.pick`).
"""
from __future__ import annotations

import math

from ...errors import ConfigError
from .base import LRSchedule, register
from .float32 import EXACT_STEPS, PI32, f32, f32_const, half_one_plus_cos32, s32

__all__ = ["CosineAnnealingLR", "CosineAnnealingWarmRestarts"]

_PI = math.pi
_cos = math.cos
_floor = math.floor


class _AnnealingBase(LRSchedule):
    """CosineAnnealing*: the peak is ``base_lr`` (``learning_rate`` is not a field)."""

    PEAK_FIELD = "base_lr"
    FLOOR_FIELDS = ("eta_min",)

    def _setup_base(self, values):
        self.base = self._float(values, "base_lr", required=True,
                                what="the peak lr of this schedule (it has no learning_rate)")
        self.eta_min = self._float(values, "eta_min")
        if self.eta_min > self.base:
            raise ConfigError(self._p("eta_min"), f"must be <= base_lr ({self.base!r}), got "
                                                  f"{self.eta_min!r}")
        self._range = self.base - self.eta_min
        f32_const(self.base, self._p("base_lr"))
        self._emin32 = f32_const(self.eta_min, self._p("eta_min"))
        self._range32 = f32(self.base - self.eta_min)  # Python floats upstream, then float32

    def _pair_at(self, x: float, x32: float):
        """(float64, upstream float32) ``eta_min + (base - eta_min) * max(0, (1+cos x)/2)``."""
        pct = 0.5 * (1.0 + _cos(x))
        exact = self.eta_min + self._range * pct if pct > 0.0 else self.eta_min
        return exact, f32(self._emin32 + f32(self._range32 * half_one_plus_cos32(x32)))


@register("cosine_annealing")
class CosineAnnealingLR(_AnnealingBase):
    """``lr = eta_min + (base_lr - eta_min) * max(0, (1 + cos(pi * s / t_max)) / 2)``.

    No warmup, no clamp at ``t_max``: periodic with period ``2 * t_max`` (as upstream and
    torch define it).
    """

    FIELDS = {"base_lr": None, "t_max": None, "eta_min": 0.0}

    def _setup(self, values):
        self._setup_base(values)
        self.t_max = self._int(values, "t_max", lo=1, required=True,
                               what="half period of the cosine in steps, an int >= 1")
        self._omega = _PI / self.t_max

    def lr_pair(self, step: int):
        if step < 0:
            step = 0
        # upstream (float32): pi * s / t_max -- its rounding grows with s, which shows far
        # past t_max (t_max 7, step 75: rel 3e-6 from the exact curve)
        return self._pair_at(self._omega * step, f32(f32(PI32 * s32(step)) / self.t_max))

    def boundaries(self):
        return {"first_min": self.t_max, "period": 2 * self.t_max}


@register("cosine_annealing_warm_restarts")
class CosineAnnealingWarmRestarts(_AnnealingBase):
    """SGDR: cycles of length ``T_i = t_0 * t_mult**i`` starting at ``t_0 (m^i - 1)/(m - 1)``;
    ``lr = eta_min + (base_lr - eta_min) * max(0, (1 + cos(pi * t_cur / T_i)) / 2)``.

    The cycle index is upstream's float32 ``floor(log(s/t_0*(m-1) + 1) / log(m))``, so a
    restart lands on the same step as in MindFormers; the rest follows from it exactly.
    """

    FIELDS = {"base_lr": None, "t_0": None, "t_mult": 1, "eta_min": 0.0}

    def _setup(self, values):
        self._setup_base(values)
        self.t_0 = self._int(values, "t_0", lo=1, required=True,
                             what="length of the first cycle in steps, an int >= 1")
        self.t_mult = self._int(values, "t_mult", lo=1)
        self._log_m = math.log(self.t_mult) if self.t_mult > 1 else 0.0
        self._log_m32 = f32(self._log_m)

    def _cycle(self, step: int):
        """(t_cur, T_i) of ``step`` with upstream's float32 cycle index (exact integers
        below 2**24 steps, where every float32 operation here is exact)."""
        t0, m = self.t_0, self.t_mult
        if step < t0:
            return step, t0
        if m == 1:
            return step % t0, t0
        q = math.log(step / t0 * (m - 1) + 1.0) / self._log_m
        i = _floor(q)
        if q - i < 1e-4 or i + 1 - q < 1e-4:
            # near a restart: upstream's float32 rounding decides which cycle the step is in
            a32 = f32(f32(f32(s32(step) / t0) * (m - 1.0)) + 1.0)
            i = _floor(f32(f32(math.log(a32)) / self._log_m32))
        start = t0 * (m ** i - 1) // (m - 1) if i >= 0 else 0
        return step - start, t0 * m ** i if i >= 0 else t0

    def lr_pair(self, step: int):
        if step < 0:
            step = 0
        t_cur, t_i = self._cycle(step)
        if step > EXACT_STEPS or t_i > EXACT_STEPS:
            x32 = f32(f32(PI32 * f32(t_cur)) / f32(t_i))
        else:
            x32 = f32(f32(PI32 * t_cur) / t_i)
        return self._pair_at(_PI * t_cur / t_i, x32)

    def boundaries(self):
        return {"first_restart": self.t_0}
