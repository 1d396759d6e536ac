"""Value checks and step resolution shared by every LR schedule.

Pure Python (no MindSpore, no numpy) so that ``run_mindformer.py --check`` stays fast.
Every failure is a :class:`~mindformers_core.config.errors.ConfigError` whose path is the
dotted key, e.g. ``lr_scheduler.warmup_steps: must be an int >= 0, got -1``.

Number rules (DESIGN.md §5.1): ints are accepted for float fields, ``bool`` is never a
number, NaN and +-inf are rejected.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Optional

from ...config.errors import ConfigError
from ...config.schema import type_name

__all__ = ["as_float", "as_int", "as_choice", "resolve_steps"]


def _fmt(x: float) -> str:
    return repr(int(x)) if isinstance(x, float) and x.is_integer() and abs(x) < 1e15 else repr(x)


def as_float(value: Any, path: str, *, lo: Optional[float] = 0.0, hi: Optional[float] = None,
             lo_open: bool = False, required: bool = False, what: str = "") -> Optional[float]:
    """``value`` as a finite float in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``).

    ``None`` passes through unless ``required``. ``what`` names the field in the message of
    a required value (``"the peak learning rate"``).
    """
    if value is None:
        if required:
            raise ConfigError(path, f"required{(': ' + what) if what else ''}")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, f"expected a number, got {type_name(value)} ({value!r})")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(path, f"must be a finite number, got {value!r}")
    low_bad = lo is not None and (value <= lo if lo_open else value < lo)
    high_bad = hi is not None and value > hi
    if low_bad or high_bad:
        if hi is None:
            raise ConfigError(path, f"must be {'>' if lo_open else '>='} {_fmt(lo)}, got {value!r}")
        left = "(" if lo_open else "["
        raise ConfigError(path, f"must be in {left}{_fmt(lo)}, {_fmt(hi)}], got {value!r}")
    return value


def as_int(value: Any, path: str, *, lo: int = 0, required: bool = False,
           what: str = "") -> Optional[int]:
    """``value`` as an int ``>= lo``; a float such as ``5.0`` is refused with a hint."""
    if value is None:
        if required:
            raise ConfigError(path, f"required{(': ' + what) if what else ''}")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        hint = ""
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            hint = f"; write {int(value)}"
        raise ConfigError(path, f"must be an int >= {lo}, got {type_name(value)} ({value!r}){hint}")
    if value < lo:
        raise ConfigError(path, f"must be an int >= {lo}, got {value}")
    return int(value)


def as_choice(value: Any, path: str, choices: tuple) -> str:
    """``value`` as one of the strings ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(path, f"must be one of {list(choices)}, got {value!r}")
    return value


def resolve_steps(steps: Optional[int], ratio: Optional[float], total_steps: int, tag: str,
                  path: str, default: Optional[int] = 0) -> Optional[int]:
    """A step count given either absolutely (``{tag}_steps``) or as ``{tag}_ratio`` of total.

    Upstream ``_get_lr_steps``: the ratio wins when both are set (we warn), and the result is
    ``int(total_steps * ratio)``, i.e. truncation (``int(100 * 0.29) == 28``).
    Both values must already be checked (``as_int`` / ``as_float`` in [0, 1]).
    """
    if ratio is not None:
        resolved = int(total_steps * ratio)
        if steps is not None:
            warnings.warn(
                f"{path}: both {tag}_ratio ({ratio!r}) and {tag}_steps ({steps}) are set; "
                f"{tag}_ratio wins: {tag} = int({total_steps} * {ratio!r}) = {resolved} steps "
                f"({tag}_steps is ignored, set only one of them)", UserWarning, stacklevel=4)
        return resolved
    if steps is not None:
        return steps
    return default
