"""Float32 numpy re-implementation of the MindFormers 2.1.0 LR formulas (test reference).

Written from upstream's formulas (``mindformers/core/lr/lr_schedule.py`` of MindFormers 2.1.0),
independently of ``mindformers_core.core.lr``: every quantity is float32 like upstream's
graph, and the upstream defects are reproduced (negative / NaN / rising values), so tests
can compare only where upstream is sane and show where we deliberately differ.

``upstream_curve(type, params, total_steps, steps) -> np.ndarray[float32]``; ``params`` use
upstream keyword names (``learning_rate``, ``warmup_steps``, ``lr_end``, ``base_lr``, ...).

It follows upstream's op order and dtypes: Python-float constants meet float32 tensors as
float32, but ``learning_rate - warmup_lr_init`` (two Python floats) is computed in float64
first, while ``learning_rate - lr_end`` is a float32 subtraction where ``lr_end`` is stored as a
float32 tensor (Cosine*, Polynomial, WSD) and float64 where it is a Python float (CoolDown's
``lr_end1``, the annealing schedules' ``eta_min``). ``cos`` and ``log`` are the correctly
rounded float32 values (MindSpore's CPU kernels give those; numpy's float32 ``cos`` is off by an
ulp on ~15% of arguments). ``test_lr_compat.py`` checks this file against values MindFormers
itself computed (``data/mindformers_2_1_0_curves.json``).
"""
import numpy as np

f32 = np.float32
PI = np.pi


def _steps(steps, ratio, total, default=None):
    if ratio is not None:
        return int(total * ratio)
    return default if steps is None else steps


def _warmup(s, W, eta, init):
    return f32(init) + f32(eta - init) * (s / f32(W))


def _cos(x):
    return np.cos(np.asarray(x, f32).astype(np.float64)).astype(f32)


def _log(x):
    return np.log(np.asarray(x, f32).astype(np.float64)).astype(f32)


def upstream_curve(kind, p, T, steps):
    if kind == "LearningRateWiseLayer":
        inner = dict(p["base_lr"])
        return f32(p["lr_scale"]) * upstream_curve(inner.pop("type"), inner, T, steps)
    s = np.asarray(steps, dtype=np.int64).astype(f32)
    eta = p.get("learning_rate", 1e-5)
    init = p.get("warmup_lr_init", 0.0)
    W = _steps(p.get("warmup_steps"), p.get("warmup_ratio"), T, 0)
    Wf = f32(W)
    out = np.empty_like(s)
    warm = (s < Wf) if W != 0 else np.zeros(s.shape, bool)
    with np.errstate(all="ignore"):
        wv = _warmup(s, max(W, 1), eta, init)
        if kind == "ConstantWarmUpLR":
            out = np.where(warm, wv, f32(eta))
        elif kind == "LinearWithWarmUpLR":
            lin = f32(max(1, T - W))
            out = np.where(warm, wv, f32(eta) * np.maximum(f32(0), (f32(T) - s) / lin))
        elif kind in ("CosineWithWarmUpLR", "CosineWithRestartsAndWarmUpLR"):
            lr_end = f32(p.get("lr_end", 0.0))
            c = p.get("num_cycles", 0.5 if kind == "CosineWithWarmUpLR" else 1.0)
            if kind == "CosineWithWarmUpLR" and p.get("decay_ratio") is not None:
                D = int(T * p["decay_ratio"])
            elif p.get("decay_steps") is not None:
                D = max(1, p["decay_steps"])
            else:
                D = max(1, T)
            prog = (s - Wf) / f32(max(1, T - W))
            if kind == "CosineWithWarmUpLR":
                pct = np.maximum(f32(0), f32(0.5) * (f32(1) + _cos(f32(PI * c * 2.0) * prog)))
                after = lr_end + (f32(eta) - lr_end) * pct
            else:
                frac = np.mod(f32(c) * prog, f32(1))
                pct = np.maximum(f32(0), f32(0.5) * (f32(1) + _cos(f32(PI) * frac)))
                after = np.where(prog < f32(1), lr_end + (f32(eta) - lr_end) * pct,
                                 f32(0))
            out = np.where(s >= f32(D), lr_end, np.where(warm, wv, after))
        elif kind == "PolynomialWithWarmUpLR":
            lr_end = p.get("lr_end", 1e-7)
            power = p.get("power", 1.0)
            Dp = max(1, p["decay_steps"]) if p.get("decay_steps") is not None else max(1, T - W)
            base = f32(1) - (s - Wf) / f32(Dp)
            decay = (f32(eta) - f32(lr_end)) * np.power(base, f32(power)) + f32(lr_end)
            after = f32(eta) * (decay / f32(eta))
            out = np.where(warm, wv, np.where(s > f32(T), f32(lr_end), after))
        elif kind == "WarmUpStableDecayLR":
            lr_end = p.get("lr_end", 1e-7)
            S = _steps(p.get("decay_start_steps"), p.get("decay_start_ratio"), T)
            stable = f32(eta) * (s / s)
            dec = f32(eta) - (f32(eta) - f32(lr_end)) * ((s - f32(S)) / f32(T - S))
            out = np.where(warm, wv, np.where(s < f32(S), stable, dec))
        elif kind == "ConstantWithCoolDownLR":
            K = max(0, p.get("keep_steps", 0))
            F = max(0, p.get("final_steps", 0))
            c = p.get("num_cycles", 0.5)
            e1 = p.get("lr_end1", 0.0)
            e2 = p.get("lr_end2") or e1
            if p.get("decay_ratio") is not None:
                D = int(T * p["decay_ratio"])
            elif p.get("decay_steps") is not None:
                D = max(1, p["decay_steps"])
            else:
                D = max(1, T)
            x = (s - f32(W + K)) / f32(max(D, 1))
            pct = np.maximum(f32(0), f32(0.5) * (f32(1) + _cos(f32(2 * PI * c) * x)))
            cos_part = f32(e1) + f32(eta - e1) * pct
            out = np.select([warm, s < W + K, s < W + K + D, s < W + K + D + F],
                            [wv, np.full_like(s, eta), cos_part, np.full_like(s, e1)],
                            np.full_like(s, e2))
        elif kind == "CosineAnnealingLR":
            base, emin, tm = p["base_lr"], p.get("eta_min", 0.0), p["t_max"]
            pct = np.maximum(f32(0), f32(0.5) * (f32(1) + _cos(f32(PI) * s / f32(tm))))
            out = f32(emin) + f32(base - emin) * pct
        elif kind == "CosineAnnealingWarmRestarts":
            base, emin = p["base_lr"], p.get("eta_min", 0.0)
            t0, m = p["t_0"], p.get("t_mult", 1)
            if m == 1:
                t_cur = s - np.floor(s / f32(t0)) * f32(t0)
                t_i = np.full_like(s, t0)
            else:
                idx = np.floor(_log(s / f32(t0) * f32(m - 1.0) + f32(1)) / f32(np.log(m)))
                q = np.power(f32(m), idx)
                start = f32(t0) * (f32(1) - q) / f32(1 - m)
                t_i = f32(t0) * q
                t_cur = s - start
            t_cur = np.where(s < f32(t0), s, t_cur)
            t_i = np.where(s < f32(t0), f32(t0), t_i)
            pct = np.maximum(f32(0), f32(0.5) * (f32(1) + _cos(f32(PI) * t_cur / t_i)))
            out = f32(emin) + f32(base - emin) * pct
        else:
            raise KeyError(kind)
    return np.asarray(out, dtype=f32)
