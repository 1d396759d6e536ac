"""Upstream's nested `train_dataset.dataloader:` layout <-> the flat `train_dataset:` fields.

    dataloader.type           -> type   (MindDataset, or this project's TokenFile /
                                         SyntheticMarkov; upstream's other loaders are errors)
    dataloader.dataset_files  -> data_path (a path, or a list of exactly one path)
    dataloader.dataset_dir    -> data_path
    dataloader.shuffle        -> shuffle (default False, as upstream; the flat layout's is True)
    dataloader.column_names   -> checked: the MindRecord columns read here
    dataloader.python_multiprocessing -> False only (samples are read in-process)
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from .errors import ConfigError
from .noop import require_noop
from .schema import convert_value, type_name, unknown_key_error

__all__ = ["split_dataloader", "nest_dataloader", "MINDRECORD_COLUMNS"]

MINDRECORD_COLUMNS = ("input_ids", "labels", "loss_mask", "position_ids")
_LOADER_KEYS = ("type", "dataset_files", "dataset_dir", "shuffle", "column_names",
                "python_multiprocessing")
_TYPES = ("MindDataset", "TokenFile", "SyntheticMarkov")
_FLAT_SOURCE_KEYS = ("type", "data_path", "shuffle")


def split_dataloader(data: Dict[str, Any], path: str) -> Tuple[Dict[str, Any], bool]:
    """``(flat mapping, nested?)``; a mapping without ``dataloader`` is returned as is."""
    if "dataloader" not in data:
        return data, False
    loader = data["dataloader"]
    where = f"{path}.dataloader"
    if not isinstance(loader, dict):
        raise ConfigError(where, f"expected a mapping, got {type_name(loader)} ({loader!r})")
    for key in _FLAT_SOURCE_KEYS:
        if key in data:
            raise ConfigError(f"{path}.{key}", "given both flat and inside dataloader:; use "
                                               "one layout")
    for key in loader:
        if key not in _LOADER_KEYS:
            raise unknown_key_error(where, key, _LOADER_KEYS)
    flat = {k: v for k, v in data.items() if k != "dataloader"}
    kind = loader.get("type", "MindDataset")
    if kind not in _TYPES:
        raise ConfigError(f"{where}.type", f"{kind!r} is not implemented here; supported "
                                           f"loaders: {list(_TYPES)}")
    flat["type"] = kind
    if "dataset_files" in loader and "dataset_dir" in loader:
        raise ConfigError(f"{where}.dataset_dir", "given together with dataset_files; keep one")
    for key in ("dataset_files", "dataset_dir"):
        if key in loader:
            files = loader[key]
            if isinstance(files, list):
                if len(files) != 1:
                    raise ConfigError(f"{where}.{key}", f"exactly one file is supported, got "
                                                        f"{len(files)}")
                files = files[0]
            flat["data_path"] = convert_value(str, files, f"{where}.{key}")
    flat["shuffle"] = loader.get("shuffle", False)   # upstream's DataloaderConfig default
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
    return flat, True


def nest_dataloader(flat: Dict[str, Any]) -> Dict[str, Any]:
    """The nested layout of a flat ``to_dict()`` (inverse of :func:`split_dataloader`)."""
    out = {k: v for k, v in flat.items() if k not in _FLAT_SOURCE_KEYS}
    loader: Dict[str, Any] = {"type": flat["type"], "shuffle": flat["shuffle"]}
    if flat.get("data_path") is not None:
        loader["dataset_files"] = flat["data_path"]
    return {"dataloader": loader, **out}
