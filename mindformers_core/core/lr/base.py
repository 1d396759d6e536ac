"""Base classes of the LR schedules and the name registry.

A schedule is an immutable object whose ``lr_at(step)`` is a pure function of the 0-based
optimizer step, computed with ``math`` only: float64, or MindFormers' float32 result where
float32 rounding shows beyond the compatibility tolerance (see :func:`pick`). Nothing is
stored between calls, so a restarted run that rebuilds the schedule from its config gets
exactly the same curve.

Construction ``Cls(total_steps, path="lr_scheduler", **fields)`` checks every field (types,
ranges, cross-field rules) and raises ``ConfigError("{path}.{field}", ...)``. A key the type
does not declare is an error that lists the valid keys, suggests the closest one and, when
another schedule accepts that key, names it (upstream silently drops such keys).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Tuple

from ...errors import MAX_STEPS, ConfigError, check_range, show
from ...errors import unknown_key_error
from .fields import as_float, as_int, resolve_steps
from .float32 import f32, f32_const

#: half the compatibility tolerance (abs 1e-9 or rel 1e-6): the float64 closed form is
#: returned where it is this close to upstream's float32 value, leaving the other half for
#: 1-2 ulp differences of float32 ``powf``/``logf`` between platforms
_PICK_ABS = 5e-10
_PICK_REL = 5e-7


def pick(exact: float, upstream32: float) -> float:
    """``exact`` (float64 closed form) unless it is further than half the compatibility
    tolerance from ``upstream32`` (upstream's float32 op sequence), else ``upstream32``.

    Far from cancellations the two agree to ~1e-7 relative and the exact value is returned;
    where float32 rounding is amplified (a difference of nearly equal numbers, a cosine
    argument rounded at a large phase, ``1 + cos`` near -1 with a large peak) upstream's value
    is returned, so ``lr_at`` always equals MindFormers within abs 1e-9 or rel 1e-6.
    """
    d = exact - upstream32
    if -_PICK_ABS <= d <= _PICK_ABS or abs(d) <= _PICK_REL * abs(upstream32):
        return exact
    return upstream32

__all__ = ["LRSchedule", "WarmupSchedule", "SCHEDULE_CLASSES", "ALIASES", "register", "pick",
           "canonical_type", "registered_schedules"]

#: canonical class name -> class (filled by :func:`register`)
SCHEDULE_CLASSES: Dict[str, type] = {}
#: alias -> canonical class name
ALIASES: Dict[str, str] = {}


def canonical_type(name: Any) -> str:
    """The class name for ``name`` (a class name or an alias); KeyError when unknown."""
    if name in SCHEDULE_CLASSES:
        return name
    return ALIASES[name]


def registered_schedules() -> Dict[str, type]:
    """Every registered ``type`` name (class names and aliases) -> class. The schedules
    register when ``core.lr`` is imported (its ``__init__`` imports every schedule module)."""
    return {**SCHEDULE_CLASSES, **{a: SCHEDULE_CLASSES[c] for a, c in ALIASES.items()}}


#: (schedule type, key) -> advice, for keys upstream accepts and silently ignores
_IGNORED_UPSTREAM = {
    ("LinearWithWarmUpLR", "lr_end"):
        "LinearWithWarmUpLR always decays to 0 (upstream ignores lr_end); to decay linearly "
        "to lr_end use PolynomialWithWarmUpLR with power: 1.0",
    ("ConstantWarmUpLR", "lr_end"):
        "ConstantWarmUpLR never decays (upstream ignores lr_end); to decay to lr_end use "
        "WarmUpStableDecayLR or ConstantWithCoolDownLR (lr_end1/lr_end2)",
    ("CosineWithRestartsAndWarmUpLR", "decay_ratio"):
        "CosineWithRestartsAndWarmUpLR has no decay_ratio (upstream ignores it); use "
        "decay_steps",
    ("WarmUpStableDecayLR", "decay_steps"):
        "WarmUpStableDecayLR decays from decay_start to total_steps (upstream ignores "
        "decay_steps); use decay_start_steps or decay_start_ratio",
    ("WarmUpStableDecayLR", "decay_ratio"):
        "WarmUpStableDecayLR decays from decay_start to total_steps (upstream ignores "
        "decay_ratio); use decay_start_ratio or decay_start_steps",
    ("ConstantWithCoolDownLR", "lr_end"):
        "ConstantWithCoolDownLR ends at lr_end1 (after the cosine) and lr_end2 (after "
        "final_steps); use those",
}


def register(*aliases: str):
    """Class decorator: register a schedule under its class name and ``aliases``."""
    def deco(cls):
        SCHEDULE_CLASSES[cls.__name__] = cls
        cls.TYPE = cls.__name__
        for alias in aliases:
            ALIASES[alias] = cls.__name__
        return cls
    return deco


def unknown_field_error(type_name_: str, key: Any, valid: Iterable[str], path: str) -> ConfigError:
    """The error for ``key`` not declared by schedule ``type_name_`` (with advice)."""
    err = unknown_key_error(path, key, sorted(valid), what=f"key for {type_name_}")
    advice = _IGNORED_UPSTREAM.get((type_name_, key))
    if advice is None:
        users = sorted(n for n, c in SCHEDULE_CLASSES.items() if key in c.FIELDS)
        if users:
            advice = f"{key} is a field of {', '.join(users)}"
    if advice:
        return ConfigError(err.path, f"{err.detail}; {advice}")
    return err


class LRSchedule:
    """Base class: ``lr_at(step) -> float``, ``peak_lr``, ``with_peak``, ``boundaries``.

    Subclasses declare ``FIELDS`` (accepted keys -> defaults, ``None`` meaning unset) and
    implement ``_setup(values)`` (check and precompute) and ``lr_at``.
    """

    TYPE = ""
    FIELDS: Dict[str, Any] = {}
    PEAK_FIELD = "learning_rate"
    #: fields that hold the floor (what ``with_peak(min_lr=...)`` replaces)
    FLOOR_FIELDS: Tuple[str, ...] = ()

    def __init__(self, total_steps: int, path: str = "lr_scheduler", **fields: Any):
        for key in fields:
            if key not in self.FIELDS:
                raise unknown_field_error(self.TYPE, key, self.FIELDS, path)
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ConfigError("training.steps",
                              f"total_steps of the LR schedule comes from training.steps and "
                              f"must be an int >= 1, got {show(total_steps)}")
        check_range(total_steps, "training.steps", hi=MAX_STEPS)
        self.total_steps = total_steps
        self._path = path
        self._params: Dict[str, Any] = {}
        self._peak_cache: Dict[Tuple[float, Optional[float]], "LRSchedule"] = {}
        self._setup({k: fields.get(k, d) for k, d in self.FIELDS.items()})

    # ---- field readers used by _setup: check, remember for to_dict, return the value ----
    def _p(self, key: str) -> str:
        return f"{self._path}.{key}"

    def _given(self, values: dict, key: str, required: bool = False) -> Any:
        """``values[key]``; null is refused for a field whose default is a value (null would
        not mean "the default", and the schedule math needs a number). A required field
        reports itself as required."""
        value = values[key]
        if value is None and not required and self.FIELDS.get(key) is not None:
            raise ConfigError(self._p(key), f"must not be null: write a number, or leave {key} "
                                            f"out for its default ({self.FIELDS[key]!r})")
        return value

    def _float(self, values: dict, key: str, **kw) -> Optional[float]:
        v = as_float(self._given(values, key, kw.get("required", False)), self._p(key), **kw)
        self._params[key] = v
        return v

    def _int(self, values: dict, key: str, **kw) -> Optional[int]:
        v = as_int(self._given(values, key, kw.get("required", False)), self._p(key), **kw)
        self._params[key] = v
        return v

    def _setup(self, values: Dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def lr_pair(self, step: int) -> Tuple[float, float]:  # pragma: no cover - abstract
        """``(float64 closed form, upstream float32 value)`` at ``step``; where upstream is
        not sane (NaN, negative, rising after the final decay) both are our safe value."""
        raise NotImplementedError

    def lr_at(self, step: int) -> float:
        """Learning rate applied at 0-based optimizer step ``step``: the float64 closed form,
        or upstream's float32 value where they differ by more than half the compatibility
        tolerance (:func:`pick`). ``step < 0`` gives ``lr_at(0)`` (upstream extrapolates the
        warmup line below 0)."""
        exact, up = self.lr_pair(step)
        d = exact - up
        if -_PICK_ABS <= d <= _PICK_ABS or abs(d) <= _PICK_REL * abs(up):
            return exact
        # float32 rounding of the peak itself can put upstream's value a few ulps above the
        # float64 peak (e.g. 0.33333334 for 1/3); the lr never exceeds the schedule's ceiling
        return min(up, self.ceiling)

    @property
    def ceiling(self) -> float:
        """The largest lr the schedule may give: ``max(peak_lr, warmup_lr_init)``."""
        return max(self.peak_lr, self._params.get("warmup_lr_init") or 0.0)

    def __call__(self, step: int) -> float:
        return self.lr_at(step)

    @property
    def peak_lr(self) -> float:
        """The schedule's peak (``learning_rate``, or ``base_lr`` for CosineAnnealing*)."""
        return self._params[self.PEAK_FIELD]

    def with_peak(self, max_lr: float, min_lr: Optional[float] = None) -> "LRSchedule":
        """The same schedule with peak ``max_lr`` and, when given, floor ``min_lr``.

        Used for parameter groups with their own ``max_lr``/``min_lr`` (Megatron style): the
        shape (warmup, decay boundaries) is unchanged; ``warmup_lr_init`` is kept.
        Results are cached per (max_lr, min_lr); schedules are immutable, so this is safe.
        """
        key = (max_lr, min_lr)
        cached = self._peak_cache.get(key)
        if cached is None:
            params = dict(self._params)
            params[self.PEAK_FIELD] = max_lr
            if min_lr is not None:
                for name in self.FLOOR_FIELDS:
                    params[name] = min_lr
            self._adjust_floor(params, min_lr)
            cached = type(self)(self.total_steps, path=self._path, **params)
            self._peak_cache[key] = cached
        return cached

    def _adjust_floor(self, params: Dict[str, Any], min_lr: Optional[float]) -> None:
        """Hook for schedules with more than one floor (ConstantWithCoolDownLR)."""

    def boundaries(self) -> Dict[str, int]:
        """Phase boundaries (0-based steps) for plots and the launch doctor."""
        return {}

    def to_dict(self) -> Dict[str, Any]:
        """The section as a user would write it (rebuilding from it gives the same curve)."""
        out = {"type": self.TYPE}
        out.update({k: v for k, v in self._params.items() if v is not None})
        return out

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "type")
        return f"{self.TYPE}({args}, total_steps={self.total_steps})"

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and other.total_steps == self.total_steps
                and other.to_dict() == self.to_dict())

    def __hash__(self) -> int:
        return hash((self.TYPE, self.total_steps, repr(sorted(self.to_dict().items()))))


class WarmupSchedule(LRSchedule):
    """Shared linear warmup of the MindFormers schedules.

    ``W`` = ``int(total * warmup_ratio)`` if ``warmup_ratio`` is set, else ``warmup_steps``
    (default 0). For ``W > 0`` and ``step < W``:
    ``lr = warmup_lr_init + (learning_rate - warmup_lr_init) * step / W``, so ``lr(0)`` is
    ``warmup_lr_init`` and the peak is reached exactly at ``step == W``.
    """

    WARMUP_FIELDS = {"learning_rate": 1e-5, "warmup_steps": None, "warmup_ratio": None,
                     "warmup_lr_init": 0.0}

    def _setup_warmup(self, values: Dict[str, Any]) -> None:
        self.eta = self._float(values, "learning_rate", required=True,
                               what="the peak learning rate")
        self.init = self._float(values, "warmup_lr_init")
        steps = self._int(values, "warmup_steps")
        ratio = self._float(values, "warmup_ratio", hi=1.0)
        self.W = resolve_steps(steps, ratio, self.total_steps, "warmup", self._path)
        if ratio is not None:
            self._params["warmup_steps"] = None  # the ratio wins; to_dict keeps what is used
        if self.W > self.total_steps:
            raise ConfigError(self._p("warmup_steps"),
                              f"warmup ({self.W} steps) is longer than total_steps "
                              f"({self.total_steps}, from training.steps)")
        # precomputed slope of the warmup line (float64)
        self._slope = (self.eta - self.init) / self.W if self.W > 0 else 0.0
        # upstream's float32 constants: eta and init as float32, (eta - init) computed on
        # Python floats then cast (it multiplies a float32 tensor)
        self._eta32 = f32_const(self.eta, self._p("learning_rate"))
        self._init32 = f32_const(self.init, self._p("warmup_lr_init"))
        self._span32 = f32(self.eta - self.init)

    def _warm(self, step: int):
        """(float64, upstream float32) warmup values at ``0 <= step < W``:
        ``init + (eta - init) * (s / W)``."""
        return (self.init + self._slope * step,
                f32(self._init32 + f32(self._span32 * f32(step / self.W))))

    def _floor32(self, key: str, value: float) -> float:
        """``value`` (a floor field) as upstream's float32 constant."""
        return f32_const(value, self._p(key))

    def _check_floor(self, key: str, value: float) -> None:
        if value > self.eta:
            raise ConfigError(self._p(key), f"must be <= learning_rate ({self.eta!r}), got "
                                             f"{value!r} (the floor cannot be above the peak)")

    def _warmup_bounds(self) -> Dict[str, int]:
        return {"warmup_end": self.W, "warmup_steps": self.W}
