"""`context:` section: the MindSpore context this module uses, applied at the start of a run
(trainer/context.py).

* ``mode``: 1 (PyNative), the only mode of this trainer;
* ``device_target``: ``CPU``, ``Ascend`` or ``GPU``; null = MindSpore's default for the
  installed package;
* ``max_device_memory``: e.g. ``"59GB"`` (upstream's default), passed to MindSpore on devices
  with their own memory (ignored by MindSpore on CPU, where host RAM is the limit);
* ``deterministic``: MindSpore's deterministic kernels, ``"ON"`` / ``"OFF"`` (null = as
  ``training.deterministic`` says); ``"OFF"`` with ``training.deterministic: True`` is an
  error (``check_context_vs_training``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from ..errors import ConfigError
from ..core.memory_size import parse_memory_size
from .schema import Section

__all__ = ["ContextConfig", "parse_memory_size", "check_context_vs_training"]



@dataclass
class ContextConfig(Section):
    mode: int = 1
    device_target: Optional[Literal["CPU", "Ascend", "GPU"]] = None
    max_device_memory: str = "59GB"
    deterministic: Optional[Literal["ON", "OFF"]] = None

    def validate(self, path: str) -> None:
        if self.mode != 1:
            raise ConfigError(f"{path}.mode", f"must be 1 (PyNative), got {self.mode}: graph "
                                              "mode is not supported by this trainer")
        parse_memory_size(self.max_device_memory, f"{path}.max_device_memory")


def check_context_vs_training(context: ContextConfig, training) -> None:
    """Deterministic kernels cannot be both off (context) and on (training)."""
    if context.deterministic == "OFF" and training.deterministic:
        raise ConfigError("context.deterministic", "'OFF' contradicts training.deterministic: "
                                                   "True; remove one of them")
