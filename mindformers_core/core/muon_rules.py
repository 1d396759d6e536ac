"""Muon's construction rules as pure functions (no MindSpore) with upstream's messages.

``optim.muon.Muon`` calls them (a direct caller sees upstream's ``ValueError``/``TypeError``);
``config.optimizer`` wraps them as ``ConfigError("optimizer.<field>", message)``, so each rule
is written once. The Newton-Schulz schedule rules are ``core.ns_schedule``.
"""
from __future__ import annotations

from typing import Any

from ..errors import in_range

__all__ = ["check_muon_swap", "check_memory_budget", "check_qk_clip_threshold", "MUON_RANGES",
           "check_muon_range"]

#: the allowed interval of each numeric Muon knob (``errors.check_range`` keywords); the config
#: layer checks them with ``check_range``, ``Muon`` with :func:`check_muon_range`
MUON_RANGES = {
    "momentum": dict(lo=0.0, hi=1.0, hi_open=True),
    "matched_adamw_rms": dict(lo=0.0, lo_open=True),
    "muon_extra_scale_factor": dict(lo=0.0, lo_open=True),
    "adamw_lr_mult": dict(lo=0.0),
}


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


def check_muon_range(name: str, value: Any) -> None:
    """``value`` of knob ``name`` within :data:`MUON_RANGES` (``ValueError``, Muon's wording:
    ``momentum must be in [0, 1), got 1.0.``)."""
    r = MUON_RANGES[name]
    lo, hi, lo_open, hi_open = r.get("lo"), r.get("hi"), r.get("lo_open", False), \
        r.get("hi_open", False)
    if in_range(value, lo, hi, lo_open, hi_open):
        return
    if hi is not None:
        what = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    elif lo == 0 and lo_open:
        what = "positive"
    else:
        what = f"{'>' if lo_open else '>='} {lo:g}"
    raise ValueError(f"{name} must be {what}, got {value!r}.")
