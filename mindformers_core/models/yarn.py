"""YaRN RoPE scaling (``position_embedding_type: yarn``), as pure numpy functions.

Formulas (Peng et al., "YaRN: Efficient Context Window Extension of Large Language Models",
arXiv:2309.00071, sec. 3.2-3.4; as implemented by DeepSeek-V3's reference
``inference/model.py`` ``precompute_freqs_cis`` / ``MLA.__init__`` and Hugging Face
transformers' DeepSeek-V3 YaRN rotary embedding):

* inv_freq_i = theta^(-2i/d), i < d/2 (plain RoPE).
* correction dim of r full rotations over the original context L (``max_position_embeddings``):
  d * ln(L / (2 pi r)) / (2 ln theta). The correction range is
  [floor(dim(beta_fast)), ceil(dim(beta_slow))] clamped to [0, d-1].
* ramp_i = clip((i - low) / (high - low), 0, 1) (high += 0.001 when equal); the kept
  (extrapolated) share is 1 - ramp_i, so
  inv_freq'_i = inv_freq_i / s * ramp_i + inv_freq_i * (1 - ramp_i), s = rotary_scaling_factor:
  high-frequency dims (i < low) keep their frequency, low-frequency dims are interpolated by s.
* yarn_get_mscale(s, m) = 0.1 * m * ln(s) + 1 for s > 1, else 1.
* the cos/sin tables are multiplied by yarn_get_mscale(s, mscale) / yarn_get_mscale(s,
  mscale_all_dim) and the softmax scale by yarn_get_mscale(s, mscale_all_dim)^2.

With s = 1 every factor is 1 and the tables are plain RoPE's.
"""
from __future__ import annotations

import math
from typing import Tuple

import numpy as np


def rope_inv_freq(dim: int, theta: float) -> np.ndarray:
    """Plain RoPE inverse frequencies theta^(-2i/dim), i < dim/2 (float64)."""
    return theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def yarn_get_mscale(scale: float, mscale: float) -> float:
    """Attention-temperature factor 0.1 * mscale * ln(scale) + 1 (1 when scale <= 1)."""
    if scale <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def find_correction_dim(num_rotations: float, dim: int, theta: float,
                        original_max_position: int) -> float:
    """The (fractional) rotary dim index whose wavelength fits ``num_rotations`` times into
    the original context."""
    return (dim * math.log(original_max_position / (num_rotations * 2 * math.pi))
            / (2 * math.log(theta)))


def find_correction_range(beta_fast: float, beta_slow: float, dim: int, theta: float,
                          original_max_position: int) -> Tuple[int, int]:
    """(low, high) dim indices of the interpolation ramp, clamped to [0, dim - 1]."""
    low = math.floor(find_correction_dim(beta_fast, dim, theta, original_max_position))
    high = math.ceil(find_correction_dim(beta_slow, dim, theta, original_max_position))
    return max(low, 0), min(high, dim - 1)


def linear_ramp(low: float, high: float, n: int) -> np.ndarray:
    """clip((i - low) / (high - low), 0, 1) for i < n (high nudged by 0.001 when equal)."""
    if low == high:
        high += 0.001
    return np.clip((np.arange(n, dtype=np.float64) - low) / (high - low), 0.0, 1.0)


def yarn_inv_freq(dim: int, theta: float, factor: float, original_max_position: int,
                  beta_fast: float, beta_slow: float) -> np.ndarray:
    """YaRN-interpolated inverse frequencies [dim/2] (float64)."""
    base = rope_inv_freq(dim, theta)
    low, high = find_correction_range(beta_fast, beta_slow, dim, theta, original_max_position)
    ramp = linear_ramp(low, high, dim // 2)   # 1 = interpolate by factor, 0 = keep
    return base / factor * ramp + base * (1.0 - ramp)


def yarn_rotary_tables(seq_length: int, dim: int, theta: float, factor: float,
                       original_max_position: int, beta_fast: float, beta_slow: float,
                       mscale: float, mscale_all_dim: float):
    """cos, sin [seq_length, dim] float32 (rotate-half convention, angles repeated twice),
    times the table factor yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor,
    mscale_all_dim)."""
    inv_freq = yarn_inv_freq(dim, theta, factor, original_max_position, beta_fast, beta_slow)
    angles = np.outer(np.arange(seq_length, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    gain = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    return (np.cos(angles) * gain).astype(np.float32), (np.sin(angles) * gain).astype(np.float32)


def yarn_softmax_scale_multiplier(factor: float, mscale_all_dim: float) -> float:
    """Multiplier of the attention softmax scale: yarn_get_mscale(factor, mscale_all_dim)^2."""
    m = yarn_get_mscale(factor, mscale_all_dim)
    return m * m


# ---------------------------------------------------------------------- model-config wiring
def rope_tables_for(cfg, seq_length: int, dim: int):
    """cos, sin tables of ``cfg`` (a ModelConfig): YaRN when ``position_embedding_type`` is
    "yarn" (original context = ``max_position_embeddings``, default ``seq_length``), else None
    (the caller builds plain RoPE)."""
    if cfg.position_embedding_type != "yarn":
        return None
    original = cfg.max_position_embeddings or cfg.seq_length
    return yarn_rotary_tables(seq_length, dim, cfg.rope_theta, cfg.rotary_scaling_factor,
                              original, cfg.beta_fast, cfg.beta_slow, cfg.mscale,
                              cfg.mscale_all_dim)


def softmax_scale_multiplier_for(cfg) -> float:
    """The softmax-scale multiplier of ``cfg`` (1.0 unless YaRN)."""
    if cfg.position_embedding_type != "yarn":
        return 1.0
    return yarn_softmax_scale_multiplier(cfg.rotary_scaling_factor, cfg.mscale_all_dim)
