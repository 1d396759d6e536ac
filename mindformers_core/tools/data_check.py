"""What ``--check`` says about the training data: the files exist, are readable, and their ids
fit the model's vocabulary (``data/token_file.py`` and ``data/mindrecord.py`` do the checking).
Raises ``ConfigError`` naming ``train_dataset.data_path`` (exit 2) for a missing or unusable
file. Only a MindRecord file needs MindSpore (its reader); nothing else here imports it.
"""
from __future__ import annotations

import os

from ..errors import ConfigError

__all__ = ["describe_data", "describe_tokenizer"]

FIELD = "train_dataset.data_path"


def _readable(path: str, what: str, field: str = FIELD) -> None:
    if not os.path.isfile(path):
        raise ConfigError(field, f"{what} not found: {path!r}")
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise ConfigError(field, f"{what} {path!r} is not readable: {exc.strerror or exc}") \
            from None


def describe_data(ds_cfg, model_cfg, section: str = "train_dataset") -> str:
    """One line for the plan: the source, and for files what was verified (every file of a
    blend; ``section`` names the dataset section in errors and in the line)."""
    kind = ds_cfg.type
    label = f"{'data' if section == 'train_dataset' else section:<17}: "
    if kind == "SyntheticMarkov":
        return f"{label}SyntheticMarkov (built in, no files)"
    if kind == "PydocText":
        return f"{label}PydocText (pydoc_data.topics, built in, tokenized at start)"
    if kind in ("TokenFile", "IndexedDataset"):
        return label + "; ".join(_describe_token_file(ds_cfg, model_cfg, path, field)
                                 for path, field in _token_files(ds_cfg, section))
    files = ds_cfg.data_path
    if isinstance(files, list):   # several MindRecord files
        return label + "; ".join(_describe_mindrecord(model_cfg, path, f"{section}.data_path[{i}]")
                                 for i, path in enumerate(files))
    return label + _describe_mindrecord(model_cfg, files, f"{section}.data_path")


def describe_tokenizer(cfg) -> str:
    """One line for the plan: the run's tokenizer, loaded and checked as the trainer does
    before step 1 (``data.tokenizer.load_run_tokenizer``: its vocabulary fits
    ``model.vocab_size``, it holds ordinary tokens, it covers a sample of a text corpus);
    '' when the run has no text."""
    # imported here: the tokenizer needs numpy (and the hf extra), which a plain --check
    # does not load for a run without text
    from ..data.tokenizer import load_run_tokenizer
    tok = load_run_tokenizer(cfg)
    if tok is None:
        return ""
    what = tok.source if tok.name == "hf" else "(UTF-8 bytes)"
    return (f"{'tokenizer':<17}: {tok.name} {what}: {tok.vocab_size:,} tokens "
            f"<= model.vocab_size {cfg.model.vocab_size} (verified)")


def _describe_mindrecord(model_cfg, path: str, field: str) -> str:
    _readable(path, "MindRecord file", field)
    _readable(path + ".db", "MindRecord index file", field)
    # reading MindRecord rows needs MindSpore's reader: the one case where --check loads it
    from ..data.mindrecord import MindDataset
    md = MindDataset(path, model_cfg.seq_length, model_cfg.vocab_size, field)
    return (f"MindDataset {path} (+ .db): {md.num_samples:,} rows of "
            f"seq_length {model_cfg.seq_length}, every id < model.vocab_size "
            f"{model_cfg.vocab_size} and every loss_mask finite and >= 0 (verified)")


def _token_files(ds_cfg, section: str):
    """``(path, field)`` of each token file: ``data_path``, or every entry of ``blend``."""
    if ds_cfg.blend:
        return [(entry[1], f"{section}.blend[{i}]") for i, entry in enumerate(ds_cfg.blend)]
    return [(ds_cfg.data_path, f"{section}.data_path")]


def _describe_token_file(ds_cfg, model_cfg, path: str, field: str) -> str:
    # imported here: the data package needs numpy, which a plain --check does not load
    from ..data.builder import file_source
    from ..data.token_meta import meta_path
    tf = file_source(ds_cfg, path, model_cfg.seq_length, model_cfg.vocab_size, field)
    if ds_cfg.type == "IndexedDataset":
        source = "its .idx"
    elif tf.meta is not None:
        source = f"sidecar {os.path.basename(meta_path(path))}"
    else:
        source = "the .npy header" if path.lower().endswith(".npy") else "train_dataset.dtype"
    return (f"{ds_cfg.type} {path}: {tf.tokens.shape[0]:,} tokens ({tf.tokens.dtype.name}, "
            f"from {source}), {tf.num_samples:,} samples, every id < model.vocab_size "
            f"{model_cfg.vocab_size} (verified)")


#: ``--set`` overrides that replace a config's data with the built-in corpus
BUILTIN_DATA_OVERRIDES = ("train_dataset.type=SyntheticMarkov", "train_dataset.data_path=null")


def missing_data_overrides(config_path: str, root: str = ".") -> list:
    """``["--set", ...]`` swapping in the built-in corpus when the config's data file (relative
    to ``root``) is not on this machine (a production recipe, or upstream MindFormers' test
    YAML with its placeholder ``dataset_files``, checked on a development box); ``[]``
    otherwise. ``--check`` itself refuses a missing file (exit 2)."""
    from ..config.yaml_io import load_yaml_text
    with open(config_path, encoding="utf-8") as fh:
        data = load_yaml_text(fh.read()) or {}
    section = data.get("train_dataset") or {}
    nested = isinstance(section.get("dataloader"), dict)   # upstream's layout
    data_path = section["dataloader"].get("dataset_files") if nested else section.get("data_path")
    if not isinstance(data_path, str) or os.path.exists(os.path.join(root, data_path)):
        return []
    items = ["train_dataset.dataloader={type: SyntheticMarkov}"] if nested \
        else list(BUILTIN_DATA_OVERRIDES)
    return [arg for item in items for arg in ("--set", item)]
