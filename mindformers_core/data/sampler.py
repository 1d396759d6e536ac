"""GlobalBatchSampler: which sample indices each rank reads for each micro-batch.

The data is one global *stream* of positions ``p = 0, 1, 2, ...``. Position ``p`` maps to a
sample index: with a finite dataset of ``N`` samples, ``epoch = p // N`` and
``index = perm(seed, epoch)[p mod N]`` (``perm`` = ``default_rng([seed, 2, epoch]).permutation``)
when shuffling, else ``p mod N``; an infinite (synthetic) dataset uses ``index = p``.

Optimizer step ``s`` with global batch ``G`` reads positions ``[start, start + G)`` where
``start`` is the number of samples consumed before the step (``s * G`` for a constant batch).
The step's ``G = world * local_batch_size * num_micro`` positions are laid out Megatron-style:
micro-batch ``j`` is the contiguous chunk ``[start + j*world*b, start + (j+1)*world*b)`` and rank
``r`` takes the ``b`` positions ``r*b ..`` of it. Every layout of the same ``G`` therefore reads the
same *set* of samples per optimizer step (e.g. dp=2, b=2, accum=1 and dp=1, b=2, accum=2), which
is what makes multi-card training equal single-card training.

State: ``consumed_samples`` (an int); the mapping itself is a pure function of the position, so
restoring that int resumes the stream exactly.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

__all__ = ["GlobalBatchSampler"]


class GlobalBatchSampler:
    """Deterministic, resumable, rank-sharded map from stream positions to sample indices."""

    def __init__(self, num_samples: Optional[int], seed: int, shuffle: bool = True,
                 rank: int = 0, world: int = 1):
        if num_samples is not None and num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, world={world}), got {rank}")
        self.num_samples = num_samples
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.rank = int(rank)
        self.world = int(world)
        self.consumed_samples = 0
        self._perm_epoch: Optional[int] = None
        self._perm: Optional[np.ndarray] = None

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._perm_epoch != epoch:
            self._perm = np.random.default_rng([self.seed, 2, int(epoch)]).permutation(
                self.num_samples)
            self._perm_epoch = epoch
        return self._perm

    def sample_indices(self, positions: np.ndarray) -> np.ndarray:
        """Sample index of each stream position (int64)."""
        positions = np.asarray(positions, dtype=np.int64)
        if self.num_samples is None:
            return positions.copy()
        epochs = positions // self.num_samples
        offsets = positions % self.num_samples
        if not self.shuffle:
            return offsets
        out = np.empty_like(positions)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            out[sel] = self._permutation(int(epoch))[offsets[sel]]
        return out

    def micro_positions(self, step_start: int, micro_index: int, num_micro: int,
                        local_batch_size: int) -> np.ndarray:
        """Stream positions read by this rank for micro-batch ``micro_index`` of the step that
        starts at ``step_start``."""
        if not 0 <= micro_index < num_micro:
            raise ValueError(f"micro_index must be in [0, {num_micro}), got {micro_index}")
        if local_batch_size < 1:
            raise ValueError(f"local_batch_size must be >= 1, got {local_batch_size}")
        base = int(step_start) + (micro_index * self.world + self.rank) * local_batch_size
        return base + np.arange(local_batch_size, dtype=np.int64)

    def global_positions(self, step_start: int, global_batch: int) -> np.ndarray:
        """All positions of one optimizer step (every rank, every micro-batch)."""
        return int(step_start) + np.arange(global_batch, dtype=np.int64)

    def micro_indices(self, step_start: int, micro_index: int, num_micro: int,
                      local_batch_size: int) -> np.ndarray:
        return self.sample_indices(self.micro_positions(step_start, micro_index, num_micro,
                                                        local_batch_size))

    def epoch_of(self, position: int) -> int:
        return 0 if self.num_samples is None else int(position) // self.num_samples

    def state_dict(self) -> Dict[str, int]:
        return {"consumed_samples": int(self.consumed_samples)}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.consumed_samples = int(state["consumed_samples"])
