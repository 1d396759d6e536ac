"""muP (maximal-update parameterization) learning-rate / eps overrides (Megatron
`get_mup_config_overrides`, Megatron's muP overrides).

Parameter classes (Tensor Programs V):
  - hidden (matrix-like): ndim >= 2 and not the input embedding / output layer; both dims grow
    with width, e.g. `decoder.layers.0.mlp.linear_fc1.weight`, grouped experts (3-D);
  - vector-like: everything else: 1-D (norm gammas, biases), the word / position embeddings and
    the output layer (one dimension grows with width).

Rules, with w = width_mult = hidden_size / base_hidden_size:
  Adam / AdamW:  hidden lr_mult = 1/w and eps = base_eps / w; vector-like keep base lr and eps.
  SGD:           vector-like lr_mult = w; hidden keep base lr; no eps override.
  other (Lion, Muon's AdamW branch):  hidden lr_mult = 1/w; no eps override. Under Muon the
                 matrices Muon itself updates are excluded (Muon's update is width-normalised).
  decoupled_lr set: the embedding / output layer keep their explicit max_lr / min_lr and muP
                 adds nothing for them.
w == 1 gives no overrides at all (the base model is its own proxy).
"""
from __future__ import annotations

import fnmatch
import math
from typing import Dict

from ..errors import ConfigError
from .muon_routing import normalize_adamw_include, routes_to_muon
from .param_key import (ParamGroupOverride, ParamKey, ParamWithNamePredicate, config_value,
                        is_embedding_or_output)

_VECTOR_LIKE_EMBEDDING_GLOBS = ("*position_embeddings*",)
_ADAM_TYPES = ("adam", "adamw")


def model_hidden_size(model) -> int:
    """hidden_size of a model: `get_gpt_transformer_config().hidden_size`, `config.hidden_size`
    or `hidden_size`."""
    getter = getattr(model, "get_gpt_transformer_config", None)
    candidates = []
    if callable(getter):
        candidates.append(getattr(getter(), "hidden_size", None))
    candidates.append(getattr(getattr(model, "config", None), "hidden_size", None))
    candidates.append(getattr(model, "hidden_size", None))
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise ValueError("optimizer.mup: cannot read hidden_size from the model; pass hidden_size explicitly.")


def mup_width_mult(model_or_hidden_size, mup_cfg) -> float:
    """width_mult = hidden_size / mup.base_hidden_size; 1.0 when `mup_cfg` is None.

    `mup_cfg`: `{base_hidden_size: N}` (dict) or an object with `base_hidden_size`.
    """
    if mup_cfg is None:
        return 1.0
    base = mup_cfg.get("base_hidden_size") if isinstance(mup_cfg, dict) else getattr(mup_cfg, "base_hidden_size", None)
    if isinstance(mup_cfg, dict):
        unknown = sorted(set(mup_cfg) - {"base_hidden_size"})
        if unknown:
            raise ConfigError(f"optimizer.mup.{unknown[0]}", "unknown key; valid keys: ['base_hidden_size']")
    if base is None:
        raise ConfigError("optimizer.mup.base_hidden_size", "required when optimizer.mup is set")
    if isinstance(base, bool) or not isinstance(base, int) or base <= 0:
        raise ConfigError("optimizer.mup.base_hidden_size", f"must be a positive integer, got {base!r}")
    if isinstance(model_or_hidden_size, int) and not isinstance(model_or_hidden_size, bool):
        hidden = model_or_hidden_size
    else:
        hidden = model_hidden_size(model_or_hidden_size)
    if hidden <= 0:
        raise ConfigError("model.hidden_size", f"must be positive for muP, got {hidden!r}")
    return hidden / base


def is_vector_like(param, name: str) -> bool:
    return (len(param.shape) < 2 or is_embedding_or_output(param, name)
            or any(fnmatch.fnmatchcase(name, p) for p in _VECTOR_LIKE_EMBEDDING_GLOBS))


def get_mup_config_overrides(config, mup_width_mult: float, optimizer_type: str = "adam"
                             ) -> Dict[ParamKey, ParamGroupOverride]:
    """muP overrides for `optimizer_type` ('adam'/'adamw', 'sgd', 'muon', 'lion', ...)."""
    w = float(mup_width_mult)
    if not math.isfinite(w) or w <= 0:
        raise ValueError(f"mup_width_mult must be a finite positive number, got {mup_width_mult!r}.")
    if w == 1.0:
        return {}
    kind = str(optimizer_type).lower()
    decoupled = config_value(config, "decoupled_lr") is not None
    muon_patterns = normalize_adamw_include(config_value(config, "adamw_include")) if kind == "muon" else None

    def keeps_decoupled_lr(param, name):
        return decoupled and is_embedding_or_output(param, name)

    def managed_by_muon(param, name):
        if muon_patterns is None:
            return False
        try:
            return routes_to_muon(name, tuple(param.shape), muon_patterns)
        except ValueError:
            return False  # not Muon-routable; the routing step reports it

    def hidden(param, name):
        return (not is_vector_like(param, name) and not keeps_decoupled_lr(param, name)
                and not managed_by_muon(param, name))

    def vector_like(param, name):
        return is_vector_like(param, name) and not keeps_decoupled_lr(param, name)

    if kind in _ADAM_TYPES:
        base_eps = float(config_value(config, "eps"))
        key = ParamKey(with_name_predicate=ParamWithNamePredicate(f"mup_hidden_adam(w={w:g})", hidden))
        return {key: ParamGroupOverride(lr_mult=1.0 / w, eps=base_eps / w)}
    if kind == "sgd":
        key = ParamKey(with_name_predicate=ParamWithNamePredicate(f"mup_vector_like_sgd(w={w:g})", vector_like))
        return {key: ParamGroupOverride(lr_mult=w)}
    key = ParamKey(with_name_predicate=ParamWithNamePredicate(f"mup_hidden_{kind}(w={w:g})", hidden))
    return {key: ParamGroupOverride(lr_mult=1.0 / w)}
