"""How large a loss scale may be: a pure rule, importable without MindSpore (``--check``).

The loss is multiplied by the scale in the model's compute dtype, and the fp32 gradients are
multiplied by ``1 / scale`` afterwards. Two things break when the scale is too large:

* ``1 / scale`` stops being a normal float32 (``1 / 1e38 = 1e-38`` is subnormal, and CPU/NPU
  kernels may flush it to zero or round it differently per run: wrong, nondeterministic
  gradients); and the scaled loss itself overflows;
* in float16 the scale must itself be finite: 65504 is the largest float16.

So a scale may be at most :data:`MAX_FP32_SCALE` (2**64: its inverse 5.4e-20 is far inside
the normal float32 range and a scaled loss or gradient keeps 2**60 of headroom), and at most
65504 when the scale is static and the compute dtype is float16. A dynamic scale starts at
``initial_loss_scale`` and only backs off from overflows, so only the float32 bound applies.
"""
from __future__ import annotations

from typing import Optional

__all__ = ["MAX_FP32_SCALE", "MAX_FP16_SCALE", "max_loss_scale", "loss_scale_problem"]

MAX_FP32_SCALE = 2.0 ** 64
MAX_FP16_SCALE = 65504.0   # numpy.finfo(numpy.float16).max


def max_loss_scale(compute_dtype: str, static: bool) -> float:
    """The largest usable scale for ``compute_dtype`` (static or dynamic scaling)."""
    if static and compute_dtype == "float16":
        return MAX_FP16_SCALE
    return MAX_FP32_SCALE


def loss_scale_problem(opt_cfg, model_cfg) -> Optional[tuple]:
    """``(field, message)`` when the configured scale exceeds :func:`max_loss_scale`."""
    compute = str(getattr(model_cfg, "compute_dtype", "float32"))
    static = getattr(opt_cfg, "loss_scale", None)
    field, value = ("loss_scale", static) if static is not None else \
        ("initial_loss_scale", getattr(opt_cfg, "initial_loss_scale", None))
    if value is None:
        return None
    limit = max_loss_scale(compute, static is not None)
    if float(value) <= limit:
        return None
    why = ("the largest finite float16" if limit == MAX_FP16_SCALE else
           "beyond it 1/scale is no longer a normal float32 (1/1e38 is subnormal) and "
           "gradients come out wrong and nondeterministic")
    return (f"optimizer.{field}", f"must be <= {limit:g} for compute_dtype {compute} ({why}), "
                                  f"got {float(value):g}")
