"""The `context:` section (config/context.py), applied once at the start of a run, before the
first MindSpore op: the device, its memory limit and MindSpore's deterministic kernels.

``max_device_memory`` is passed on devices with their own memory (MindSpore has no such limit
on CPU). ``deterministic: "ON"`` turns deterministic kernels on, as ``training.deterministic``
does; ``"OFF"`` is MindSpore's default (it contradicts ``training.deterministic: True``, a
ConfigError of the config layer).
"""
from __future__ import annotations

from typing import Optional

__all__ = ["apply_context", "context_settings"]


def context_settings(context_cfg, current_target: str) -> dict:
    """What a run sets (pure; tested alone): ``device_target`` (when given),
    ``max_device_memory`` (off CPU) and ``deterministic`` ("ON" only). ``current_target`` is
    MindSpore's backend when ``device_target`` is null."""
    target: Optional[str] = context_cfg.device_target or current_target
    settings = {}
    if context_cfg.device_target is not None:
        settings["device_target"] = target
    if target != "CPU":
        settings["max_device_memory"] = context_cfg.max_device_memory
    if context_cfg.deterministic == "ON":
        settings["deterministic"] = "ON"
    return settings


def apply_context(cfg) -> dict:
    """Apply ``cfg.context`` (a RunConfig's); returns the settings applied."""
    import mindspore as ms
    from .rng import enable_deterministic
    settings = context_settings(cfg.context, ms.get_context("device_target"))
    current = ms.get_context("device_target")
    if settings.get("device_target", current) != current:
        ms.set_device(settings["device_target"])   # it refuses once the runtime is up
    if "max_device_memory" in settings:
        ms.set_context(max_device_memory=settings["max_device_memory"])
    if "deterministic" in settings:
        enable_deterministic()
    return settings
