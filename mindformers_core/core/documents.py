"""Document boundaries inside a training window: the pure rule ``data/`` (the run's choice) and
``models/`` (the attention tables, ``models/documents.py``) both read; see ``data/eod.py``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np

__all__ = ["Documents", "document_positions_and_mask"]


@dataclass(frozen=True)
class Documents:
    """End-of-document id and which of the two resets are on (at least one is)."""

    eod: int
    reset_positions: bool
    reset_mask: bool

    def __post_init__(self):
        if not (self.reset_positions or self.reset_mask):
            raise ValueError("document masking needs reset_position_ids or reset_attention_mask")


def document_positions_and_mask(input_ids: np.ndarray, eod: int) -> Tuple[np.ndarray, np.ndarray]:
    """(position ids int32 ``[B, S]``, allowed-attention bool ``[B, S, S]``, True = may attend)."""
    x = np.asarray(input_ids)
    b, s = x.shape
    # document number of each position: eods seen strictly before it
    is_eod = (x == int(eod)).astype(np.int64)
    doc = np.concatenate([np.zeros((b, 1), np.int64), np.cumsum(is_eod, 1)[:, :-1]], 1)
    first = np.zeros_like(doc)
    for r in range(b):
        starts = np.flatnonzero(np.diff(doc[r], prepend=-1))
        first[r] = np.repeat(starts, np.diff(np.append(starts, s)))
    positions = (np.arange(s)[None, :] - first).astype(np.int32)
    causal = np.tril(np.ones((s, s), bool))
    same_doc = doc[:, :, None] == doc[:, None, :]
    return positions, same_doc & causal[None]
