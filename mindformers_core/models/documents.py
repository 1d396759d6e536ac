"""Document masking: attention that does not cross documents, positions that restart per document.

A training window cut from a token stream spans documents joined by the end-of-document id
``eod`` (Megatron's ``reset_attention_mask`` / ``reset_position_ids``, upstream MindFormers'
``create_compressed_eod_mask``; ``data/eod.py`` holds the numpy math, Megatron's
``get_ltor_masks_and_position_ids``, and ``Documents``). With document masking on, the model
builds its attention tables from each batch's ``input_ids`` (:func:`document_tables`) instead
of the shared causal tables: same tuple, same shapes except the mask bias, which is ``[B, 1, S, S]`` (one mask
per sample, broadcast over the heads):

* ``reset_positions``: the RoPE / YaRN rows are each token's position inside its document;
* ``reset_mask``: the bias is ``-inf`` above the diagonal (the causal part) and
  :data:`OTHER_DOCUMENT` where the key lies in an earlier document of the window.

``OTHER_DOCUMENT`` is finite on purpose. Every query sees at least its own key, so the softmax
gives the other documents' keys exactly zero weight (``exp(-1e30 - m) == 0`` in float32), and
the block-by-block cores (``models/blockwise_attention.py``, ``distributed/ring_attention.py``)
stay finite on a block where a query row sees no key at all: its running max is a finite
``-1e30``, whose weights the first visible block multiplies by ``exp(-1e30 - m) == 0``.
With ``-inf`` there such a row would be ``exp(-inf - -inf)``: NaN.

Every attention core reads this bias: the plain one adds it; the blockwise one adds its
blocks (``attention_function(..., documents=True)``); under context parallelism the tables keep
the whole ``[B, 1, S, S]`` bias in global positions (``cp_model.SequenceChunks.tables``), and
the ring and ulysses cores cut the blocks of the positions they hold.
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor

from ..core.documents import Documents, document_positions_and_mask
from .layers import rotary_tables, rotate_half_matrix

__all__ = ["Documents", "OTHER_DOCUMENT", "document_bias", "document_tables"]

#: the mask bias of a key in another (earlier) document of the window (module docstring)
OTHER_DOCUMENT = -1e30


def document_bias(allowed: np.ndarray) -> np.ndarray:
    """float32 ``[B, 1, S, S]`` bias of an allowed-attention mask ``[B, S, S]`` (True: may
    attend): 0 where allowed, ``-inf`` above the diagonal, :data:`OTHER_DOCUMENT` elsewhere."""
    s = allowed.shape[-1]
    future = np.triu(np.ones((s, s), bool), 1)[None]
    bias = np.where(allowed, 0.0, np.where(future, -np.inf, OTHER_DOCUMENT))
    return np.ascontiguousarray(bias.astype(np.float32)[:, None])


def document_tables(input_ids: np.ndarray, docs: Documents, q_heads: int, k_heads: int,
                    dim: int, theta: float, precision, rope=None) -> tuple:
    """``layers.attention_tables`` of one batch ``input_ids`` ``[B, S]`` under ``docs``
    (module docstring): cos_q, sin_q ``[B, Nq, S, d]``, cos_k, sin_k ``[B, Nk, S, d]``, rot,
    and the mask bias ``[B, 1, S, S]``. ``rope``: (cos, sin) ``[S, d]`` numpy tables to use
    instead of plain RoPE's (``models.yarn``)."""
    ids = np.asarray(input_ids)
    b, s = ids.shape
    positions, allowed = document_positions_and_mask(ids, docs.eod)
    if not docs.reset_positions:
        positions = np.broadcast_to(np.arange(s, dtype=np.int32), (b, s))
    if not docs.reset_mask:
        allowed = np.broadcast_to(np.tril(np.ones((s, s), bool)), (b, s, s))
    cos, sin = rotary_tables(s, dim, theta) if rope is None else rope
    cos, sin = cos[positions], sin[positions]          # [B, S, d]

    def full(table, heads):
        return precision.cast(Tensor(np.ascontiguousarray(
            np.broadcast_to(table[:, None], (b, heads, s, dim)))))

    rot = precision.cast(Tensor(rotate_half_matrix(dim)))
    return (full(cos, q_heads), full(sin, q_heads), full(cos, k_heads), full(sin, k_heads),
            rot, Tensor(document_bias(allowed)))
