"""MindDataset: MindRecord files read through ``mindspore.dataset.MindDataset``.

Columns (as in upstream MindFormers YAML ``input_columns``): ``input_ids``, ``labels``,
``loss_mask``, ``position_ids``. Accepted layouts per row, ``S`` = model.seq_length:

* ``input_ids`` and ``labels`` of length ``S`` (already shifted), optional ``loss_mask`` of
  length ``S`` (missing = all ones); ``position_ids`` is not needed by our models and not read;
* ``input_ids`` of length ``S + 1`` and no ``labels``: shifted here like a token window.

Random access: each request builds a small pipeline with ``SubsetSampler(indices)`` (about
2-3 ms on CPU), so sample ``i`` is a pure function of ``i`` and resume/sharding need no
fast-forward. The constructor scans every row once to check lengths and token ids, so errors
come before the first training step.
"""
from __future__ import annotations

import os
from typing import Dict, Optional, Sequence

import numpy as np

from ..errors import ConfigError

__all__ = ["MindDataset", "MINDRECORD_COLUMNS"]

MINDRECORD_COLUMNS = ("input_ids", "labels", "loss_mask", "position_ids")


def _pipeline(path: str, columns, indices=None):
    import mindspore.dataset as msds   # imported lazily: config-only users never load MindSpore
    kwargs = {"columns_list": list(columns), "num_parallel_workers": 1}
    if indices is None:
        kwargs["shuffle"] = False
    else:
        kwargs["sampler"] = msds.SubsetSampler([int(i) for i in indices])
    return msds.MindDataset(path, **kwargs)


class MindDataset:
    """Token samples from a MindRecord file, by sample index."""

    entropy_floor = None

    def __init__(self, path: str, seq_length: int, vocab_size: Optional[int] = None,
                 field: str = "train_dataset.data_path"):
        self.path = path
        self.seq_length = int(seq_length)
        self.vocab_size = vocab_size
        self._field = field
        if not os.path.isfile(path):
            raise ConfigError(field, f"MindRecord file not found: {path!r}")
        if not os.path.isfile(path + ".db"):
            raise ConfigError(field, (f"{path!r} has no index file {path + '.db'!r}; "
                                      "is it a MindRecord file written by FileWriter?"))
        try:
            names = _all_columns(path)
            if "input_ids" not in names:
                raise ConfigError(field, f"{path!r} has no input_ids column (columns: {names})")
            self.num_samples = int(_pipeline(path, ["input_ids"]).get_dataset_size())
        except (RuntimeError, ValueError, OSError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(field, f"cannot read MindRecord {path!r}: {_reason(exc)}") from exc
        self.has_labels = "labels" in names
        self.has_loss_mask = "loss_mask" in names
        self.columns = [c for c in ("input_ids", "labels", "loss_mask") if c in names]
        if self.num_samples < 1:
            raise ConfigError(field, f"{path!r} holds no samples")
        self._check_all_rows()

    def _check_all_rows(self) -> None:
        want = self.seq_length if self.has_labels else self.seq_length + 1
        layout = "input_ids/labels" if self.has_labels else "input_ids (no labels column)"
        it = _pipeline(self.path, self.columns).create_dict_iterator(num_epochs=1,
                                                                     output_numpy=True)
        for row_idx, row in enumerate(it):
            for col in self.columns:
                n = int(np.asarray(row[col]).size)
                if n != want:
                    raise ConfigError(self._field, (
                        f"row {row_idx} of {self.path!r}: {col} has length {n}, but "
                        f"{layout} must have {want} for model.seq_length {self.seq_length}"))
            for col in ("input_ids", "labels"):
                if col in row and np.asarray(row[col]).dtype.kind not in "iu":
                    raise ConfigError(self._field, (
                        f"row {row_idx} of {self.path!r}: {col} holds "
                        f"{np.asarray(row[col]).dtype} values; token ids must be integers "
                        "(a float id would be truncated silently)"))
            if "loss_mask" in row:
                mask = np.asarray(row["loss_mask"], dtype=np.float64)
                bad = np.flatnonzero(~np.isfinite(mask) | (mask < 0))
                if bad.size:
                    raise ConfigError(self._field, (
                        f"row {row_idx} of {self.path!r}: loss_mask[{int(bad[0])}] is "
                        f"{mask[bad[0]]!r}; a loss mask must be finite and >= 0 (it weights "
                        "each label token's loss)"))
            if self.vocab_size is not None:
                for col in ("input_ids", "labels"):
                    if col in row:
                        ids = np.asarray(row[col])
                        bad = np.flatnonzero((ids < 0) | (ids >= self.vocab_size))
                        if bad.size:
                            raise ConfigError(self._field, (
                                f"token id {int(ids[bad[0]])} in {col} of row {row_idx} of "
                                f"{self.path!r} is outside [0, model.vocab_size="
                                f"{self.vocab_size})"))

    def get(self, indices: Sequence[int], seq_length: Optional[int] = None) -> Dict[str, np.ndarray]:
        """``input_ids``/``labels`` int32 ``[n, S]`` and ``loss_mask`` float32 ``[n, S]``."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        uniq, inverse = np.unique(indices, return_inverse=True)
        rows = {c: [] for c in self.columns}
        it = _pipeline(self.path, self.columns, uniq).create_dict_iterator(num_epochs=1,
                                                                           output_numpy=True)
        for row in it:
            for c in self.columns:
                rows[c].append(np.asarray(row[c]).reshape(-1))
        cols = {c: np.stack(v)[inverse] for c, v in rows.items()}
        ids = cols["input_ids"].astype(np.int32)
        if self.has_labels:
            input_ids, labels = ids, cols["labels"].astype(np.int32)
        else:
            input_ids, labels = ids[:, :-1], ids[:, 1:]
        if self.has_loss_mask:
            mask = cols["loss_mask"].astype(np.float32)
            if not self.has_labels:
                mask = mask[:, 1:]
        else:
            mask = np.ones(labels.shape, np.float32)
        return {"input_ids": np.ascontiguousarray(input_ids),
                "labels": np.ascontiguousarray(labels),
                "loss_mask": np.ascontiguousarray(mask)}


def _reason(exc: Exception) -> str:
    """The useful lines of a MindSpore dataset error (drops the banner and C++ stack)."""
    text = str(exc)
    if "[ERROR]" in text:
        text = text.split("[ERROR]", 1)[1].split("----", 1)[0]
    return " ".join(text.split())


def _all_columns(path: str):
    """Column names of the file's schema (through the MindRecord reader)."""
    from mindspore.mindrecord import FileReader
    reader = FileReader(path, num_consumer=1)
    try:
        names = list(reader.schema().keys())
    finally:
        reader.close()
    return names
