"""Memory sizes written the way MindSpore's ``max_device_memory`` is (``"59GB"``, ``"1024MB"``);
pure Python, shared by the config layer and the memory planner."""
from __future__ import annotations

import re

from ..errors import ConfigError

__all__ = ["parse_memory_size"]

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GB|MB)\s*$")


def parse_memory_size(text: str, path: str) -> float:
    """Bytes of a size written like ``"59GB"`` or ``"1024MB"`` (MindSpore's format)."""
    match = _MEMORY.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(path, f"expected a positive size like '59GB' or '1024MB', got {text!r}")
    scale = 1024 ** 3 if match.group(2) == "GB" else 1024 ** 2
    return float(match.group(1)) * scale
