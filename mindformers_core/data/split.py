"""Held-out validation: the last ``validation_split`` of a finite source's samples.

``split_counts(n, fraction) -> (n_train, n_val)``: ``n_val = max(1, round(n * fraction))``
when ``fraction > 0`` (0 holds nothing out) and at least one sample must stay for training.
The held-out samples are the tail of the stream (contiguous text the training samples never
read: with windows of ``S + 1`` tokens at stride ``S`` the two parts share only the one
boundary token, as an input on one side and a label on the other).

``SampleRange(source, start, stop)`` is the view of samples ``[start, stop)`` of a source, so
the training sampler and the evaluator each see an ordinary source.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError

__all__ = ["split_counts", "SampleRange", "split_source"]


def split_counts(num_samples: int, fraction: float,
                 field: str = "train_dataset.validation_split") -> Tuple[int, int]:
    """(train, held-out) sample counts of a source of ``num_samples``."""
    if not 0.0 <= fraction < 1.0:
        raise ConfigError(field, f"must be in [0, 1), got {fraction!r}")
    if fraction == 0.0:
        return int(num_samples), 0
    n_val = max(1, int(round(num_samples * fraction)))
    if n_val >= num_samples:
        raise ConfigError(field, (f"{fraction} of {num_samples} samples leaves none for "
                                  "training; lower it or use more data"))
    return int(num_samples) - n_val, n_val


class SampleRange:
    """Samples ``[start, stop)`` of ``source`` re-indexed from 0."""

    def __init__(self, source, start: int, stop: int):
        if not 0 <= start < stop <= source.num_samples:
            raise ValueError(f"sample range [{start}, {stop}) is outside [0, "
                             f"{source.num_samples})")
        self.source = source
        self.start = int(start)
        self.num_samples = int(stop) - int(start)
        self.entropy_floor = getattr(source, "entropy_floor", None)

    def get(self, indices: Sequence[int], seq_length: Optional[int] = None):
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_samples):
            raise IndexError(f"sample index outside [0, {self.num_samples})")
        return self.source.get(indices + self.start, seq_length)


def split_source(source, fraction: float):
    """(train view, held-out view or None) of a finite ``source``."""
    if fraction == 0.0:
        return source, None
    if source.num_samples is None:
        raise ConfigError("train_dataset.validation_split",
                          "needs a finite dataset (SyntheticMarkov is infinite: set "
                          "eval_dataset instead, or leave validation_split at 0)")
    n_train, n_val = split_counts(source.num_samples, fraction)
    return SampleRange(source, 0, n_train), SampleRange(source, n_train, n_train + n_val)
