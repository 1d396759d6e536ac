"""Upstream's nested `train_dataset.dataloader:` layout <-> the flat `train_dataset:` fields.

    dataloader.type           -> type   (MindDataset, or this project's TokenFile /
                                         SyntheticMarkov; BlendedMegatronDatasetDataLoader ->
                                         IndexedDataset, its keys in config/compat/megatron_loader.py;
                                         upstream's other loaders are errors)
    dataloader.dataset_files  -> data_path (a path, or a list: several MindRecord files)
    dataloader.dataset_dir    -> data_path
    dataloader.shuffle        -> shuffle (default False, as upstream; the flat layout's is True)
    dataloader.column_names   -> checked: the MindRecord columns read here
    dataloader.python_multiprocessing -> False only (samples are read in-process)
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ...errors import ConfigError
from .megatron_loader import (MEGATRON_LOADER, MEGATRON_LOADER_KEYS, MOVED_FIELDS,
                              nest_megatron, split_megatron)
from .noop import require_noop
from ..schema import convert_value, type_name, unknown_key_error

__all__ = ["split_dataloader", "nest_dataloader", "MINDRECORD_COLUMNS"]

MINDRECORD_COLUMNS = ("input_ids", "labels", "loss_mask", "position_ids")
_LOADER_KEYS = ("type", "dataset_files", "dataset_dir", "shuffle", "column_names",
                "python_multiprocessing")
_TYPES = ("MindDataset", "TokenFile", "SyntheticMarkov", MEGATRON_LOADER)
_FLAT_SOURCE_KEYS = ("type", "data_path", "shuffle")
_WRITTEN_BACK = ("column_names", "python_multiprocessing")


def split_dataloader(data: Dict[str, Any], path: str) -> Tuple[Dict[str, Any], Optional[dict]]:
    """``(flat mapping, layout)``; ``layout`` is None for a mapping without ``dataloader``
    (returned as is), else what :func:`nest_dataloader` needs to write the nested layout
    back."""
    if "dataloader" not in data:
        return data, None
    loader = data["dataloader"]
    where = f"{path}.dataloader"
    if not isinstance(loader, dict):
        raise ConfigError(where, f"expected a mapping, got {type_name(loader)} ({loader!r})")
    for key in _FLAT_SOURCE_KEYS:
        if key in data:
            raise ConfigError(f"{path}.{key}", "given both flat and inside dataloader:; use "
                                               "one layout")
    kind = loader.get("type", "MindDataset")
    if kind not in _TYPES:
        raise ConfigError(f"{where}.type", f"{kind!r} is not implemented here; supported "
                                           f"loaders: {list(_TYPES)}")
    megatron = kind == MEGATRON_LOADER
    # the Megatron loader names its files in config.data_path
    allowed = tuple(k for k in _LOADER_KEYS if k not in ("dataset_files", "dataset_dir")) \
        + MEGATRON_LOADER_KEYS if megatron else _LOADER_KEYS
    for key in loader:
        if key not in allowed:
            raise unknown_key_error(where, key, allowed)
    flat = {k: v for k, v in data.items() if k != "dataloader"}
    layout: Dict[str, Any] = {"type": kind, "shuffle": loader.get("shuffle", False),
                              **{k: loader[k] for k in _WRITTEN_BACK if k in loader}}
    if megatron:
        fields, layout["megatron"] = split_megatron(loader, where)
        for key in fields:
            if key in flat:
                raise ConfigError(f"{path}.{key}", "given both flat and inside "
                                                   "dataloader.config:; use one layout")
        flat.update(fields)
        flat["type"] = "IndexedDataset"
    else:
        flat["type"] = kind
    if "dataset_files" in loader and "dataset_dir" in loader:
        raise ConfigError(f"{where}.dataset_dir", "given together with dataset_files; keep one")
    for key in ("dataset_files", "dataset_dir"):
        if key in loader:
            files = loader[key]
            if isinstance(files, list):
                if not files:
                    raise ConfigError(f"{where}.{key}", "must name at least one file")
                files = convert_value(List[str], files, f"{where}.{key}")
                flat["data_path"] = files[0] if len(files) == 1 else files
            else:
                flat["data_path"] = convert_value(str, files, f"{where}.{key}")
    # upstream's DataloaderConfig default is False; GPTDataset shuffles its samples anyway
    layout["shuffle"] = convert_value(bool, layout["shuffle"], f"{where}.shuffle")
    flat["shuffle"] = True if megatron else layout["shuffle"]
    if "column_names" in loader:
        cols = convert_value(List[str], loader["column_names"], f"{where}.column_names")
        bad = [c for c in cols if c not in MINDRECORD_COLUMNS]
        if bad or "input_ids" not in cols:
            raise ConfigError(f"{where}.column_names",
                              f"must name columns of {list(MINDRECORD_COLUMNS)} including "
                              f"input_ids, got {cols}")
    if "python_multiprocessing" in loader:
        value = convert_value(bool, loader["python_multiprocessing"],
                              f"{where}.python_multiprocessing")
        require_noop(f"{where}.python_multiprocessing", value, (False,),
                     "multiprocess sample loading")
    return flat, layout


def nest_dataloader(flat: Dict[str, Any], layout: Dict[str, Any]) -> Dict[str, Any]:
    """The nested layout of a flat ``to_dict()`` (inverse of :func:`split_dataloader`)."""
    megatron = layout.get("megatron")
    moved = _FLAT_SOURCE_KEYS + (MOVED_FIELDS if megatron is not None else ())
    out = {k: v for k, v in flat.items() if k not in moved}
    loader: Dict[str, Any] = {"type": layout["type"] if megatron is not None else flat["type"],
                              "shuffle": layout["shuffle"] if megatron is not None
                              else flat["shuffle"],
                              **{k: layout[k] for k in _WRITTEN_BACK if k in layout}}
    if megatron is not None:
        loader.update(nest_megatron(flat, megatron))
    elif flat.get("data_path") is not None:
        loader["dataset_files"] = flat["data_path"]
    return {"dataloader": loader, **out}
