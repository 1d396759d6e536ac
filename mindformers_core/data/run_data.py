"""The datasets of a run: training data and the held-out data of evaluation.

``build_run_datasets(cfg, rank, world, tokenizer) -> (train, held_out)``:

* ``train``: a :class:`TrainDataset` of ``train_dataset`` (its first ``1 - validation_split``
  of the samples when a split is set);
* ``held_out``: a :class:`TrainDataset` (no shuffling) over ``eval_dataset`` when given, else
  the held-out tail of ``train_dataset``, else None.

The tokenizer is built once by the caller (``data.tokenizer.build_tokenizer``) and used by both
text corpora.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .builder import TrainDataset, build_dataset, build_source
from .split import split_source

__all__ = ["build_run_datasets"]


def build_run_datasets(cfg, rank: int = 0, world: int = 1,
                       tokenizer=None) -> Tuple[TrainDataset, Optional[TrainDataset]]:
    seed = int(cfg.training.seed)
    ds = cfg.train_dataset
    data_seed = seed if ds.seed is None else int(ds.seed)
    source = build_source(ds, cfg.model, data_seed, tokenizer)
    train_source, held = split_source(source, ds.validation_split)
    train = build_dataset(ds, cfg.model, seed, rank, world, source=train_source)
    held_kind = "validation_split"
    if cfg.eval_dataset is not None:
        ev = cfg.eval_dataset
        held = build_source(ev, cfg.model, seed if ev.seed is None else int(ev.seed), tokenizer,
                            path="eval_dataset")
        held_kind = ev.type
    if held is None:
        return train, None
    held_ds = TrainDataset(held, int(cfg.model.seq_length), int(cfg.model.vocab_size), seed,
                           shuffle=False, rank=rank, world=world, kind=held_kind)
    return train, held_ds
