"""Blends: one training stream drawn from several corpora in fixed proportions.

``train_dataset.blend: [[weight, path], ...]`` (weights are normalised). The stream position
``p`` maps to ``(corpus d, the k-th sample drawn from d)`` by Megatron's greedy rule
(``build_blending_indices``): position ``p`` goes to the corpus whose realised count lags its
target most, ``argmax_d (w_d * max(p, 1) - count_d)`` (the lowest ``d`` on ties). The
realised count of every corpus therefore stays within one sample of ``w_d * p`` at every
prefix, with no randomness. Inside corpus ``d`` the ``k``-th draw is sample
``perm(seed + d, epoch)[k mod n_d]`` (a :class:`GlobalBatchSampler`: epoch-wise shuffles).

Everything is a pure function of ``p``, so the blend is resumed by the one
``consumed_samples`` integer of the training sampler, like any infinite source. The
assignment is computed once per block of positions and cached (``_BLOCK``), so a resumed run
at position ``p`` does the same ``O(p)`` arithmetic the first run did, in numpy-sized chunks.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from .sampler import GlobalBatchSampler

__all__ = ["blend_assignment", "BlendedSource", "normalise_weights"]

_BLOCK = 1 << 14


def normalise_weights(weights: Sequence[float]) -> np.ndarray:
    w = np.asarray(weights, np.float64)
    if w.ndim != 1 or w.size == 0 or (w <= 0).any() or not np.isfinite(w).all():
        raise ValueError(f"blend weights must be finite and > 0, got {list(weights)}")
    return w / w.sum()


def blend_assignment(weights: Sequence[float], n: int, start: int = 0,
                     counts: Optional[np.ndarray] = None):
    """Corpus of positions ``[start, start + n)`` and the within-corpus draw number of each,
    continuing from ``counts`` (the draws of each corpus before ``start``).

    Returns ``(corpus int64 [n], draw int64 [n], counts after)``.
    """
    w = normalise_weights(weights)
    counts = np.zeros(w.size, np.int64) if counts is None else np.array(counts, np.int64)
    corpus = np.empty(n, np.int64)
    draw = np.empty(n, np.int64)
    for i in range(n):
        p = start + i
        d = int(np.argmax(w * max(p, 1) - counts))
        corpus[i] = d
        draw[i] = counts[d]
        counts[d] += 1
    return corpus, draw, counts


class BlendedSource:
    """An infinite source over finite ``sources`` (``num_samples`` and ``get`` each)."""

    num_samples = None
    entropy_floor = None

    def __init__(self, sources: List, weights: Sequence[float], seed: int, shuffle: bool = True):
        if len(sources) != len(weights):
            raise ValueError("one weight per blended source")
        self.sources = list(sources)
        self.weights = normalise_weights(weights)
        self.samplers = [GlobalBatchSampler(s.num_samples, int(seed) + d, shuffle)
                         for d, s in enumerate(self.sources)]
        self._corpus = np.zeros(0, np.int64)
        self._draw = np.zeros(0, np.int64)
        self._counts = np.zeros(len(self.sources), np.int64)

    def _extend(self, upto: int) -> None:
        while self._corpus.size < upto:
            c, k, self._counts = blend_assignment(self.weights, _BLOCK, self._corpus.size,
                                                  self._counts)
            self._corpus = np.concatenate([self._corpus, c])
            self._draw = np.concatenate([self._draw, k])

    def locate(self, positions) -> tuple:
        """``(corpus, sample index within it)`` of each stream position."""
        positions = np.asarray(positions, np.int64).reshape(-1)
        if positions.size:
            self._extend(int(positions.max()) + 1)
        corpus = self._corpus[positions]
        index = np.empty_like(positions)
        for d in np.unique(corpus):
            sel = corpus == d
            index[sel] = self.samplers[int(d)].sample_indices(self._draw[positions[sel]])
        return corpus, index

    def get(self, positions, seq_length=None):
        corpus, index = self.locate(positions)
        rows = [None] * corpus.size
        for d in np.unique(corpus):
            sel = np.flatnonzero(corpus == d)
            got = self.sources[int(d)].get(index[sel], seq_length)
            for j, r in zip(sel, got):
                rows[j] = r
        return np.stack(rows) if rows else np.zeros((0, 0), np.int32)
