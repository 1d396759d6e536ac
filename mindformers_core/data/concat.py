"""Several finite sources read as one, their samples concatenated in order (upstream's
``dataset_files: [a.mindrecord, b.mindrecord, ...]``: the rows of ``a``, then of ``b``, ...).

``ConcatSource(sources)``: sample ``i`` is sample ``i - offset[k]`` of the source ``k`` whose
range holds it; ``get`` joins the sources' dicts of arrays (as ``MindDataset.get`` returns),
in the order of the requested indices.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

__all__ = ["ConcatSource"]


class ConcatSource:
    """The samples of ``sources`` (each with ``num_samples`` and ``get``), one after another."""

    entropy_floor = None

    def __init__(self, sources: List):
        if not sources:
            raise ValueError("ConcatSource needs at least one source")
        self.sources = list(sources)
        self.offsets = np.cumsum([0] + [int(s.num_samples) for s in self.sources])
        self.num_samples = int(self.offsets[-1])

    def get(self, indices: Sequence[int], seq_length: Optional[int] = None):
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_samples):
            raise IndexError(f"sample index outside [0, {self.num_samples})")
        which = np.searchsorted(self.offsets, indices, side="right") - 1
        order, parts = [], []
        for k in np.unique(which):
            sel = np.flatnonzero(which == k)
            order.append(sel)
            parts.append(self.sources[int(k)].get(indices[sel] - self.offsets[k], seq_length))
        if not parts:
            return self.sources[0].get(indices, seq_length)
        back = np.argsort(np.concatenate(order))
        return {key: np.concatenate([p[key] for p in parts])[back] for key in parts[0]}
