"""What ``--check`` says about the training data: the files exist, are readable, and their ids
fit the model's vocabulary (``data/token_file.py`` and ``data/mindrecord.py`` do the checking).
Raises ``ConfigError`` naming ``train_dataset.data_path`` (exit 2) for a missing or unusable
file. Only a MindRecord file needs MindSpore (its reader); nothing else here imports it.
"""
from __future__ import annotations

import os

from ..config.errors import ConfigError

__all__ = ["describe_data"]

FIELD = "train_dataset.data_path"


def _readable(path: str, what: str) -> None:
    if not os.path.isfile(path):
        raise ConfigError(FIELD, f"{what} not found: {path!r}")
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise ConfigError(FIELD, f"{what} {path!r} is not readable: {exc.strerror or exc}") \
            from None


def describe_data(ds_cfg, model_cfg) -> str:
    """One line for the plan: the source, and for files what was verified."""
    kind = ds_cfg.type
    if kind == "SyntheticMarkov":
        return "data             : SyntheticMarkov (built in, no files)"
    path = ds_cfg.data_path
    if kind == "TokenFile":
        # imported here: the data package needs numpy, which a plain --check does not load
        from ..data.token_file import TokenFile
        from ..data.token_meta import meta_path
        tf = TokenFile(path, model_cfg.seq_length, ds_cfg.dtype, model_cfg.vocab_size, FIELD)
        source = f"sidecar {os.path.basename(meta_path(path))}" if tf.meta is not None else \
            ("the .npy header" if path.lower().endswith(".npy") else "train_dataset.dtype")
        return (f"data             : TokenFile {path}: {tf.tokens.shape[0]:,} tokens "
                f"({tf.tokens.dtype.name}, from {source}), {tf.num_samples:,} samples, every id "
                f"< model.vocab_size {model_cfg.vocab_size} (verified)")
    _readable(path, "MindRecord file")
    _readable(path + ".db", "MindRecord index file")
    # reading MindRecord rows needs MindSpore's reader: the one case where --check loads it
    from ..data.mindrecord import MindDataset
    md = MindDataset(path, model_cfg.seq_length, model_cfg.vocab_size, FIELD)
    return (f"data             : MindDataset {path} (+ .db): {md.num_samples:,} rows of "
            f"seq_length {model_cfg.seq_length}, every id < model.vocab_size "
            f"{model_cfg.vocab_size} and every loss_mask finite and >= 0 (verified)")


#: ``--set`` overrides that replace a config's data with the built-in corpus
BUILTIN_DATA_OVERRIDES = ("train_dataset.type=SyntheticMarkov", "train_dataset.data_path=null")


def missing_data_overrides(config_path: str, root: str = ".") -> list:
    """``["--set", ...]`` swapping in the built-in corpus when the config's data file (relative
    to ``root``) is not on this machine (a production recipe checked on a development box);
    ``[]`` otherwise. ``--check`` itself refuses a missing file (exit 2)."""
    from ..config.yaml_io import load_yaml_text
    with open(config_path, encoding="utf-8") as fh:
        data = load_yaml_text(fh.read()) or {}
    data_path = (data.get("train_dataset") or {}).get("data_path")
    if not data_path or os.path.exists(os.path.join(root, data_path)):
        return []
    return [arg for item in BUILTIN_DATA_OVERRIDES for arg in ("--set", item)]
