"""Document boundaries inside a training window (Megatron ``get_ltor_masks_and_position_ids``).

Windows cut from a token stream span documents joined by the end-of-document id ``eod``.
For inputs ``x`` of length ``S``:

* ``eod_mask_loss``: ``loss_mask[t] = 0`` where ``x[t] == eod`` (the prediction made *from* an
  end-of-document token, i.e. of the next document's first token, does not count);
* ``reset_position_ids``: positions restart at 0 after every ``eod`` in ``x``;
* ``reset_attention_mask``: token ``t`` attends to ``u <= t`` of its own document only (a block
  diagonal causal mask; the ``eod`` token belongs to the document it ends).

:func:`eod_loss_mask` is what the trainer applies (``train_dataset.eod_mask_loss``).
:func:`document_positions_and_mask` computes the other two; :class:`Documents` says which of
them a run asks for, and the model builds its attention tables from them
(``models/documents.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np

__all__ = ["Documents", "eod_loss_mask", "document_positions_and_mask"]


@dataclass(frozen=True)
class Documents:
    """End-of-document id and which of the two resets are on (at least one is)."""

    eod: int
    reset_positions: bool
    reset_mask: bool

    def __post_init__(self):
        if not (self.reset_positions or self.reset_mask):
            raise ValueError("document masking needs reset_position_ids or reset_attention_mask")


def eod_loss_mask(input_ids: np.ndarray, eod: int) -> np.ndarray:
    """float32 mask of ``input_ids`` ``[B, S]``: 0 at end-of-document inputs, else 1."""
    return (np.asarray(input_ids) != int(eod)).astype(np.float32)


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
