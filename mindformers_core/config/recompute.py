"""`recompute:` section (upstream's keys). Recompute itself is not implemented yet, so only the
values that turn it off are accepted; anything else is a ConfigError naming the field.

Off values: ``mode`` "None" (upstream's default) or null, ``full_recompute_layer`` /
``select_module`` / ``exclude_op`` null or empty, and older branches' ``full_recompute`` /
``select_recompute`` False.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .noop import require_noop
from .schema import Section

__all__ = ["RecomputeConfig"]

_FEATURE = "activation recompute"


@dataclass
class RecomputeConfig(Section):
    mode: Optional[str] = "None"
    full_recompute_layer: Any = None
    select_module: Any = None
    exclude_op: Any = None
    full_recompute: bool = False      # older branches (r1.9)
    select_recompute: bool = False    # older branches (r1.9)

    def validate(self, path: str) -> None:
        require_noop(f"{path}.mode", self.mode, ("None", None), _FEATURE)
        for name in ("full_recompute_layer", "select_module", "exclude_op"):
            value = getattr(self, name)
            if value is not None and value not in ([], {}, ()):
                require_noop(f"{path}.{name}", value, (None,), _FEATURE)
        for name in ("full_recompute", "select_recompute"):
            require_noop(f"{path}.{name}", getattr(self, name), (False,), _FEATURE)
