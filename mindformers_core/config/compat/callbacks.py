"""`callbacks:` section: a list of ``{type: Name, ...}`` entries, as upstream.

Only upstream callbacks whose behaviour exists here are accepted (each is the built-in
behaviour upstream adds anyway):

* ``LossCallback``: the per-step loss / lr / norm line and ``metrics.jsonl`` record (its
  upstream parameter ``log_interval`` only with 1: a line every step);
* ``CheckpointCallback``: saving as configured in ``checkpoint:``;
* ``MonitorCallback``: the ``monitor:`` section's records.

Any other type (including upstream's ``MaxLogitsMonitor`` / ``MaxLogitsReset``, which QK-Clip
here replaces with its own max-logit tracking) is an error naming the entry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from ...errors import ConfigError
from .noop import require_noop
from ..schema import Section, closest, type_name

__all__ = ["CallbacksConfig", "CallbackConfig", "KNOWN_CALLBACKS"]

KNOWN_CALLBACKS = ("LossCallback", "CheckpointCallback", "MonitorCallback")


@dataclass
class CallbackConfig(Section):
    type: str = "LossCallback"
    log_interval: int = 1     # LossCallback's

    @classmethod
    def from_dict(cls, data, path: str):
        data = cls.mapping_of(data, path)
        kind = data.get("type")
        if kind not in KNOWN_CALLBACKS:
            hint = closest(str(kind), KNOWN_CALLBACKS)
            msg = (f"callback type {kind!r} has no counterpart in this module; accepted: "
                   f"{list(KNOWN_CALLBACKS)} (built-in behaviour, no parameters)")
            raise ConfigError(f"{path}.type", msg + (f"; did you mean '{hint}'?" if hint else ""))
        if kind != "LossCallback" and "log_interval" in data:
            raise ConfigError(f"{path}.log_interval", f"not a parameter of {kind}")
        return super().from_dict(data, path)

    def validate(self, path: str) -> None:
        require_noop(f"{path}.log_interval", self.log_interval, (1,),
                     "a loss line every log_interval steps")

    def to_dict(self):
        out = super().to_dict()
        if "log_interval" not in self.explicit_keys:
            out.pop("log_interval")
        return out


@dataclass
class CallbacksConfig(Section):
    """The list, kept as a section so the run config loads it like the others."""
    items: List[CallbackConfig] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Any, path: str):
        if isinstance(data, cls):
            return data
        if data is None:
            data = []
        if not isinstance(data, list):
            raise ConfigError(path, f"expected a list of {{type: ...}} entries, got "
                                    f"{type_name(data)} ({data!r})")
        items = [CallbackConfig.from_dict(v, f"{path}[{i}]") for i, v in enumerate(data)]
        obj = cls(items=items)
        object.__setattr__(obj, "_explicit", frozenset(["items"]))
        return obj

    def types(self) -> List[str]:
        return [c.type for c in self.items]

    def to_dict(self) -> List[Dict[str, Any]]:  # type: ignore[override]
        return [c.to_dict() for c in self.items]
