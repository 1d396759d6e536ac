"""Weights of another format as a run's start: ``checkpoint.load_format`` (auto, native, hf,
mindformers).

A training checkpoint of this project (``store.py``, ``sharded.py``) resumes a run. Any other
weight file starts one from its weights only (a fine-tune start: step 0, a fresh optimizer,
the data from its beginning, a new run id):

* ``hf``: Hugging Face safetensors, one file or a directory with
  ``model.safetensors.index.json`` (its ``weight_map`` names the shard files);
* ``mindformers``: an upstream MindFormers checkpoint: safetensors (one file or such a
  directory) or a MindSpore ``.ckpt``; its optimizer state and counters (``adam_m.*``,
  ``global_step``, ...) are dropped;
* ``native``: this project's parameter names without a training state (``convert_checkpoint
  merge --weights-only``, ``convert_weights --to native``).

Names and layouts go through the converter's tables (``weight_names.py``), the same ones
``tools/convert_weights.py`` uses. ``auto`` (the default) detects the format: this project's
checkpoints by their ``format`` metadata (:data:`WEIGHTS_FORMAT` for weight files), a
``.ckpt`` as MindFormers, otherwise by the tensor names (``model.layers.*``,
``model.embed_tokens.*``, ``lm_head.*``: hf; ``decoder.*``, ``embedding.*`` with a name only
MindFormers uses, or its optimizer state: mindformers). Names both projects use (a GPT's) with
nothing that tells them apart are refused: the layouts differ (``linear_qkv``'s row order),
so a guess could load permuted weights without any error.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Optional

import numpy as np

from ..config.checkpoint import LOAD_FORMATS
from .file_io import CheckpointData, CheckpointError, read_header
from .sharded import INDEX_FORMAT
from .store import FORMAT, resolve_checkpoint
from .weight_names import to_native

__all__ = ["LOAD_FORMATS", "WEIGHTS_FORMAT", "HF_INDEX", "detect_format", "read_weights",
           "foreign_weights", "resolve_start"]

#: ``format`` metadata of a file holding only this project's model weights
WEIGHTS_FORMAT = "mindformers_core.weights/1"
HF_INDEX = "model.safetensors.index.json"
#: upstream MindFormers' non-weight entries of a training checkpoint (optimizer, counters)
_MF_STATE = ("adam_m.", "adam_v.", "accu_grads.", "moments.", "global_step", "learning_rate",
             "scale_sense", "current_iterator_step", "last_overflow_iterator_step", "epoch_num",
             "step_num", "loss_scale")
#: tensor names only MindFormers' PyNative models use
_MF_ONLY = ("linear_qb.weight", "linear_kvb.weight", "mlp.expert_bias")


def _file_format(path: str) -> Optional[str]:
    """The ``format`` metadata of a safetensors file (None for none; CheckpointError for a
    file that is not safetensors)."""
    return read_header(path, os.path.getsize(path))["__metadata__"].get("format")


def _names(path: str):
    if path.endswith(".ckpt"):
        return None
    if os.path.isdir(path):
        with open(os.path.join(path, HF_INDEX), encoding="utf-8") as fh:
            return list(json.load(fh).get("weight_map", {}))
    return [k for k in read_header(path, os.path.getsize(path)) if k != "__metadata__"]


def detect_format(path: str) -> str:
    """``native`` (a training checkpoint or weights of this project), ``hf`` or ``mindformers``
    (module docstring); :class:`CheckpointError` naming the file when none fits."""
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, HF_INDEX)):
            return "native"   # a checkpoint directory (store.resolve_checkpoint)
    elif path.endswith(".ckpt"):
        return "mindformers"
    elif not os.path.isfile(path):
        raise CheckpointError(f"checkpoint.load_path: no such file or directory: {path}")
    elif _file_format(path) in (FORMAT, INDEX_FORMAT, WEIGHTS_FORMAT):
        return "native"
    names = _names(path)
    if any(n.startswith(("model.layers.", "model.embed_tokens.", "lm_head.")) for n in names):
        return "hf"
    if any(n.startswith(("decoder.", "embedding.")) for n in names):
        if any(n.startswith(_MF_STATE) or n.endswith(_MF_ONLY) for n in names):
            return "mindformers"
        # both projects use these names, with other row layouts: guessing could load the
        # weights permuted without an error, so the format must be said
        raise CheckpointError(
            f"{path}: its tensor names are both this project's and upstream MindFormers' (with "
            "other row layouts), and nothing in the file tells which; set "
            "checkpoint.load_format to native or mindformers")
    raise CheckpointError(f"{path}: cannot tell its weight format from its tensor names "
                          f"({sorted(names)[:3]}...); set checkpoint.load_format to native, hf "
                          "or mindformers")


def read_weights(path: str) -> Dict[str, np.ndarray]:
    """``{name: array}`` of a safetensors file, a directory with ``model.safetensors.index.json``
    (every shard it names must be there) or a MindSpore ``.ckpt``."""
    if path.endswith(".ckpt") and os.path.isfile(path):
        import mindspore as ms
        return {k: v.asnumpy() for k, v in ms.load_checkpoint(path).items()}
    from safetensors.numpy import load_file
    if not os.path.isdir(path):
        try:
            return load_file(path)
        except Exception as exc:   # safetensors' own error type for a bad file
            raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from exc
    index = os.path.join(path, HF_INDEX)
    if not os.path.isfile(index):
        raise CheckpointError(f"{path}: a directory of weights needs {HF_INDEX}")
    with open(index, encoding="utf-8") as fh:
        weight_map = json.load(fh).get("weight_map", {})
    files = sorted(set(weight_map.values()))
    missing = [f for f in files if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise CheckpointError(f"{index} names shard file(s) {missing[:3]} that are not in {path}")
    out: Dict[str, np.ndarray] = {}
    for name in files:
        out.update(load_file(os.path.join(path, name)))
    absent = sorted(set(weight_map) - set(out))
    if absent:
        raise CheckpointError(f"{index} lists tensor(s) {absent[:3]} its shard files lack")
    return out


def foreign_weights(path: str, fmt: str, model_cfg) -> CheckpointData:
    """The weights at ``path`` (format ``fmt``: native, hf or mindformers) as a weights-only
    :class:`CheckpointData` with this project's ``model.*`` names."""
    w = read_weights(path)
    if fmt == "mindformers":
        w = {k: v for k, v in w.items() if not k.startswith(_MF_STATE)}
        # its PyNative DeepSeek-V3 fuses MLA's down projections (linear_qkv); mcore does not
        concat = any(k.endswith("self_attention.linear_qkv.weight") for k in w)
    else:
        concat = True
    try:
        native = to_native(w, fmt, model_cfg, concat)
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read it as {fmt} weights of this model: "
                              f"{str(exc).strip(chr(39))}") from None
    return CheckpointData(path=path, step=0, tensors={f"model.{k}": v for k, v in native.items()},
                          state={}, config={}, dtypes={}, run_id=None, weights_only=True)


def resolve_start(load_path: str, load_format: str, model_cfg, log=None,
                  **load_options) -> CheckpointData:
    """What ``checkpoint.load_path`` starts from: a training checkpoint (resolved and verified
    by ``store.resolve_checkpoint``) or weights only (:func:`foreign_weights`)."""
    fmt = detect_format(load_path) if load_format == "auto" else load_format
    if fmt == "native":
        if os.path.isfile(load_path) and _file_format(load_path) not in (FORMAT, INDEX_FORMAT):
            return foreign_weights(load_path, "native", model_cfg)
        return resolve_checkpoint(load_path, log=log, **load_options)
    if log is not None and load_format == "auto":
        log(f"checkpoint.load_path {load_path}: {fmt} weights (checkpoint.load_format: auto)")
    return foreign_weights(load_path, fmt, model_cfg)
