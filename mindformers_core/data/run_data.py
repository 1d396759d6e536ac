"""The datasets of a run: training data and the held-out data of evaluation.

``build_run_datasets(cfg, rank, world, tokenizer) -> (train, held_out)``:

* ``train``: a :class:`TrainDataset` of ``train_dataset`` (its first ``1 - validation_split``
  of the samples when a split is set; with a ``blend``, of every blended corpus);
* ``held_out``: a :class:`TrainDataset` over ``eval_dataset`` when given, else the held-out
  tail of ``train_dataset`` (a blend of the held-out tails, same weights), else None. Its
  sampler's seeded permutation spreads the evaluated samples (the first stream positions,
  the same every evaluation) over the whole held-out set.

The tokenizer is built once by the caller (``data.tokenizer.build_tokenizer``); it tokenizes
text corpora and gives the end-of-document id of ``eod_mask_loss`` unless ``eod_id`` is set.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .blend import BlendedSource
from .builder import TrainDataset, build_dataset, build_source, file_source
from ..core.documents import Documents
from .split import split_source
from .tokenizer import ByteTokenizer

__all__ = ["build_run_datasets", "build_split_sources", "run_eod_id", "run_documents"]


def run_documents(ds, tokenizer=None) -> Optional[Documents]:
    """The document masking ``ds`` (``train_dataset``) asks for (``reset_position_ids`` /
    ``reset_attention_mask``), or None."""
    if not (ds.reset_position_ids or ds.reset_attention_mask):
        return None
    return Documents(int(run_eod_id(ds, tokenizer)), bool(ds.reset_position_ids),
                     bool(ds.reset_attention_mask))


def run_eod_id(ds, tokenizer=None) -> int:
    """The end-of-document id of a dataset section: ``eod_id``, else the tokenizer's
    (byte-level without one): what ``eod_mask_loss`` and the document resets read."""
    return ds.eod_id if ds.eod_id is not None else (tokenizer or ByteTokenizer()).eod_id


def build_split_sources(ds, model_cfg, data_seed: int, tokenizer=None, path="train_dataset"):
    """(training source, held-out source or None) of a dataset section."""
    if ds.blend is None:
        return split_source(build_source(ds, model_cfg, data_seed, tokenizer, path),
                            ds.validation_split)
    weights = [float(w) for w, _ in ds.blend]
    parts = [split_source(file_source(ds, file, int(model_cfg.seq_length),
                                      int(model_cfg.vocab_size), f"{path}.blend[{i}][1]"),
                          ds.validation_split) for i, (_, file) in enumerate(ds.blend)]
    train = BlendedSource([t for t, _ in parts], weights, data_seed, ds.shuffle)
    held = None
    if ds.validation_split > 0:
        held = BlendedSource([h for _, h in parts], weights, data_seed, ds.shuffle)
    return train, held


def build_run_datasets(cfg, rank: int = 0, world: int = 1,
                       tokenizer=None) -> Tuple[TrainDataset, Optional[TrainDataset]]:
    seed = int(cfg.training.seed)
    ds = cfg.train_dataset
    data_seed = seed if ds.seed is None else int(ds.seed)
    eod = None
    if ds.eod_mask_loss:
        eod = run_eod_id(ds, tokenizer)
    train_source, held = build_split_sources(ds, cfg.model, data_seed, tokenizer)
    train = build_dataset(ds, cfg.model, seed, rank, world, source=train_source,
                          eod_mask_id=eod)
    held_kind = "validation_split"
    if cfg.eval_dataset is not None:
        ev = cfg.eval_dataset
        held, _ = build_split_sources(ev, cfg.model, seed if ev.seed is None else int(ev.seed),
                                      tokenizer, path="eval_dataset")
        held_kind = ev.type
    if held is None:
        return train, None
    held_ds = TrainDataset(held, int(cfg.model.seq_length), int(cfg.model.vocab_size), seed,
                           shuffle=True, rank=rank, world=world, kind=held_kind,
                           eod_mask_id=eod)
    return train, held_ds
