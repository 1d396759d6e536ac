"""Field-by-field difference between the config saved in a checkpoint and the current one."""
from __future__ import annotations

from typing import Any, Dict, List

__all__ = ["flatten_config", "config_changes", "IGNORED_ON_RESUME"]

#: Fields expected to differ between a run and its resumption; not reported.
IGNORED_ON_RESUME = ("checkpoint.load_path", "checkpoint.load_format", "training.stop_at_step")


def flatten_config(data: Any, prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists are leaves)."""
    if isinstance(data, dict):
        out: Dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten_config(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def config_changes(saved: dict, current: dict, ignore=IGNORED_ON_RESUME) -> List[str]:
    """One line per changed, added or removed field: ``path: old -> new``, sorted by path."""
    old, new = flatten_config(saved), flatten_config(current)
    lines = []
    for key in sorted(set(old) | set(new)):
        if key in ignore:
            continue
        if key not in old:
            lines.append(f"{key}: (absent) -> {new[key]!r}")
        elif key not in new:
            lines.append(f"{key}: {old[key]!r} -> (absent)")
        elif old[key] != new[key]:
            lines.append(f"{key}: {old[key]!r} -> {new[key]!r}")
    return lines
