"""Building a schedule from an ``lr_scheduler`` section, and per-group learning rates.

    sched = build_lr_scheduler({"type": "CosineWithWarmUpLR", "learning_rate": 1e-5,
                                "warmup_ratio": 0.01}, total_steps=1000)
    sched.lr_at(step)                       # 0-based optimizer step, float64
    group_lrs(sched, opt.param_groups, step)  # lr of each parameter group at that step
"""
from __future__ import annotations

import difflib
from typing import Any, Dict, List, Mapping, Sequence

from ...errors import ConfigError
from ...errors import type_name
from .base import LRSchedule, canonical_type, registered_schedules

__all__ = ["build_lr_scheduler", "scheduler_fields", "group_lrs", "schedule_class"]

#: MindSpore's own nn.learning_rate_schedule classes: upstream registers them but they can
#: never be built from YAML (learning_rate/total_steps are injected and they reject them).
_MINDSPORE_BUILTINS = {
    "CosineDecayLR": "CosineWithWarmUpLR (or CosineAnnealingLR)",
    "PolynomialDecayLR": "PolynomialWithWarmUpLR",
    "WarmUpLR": "ConstantWarmUpLR",
    "ExponentialDecayLR": "PolynomialWithWarmUpLR or CosineWithWarmUpLR",
    "NaturalExpDecayLR": "PolynomialWithWarmUpLR or CosineWithWarmUpLR",
    "InverseDecayLR": "InverseSqrtLR",
}


def _valid_names() -> List[str]:
    return sorted(registered_schedules())


def schedule_class(type_name_: Any, path: str = "lr_scheduler") -> type:
    """The schedule class for a ``type`` value; ConfigError listing every valid name."""
    names = _valid_names()
    if type_name_ is None:
        raise ConfigError(f"{path}.type", f"required; one of {names}")
    if not isinstance(type_name_, str):
        raise ConfigError(f"{path}.type", f"expected a string, got {type_name(type_name_)} "
                                          f"({type_name_!r}); one of {names}")
    try:
        return registered_schedules()[canonical_type(type_name_)]
    except KeyError:
        pass
    msg = f"unknown scheduler {type_name_!r}; valid: {names}"
    if type_name_ in _MINDSPORE_BUILTINS:
        msg += (f"; MindSpore's {type_name_} cannot be built from a config (upstream fails "
                f"too): use {_MINDSPORE_BUILTINS[type_name_]}")
    else:
        lowered = {n.lower(): n for n in names}
        hit = difflib.get_close_matches(type_name_.lower(), list(lowered), n=1, cutoff=0.6)
        if hit:
            msg += f"; did you mean '{lowered[hit[0]]}'?"
    raise ConfigError(f"{path}.type", msg)


def scheduler_fields(type_name_: str) -> Dict[str, Any]:
    """Accepted keys of a schedule type or alias (excluding ``type``) with their defaults.

    ``None`` means "not set" (e.g. ``warmup_ratio``) or "required" (``t_max``, ``base_lr``).
    The CosineAnnealing* types and LearningRateWiseLayer have no ``learning_rate``.
    """
    return dict(schedule_class(type_name_).FIELDS)


def _section_dict(section: Any, path: str) -> Dict[str, Any]:
    if isinstance(section, Mapping):
        return dict(section)
    if hasattr(section, "as_build_dict"):
        return dict(section.as_build_dict())
    if hasattr(section, "to_dict"):
        return dict(section.to_dict())
    raise ConfigError(path, f"expected a mapping, got {type_name(section)} ({section!r})")


def build_lr_scheduler(section: Any, total_steps: int, path: str = "lr_scheduler") -> LRSchedule:
    """Build the schedule of an ``lr_scheduler`` section.

    ``section``: a dict (``type``, ``learning_rate`` and the type's extension fields) or an
    object with ``to_dict()`` (``LrSchedulerConfig``); a built schedule is returned as is.
    ``total_steps``: ``training.steps``, the only source of total steps (ratios resolve
    against it). Raises ``ConfigError`` whose path starts with ``path``.
    """
    if isinstance(section, LRSchedule):
        return section
    data = _section_dict(section, path)
    cls = schedule_class(data.get("type"), path)
    if "total_steps" in data:
        raise ConfigError(f"{path}.total_steps",
                          "must not be set: total_steps comes from training.steps "
                          "(set training.steps instead)")
    if "learning_rate" in data and "learning_rate" not in cls.FIELDS:
        if cls.__name__ == "LearningRateWiseLayer":
            advice = "put learning_rate inside the base_lr section"
        else:
            advice = "write base_lr instead"
        raise ConfigError(f"{path}.learning_rate",
                          f"{cls.__name__} takes its peak from base_lr (learning_rate has no "
                          f"effect on it); {advice}")
    fields = {k: v for k, v in data.items() if k != "type"}
    return cls(total_steps, path=path, **fields)


def group_lrs(sched: LRSchedule, param_groups: Sequence[Mapping[str, Any]],
              step: int) -> List[float]:
    """Learning rate of each parameter group at ``step``.

    A group with ``max_lr`` (and optionally ``min_lr``) gets the same schedule re-evaluated
    with that peak and floor: ``sched.with_peak(max_lr, min_lr).lr_at(step)`` (a group with
    only ``min_lr`` keeps the schedule's peak). Any other group gets
    ``sched.lr_at(step) * group.get("lr_mult", 1.0)``, so ratios between groups (muP,
    Muon vs AdamW, decoupled embedding LR) hold at every step and after every resume.
    """
    base = None
    out = []
    for group in param_groups:
        max_lr = group.get("max_lr")
        min_lr = group.get("min_lr")
        if max_lr is not None or min_lr is not None:
            peak = sched.peak_lr if max_lr is None else max_lr
            out.append(sched.with_peak(peak, min_lr).lr_at(step))
        else:
            if base is None:
                base = sched.lr_at(step)
            out.append(base * group.get("lr_mult", 1.0))
    return out
