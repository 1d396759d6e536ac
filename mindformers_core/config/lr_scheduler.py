"""`lr_scheduler:` section: ``type``, ``learning_rate`` and the type's extension fields.

The schedule classes in :mod:`mindformers_core.core.lr` declare which fields each type accepts
(``scheduler_fields(type) -> {field: default}``) and validate values
(``build_lr_scheduler(section, total_steps)``), so there is one source of truth. This section
only checks the structure: ``type`` is a registered name, no key outside the type's fields
(error lists them and the closest), and no ``total_steps`` (it comes from ``training.steps``).
Values are validated by ``RunConfig`` once ``training.steps`` is known.

Extension fields are read as attributes: ``cfg.lr_scheduler.warmup_ratio``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict

from ..errors import ConfigError, as_float, to_float
from .schema import Section

__all__ = ["LrSchedulerConfig", "ABSENT_LR_SCHEDULER"]

#: The section a config without ``lr_scheduler:`` gets. Upstream's ``LrSchedulerConfig`` has no
#: default ``type`` (its empty ``TrainConfig`` fails on it); we take the schedule every upstream
#: PyNative YAML writes (tests/fixtures/upstream_yaml/), ConstantWarmUpLR without warmup, at
#: the field default ``learning_rate`` (upstream's 1e-5). A written section still needs ``type``.
ABSENT_LR_SCHEDULER = {"type": "ConstantWarmUpLR", "warmup_steps": 0}


def _lr_registry():
    # imported lazily: core.lr is pure Python but is written by another package
    from ..core import lr as core_lr
    return core_lr


@dataclass
class LrSchedulerConfig(Section):
    type: str = None  # type: ignore[assignment]  # required
    learning_rate: float = 1e-5
    #: The type's extension fields, defaults filled in (``scheduler_fields(type)``).
    params: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any, path: str):
        data = cls.mapping_of(data, path)
        core_lr = _lr_registry()
        from ..core.lr.base import unknown_field_error
        sched_type = data.get("type")
        core_lr.schedule_class(sched_type, path)  # ConfigError listing the valid names
        if "total_steps" in data:
            raise ConfigError(f"{path}.total_steps",
                              "must not be set: total_steps comes from training.steps "
                              "(set training.steps instead)")
        fields = dict(core_lr.scheduler_fields(sched_type))
        uses_base_lr = "base_lr" in fields and "learning_rate" not in fields
        if uses_base_lr and "learning_rate" in data:
            raise ConfigError(f"{path}.learning_rate",
                              f"{sched_type} takes its peak from base_lr (learning_rate has no "
                              "effect on it); write base_lr instead")
        accepted = set(fields) | {"type"} | (set() if uses_base_lr else {"learning_rate"})
        for key in data:
            if not isinstance(key, str) or key not in accepted:
                raise unknown_field_error(sched_type, key, sorted(accepted), path)
        lr = to_float(data.get("learning_rate", fields.get("learning_rate", 1e-5)),
                      f"{path}.learning_rate")
        params = {k: v for k, v in fields.items() if k != "learning_rate"}
        params.update({k: v for k, v in data.items() if k not in ("type", "learning_rate")})
        obj = cls(type=sched_type, learning_rate=lr, params=params)
        object.__setattr__(obj, "_explicit", frozenset(data.keys()))
        obj.validate(path)
        return obj

    def validate(self, path: str) -> None:
        # the values are checked by core.lr in RunConfig (they need training.steps); here the
        # type-independent rules that need nothing else
        as_float(self.learning_rate, f"{path}.learning_rate", lo=0)

    def __getattr__(self, name: str) -> Any:
        # only called when normal lookup fails: expose extension fields as attributes
        if name.startswith("_") or name == "params":
            raise AttributeError(name)
        params = self.__dict__.get("params", {})
        if name in params:
            return params[name]
        raise AttributeError(f"{type(self).__name__} ({self.type}) has no field {name!r}")

    def as_build_dict(self) -> Dict[str, Any]:
        """What ``build_lr_scheduler`` takes: type, learning_rate, extension fields."""
        fields = _lr_registry().scheduler_fields(self.type)
        if "base_lr" in fields and "learning_rate" not in fields:
            return {"type": self.type, **self.params}
        return {"type": self.type, "learning_rate": self.learning_rate, **self.params}

    def to_dict(self) -> Dict[str, Any]:
        return self.as_build_dict()
