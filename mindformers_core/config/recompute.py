"""`recompute:` section (upstream's keys).

``mode: full`` recomputes the decoder layers of ``full_recompute_layer`` (null = all; a count,
or a list of indices and ``"a-b"`` ranges such as ``[0-3]``) in the backward
(``core/recompute.py``; the layers are checked against ``model.num_layers`` by
``RunConfig.validate``). ``mode: selective`` and the selective keys (``select_module``,
``exclude_op``, older branches' ``select_recompute``) are not implemented: only their off
values are accepted, anything else is a ConfigError naming the field. Off: ``mode`` "None"
(upstream's default) or null; older branches' ``full_recompute: True`` is not implemented
either (use ``mode: full``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..errors import ConfigError
from .noop import require_noop
from .schema import Section

__all__ = ["RecomputeConfig"]

_FEATURE = "selective recompute"


@dataclass
class RecomputeConfig(Section):
    mode: Optional[str] = "None"
    full_recompute_layer: Any = None
    select_module: Any = None
    exclude_op: Any = None
    full_recompute: bool = False      # older branches (r1.9)
    select_recompute: bool = False    # older branches (r1.9)

    def validate(self, path: str) -> None:
        require_noop(f"{path}.mode", self.mode, ("None", None, "full"), "selective recompute")
        for name in ("select_module", "exclude_op"):
            value = getattr(self, name)
            if value is not None and value not in ([], {}, ()):
                require_noop(f"{path}.{name}", value, (None,), _FEATURE)
        require_noop(f"{path}.select_recompute", self.select_recompute, (False,), _FEATURE)
        require_noop(f"{path}.full_recompute", self.full_recompute, (False,),
                     "older branches' full_recompute (use mode: full)")

    def layers(self, num_layers: int, path: str = "recompute") -> list:
        """The decoder layers to recompute (ConfigError naming the field)."""
        from ..core.recompute import recompute_layers
        try:
            return recompute_layers(self.mode, self.full_recompute_layer, num_layers)
        except ValueError as exc:
            raise ConfigError(f"{path}.full_recompute_layer", str(exc)) from None
