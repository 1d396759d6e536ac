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

import re
from dataclasses import dataclass
from typing import Literal, Optional

from .errors import ConfigError
from .schema import Section

__all__ = ["ContextConfig", "parse_memory_size", "check_context_vs_training"]

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GB|MB)\s*$")


def parse_memory_size(text: str, path: str) -> float:
    """Bytes of a size written like ``"59GB"`` or ``"1024MB"`` (MindSpore's format)."""
    match = _MEMORY.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(path, f"expected a positive size like '59GB' or '1024MB', got {text!r}")
    scale = 1024 ** 3 if match.group(2) == "GB" else 1024 ** 2
    return float(match.group(1)) * scale


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
