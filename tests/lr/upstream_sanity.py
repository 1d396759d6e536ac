"""Where an upstream (MindFormers 2.1.0) curve is *sane*, so ours must equal it.

The rule the compat tests skip by (where we differ instead: docs/differences.md, rows 16-17):

* a value that is NaN, infinite or negative is insane;
* decaying schedules have an "after the decay" region starting at step ``E`` (Linear: ``T``;
  Cosine and CosineWithRestarts: ``min(D, T)``; Polynomial: ``min(W + Dp, T)`` for
  ``power > 0``; WSD: ``max(S, T)``). From ``E`` on, a value above the lowest value since
  ``E - 1`` (the lr rises again), or below the floor (``lr_end``; 0 for Linear) by more than the
  tolerance is insane -- upstream climbs back, drops to 0 below ``lr_end`` or falls through it
  toward negative values there, where ours holds the floor;
* once a point after ``E`` is insane, every later point is (ours holds, upstream may come back).

Everything else (warmup, the formula's own shape inside the decay, the periodic annealing
schedules, CoolDown's phases) is sane and must match within abs 1e-9 or rel 1e-6.
"""
import math

ABS_TOL = 1e-9
REL_TOL = 1e-6

DECAYING = ("LinearWithWarmUpLR", "CosineWithWarmUpLR", "CosineWithRestartsAndWarmUpLR",
            "PolynomialWithWarmUpLR", "WarmUpStableDecayLR")


def _steps(steps, ratio, total, default=None):
    if ratio is not None:
        return int(total * ratio)
    return default if steps is None else steps


def decay_end_and_floor(kind, p, T):
    """(E, floor) of a decaying schedule (see the module docstring), else (None, None)."""
    if kind == "LearningRateWiseLayer":
        inner = dict(p["base_lr"])
        E, floor = decay_end_and_floor(inner.pop("type"), inner, T)
        return E, (None if floor is None else floor * p["lr_scale"])
    if kind not in DECAYING:
        return None, None
    W = _steps(p.get("warmup_steps"), p.get("warmup_ratio"), T, 0)
    if kind == "LinearWithWarmUpLR":
        return T, 0.0
    if kind in ("CosineWithWarmUpLR", "CosineWithRestartsAndWarmUpLR"):
        if kind == "CosineWithWarmUpLR" and p.get("decay_ratio") is not None:
            D = int(T * p["decay_ratio"])
        elif p.get("decay_steps") is not None:
            D = max(1, p["decay_steps"])
        else:
            D = max(1, T)
        return min(D, T), p.get("lr_end", 0.0)
    if kind == "PolynomialWithWarmUpLR":
        Dp = max(1, p["decay_steps"]) if p.get("decay_steps") is not None else max(1, T - W)
        E = min(W + Dp, T) if p.get("power", 1.0) > 0 else T
        return E, p.get("lr_end", 1e-7)
    S = _steps(p.get("decay_start_steps"), p.get("decay_start_ratio"), T)
    return max(S, T), p.get("lr_end", 1e-7)


def close(a, b):
    """The compatibility tolerance: abs 1e-9 or rel 1e-6."""
    return abs(a - b) <= ABS_TOL or abs(a - b) <= REL_TOL * abs(b)


def sane_mask(kind, p, T, values):
    """``[bool]``: which upstream values (steps 0..len-1) ours must match."""
    E, floor = decay_end_and_floor(kind, p, T)
    out, broken, low = [], False, math.inf
    for s, v in enumerate(values):
        ok = math.isfinite(v) and v >= 0.0
        if E is not None and s >= E and ok and not broken:
            if s == E and E >= 1:
                low = values[E - 1] if math.isfinite(values[E - 1]) else math.inf
            tol = max(ABS_TOL, REL_TOL * abs(v))
            if v > low + tol or v < floor - tol:
                broken = True
            low = min(low, v)
        if E is not None and s >= E and broken:
            ok = False
        out.append(ok)
    return out
