"""Step resolution shared by every LR schedule.

Pure Python (no MindSpore, no numpy) so that ``run_mindformer.py --check`` stays fast. The
number checks (``as_float``, ``as_int``, ``as_choice``) are the package-wide rules of
:mod:`mindformers_core.errors`; every failure is a ``ConfigError`` whose path is the dotted
key, e.g. ``lr_scheduler.warmup_steps: must be an int >= 0, got -1``.
"""
from __future__ import annotations

import warnings
from typing import Optional

from ...errors import as_choice, as_float, as_int

__all__ = ["as_float", "as_int", "as_choice", "resolve_steps"]


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
