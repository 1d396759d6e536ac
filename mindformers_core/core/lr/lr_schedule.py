"""Every LR schedule of MindFormers 2.1.0 (plus WSD styles and inverse-sqrt) and the registry.

Notation in the docstrings: ``s`` = 0-based optimizer step, ``W`` = resolved warmup steps,
``T`` = ``total_steps`` (``training.steps``), ``eta`` = ``learning_rate`` (the peak).
Every schedule with warmup shares the line ``init + (eta - init) * s / W`` for ``s < W``
(:class:`~.base.WarmupSchedule`).

Compatibility: each ``lr_at`` evaluates both the float64 closed form and upstream's float32 op
sequence (same operations, same order, each rounded to float32 with :func:`~.float32.f32`) and
returns the closed form unless float32 rounding moved upstream further than half the tolerance
(:func:`~.base.pick`). So ``lr_at`` equals MindFormers 2.1.0 within abs 1e-9 or rel 1e-6
wherever upstream is sane, including where float32 cancellation shows (WSD's last decay steps
with a large peak, cosines far past ``t_max``, ``1 + cos`` near -1). Where upstream is not sane
we never return NaN or a negative lr and never rise after the final decay.
"""
from __future__ import annotations

import math
from typing import Dict

from ...errors import ConfigError, check_range
from .base import LRSchedule, WarmupSchedule, canonical_type, register, registered_schedules
from .fields import as_choice, as_float, resolve_steps
from .float32 import PI32, f32, f32_const, half_one_plus_cos32, s32

__all__ = [
    "ConstantWarmUpLR", "LinearWithWarmUpLR", "CosineWithWarmUpLR",
    "CosineWithRestartsAndWarmUpLR", "PolynomialWithWarmUpLR", "WarmUpStableDecayLR",
    "ConstantWithCoolDownLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts",
    "LearningRateWiseLayer", "InverseSqrtLR", "LR_SCHEDULERS", "canonical_type",
]

_PI = math.pi
#: largest num_cycles: the phase frac(num_cycles * p) keeps ~10 significant digits in float64
#: only while num_cycles <= 1e6 (1e308 overflows to inf and the cosine is undefined)
MAX_NUM_CYCLES = 1e6
_TWO_PI = 2.0 * math.pi
_PI32 = PI32
_cos = math.cos
_floor = math.floor
_s32 = s32
_half_one_plus_cos32 = half_one_plus_cos32

# A step before the first update (``step < 0``, e.g. a "previous step" lookup at step 0) gets
# lr(0): upstream would extrapolate the warmup line to a negative lr (-1e-4 for
# ConstantWarmUp(1e-3, W=10) at -1) or above the peak (Linear/Polynomial with W = 0).


@register("constant_with_warmup")
class ConstantWarmUpLR(WarmupSchedule):
    """Warmup, then ``lr = eta`` for ``s >= W`` (``total_steps`` only resolves the ratio)."""

    FIELDS = dict(WarmupSchedule.WARMUP_FIELDS)

    def _setup(self, values):
        self._setup_warmup(values)

    def lr_pair(self, step: int):
        if step < self.W:
            return self._warm(step) if step >= 0 else self.lr_pair(0)
        return self.eta, self._eta32

    def boundaries(self):
        return self._warmup_bounds()


@register("linear")
class LinearWithWarmUpLR(WarmupSchedule):
    """Warmup, then ``lr = eta * max(0, (T - s) / max(1, T - W))``: 0 at ``s = T`` and after.

    There is no ``lr_end`` (use PolynomialWithWarmUpLR with ``power: 1.0`` for a floor).
    """

    FIELDS = dict(WarmupSchedule.WARMUP_FIELDS)

    def _setup(self, values):
        self._setup_warmup(values)
        self._len = float(max(1, self.total_steps - self.W))

    def lr_pair(self, step: int):
        if step < self.W:
            return self._warm(step) if step >= 0 else self.lr_pair(0)
        frac = (self.total_steps - step) / self._len
        if frac <= 0.0:
            return 0.0, 0.0
        # upstream: eta * max(0, (T - s) / max(1, T - W)), float32
        return (self.eta * frac,
                f32(self._eta32 * f32((self.total_steps - _s32(step)) / self._len)))

    def boundaries(self):
        return {**self._warmup_bounds(), "decay_start": self.W, "decay_end": self.total_steps,
                "decay_start_steps": self.W, "decay_steps": self.total_steps - self.W}


def _decay_cutoff(sched: WarmupSchedule, values, allow_ratio: bool) -> int:
    """Upstream decay cutoff ``D``: ``int(T*decay_ratio)``, else ``max(1, decay_steps)``,
    else ``max(1, T)``. At ``s >= D`` the lr is ``lr_end`` (checked before the warmup)."""
    steps = sched._int(values, "decay_steps")
    ratio = sched._float(values, "decay_ratio", hi=1.0) if allow_ratio else None
    if ratio is not None:
        sched._params["decay_steps"] = None
        return resolve_steps(steps, ratio, sched.total_steps, "decay", sched._path)
    return max(1, steps) if steps is not None else max(1, sched.total_steps)


class _CosineBase(WarmupSchedule):
    """Shared setup of CosineWithWarmUpLR and CosineWithRestartsAndWarmUpLR.

    ``p = (s - W) / max(1, T - W)``; the cosine is always stretched over ``T - W`` and cut
    at ``D`` (``D`` truncates, it does not stretch). From ``cut`` on we hold ``lr_end`` (or the
    last decay value if float32 rounding put it a hair below): ``cut = D`` when ``D <= T``;
    beyond ``T`` upstream keeps the cosine going (CosineWithWarmUpLR: we follow it while it
    still falls and stop where it would rise again) or returns 0 (CosineWithRestarts: we
    cut at ``T``).
    """

    FLOOR_FIELDS = ("lr_end",)

    def _setup_cosine(self, values, allow_ratio: bool, cycles_lo_open: bool):
        self._setup_warmup(values)
        self.lr_end = self._float(values, "lr_end")
        self._check_floor("lr_end", self.lr_end)
        self.c = self._float(values, "num_cycles", lo_open=cycles_lo_open)
        check_range(self.c, self._p("num_cycles"), hi=MAX_NUM_CYCLES)
        self.D = _decay_cutoff(self, values, allow_ratio)
        self._len = float(max(1, self.total_steps - self.W))
        self.cut = min(self.D, self.W + int(self._len))
        self._range = self.eta - self.lr_end
        self._lr_end32 = self._floor32("lr_end", self.lr_end)
        # upstream: learning_rate - lr_end with lr_end a float32 tensor -> float32 subtraction
        self._range32 = f32(self._eta32 - self._lr_end32)

    def _set_hold(self) -> None:
        """The value held from ``cut`` on: ``lr_end``, never above the last decay value."""
        last = self.cut - 1
        hold = min(self.lr_end, self.lr_at(last)) if last >= self.W else self.lr_end
        self._hold = (hold, hold)

    def _decay(self, step: int):  # pragma: no cover - abstract
        raise NotImplementedError

    def lr_pair(self, step: int):
        if step >= self.cut:
            return self._hold
        if step < self.W:
            return self._warm(step) if step >= 0 else self.lr_pair(0)
        return self._decay(step)

    def boundaries(self):
        return {**self._warmup_bounds(), "decay_start": min(self.W, self.cut),
                "decay_end": self.cut, "decay_start_steps": min(self.W, self.cut),
                "decay_steps": self.cut - min(self.W, self.cut)}


@register("cosine")
class CosineWithWarmUpLR(_CosineBase):
    """Warmup, then ``lr = lr_end + (eta - lr_end) * max(0, (1 + cos(2*pi*c*p)) / 2)``.

    Defaults: ``warmup_steps`` 0, ``num_cycles`` c = 0.5 (peak to lr_end), ``lr_end`` 0.
    ``s >= cut`` gives ``lr_end`` (see :class:`_CosineBase`).
    """

    FIELDS = {**WarmupSchedule.WARMUP_FIELDS, "num_cycles": 0.5, "lr_end": 0.0,
              "decay_steps": None, "decay_ratio": None}

    def _setup(self, values):
        self._setup_cosine(values, allow_ratio=True, cycles_lo_open=False)
        self._omega = _TWO_PI * self.c
        self._k32 = f32(math.pi * self.c * 2.0)  # upstream: math_pi * num_cycles * 2.0 * p
        self._cap_from, self._cap = self.cut, math.inf
        if self.D > self.total_steps:
            self.cut = self._first_rise_after_total()
            # past T ours never rises, not even by upstream's float32 noise
            self._cap_from = max(self.total_steps, self.W + 1)
            if self._cap_from < self.cut:
                self._cap = self.lr_at(self._cap_from - 1)
        self._set_hold()

    def lr_pair(self, step: int):
        if self._cap_from <= step < self.cut:
            exact, up = self._decay(step)
            return min(exact, self._cap), min(up, self._cap)
        return _CosineBase.lr_pair(self, step)

    def _decay(self, step: int):
        pct = 0.5 * (1.0 + _cos(self._omega * ((step - self.W) / self._len)))
        exact = self.lr_end + self._range * pct if pct > 0.0 else self.lr_end
        x32 = f32(self._k32 * f32((_s32(step) - self.W) / self._len))
        return exact, f32(self._lr_end32 + f32(self._range32 * _half_one_plus_cos32(x32)))

    def _value(self, step: int) -> float:
        return self._decay(step)[1]  # upstream's float32 value decides where it rises

    def _rises(self, step: int) -> bool:
        """Upstream rises at ``step`` by more than the compatibility tolerance."""
        v = self._value(step)
        return v > self._value(step - 1) + max(1e-9, 1e-6 * abs(v))

    def _first_rise_after_total(self) -> int:
        """With ``D > T`` upstream continues the cosine past ``T``: the first step there at
        which it rises (or ``D``). It falls until its phase ``2*pi*c*p`` reaches the next odd
        multiple of pi, so only a few steps around that point are evaluated."""
        s0 = max(self.total_steps, self.W + 1)
        if s0 >= self.D:
            return self.D
        if self._rises(s0):
            return s0
        if self.c == 0.0:
            return self.D  # constant eta until D
        half_turns = self.c * 2.0 * (s0 - self.W) / self._len  # phase / pi at s0
        odd = 2 * math.ceil((half_turns - 1.0) / 2.0) + 1
        s_min = self.W + self._len * odd / (2.0 * self.c)
        if s_min >= self.D:
            return self.D
        lo = max(s0 + 1, int(s_min) - 1)
        for step in range(lo, min(self.D, int(s_min) + 4)):
            if self._value(step) > self._value(step - 1):
                return step
        return min(self.D, int(s_min) + 1)


@register("cosine_with_restarts")
class CosineWithRestartsAndWarmUpLR(_CosineBase):
    """Warmup, then ``c`` half-cosines from eta to lr_end:
    ``lr = lr_end + (eta - lr_end) * max(0, (1 + cos(pi * frac(c*p))) / 2)``.

    Defaults ``num_cycles`` 1.0, ``lr_end`` 0. Upstream returns 0 (not lr_end) for
    ``p >= 1`` when ``decay_steps > T``; we hold ``lr_end`` from ``cut``.
    """

    FIELDS = {**WarmupSchedule.WARMUP_FIELDS, "num_cycles": 1.0, "lr_end": 0.0,
              "decay_steps": None}

    def _setup(self, values):
        self._setup_cosine(values, allow_ratio=False, cycles_lo_open=True)
        self._c32 = f32(self.c)
        self._set_hold()

    def _decay(self, step: int):
        # c*(s-W) first: exact for the usual c, so a restart on an integer step lands exactly
        x = (self.c * (step - self.W)) / self._len
        pct = 0.5 * (1.0 + _cos(_PI * (x - _floor(x))))
        exact = self.lr_end + self._range * pct if pct > 0.0 else self.lr_end
        # upstream: pi * ((num_cycles * p) % 1) with p = (s - W) / max(1, T - W), float32;
        # y - floor(y) is exact in float32. Where its rounding moves a restart by a step,
        # lr_at returns upstream's value (base.pick).
        y32 = f32(self._c32 * f32((_s32(step) - self.W) / self._len))
        x32 = f32(_PI32 * (y32 - _floor(y32)))
        return exact, f32(self._lr_end32 + f32(self._range32 * _half_one_plus_cos32(x32)))


@register("polynomial")
class PolynomialWithWarmUpLR(WarmupSchedule):
    """Warmup, then ``lr = lr_end + (eta - lr_end) * (1 - (s - W) / Dp) ** power``.

    ``Dp = max(1, decay_steps)`` or ``max(1, T - W)``; ``lr_end`` for ``s > T``. Defaults
    ``lr_end`` 1e-7, ``power`` 1.0. Upstream goes negative / climbs back / NaN between
    ``W + Dp`` and ``T`` when ``Dp < T - W``; we hold ``lr_end`` after ``W + Dp``.
    """

    FIELDS = {**WarmupSchedule.WARMUP_FIELDS, "lr_end": 1e-7, "power": 1.0,
              "decay_steps": None}
    FLOOR_FIELDS = ("lr_end",)

    def _setup(self, values):
        self._setup_warmup(values)
        self.lr_end = self._float(values, "lr_end")
        self._check_floor("lr_end", self.lr_end)
        self.power = self._float(values, "power")
        steps = self._int(values, "decay_steps")
        self.Dp = max(1, steps) if steps is not None else max(1, self.total_steps - self.W)
        # lr_end for s > _hold; with power 0 upstream's base**0 is 1 even when the base goes
        # negative, so it stays sane (constant eta) up to T
        self._hold = min(self.W + self.Dp, self.total_steps) if self.power > 0 else self.total_steps
        self._range = self.eta - self.lr_end
        self._lr_end32 = self._floor32("lr_end", self.lr_end)
        self._range32 = f32(self._eta32 - self._lr_end32)  # lr_end is a float32 tensor upstream
        self._power32 = f32_const(self.power, self._p("power"))
        last = min(self.lr_end, self.lr_at(self._hold))  # never above the last decay value
        self._floor_pair = (last, last)

    def lr_pair(self, step: int):
        if step < self.W:
            return self._warm(step) if step >= 0 else self.lr_pair(0)
        if step > self._hold:
            return self._floor_pair
        exact = self.lr_end + self._range * (1.0 - (step - self.W) / self.Dp) ** self.power
        # upstream (float32): decay = (eta - lr_end) * (1 - (s - W) / Dp) ** power + lr_end;
        # lr = eta * (decay / eta)
        base32 = f32(1.0 - f32((_s32(step) - self.W) / self.Dp))
        decay32 = f32(f32(self._range32 * f32(math.pow(base32, self._power32))) + self._lr_end32)
        if self._eta32 == 0.0:
            return exact, 0.0
        return exact, f32(self._eta32 * f32(decay32 / self._eta32))

    def boundaries(self):
        end = min(self.W + self.Dp, self.total_steps + 1)
        return {**self._warmup_bounds(), "decay_start": self.W, "decay_end": end,
                "decay_start_steps": self.W, "decay_steps": end - self.W}


@register("wsd")
class WarmUpStableDecayLR(WarmupSchedule):
    """Warmup-Stable-Decay: warmup to eta, hold eta until ``S``, decay to lr_end at ``T``.

    ``S`` = ``int(T * decay_start_ratio)`` or ``decay_start_steps`` (one is required).
    With ``p = (s - S) / (T - S)``: ``linear`` (upstream, default)
    ``lr = eta - (eta - lr_end) * p``; ``cosine`` ``lr_end + (eta - lr_end)(1 + cos(pi p))/2``;
    ``1-sqrt`` ``lr_end + (eta - lr_end)(1 - sqrt(p))``. Ours holds ``lr_end`` for ``s >= T``
    (upstream keeps falling below 0), starts at eta with ``warmup_steps: 0`` (upstream NaN),
    and with ``S >= T`` holds eta until ``S`` then ``lr_end`` (upstream NaN / rises).
    """

    FIELDS = {**WarmupSchedule.WARMUP_FIELDS, "lr_end": 1e-7, "decay_start_steps": None,
              "decay_start_ratio": None, "decay_style": "linear"}
    FLOOR_FIELDS = ("lr_end",)
    DECAY_STYLES = ("linear", "cosine", "1-sqrt")

    def _setup(self, values):
        self._setup_warmup(values)
        self.lr_end = self._float(values, "lr_end")
        self._check_floor("lr_end", self.lr_end)
        steps = self._int(values, "decay_start_steps")
        ratio = self._float(values, "decay_start_ratio", hi=1.0)
        if steps is None and ratio is None:
            raise ConfigError(self._p("decay_start_steps"),
                              "WarmUpStableDecayLR needs decay_start_steps or "
                              "decay_start_ratio (where the decay begins)")
        if ratio is not None:
            self._params["decay_start_steps"] = None
        self.S = resolve_steps(steps, ratio, self.total_steps, "decay_start", self._path)
        self.style = as_choice(values["decay_style"], self._p("decay_style"), self.DECAY_STYLES)
        self._params["decay_style"] = self.style
        self._len = float(self.total_steps - self.S) if self.total_steps > self.S else 1.0
        self._range = self.eta - self.lr_end
        self._lr_end32 = self._floor32("lr_end", self.lr_end)
        self._range32 = f32(self._eta32 - self._lr_end32)  # lr_end is a float32 tensor upstream
        self._eta_pair = (self.eta, self._eta32)
        if self.S < self.total_steps:
            # the decay includes T (upstream lr(T) is lr_end up to float32 rounding); after T
            # upstream falls below lr_end and goes negative: hold, never above lr(T)
            self._end = self.total_steps + 1
            last = min(self.lr_end, self.lr_at(self.total_steps))
        else:
            # S == T: upstream NaN at T, -inf after; S > T: eta at S, then rising
            self._end = self.S + 1 if self.S > self.total_steps else self.S
            last = self.lr_end
        self._floor_pair = (last, last)

    def lr_pair(self, step: int):
        if step < self.W:
            return self._warm(step) if step >= 0 else self.lr_pair(0)
        if step < self.S:
            # upstream eta * s / s: NaN at s = 0 (warmup_steps 0; ours starts at the peak),
            # else within 1 float32 ulp of eta
            return self._eta_pair
        if step >= self._end:
            return self._floor_pair
        p = (step - self.S) / self._len
        if self.style == "linear":
            if self.S > self.total_steps:  # only step == S gets here: upstream eta
                return self._eta_pair
            # upstream (float32): eta - (eta - lr_end) * ((s - S) / (T - S))
            return (self.eta - self._range * p if p < 1.0 else self.lr_end,
                    f32(self._eta32 - f32(self._range32 * f32((_s32(step) - self.S) / self._len))))
        if self.S > self.total_steps:
            return self._eta_pair
        if self.style == "cosine":
            lr = self.lr_end + self._range * 0.5 * (1.0 + _cos(_PI * p))
        else:
            lr = self.lr_end + self._range * (1.0 - math.sqrt(p))
        return lr, lr  # not an upstream style: float64 only

    def boundaries(self):
        end = max(self.S, self.total_steps)
        return {**self._warmup_bounds(), "decay_start": self.S, "decay_end": end,
                "decay_start_steps": self.S, "decay_steps": end - self.S}


@register()
class ConstantWithCoolDownLR(WarmupSchedule):
    """Warmup, keep, cosine cool-down, then two floors.

    ``K = keep_steps``, ``F = final_steps``, ``D`` = ``int(T*decay_ratio)``, else
    ``max(1, decay_steps)``, else ``max(1, T)`` (upstream: the default D is T, so the schedule
    runs past ``total_steps``). Phases: warmup; ``s < W+K``: eta; ``s < W+K+D``:
    ``lr_end1 + (eta - lr_end1) * max(0, (1 + cos(2*pi*c*(s-W-K)/D)) / 2)``;
    ``s < W+K+D+F``: lr_end1; then lr_end2 (``None`` means lr_end1). ``lr_end2 <= lr_end1``.
    As upstream (``lr_end2 or lr_end1``), an explicit ``lr_end2: 0.0`` also means lr_end1:
    its curve is sane there, so ours matches it (set ``lr_end1`` lower to end lower).
    """

    FIELDS = {**WarmupSchedule.WARMUP_FIELDS, "keep_steps": 0, "final_steps": 0,
              "num_cycles": 0.5, "lr_end1": 0.0, "lr_end2": None, "decay_steps": None,
              "decay_ratio": None}
    FLOOR_FIELDS = ("lr_end1",)

    def _setup(self, values):
        self._setup_warmup(values)
        self.K = self._int(values, "keep_steps")
        self.F = self._int(values, "final_steps")
        self.c = self._float(values, "num_cycles")
        check_range(self.c, self._p("num_cycles"), hi=MAX_NUM_CYCLES)
        self.e1 = self._float(values, "lr_end1")
        self._check_floor("lr_end1", self.e1)
        e2 = self._float(values, "lr_end2")
        if e2 is not None and e2 > self.e1:
            raise ConfigError(self._p("lr_end2"), f"must be <= lr_end1 ({self.e1!r}), got "
                                                  f"{e2!r} (the lr must not rise after the "
                                                  "cool-down)")
        self.e2 = e2 or self.e1  # upstream: lr_end2 or lr_end1 (0.0 falls back too)
        self.D = _decay_cutoff(self, values, allow_ratio=True)
        self._b1 = self.W + self.K
        self._b2 = self._b1 + self.D
        self._b3 = self._b2 + self.F
        self._omega = _TWO_PI * self.c / self.D if self.D > 0 else 0.0
        self._range = self.eta - self.e1
        e1_32 = self._floor32("lr_end1", self.e1)
        self._e1_32 = e1_32
        self._cool32 = f32(self.eta - self.e1)  # Python floats upstream, then float32
        self._k32 = f32(math.pi * self.c * 2.0)
        self._eta_pair = (self.eta, self._eta32)
        self._e1_pair = (self.e1, e1_32)
        self._e2_pair = (self.e2, self._floor32("lr_end2", self.e2))

    def _adjust_floor(self, params, min_lr):
        if min_lr is not None and params.get("lr_end2") is not None:
            params["lr_end2"] = min(params["lr_end2"], min_lr)

    def lr_pair(self, step: int):
        if step < self.W:
            return self._warm(step) if step >= 0 else self.lr_pair(0)
        if step < self._b1:
            return self._eta_pair
        if step < self._b2:
            pct = 0.5 * (1.0 + _cos(self._omega * (step - self._b1)))
            exact = self.e1 + self._range * pct if pct > 0.0 else self.e1
            # upstream (float32): p = (s - K - W) / D; e1 + (eta - e1) * (1 + cos(2 pi c p)) / 2
            x32 = f32(self._k32 * f32((_s32(step) - self.K - self.W) / self.D))
            return exact, f32(self._e1_32 + f32(self._cool32 * _half_one_plus_cos32(x32)))
        if step < self._b3:
            return self._e1_pair
        return self._e2_pair

    def boundaries(self):
        return {**self._warmup_bounds(), "decay_start": self._b1, "decay_end": self._b3,
                "decay_start_steps": self._b1, "decay_steps": self.D,
                "cooldown_end": self._b2, "final_end": self._b3}


@register("inverse_sqrt")
class InverseSqrtLR(WarmupSchedule):
    """Inverse square root (Vaswani et al. 2017 rsqrt), with the shared linear warmup:
    ``lr = max(lr_end, eta * sqrt(max(W, 1) / max(s, 1)))`` for ``s >= W``.

    It equals eta at ``s = W`` and decays as ``1/sqrt(s)`` (never plateaus); ``lr_end``
    (default 0) is an optional floor it then holds. The Transformer's ``d_model**-0.5``
    factor belongs in ``learning_rate``.
    """

    FIELDS = {**WarmupSchedule.WARMUP_FIELDS, "lr_end": 0.0}
    FLOOR_FIELDS = ("lr_end",)

    def _setup(self, values):
        self._setup_warmup(values)
        self.lr_end = self._float(values, "lr_end")
        self._check_floor("lr_end", self.lr_end)
        self._scale = self.eta * math.sqrt(max(self.W, 1))

    def lr_pair(self, step: int):
        if step < self.W:
            return self._warm(step) if step >= 0 else self.lr_pair(0)
        lr = self._scale / math.sqrt(step) if step > 1 else self.eta
        lr = lr if lr > self.lr_end else self.lr_end
        return lr, lr  # not an upstream schedule: float64 only

    def boundaries(self):
        return {**self._warmup_bounds(), "decay_start": self.W, "decay_start_steps": self.W}


@register()
class LearningRateWiseLayer(LRSchedule):
    """``lr = lr_scale * base(s)`` where ``base_lr`` is a nested schedule section
    (``{type: CosineWithWarmUpLR, learning_rate: ..., ...}``) or a schedule object.

    Upstream cannot build it from YAML; ours can. Errors inside the nested section name
    ``lr_scheduler.base_lr.<field>``.
    """

    FIELDS = {"base_lr": None, "lr_scale": None}
    PEAK_FIELD = "base_lr"

    def _setup(self, values):
        self.scale = as_float(values["lr_scale"], self._p("lr_scale"), lo=0.0, lo_open=True,
                              required=True, what="the factor applied to base_lr's schedule")
        self._params["lr_scale"] = self.scale
        self._scale32 = f32_const(self.scale, self._p("lr_scale"))
        base = values["base_lr"]
        if base is None:
            raise ConfigError(self._p("base_lr"), "required: the wrapped schedule section, "
                                                  "e.g. {type: CosineWithWarmUpLR, ...}")
        if not isinstance(base, LRSchedule):
            from .build import build_lr_scheduler  # build imports base only: one way
            base = build_lr_scheduler(base, self.total_steps, path=self._p("base_lr"))
        self.base = base
        self._params["base_lr"] = base.to_dict()

    def lr_pair(self, step: int):
        exact, up = self.base.lr_pair(step)
        return self.scale * exact, f32(self._scale32 * up)  # upstream: lr_scale * lr, float32

    @property
    def peak_lr(self) -> float:
        return self.scale * self.base.peak_lr

    @property
    def ceiling(self) -> float:
        return self.scale * self.base.ceiling

    def with_peak(self, max_lr: float, min_lr=None) -> "LearningRateWiseLayer":
        key = (max_lr, min_lr)
        if key not in self._peak_cache:
            inner = self.base.with_peak(max_lr / self.scale,
                                        None if min_lr is None else min_lr / self.scale)
            self._peak_cache[key] = LearningRateWiseLayer(
                self.total_steps, path=self._path, base_lr=inner, lr_scale=self.scale)
        return self._peak_cache[key]

    def boundaries(self):
        return self.base.boundaries()


# the annealing schedules live in their own module; importing it registers them
from .annealing import CosineAnnealingLR, CosineAnnealingWarmRestarts  # noqa: E402

#: every accepted ``type`` name (class names and aliases) -> class
LR_SCHEDULERS: Dict[str, type] = registered_schedules()
