"""Document boundaries inside a training window (Megatron ``get_ltor_masks_and_position_ids``).

Windows cut from a token stream span documents joined by the end-of-document id ``eod``.
For inputs ``x`` of length ``S``:

* ``eod_mask_loss``: ``loss_mask[t] = 0`` where ``x[t] == eod`` (the prediction made *from* an
  end-of-document token, i.e. of the next document's first token, does not count);
* ``reset_position_ids``: positions restart at 0 after every ``eod`` in ``x``;
* ``reset_attention_mask``: token ``t`` attends to ``u <= t`` of its own document only (a block
  diagonal causal mask; the ``eod`` token belongs to the document it ends).

:func:`eod_loss_mask` is what the trainer applies (``train_dataset.eod_mask_loss``).
:func:`core.documents.document_positions_and_mask` computes the other two (in ``core/``: the
data and the models both read it); ``core.documents.Documents`` says which of them a run asks
for, and the model builds its attention tables from them (``models/documents.py``).
"""
from __future__ import annotations

import numpy as np

__all__ = ["eod_loss_mask"]


def eod_loss_mask(input_ids: np.ndarray, eod: int) -> np.ndarray:
    """float32 mask of ``input_ids`` ``[B, S]``: 0 at end-of-document inputs, else 1."""
    return (np.asarray(input_ids) != int(eod)).astype(np.float32)
