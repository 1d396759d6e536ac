"""Independent numpy references for the optimizer tests (no MindSpore)."""
import numpy as np


def numpy_adamw_step(p, m, v, g, t, lr, b1, b2, eps, wd, decoupled=True):
    """torch.optim.AdamW (single-tensor path) arithmetic in float64; returns new (p, m, v)."""
    p, m, v, g = (np.asarray(x, np.float64) for x in (p, m, v, g))
    if decoupled:
        # torch multiplies an fp32 tensor by the scalar (1 - lr*wd) rounded to fp32; that
        # rounding (2.6e-8 for 0.998) is systematic over steps, so mirror it.
        p = p * float(np.float32(1.0 - lr * wd))
    else:
        g = g + wd * p
    m = b1 * m + (1.0 - b1) * g
    v = b2 * v + (1.0 - b2) * g * g
    bc1 = 1.0 - b1 ** t
    bc2 = 1.0 - b2 ** t
    p = p - (lr / bc1) * m / (np.sqrt(v) / np.sqrt(bc2) + eps)
    return p, m, v


def numpy_sgd_step(p, buf, g, lr, momentum, wd, nesterov=False):
    """torch.optim.SGD (dampening 0, coupled L2) in float64; buf None before the first step."""
    p, g = np.asarray(p, np.float64), np.asarray(g, np.float64)
    g = g + wd * p
    if momentum != 0.0:
        buf = g.copy() if buf is None else momentum * buf + g
        g = g + momentum * buf if nesterov else buf
    return p - lr * g, buf


def numpy_lion_step(p, m, g, lr, b1, b2, wd):
    """Lion (Chen et al. 2023): c = b1 m + (1-b1) g; p <- p(1 - lr wd) - lr sign(c);
    m <- b2 m + (1-b2) g."""
    p, m, g = (np.asarray(x, np.float64) for x in (p, m, g))
    c = b1 * m + (1.0 - b1) * g
    p = p * (1.0 - lr * wd) - lr * np.sign(c)
    m = b2 * m + (1.0 - b2) * g
    return p, m


def rel_err(a, b):
    """||a - b||_2 / ||b||_2: error relative to the tensor's scale (fp32 storage rounds each
    element to ~6e-8 relative every step, so element-wise ratios near 0 are meaningless)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
