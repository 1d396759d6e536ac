"""Float32 rounding in pure Python, to reproduce MindFormers' float32 LR arithmetic.

Upstream evaluates every schedule as float32 MindSpore ops on 0-d tensors. Each IEEE binary op
(+ - * /) on two float32 values, computed in float64 and then rounded once to float32, gives
exactly the float32 result (float64 has more than 2*24 + 2 bits, so the double rounding is
harmless). ``cos`` and ``log`` are rounded the same way: MindSpore's CPU scalar ``Cos`` matched
the correctly rounded float32 cosine on every one of 400,000 arguments we checked, its scalar
``Log`` in all but 1 of 400 (1 ulp). ``x ** p`` for non-integer ``p`` can differ by 1-2 ulps
(float32 ``powf``); that is harmless where it is used (no cancellation follows).

Schedules call :func:`f32` after each upstream op whose rounding can show beyond the
compatibility tolerance (abs 1e-9 or rel 1e-6); the return value is a Python float holding a
float32 value. No numpy or mindspore here: ``lr_at`` must stay a few hundred nanoseconds.
"""
from __future__ import annotations

import math
import struct

from ...config.errors import ConfigError

__all__ = ["f32", "f32_const", "F32_MAX"]

_F32 = struct.Struct("f")
_pack = _F32.pack
_unpack = _F32.unpack

#: largest finite float32
F32_MAX = 3.4028234663852886e38


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (ties to even), returned as a Python float.

    ``x`` must be finite and below :data:`F32_MAX` in magnitude (schedules check their
    constants with :func:`f32_const`, so every intermediate value stays in range)."""
    return _unpack(_pack(x))[0]


def f32_const(value: float, path: str) -> float:
    """A config constant as upstream stores it (float32); ConfigError when it overflows."""
    if not math.isfinite(value) or abs(value) > F32_MAX:
        raise ConfigError(path, f"must be representable as float32 (|x| <= {F32_MAX:.6g}), "
                                f"got {value!r}")
    return f32(value)
