"""Upstream PyNative sections of features that do not exist here, accepted with their off
values only (``noop.require_noop`` names the field otherwise):

* ``recompute_comm:`` communication recompute: ``enable: False``, no ``select_module``;
* ``swap:`` activation offload: ``enable: False``, no ``layer_swap`` / ``op_swap``
  (``default_prefetch`` >= 0 is read only when swapping, as upstream);
* ``lora_config:`` LoRA fine-tuning: null, or an empty ``target_modules`` (no layer adapted);
  the rank / alpha / dropout / init keys are range-checked and unused then, as upstream.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .noop import require_noop
from ..schema import Section, check_range

__all__ = ["RecomputeCommConfig", "SwapConfig", "LoraConfig"]


def _require_empty(path: str, value: Any, feature: str) -> None:
    if value is not None and value not in ([], {}, ()):
        require_noop(path, value, (None,), feature)


@dataclass
class RecomputeCommConfig(Section):
    enable: bool = False
    select_module: Any = None

    def validate(self, path: str) -> None:
        require_noop(f"{path}.enable", self.enable, (False,), "communication recompute")
        _require_empty(f"{path}.select_module", self.select_module, "communication recompute")


@dataclass
class SwapConfig(Section):
    enable: bool = False
    default_prefetch: int = 1
    layer_swap: Any = None
    op_swap: Any = None

    def validate(self, path: str) -> None:
        require_noop(f"{path}.enable", self.enable, (False,), "activation swap (offload)")
        check_range(self.default_prefetch, f"{path}.default_prefetch", lo=0)
        for name in ("layer_swap", "op_swap"):
            _require_empty(f"{path}.{name}", getattr(self, name), "activation swap (offload)")


@dataclass
class LoraConfig(Section):
    target_modules: str = ""
    exclude_layers: Optional[str] = None
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_a_std: float = 0.01
    lora_b_std: float = 0.0

    def validate(self, path: str) -> None:
        require_noop(f"{path}.target_modules", self.target_modules, ("",), "LoRA fine-tuning")
        check_range(self.lora_rank, f"{path}.lora_rank", lo=1)
        check_range(self.lora_dropout, f"{path}.lora_dropout", lo=0, hi=1, hi_open=True)
        for name in ("lora_a_std", "lora_b_std"):
            check_range(getattr(self, name), f"{path}.{name}", lo=0)
