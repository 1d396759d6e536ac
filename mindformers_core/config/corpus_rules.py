"""Rules of the ``train_dataset`` fields for real corpora: Megatron indexed files, blends and
document-boundary (EOD) handling. Called by ``DatasetConfig.validate``.

* ``blend: [[weight, path], ...]``: several corpora of one ``type`` (``TokenFile`` or
  ``IndexedDataset``) drawn in proportion to the weights (``data/blend.py``); replaces
  ``data_path``.
* ``eod_mask_loss``: no loss on predictions made from an end-of-document token; the id is
  ``eod_id``, else the tokenizer's (``tokenizer:``, byte-level: 0).
* ``reset_position_ids`` / ``reset_attention_mask`` (Megatron's names) are refused: the models
  in ``models/`` take neither position ids nor a per-sample attention mask, so they cannot
  honour them (``data/eod.py`` computes both for a model that can).
"""
from __future__ import annotations

from ..errors import ConfigError

__all__ = ["check_corpus_fields", "BLEND_TYPES"]

BLEND_TYPES = ("TokenFile", "IndexedDataset")


def check_corpus_fields(ds, path: str) -> None:
    for name in ("reset_position_ids", "reset_attention_mask"):
        if getattr(ds, name):
            raise ConfigError(f"{path}.{name}", (
                "the models of this package cannot honour it: their attention takes no "
                "position ids and no per-sample attention mask (one causal mask for the whole "
                "window); use eod_mask_loss to keep the loss off document boundaries"))
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
