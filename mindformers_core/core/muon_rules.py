"""Muon's construction rules as pure functions (no MindSpore) with upstream's messages.

``optim.muon.Muon`` calls them (a direct caller sees upstream's ``ValueError``/``TypeError``);
``config.optimizer`` wraps them as ``ConfigError("optimizer.<field>", message)``, so each rule
is written once. The Newton-Schulz schedule rules are ``core.ns_schedule``.
"""
from __future__ import annotations

from typing import Any

__all__ = ["check_muon_swap", "check_memory_budget", "check_qk_clip_threshold"]


def check_muon_swap(swap: Any) -> None:
    """Muon keeps its state on the device (upstream refuses ``swap``)."""
    if swap:
        raise ValueError("Muon does not support swap.")


def check_memory_budget(name: str, value: Any) -> None:
    """``phase0_batch_memory_gb`` / ``ns_batch_memory_gb`` / ``phase4_batch_memory_gb``: a
    positive number of GB."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of GB, but got {type(value).__name__}.")
    if not value > 0:
        raise ValueError(f"{name} must be positive, but got {value}.")


def check_qk_clip_threshold(enabled: bool, threshold: Any) -> None:
    """With QK-Clip on, the max-logit threshold must be a positive number."""
    if enabled and not (isinstance(threshold, (int, float)) and not isinstance(threshold, bool)
                        and threshold > 0):
        raise ValueError(f"qk_clip_threshold must be positive, got {threshold!r}.")
