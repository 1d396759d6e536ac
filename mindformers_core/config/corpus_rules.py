"""Rules of the ``train_dataset`` fields for real corpora: Megatron indexed files, blends and
document-boundary (EOD) handling. Called by ``DatasetConfig.validate``.

* ``blend: [[weight, path], ...]``: several corpora of one ``type`` (``TokenFile`` or
  ``IndexedDataset``) drawn in proportion to the weights (``data/blend.py``); replaces
  ``data_path``.
* ``eod_mask_loss``: no loss on predictions made from an end-of-document token; the id is
  ``eod_id``, else the tokenizer's (``tokenizer:``, byte-level: 0).
* ``reset_position_ids`` / ``reset_attention_mask`` (Megatron's names): positions restarting
  after each end-of-document token, attention inside each document (``models/documents.py``;
  the same id as ``eod_mask_loss``). The model runs one masking for every batch it sees, so an
  ``eval_dataset`` writes the same two values (:func:`check_eval_documents`).
"""
from __future__ import annotations

from ..errors import ConfigError

__all__ = ["check_corpus_fields", "check_eval_documents", "BLEND_TYPES", "DOCUMENT_FIELDS"]

BLEND_TYPES = ("TokenFile", "IndexedDataset")


DOCUMENT_FIELDS = ("reset_position_ids", "reset_attention_mask")


def check_eval_documents(train, evaluation) -> None:
    """``eval_dataset`` (``evaluation``) writes the document resets of ``train_dataset``."""
    for name in DOCUMENT_FIELDS:
        if getattr(evaluation, name) != getattr(train, name):
            raise ConfigError(f"eval_dataset.{name}", (
                f"{getattr(evaluation, name)} differs from train_dataset.{name} "
                f"({getattr(train, name)}): the model applies one document masking to "
                "every batch it runs"))


def check_corpus_fields(ds, path: str) -> None:
    if ds.eod_id is not None and ds.eod_id < 0:
        raise ConfigError(f"{path}.eod_id", f"must be >= 0, got {ds.eod_id}")
    if ds.blend is None:
        return
    if ds.type not in BLEND_TYPES:
        raise ConfigError(f"{path}.blend", f"needs type TokenFile or IndexedDataset, not "
                                           f"{ds.type}")
    if ds.data_path is not None:
        raise ConfigError(f"{path}.data_path", "not used with blend (each entry names its file)")
    if not ds.blend:
        raise ConfigError(f"{path}.blend", "must list at least one [weight, path]")
    for i, entry in enumerate(ds.blend):
        here = f"{path}.blend[{i}]"
        if not isinstance(entry, list) or len(entry) != 2:
            raise ConfigError(here, f"must be [weight, path], got {entry!r}")
        weight, file = entry
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0 \
                or weight == float("inf"):
            raise ConfigError(f"{here}[0]", f"(weight) must be a number > 0, got {weight!r}")
        if not isinstance(file, str) or not file:
            raise ConfigError(f"{here}[1]", f"(path) must be a file path, got {file!r}")
