"""Newton-Schulz orthogonalisation for Muon (pure functions; no optimizer state).

For a matrix X with SVD X = U S V^T, Muon wants the polar factor U V^T. The quintic
Newton-Schulz iteration approximates it with matrix products only:

    X_0     = X / max(||X||_F, eps)                         (Frobenius norm over the last 2 dims, fp32)
    A_k     = X_k X_k^T                                      (Gram matrix of the short side)
    X_{k+1} = a_k X_k + (b_k A_k + c_k A_k^2) X_k            one (a, b, c) triple per step

which maps every singular value s of X_0 through p(s) = a s + b s^3 + c s^5 (composed over the
steps). With the default triple (3.4445, -4.7750, 2.0315) five steps send every s in (0, 1] to
roughly [0.7, 1.2]: "something like U S' V^T" rather than the exact polar factor, which Muon does
not need.

Layout (why it is fast on CPU): the iteration runs on the short side of X, never transposing it.
For a wide X (m <= n) the Gram is `MatMul(transpose_b=True)(X, X)` (m x m) and the update is
`B @ X`; for a tall X (m > n) the Gram is `MatMul(transpose_a=True)(X, X)` (n x n) and the update
is `X @ B`. Both are the transposed-then-transposed-back iteration of upstream, without the two
copies. The three terms are folded into one m x m matrix B = a I + A (b I + c A), so each step is
three matmuls plus three small m x m element-wise ops, and X (the large operand) is written once
per step. Same-shape matrices stacked into a (batch, m, n) tensor run as one batched iteration
(`ops.BatchMatMul`), which removes the per-matrix kernel launches that dominate small shapes.

In fp32 the normalisation never touches X: ||X||_F^2 = trace(X X^T) comes from the first
Gram matrix, and 1/||X||_F is folded into the first step's B (A0 = G / s^2, X1 = (B(A0) / s) X),
which saves two full passes over X. (An fp32 Gram overflows for entries above ~1e18; gradients
and momenta are far below that after clipping.)

Precision (`ns_dtype`): float32 on CPU (MindSpore 2.10 has no CPU bf16 matmul), bfloat16 on
Ascend, as upstream, where the normalisation is still done in fp32 and the result is returned in
fp32. On Ascend upstream additionally sets `cube_math_type(4)` (fp32 accumulation of bf16 matmul
adds); `configure_ns_precision` does that behind a device check.

FLOPs of one step on an (m x n) matrix, m = short side: 2 m^2 n (Gram) + 2 m^3 (A (bI + cA))
+ 2 m^2 n (B X) = 4 m^2 n + 2 m^3.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import mindspore as ms
from mindspore import Tensor, ops

# Re-exported: the schedule forms and named presets live in one pure-Python place.
from ..core.ns_schedule import (DEFAULT_NS_COEFFICIENTS, NS_COEFFICIENT_PRESETS, normalize_ns_schedule,
                          preset_schedule)

__all__ = [
    "DEFAULT_NS_COEFFICIENTS", "NS_COEFFICIENT_PRESETS", "MUON_SCALE_MODES", "preset_schedule",
    "normalize_ns_schedule", "muon_scale_factor", "default_ns_dtype", "configure_ns_precision",
    "orthogonalize", "ns_matmul_flops",
]

# `muon_scale_mode`: the factor applied to NS(U) of an (rows x cols) piece.
MUON_SCALE_MODES = ("spectral", "shape_scaling", "unit_rms_norm")


def muon_scale_factor(rows: int, cols: int, mode: str = "spectral") -> float:
    """Scale of the orthogonalised update of an (rows x cols) piece.

    spectral:      sqrt(max(rows, cols))      (upstream MindFormers / Kimi; with
                                               matched_adamw_rms = 0.2 the update RMS matches AdamW's)
    shape_scaling: sqrt(max(1, rows / cols))  (Keller Jordan's Muon)
    unit_rms_norm: sqrt(rows / cols)          (Scion)
    """
    if mode == "spectral":
        return math.sqrt(max(rows, cols))
    if mode == "shape_scaling":
        return math.sqrt(max(1.0, rows / cols))
    if mode == "unit_rms_norm":
        return math.sqrt(rows / cols)
    raise ValueError(f"muon_scale_mode must be one of {list(MUON_SCALE_MODES)}, got {mode!r}.")


def _device_target() -> str:
    return ms.get_context("device_target")


def default_ns_dtype(device_target: Optional[str] = None):
    """float32 on CPU/GPU, bfloat16 on Ascend (upstream's Newton-Schulz dtype)."""
    target = device_target or _device_target()
    return ms.bfloat16 if target == "Ascend" else ms.float32


def configure_ns_precision(device_target: Optional[str] = None) -> None:
    """On Ascend, set upstream's `cube_math_type(4)` for bf16 matmuls; a no-op elsewhere.

    Raises upstream's RuntimeError when the running MindSpore lacks the setting.
    """
    if (device_target or _device_target()) != "Ascend":
        return
    precision = getattr(getattr(getattr(ms, "device_context", None), "ascend", None),
                        "op_precision", None)
    setter = getattr(precision, "cube_math_type", None)
    if setter is None:
        raise RuntimeError("cube_math_type(4) for Muon requires MindSpore support for "
                           "device_context.ascend.op_precision.cube_math_type.")
    setter(4)


# Kernels are stateless primitives; build them once.
_MM = ops.MatMul()
_GRAM_WIDE = ops.MatMul(transpose_b=True)     # X X^T
_GRAM_TALL = ops.MatMul(transpose_a=True)     # X^T X
_BMM = ops.BatchMatMul()
_BGRAM_WIDE = ops.BatchMatMul(transpose_b=True)
_BGRAM_TALL = ops.BatchMatMul(transpose_a=True)
_REDUCE_SUM_KEEP = ops.ReduceSum(keep_dims=True)
_SCALED_EYE_CACHE: dict = {}


def _scaled_eye(m: int, dtype, value: float) -> Tensor:
    """value * I (m x m), cached: the schedule's few distinct a, b reuse the same tensors."""
    key = (m, dtype, float(value))
    eye = _SCALED_EYE_CACHE.get(key)
    if eye is None:
        if len(_SCALED_EYE_CACHE) > 256:
            _SCALED_EYE_CACHE.clear()
        eye = _SCALED_EYE_CACHE[key] = ops.eye(m, m, ms.float32).astype(dtype) * value
    return eye


def orthogonalize(x: Tensor, schedule: Sequence[Sequence[float]], eps: float = 1e-7,
                  ns_dtype=None) -> Tensor:
    """Approximate polar factor of `x` (2-D, or 3-D = a batch of same-shape matrices).

    Args:
        x: float tensor of shape (m, n) or (batch, m, n); not modified.
        schedule: one (a, b, c) triple per Newton-Schulz step (see `normalize_ns_schedule`).
        eps: floor of the Frobenius norm in the normalisation X / max(||X||_F, eps).
        ns_dtype: dtype of the iteration; None = `default_ns_dtype()` (fp32 on CPU).
    Returns:
        float32 tensor of x's shape.
    """
    if x.ndim not in (2, 3):
        raise ValueError(f"orthogonalize expects a 2-D matrix or a 3-D batch, got shape {tuple(x.shape)}.")
    dtype = ns_dtype if ns_dtype is not None else default_ns_dtype()
    if dtype == ms.bfloat16 and _device_target() == "CPU":
        raise ValueError("ns_dtype bfloat16 needs Ascend: MindSpore has no CPU bf16 matmul kernel.")
    batched = x.ndim == 3
    rows, cols = x.shape[-2], x.shape[-1]
    tall = rows > cols
    short = cols if tall else rows

    x32 = x.astype(ms.float32) if x.dtype != ms.float32 else x
    if batched:
        gram = _BGRAM_TALL if tall else _BGRAM_WIDE
        mm = _BMM
    else:
        gram = _GRAM_TALL if tall else _GRAM_WIDE
        mm = _MM

    def step(X, A, a, b, c, inv_norm=None):
        B = mm(A, A * c + _scaled_eye(short, dtype, b)) + _scaled_eye(short, dtype, a)
        if inv_norm is not None:
            B = B * inv_norm
        return mm(X, B) if tall else mm(B, X)       # B = a I + b A + c A^2 is symmetric:
                                                    # (B X^T)^T = X B

    schedule = list(schedule)
    if dtype == ms.float32 and schedule:
        # fp32: never rescale X itself. With s = max(||X||_F, eps) and G = X X^T (short side),
        # ||X||_F^2 = trace(G), the first step on X0 = X / s is
        #     A0 = G / s^2,   X1 = B(A0) X0 = (B(A0) / s) X,
        # so the two full passes over X (norm, divide) become small ops on the Gram matrix.
        G = gram(x32, x32)
        trace = _REDUCE_SUM_KEEP(G * _scaled_eye(short, dtype, 1.0), (-2, -1))
        # Multiply by reciprocals: on CPU a broadcast divide of a large tensor is ~20x slower
        # than a multiply (measured 30 ms vs 1.3 ms at 1024 x 1024).
        inv_norm = 1.0 / ops.maximum(ops.sqrt(trace), eps)
        a, b, c = schedule[0]
        X = step(x32, G * (inv_norm * inv_norm), a, b, c, inv_norm=inv_norm)
        rest = schedule[1:]
    else:
        # Normalisation in fp32 (upstream), then the iteration dtype (bf16 on Ascend).
        norm = ops.norm(x32, dim=(-2, -1), keepdim=True) if batched else ops.norm(x32)
        X = x32 * (1.0 / ops.maximum(norm, eps))
        if dtype != ms.float32:
            X = X.astype(dtype)
        rest = schedule
    for a, b, c in rest:
        X = step(X, gram(X, X), a, b, c)
    return X.astype(ms.float32) if X.dtype != ms.float32 else X


def ns_matmul_flops(shape: Sequence[int], ns_steps: int) -> int:
    """Matmul FLOPs of `orthogonalize` on a (..., m, n) input: steps * batch * (4 s^2 l + 2 s^3)."""
    *batch, rows, cols = shape
    s, l = min(rows, cols), max(rows, cols)
    return int(ns_steps * math.prod(batch or [1]) * (4 * s * s * l + 2 * s ** 3))
