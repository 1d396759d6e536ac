"""`recompute:` section (upstream's keys).

``mode: full`` recomputes the decoder layers of ``full_recompute_layer`` (null = all; a count,
or a list of indices and ``"a-b"`` ranges such as ``[0-3]``) in the backward. ``mode: select``
(upstream's name; ``selective`` reads the same) recomputes the parts of layers that
``select_module`` names (``{"layers.*.self_attention.*": ["0-3"], ...}``; the parts and the
matching rule are ``core/recompute.py``'s). Both are checked against ``model.num_layers`` by
``RunConfig.validate``. Not implemented, so only their off values are accepted (anything else
is a ConfigError naming the field): ``exclude_op``, older branches' ``select_recompute`` and
``full_recompute: True`` (use ``mode: full``). Off: ``mode`` "None" (upstream's default) or
null.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..core.recompute import (SELECT_MODES, check_mode, recompute_layers,
                              selected_modules)
from ..errors import ConfigError, checked
from .compat.noop import require_noop
from .schema import Section

__all__ = ["RecomputeConfig"]

_FEATURE = "older branches' select_recompute (use mode: select with select_module)"


@dataclass
class RecomputeConfig(Section):
    mode: Optional[str] = "None"
    full_recompute_layer: Any = None
    select_module: Any = None
    exclude_op: Any = None
    full_recompute: bool = False      # older branches (r1.9)
    select_recompute: bool = False    # older branches (r1.9)

    def validate(self, path: str) -> None:
        checked(f"{path}.mode", check_mode, self.mode)
        if self.select_module not in (None, [], {}, ()) and self.mode not in SELECT_MODES:
            raise ConfigError(f"{path}.select_module", f"is read by mode: select only, got mode "
                                                       f"{self.mode!r}")
        if self.exclude_op is not None and self.exclude_op not in ([], {}, ()):
            require_noop(f"{path}.exclude_op", self.exclude_op, (None,),
                         "excluding operators from recompute")
        require_noop(f"{path}.select_recompute", self.select_recompute, (False,), _FEATURE)
        require_noop(f"{path}.full_recompute", self.full_recompute, (False,),
                     "older branches' full_recompute (use mode: full)")

    def layers(self, num_layers: int, path: str = "recompute") -> list:
        """The decoder layers to recompute (ConfigError naming the field)."""
        return checked(f"{path}.full_recompute_layer", recompute_layers, self.mode,
                       self.full_recompute_layer, num_layers)

    def modules(self, num_layers: int, path: str = "recompute") -> dict:
        """``{layer: parts}`` of ``mode: select`` (ConfigError naming the field)."""
        return checked(f"{path}.select_module", selected_modules, self.mode, self.select_module,
                       num_layers)
