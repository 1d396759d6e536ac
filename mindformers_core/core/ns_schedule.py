"""Newton-Schulz coefficient schedules (pure Python, no MindSpore).

A schedule is a list of ``(a, b, c)`` triples, one per Newton-Schulz iteration; iteration k
computes ``X <- a_k X + (b_k A + c_k A @ A) @ X`` with ``A = X @ X^T``.

``normalize_ns_schedule(coeffs, ns_steps)`` accepts the two YAML forms of
``optimizer.ns_coefficients`` (MindFormers ``_normalize_ns_schedule``) and raises ``ValueError``
with upstream's messages:

* flat ``[a, b, c]``: the triple repeated ``ns_steps`` times;
* segmented ``[[[a, b, c], count], ...]``: each triple repeated ``count`` times; ``ns_steps``
  is ignored (the schedule length is ``sum(count)``).

``NS_COEFFICIENT_PRESETS`` holds the named coefficient sets (``optimizer.muon_coefficient_type``,
the names of Megatron's emerging-optimizers table); ``preset_schedule(name, ns_steps)`` cycles a
preset over ``ns_steps`` iterations as Megatron does.

It lives in ``core`` (pure Python) because the config layer checks the schedule at load and
the optimizers run it; ``core.ns_schedule`` re-exports it.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Any, List, Tuple

from ..errors import show

__all__ = ["DEFAULT_NS_COEFFICIENTS", "NS_COEFFICIENT_PRESETS", "normalize_ns_schedule",
           "preset_schedule", "MAX_NS_STEPS"]

Triple = Tuple[float, float, float]

#: Longest schedule accepted (a guard against building a huge list from a typo like 5e9;
#: practical schedules use 5-10 steps).
MAX_NS_STEPS = 1000

#: Keller Jordan's quintic coefficients, MindFormers' default ``ns_coefficients``.
DEFAULT_NS_COEFFICIENTS: Triple = (3.4445, -4.7750, 2.0315)

#: Named coefficient sets (Megatron emerging-optimizers ``_COEFFICIENT_SETS``, DeepSeek-V4).
NS_COEFFICIENT_PRESETS = {
    "simple": [DEFAULT_NS_COEFFICIENTS],
    "quintic": [
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ],
    "polar_express": [
        (7.2086, -15.5131, 9.0178),
        (3.9623, -2.5813, 0.4542),
        (3.9466, -2.5765, 0.4544),
        (3.8991, -2.5671, 0.4566),
        (3.7186, -2.5308, 0.4653),
        (3.1390, -2.3073, 0.4733),
        (2.1715, -1.5246, 0.3885),
        (1.8648, -1.2224, 0.3577),
    ],
    "aol": [
        (4.0098, -7.0585, 2.4635),
        (3.4585, -5.5479, 2.5959),
        (2.7573, -3.2939, 1.4254),
        (2.7215, -3.0494, 1.3169),
    ],
    # DeepSeek-V4: 8 steps of the simple triple, then 2 steps of (2, -1.5, 0.5).
    "deepseekv4": [DEFAULT_NS_COEFFICIENTS] * 8 + [(2.0, -1.5, 0.5)] * 2,
}


def _is_number(x: Any) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def _finite(x: Real) -> bool:
    """A finite number that fits a float (a 400-digit YAML int does not)."""
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def _triple(values: Any) -> Triple:
    """Three finite numbers as floats; ValueError otherwise (caller adds the context)."""
    if not isinstance(values, (list, tuple)) or len(values) != 3:
        raise ValueError("not a 3-element triple")
    if not all(_is_number(v) and _finite(v) for v in values):
        raise ValueError(f"coefficients must be finite numbers, got {show(values)}")
    return (float(values[0]), float(values[1]), float(values[2]))


def normalize_ns_schedule(coeffs: Any, ns_steps: Any) -> List[Triple]:
    """One ``(a, b, c)`` triple per Newton-Schulz iteration (see the module docstring)."""
    if not isinstance(coeffs, (list, tuple)) or len(coeffs) == 0:
        raise ValueError(f"ns_coefficients must be a non-empty list/tuple, got {show(coeffs)}.")
    if _is_number(coeffs[0]):  # flat form; a leading bool goes down the segmented path
        if len(coeffs) != 3:
            raise ValueError(f"flat ns_coefficients must have 3 elements, got {show(coeffs)}.")
        if not _is_number(ns_steps) or int(ns_steps) != ns_steps or ns_steps <= 0:
            raise ValueError(f"ns_steps must be positive, got {ns_steps!r}.")
        try:
            triple = _triple(coeffs)
        except ValueError:
            raise ValueError(f"flat ns_coefficients must hold 3 finite numbers, got {show(coeffs)}.")
        _check_length(int(ns_steps))
        return [triple] * int(ns_steps)
    schedule: List[Triple] = []
    for i, seg in enumerate(coeffs):
        if not isinstance(seg, (list, tuple)) or len(seg) != 2:
            raise ValueError(
                f"segmented ns_coefficients entry {i} must be [[a, b, c], count], got {show(seg)}.")
        trip, count = seg
        if not isinstance(trip, (list, tuple)) or len(trip) != 3:
            raise ValueError(
                f"segmented ns_coefficients entry {i} must hold a 3-element triple, got {show(trip)}.")
        try:
            triple = _triple(trip)
        except ValueError:
            raise ValueError(f"segmented ns_coefficients entry {i} must hold 3 finite numbers, "
                             f"got {show(trip)}.")
        # upstream does int(count); we refuse what int() would silently truncate or reject
        if not _is_number(count) or not _finite(count) or int(count) != count \
                or int(count) <= 0:
            raise ValueError(f"segmented ns_coefficients entry {i} count must be positive, "
                             f"got {show(count)}.")
        _check_length(len(schedule) + int(count))
        schedule.extend([triple] * int(count))
    return schedule


def _check_length(n: int) -> None:
    if n > MAX_NS_STEPS:
        raise ValueError(f"Newton-Schulz schedule of {n} steps is longer than the supported "
                         f"maximum ({MAX_NS_STEPS}).")


def preset_schedule(name: str, ns_steps: int) -> List[Triple]:
    """The named preset cycled over ``ns_steps`` iterations (Megatron's ``mode="cycle"``)."""
    if name not in NS_COEFFICIENT_PRESETS:
        raise ValueError(f"unknown Newton-Schulz coefficient preset {name!r}; valid: "
                         f"{sorted(NS_COEFFICIENT_PRESETS)}")
    if not _is_number(ns_steps) or int(ns_steps) != ns_steps or ns_steps <= 0:
        raise ValueError(f"ns_steps must be positive, got {ns_steps!r}.")
    _check_length(int(ns_steps))
    preset = NS_COEFFICIENT_PRESETS[name]
    return [preset[k % len(preset)] for k in range(int(ns_steps))]
