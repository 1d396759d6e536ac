"""Upstream's ``BlendedMegatronDatasetDataLoader`` (its Megatron ``.bin``/``.idx`` GPT dataset)
onto this project's ``type: IndexedDataset`` fields.

    dataloader.type: BlendedMegatronDatasetDataLoader -> type IndexedDataset
    dataloader.datasets_type   GPTDataset only
    dataloader.sizes           [train, 0, 0]: test/eval sets are not implemented; the train
                               count is accepted (the trainer reads training.steps x
                               global_batch_size samples, cycling epochs as GPTDataset does)
    dataloader.config:
      data_path                [weight, prefix, weight, prefix, ...] -> blend; one prefix
                               (a string, [prefix] or [weight, prefix]) -> data_path
      seed / random_seed       -> seed (GPTDataset always shuffles its samples with it, so
                               shuffle is on whatever dataloader.shuffle says)
      seq_length               must equal model.seq_length (check_loader_vs_model)
      split                    "a, 0, 0" only (held-out test/eval parts are not implemented)
      eod                      -> eod_id
      pad                      < 0 only (upstream drops the loss where labels == pad)
      eod_mask_loss, reset_position_ids, reset_attention_mask -> the fields of those names
      create_attention_mask    either: without reset_attention_mask it is the causal mask
                               the attention here applies anyway
      create_compressed_eod_mask  True: attention inside each document (upstream's compressed
                               end-of-document mask for flash attention), i.e.
                               reset_attention_mask True (models/documents.py builds the mask
                               every attention core reads)
      eod_pad_length, num_dataset_builder_threads  int >= 1 (they do not change the data)
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ...errors import ConfigError
from .noop import not_implemented, require_noop
from ..schema import convert_value, type_name, unknown_key_error

__all__ = ["MEGATRON_LOADER", "MEGATRON_LOADER_KEYS", "split_megatron", "nest_megatron",
           "check_loader_vs_model"]

MEGATRON_LOADER = "BlendedMegatronDatasetDataLoader"
MEGATRON_LOADER_KEYS = ("datasets_type", "sizes", "config")
#: config keys that become flat fields, and the flat field of each
_MAPPED = {"seed": "seed", "random_seed": "seed", "eod": "eod_id",
           "eod_mask_loss": "eod_mask_loss", "reset_position_ids": "reset_position_ids",
           "reset_attention_mask": "reset_attention_mask"}
#: config keys kept as written (checked here, written back by nest_megatron)
_KEPT = ("seq_length", "split", "pad", "create_attention_mask", "create_compressed_eod_mask",
         "eod_pad_length", "num_dataset_builder_threads")
_CONFIG_KEYS = ("data_path",) + tuple(_MAPPED) + _KEPT
#: flat fields the nested layout carries inside dataloader.config
MOVED_FIELDS = ("seed", "eod_id", "eod_mask_loss", "reset_position_ids",
                "reset_attention_mask", "data_path", "blend")


def _weight(value: Any, where: str) -> float:
    try:
        weight = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        weight = None
    if weight is None:
        raise ConfigError(where, f"(weight) must be a number, got {value!r}")
    return int(weight) if weight.is_integer() else weight


def data_path_fields(value: Any, where: str) -> Dict[str, Any]:
    """``{"data_path": prefix}`` or ``{"blend": [[w, prefix], ...]}`` of upstream's list."""
    if isinstance(value, str):
        return {"data_path": value}
    if not isinstance(value, list) or not value:
        raise ConfigError(where, f"expected a prefix or a list [weight, prefix, ...], got "
                                 f"{type_name(value)} ({value!r})")
    if len(value) == 1:
        return {"data_path": convert_value(str, value[0], f"{where}[0]")}
    if len(value) % 2:
        raise ConfigError(where, f"must alternate weight and prefix (an even length), got "
                                 f"{len(value)} items")
    pairs = [[_weight(value[i], f"{where}[{i}]"), convert_value(str, value[i + 1],
                                                                f"{where}[{i + 1}]")]
             for i in range(0, len(value), 2)]
    if len(pairs) == 1:
        return {"data_path": pairs[0][1]}
    return {"blend": pairs}


def _check_kept(config: Dict[str, Any], where: str) -> None:
    if "seq_length" in config:
        n = convert_value(int, config["seq_length"], f"{where}.seq_length")
        if n < 1:
            raise ConfigError(f"{where}.seq_length", f"must be >= 1, got {n}")
    if "split" in config:
        split = config["split"]
        try:
            parts = [float(p) for p in str(split).split(",")]
        except ValueError:
            parts = []
        if len(parts) != 3 or parts[0] <= 0 or min(parts) < 0:
            raise ConfigError(f"{where}.split", f"must be three weights 'train, test, eval' "
                                                f"with train > 0, got {split!r}")
        if parts[1] or parts[2]:
            raise not_implemented(f"{where}.split", split, "held-out test/eval parts of a "
                                  "Megatron dataset", ["1, 0, 0"])
    if "pad" in config:
        pad = convert_value(int, config["pad"], f"{where}.pad")
        if pad >= 0:
            raise not_implemented(f"{where}.pad", pad, "dropping the loss on pad tokens", [-1])
    if "create_attention_mask" in config:
        convert_value(bool, config["create_attention_mask"], f"{where}.create_attention_mask")
    if "create_compressed_eod_mask" in config:
        convert_value(bool, config["create_compressed_eod_mask"],
                      f"{where}.create_compressed_eod_mask")
    for key in ("eod_pad_length", "num_dataset_builder_threads"):
        if key in config:
            n = convert_value(int, config[key], f"{where}.{key}")
            if n < 1:
                raise ConfigError(f"{where}.{key}", f"must be >= 1, got {n}")


def split_megatron(loader: Dict[str, Any], where: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``(flat fields, kept)`` of a BlendedMegatronDatasetDataLoader mapping ``loader`` at
    ``where`` (``train_dataset.dataloader``); ``kept`` holds the values written back as they
    are (``datasets_type``, ``sizes``, the ``config`` keys of ``_KEPT`` and the seed's name)."""
    kept: Dict[str, Any] = {}
    if "datasets_type" in loader:
        kept["datasets_type"] = convert_value(str, loader["datasets_type"],
                                              f"{where}.datasets_type")
        require_noop(f"{where}.datasets_type", kept["datasets_type"], ("GPTDataset",),
                     "Megatron dataset types other than GPTDataset")
    if "sizes" in loader:
        sizes = convert_value(List[int], loader["sizes"], f"{where}.sizes")
        if len(sizes) != 3 or min(sizes) < 0:
            raise ConfigError(f"{where}.sizes", f"must be three sample counts [train, test, "
                                                f"eval] >= 0, got {sizes}")
        if sizes[1] or sizes[2]:
            raise not_implemented(f"{where}.sizes", sizes, "Megatron test/eval datasets",
                                  [[sizes[0], 0, 0]])
        kept["sizes"] = sizes
    config = loader.get("config")
    config = {} if config is None else config
    here = f"{where}.config"
    if not isinstance(config, dict):
        raise ConfigError(here, f"expected a mapping, got {type_name(config)} ({config!r})")
    for key in config:
        if key not in _CONFIG_KEYS:
            raise unknown_key_error(here, key, _CONFIG_KEYS)
    if "seed" in config and "random_seed" in config:
        raise ConfigError(f"{here}.random_seed", "given together with seed; keep one")
    if not config.get("data_path"):
        raise ConfigError(f"{here}.data_path", "required for BlendedMegatronDatasetDataLoader "
                                               "(the .bin/.idx prefix, or [weight, prefix, ...])")
    _check_kept(config, here)
    flat = data_path_fields(config["data_path"], f"{here}.data_path")
    for key, field in _MAPPED.items():
        if key in config:
            flat[field] = config[key]
            if field == "seed":
                kept["seed_key"] = key
    if "create_compressed_eod_mask" in config and convert_value(
            bool, config["create_compressed_eod_mask"], f"{here}.create_compressed_eod_mask"):
        flat["reset_attention_mask"] = True   # the compressed form of the same mask
    kept["config"] = {k: config[k] for k in _KEPT if k in config}
    return flat, kept


def nest_megatron(flat: Dict[str, Any], kept: Dict[str, Any]) -> Dict[str, Any]:
    """The ``dataloader:`` mapping of a flat ``to_dict()`` (inverse of :func:`split_megatron`)."""
    config: Dict[str, Any] = dict(kept.get("config", {}))
    if flat.get("seed") is not None:
        config[kept.get("seed_key", "seed")] = flat["seed"]
    if flat.get("eod_id") is not None:
        config["eod"] = flat["eod_id"]
    for key in ("eod_mask_loss", "reset_position_ids", "reset_attention_mask"):
        config[key] = flat[key]
    if flat.get("blend") is not None:
        config["data_path"] = [x for weight, prefix in flat["blend"] for x in (weight, prefix)]
    else:
        config["data_path"] = [1, flat["data_path"]]
    loader = {k: kept[k] for k in ("datasets_type", "sizes") if k in kept}
    loader["config"] = config
    return loader


def check_loader_vs_model(ds, model_seq_length: int, path: str) -> None:
    """``dataloader.config.seq_length`` of upstream's Megatron loader must be the model's."""
    kept = (ds.source_layout or {}).get("megatron") or {}
    n = kept.get("config", {}).get("seq_length")
    if n is not None and int(n) != int(model_seq_length):
        raise ConfigError(f"{path}.dataloader.config.seq_length", (
            f"{n} must match model.seq_length {model_seq_length} (samples are windows of "
            "model.seq_length tokens)"))
