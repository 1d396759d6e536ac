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

from ...errors import ConfigError

__all__ = ["f32", "f32_exact", "f32_const", "F32_MAX", "PI32", "EXACT_STEPS", "s32",
           "half_one_plus_cos32"]

_F32 = struct.Struct("f")
_pack = _F32.pack
_unpack = _F32.unpack

#: largest finite float32
F32_MAX = 3.4028234663852886e38
#: Veltkamp's splitting constant 2**(53 - 24) + 1
_SPLIT = 536870913.0


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (ties to even), returned as a Python float.

    Veltkamp's splitting ``c = x * (2**29 + 1); c - (c - x)`` keeps the top 24 significant bits
    of ``x`` rounded to nearest: the float32 rounding for every normal float32 magnitude, in
    three float64 operations (half the cost of a ``struct`` round trip, which gave the same
    result on 10**6 test values, 3*10**5 of them exact ties). It does not reproduce float32
    overflow or subnormals (``|x| < 1.2e-38``); schedules check their constants with
    :func:`f32_const`, so values stay far from both (an lr below 1e-38 is 0 for the
    tolerance).
    """
    c = x * _SPLIT
    return c - (c - x)


def f32_exact(x: float) -> float:
    """``x`` rounded to float32 by packing it (reference for :func:`f32`; overflow raises)."""
    return _unpack(_pack(x))[0]


def f32_const(value: float, path: str) -> float:
    """A config constant as upstream stores it (float32); ConfigError when it overflows."""
    if not math.isfinite(value) or abs(value) > F32_MAX:
        raise ConfigError(path, f"must be representable as float32 (|x| <= {F32_MAX:.6g}), "
                                f"got {value!r}")
    return f32_exact(value)


#: ``math.pi`` as upstream multiplies it into a float32 tensor
PI32 = f32(math.pi)
#: steps up to this are exact in float32 (upstream casts the step to float32)
EXACT_STEPS = 1 << 24


def s32(step: int) -> float:
    """The step as upstream's float32 cast of it."""
    return float(step) if step <= EXACT_STEPS else f32(step)


def half_one_plus_cos32(x32: float) -> float:
    """Upstream ``max(0, 0.5 * (1.0 + cos(x)))`` in float32 (``0.5 * y`` is exact and
    ``1 + cos`` is never negative, so the max is a no-op)."""
    return 0.5 * f32(1.0 + f32(math.cos(x32)))
