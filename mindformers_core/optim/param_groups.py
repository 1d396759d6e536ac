"""Parameter groups: which lr multiplier, weight decay, eps and update rule each parameter gets.

Megatron `_get_param_groups` semantics on MindFormers-style configs:
  1. overrides: `{ParamKey: ParamGroupOverride}`; `None` means "build them from the config":
     standard (weight-decay rules, decoupled LR) + muP + `optimizer.param_overrides` + Muon
     routing. An explicit `{}` means "no overrides at all" (every parameter decays).
  2. every trainable parameter collects the overrides of every key it matches; they are merged
     (equal values agree, different values are a ValueError naming both keys and the parameter);
  3. parameters with the same merged settings share one group; groups are ordered by the first
     parameter that lands in them, so the order is the same in every construction and on every
     rank (the parameter order of the model is).

A group is a plain dict (docs/architecture.md "Parameter groups"):
  {"params": [Parameter, ...], "lr_mult": float, "weight_decay": float, "wd_mult": float,
   optional "max_lr", "min_lr", "eps", "betas", "optimizer", and "name"}
The effective decay is `weight_decay * wd_mult` (Megatron; `Optimizer.group_weight_decay`):
`weight_decay` is the override's absolute value or config.weight_decay, `wd_mult` the rules'
multiplier; a group with wd_mult 0 also has weight_decay 0.0 (as upstream's no-decay group).

Weight decay (MindFormers 2.1 `get_param_groups`): include > exclude > defaults.
A rule matches a name when `rule == name`, `rule in name` (substring) or `fnmatch(name, rule)`.
Default no-decay reasons, in order: 1-D shape; name ending in `.bias`; name in
`model.no_weight_decay()`; a `model.no_weight_decay_keywords()` entry as a substring. Megatron
extras: `apply_wd_to_qk_layernorm` (q_layernorm./k_layernorm. params keep decay) and
`rmsnorm_weight_decay_mult` (wd_mult for RMSNorm gammas `*norm.weight`, beating the former).
"""
from __future__ import annotations

import fnmatch
import math
import warnings
from typing import Dict, List, Optional, Tuple

from ..core.optimizer_rules import ALLOWED_GROUP_OPTIMIZERS, OVERRIDE_FIELDS
from ..errors import ConfigError
from .mup import get_mup_config_overrides, mup_width_mult, model_hidden_size
from .muon_routing import DEFAULT_ADAMW_INCLUDE, muon_routing, normalize_adamw_include, routes_to_muon
from .param_key import (EMBEDDING_OR_OUTPUT_GLOBS, ParamGroupOverride, ParamKey, ParamPredicate,
                        ParamWithNamePredicate,
                        as_tuple, check_override_values, config_value,
                        merge_overrides, optimizer_kind)

__all__ = [
    "ParamKey", "ParamPredicate", "ParamWithNamePredicate", "ParamGroupOverride",
    "get_param_groups", "get_standard_config_overrides", "get_mup_config_overrides",
    "build_config_overrides", "check_config_overrides_consistency", "format_param_group_table",
    "param_group_map", "mup_width_mult", "muon_routing", "weight_decay_rule_matches",
    "DEFAULT_ADAMW_INCLUDE",
]


# --- collecting parameters --------------------------------------------------------------------

def named_trainable_params(model_or_named_params) -> Tuple[List[Tuple[str, object]], object]:
    """(name, Parameter) pairs in model order, plus the model (None for a plain iterable).

    A `mindspore.nn.Cell` gives its `trainable_params()` (names = `param.name`); an iterable
    gives (name, param) pairs or parameters (names = `.name`). Frozen parameters
    (`requires_grad` False) are skipped; a parameter listed twice (tied weights) counts once.
    """
    model = None
    if hasattr(model_or_named_params, "trainable_params") and callable(model_or_named_params.trainable_params):
        model = model_or_named_params
        items = [(p.name, p) for p in model.trainable_params()]
    else:
        items = []
        for item in model_or_named_params:
            if isinstance(item, tuple) and len(item) == 2:
                items.append((item[0], item[1]))
            else:
                items.append((item.name, item))
    seen = set()
    out = []
    for name, param in items:
        if not getattr(param, "requires_grad", True) or id(param) in seen:
            continue
        seen.add(id(param))
        out.append((name, param))
    return out, model


# --- weight-decay rules -----------------------------------------------------------------------

def weight_decay_rule_matches(rule: str, name: str) -> bool:
    """Upstream rule: exact name, substring, or fnmatch (case-sensitive)."""
    return rule == name or rule in name or fnmatch.fnmatchcase(name, rule)


def _rule_list(config, field_name: str) -> Tuple[str, ...]:
    rules = config_value(config, field_name)
    if rules is None:
        return ()
    if not isinstance(rules, (list, tuple)):
        raise TypeError(f"{field_name} should be a list of strings, but got {type(rules)}.")
    for rule in rules:
        if not isinstance(rule, str):
            raise TypeError(f"All items in {field_name} should be strings, but got {type(rule)}.")
    return tuple(rules)


def _model_no_weight_decay(model) -> Tuple[set, Tuple[str, ...]]:
    names, keywords = set(), ()
    if model is not None:
        hook = getattr(model, "no_weight_decay", None)
        if callable(hook):
            names = set(hook())
        hook = getattr(model, "no_weight_decay_keywords", None)
        if callable(hook):
            keywords = tuple(hook())
    return names, keywords


def _rmsnorm_mult(config) -> Optional[float]:
    mult = config_value(config, "rmsnorm_weight_decay_mult")
    if mult is None:
        return None
    if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not math.isfinite(mult) or mult < 0:
        raise ConfigError("optimizer.rmsnorm_weight_decay_mult",
                          f"rmsnorm_weight_decay_mult must be a finite nonnegative value, got {mult!r}")
    return float(mult)


def _is_rmsnorm_gamma(param, name: str) -> bool:
    # All norms of our models are RMSNorm; their gamma is the 1-D `...norm.weight`.
    return len(param.shape) == 1 and fnmatch.fnmatchcase(name, "*norm.weight")


def _is_qk_layernorm(name: str) -> bool:
    return "q_layernorm." in name or "k_layernorm." in name   # Megatron's test, kv_layernorm excluded


def get_standard_config_overrides(config, model=None) -> Dict[ParamKey, ParamGroupOverride]:
    """Weight-decay skips and decoupled LR (Megatron `get_standard_config_overrides`, extended
    with MindFormers' include/exclude rules and the model's no_weight_decay hooks)."""
    include = _rule_list(config, "weight_decay_include")
    exclude = _rule_list(config, "weight_decay_exclude")
    rms_mult = _rmsnorm_mult(config)
    apply_qk = bool(config_value(config, "apply_wd_to_qk_layernorm"))
    no_wd_names, no_wd_keywords = _model_no_weight_decay(model)

    def wd_mult_of(param, name) -> Optional[float]:
        """The wd_mult the rules give this parameter; None = untouched (full decay)."""
        if any(weight_decay_rule_matches(r, name) for r in include):
            return None
        if any(weight_decay_rule_matches(r, name) for r in exclude):
            return 0.0
        if rms_mult is not None and _is_rmsnorm_gamma(param, name):
            return rms_mult
        if len(param.shape) == 1 or name.endswith(".bias"):
            return None if apply_qk and _is_qk_layernorm(name) else 0.0
        if name in no_wd_names or any(kw in name for kw in no_wd_keywords):
            return 0.0
        return None

    overrides: Dict[ParamKey, ParamGroupOverride] = {
        ParamKey(with_name_predicate=ParamWithNamePredicate(
            "no_weight_decay", lambda p, n: wd_mult_of(p, n) == 0.0)): ParamGroupOverride(wd_mult=0.0),
    }
    if rms_mult not in (None, 0.0):
        overrides[ParamKey(with_name_predicate=ParamWithNamePredicate(
            f"rmsnorm_weight_decay_mult={rms_mult:g}", lambda p, n: wd_mult_of(p, n) == rms_mult
        ))] = ParamGroupOverride(wd_mult=rms_mult)

    decoupled_lr = config_value(config, "decoupled_lr")
    decoupled_min_lr = config_value(config, "decoupled_min_lr")
    if decoupled_lr is not None:
        override = ParamGroupOverride(max_lr=float(decoupled_lr))
        if decoupled_min_lr is not None:
            override["min_lr"] = float(decoupled_min_lr)
        overrides[ParamKey(name=EMBEDDING_OR_OUTPUT_GLOBS, attr="is_embedding_or_output_parameter")] = override
    elif decoupled_min_lr is not None:
        raise ConfigError("optimizer.decoupled_min_lr", "has no effect without optimizer.decoupled_lr; set both")
    return overrides


# --- optimizer.param_overrides ----------------------------------------------------------------

_SELECTOR_FIELDS = ("name", "ndim")


def param_overrides_from_config(config) -> Dict[ParamKey, ParamGroupOverride]:
    """`optimizer.param_overrides: [{name: [globs] | glob, ndim: int, lr_mult: ..., ...}]`.

    An entry selects the parameters whose full name fnmatches one of `name` AND whose ndim
    equals `ndim` (each selector optional, at least one required).
    """
    entries = config_value(config, "param_overrides")
    if entries is None:
        return {}
    if not isinstance(entries, (list, tuple)):
        raise ConfigError("optimizer.param_overrides", f"must be a list of entries, got {type(entries).__name__}")
    allowed = ALLOWED_GROUP_OPTIMIZERS.get(optimizer_kind(config))
    out: Dict[ParamKey, ParamGroupOverride] = {}
    for i, entry in enumerate(entries):
        path = f"optimizer.param_overrides[{i}]"
        if not isinstance(entry, dict):
            if not hasattr(entry, "ndim") or not hasattr(entry, "name"):
                raise ConfigError(path, f"must be a mapping, got {type(entry).__name__}")
            # a config.param_overrides.ParamOverrideConfig: None means "not set"
            entry = {k: getattr(entry, k, None) for k in _SELECTOR_FIELDS + OVERRIDE_FIELDS}
            entry = {k: v for k, v in entry.items() if v is not None}
        for k in entry:
            if k not in _SELECTOR_FIELDS + OVERRIDE_FIELDS:
                raise ConfigError(f"{path}.{k}", f"unknown key; valid keys: {list(_SELECTOR_FIELDS + OVERRIDE_FIELDS)}")
        globs = entry.get("name")
        if isinstance(globs, str):
            globs = (globs,)
        if globs is not None and (not isinstance(globs, (list, tuple)) or not globs
                                  or not all(isinstance(g, str) for g in globs)):
            raise ConfigError(f"{path}.name", f"must be a glob string or a non-empty list of them, got {globs!r}")
        ndim = entry.get("ndim")
        if ndim is not None and (isinstance(ndim, bool) or not isinstance(ndim, int) or ndim < 0):
            raise ConfigError(f"{path}.ndim", f"must be a non-negative integer, got {ndim!r}")
        if globs is None and ndim is None:
            raise ConfigError(path, "needs 'name' and/or 'ndim' to select parameters")
        override = {k: v for k, v in entry.items() if k in OVERRIDE_FIELDS}
        if not override:
            raise ConfigError(path, f"sets nothing; give at least one of {list(OVERRIDE_FIELDS)}")
        try:
            check_override_values(path, override, allowed)
        except ValueError as err:
            raise ConfigError("", str(err)) from None
        globs = tuple(globs) if globs is not None else None
        label = f"param_overrides[{i}](name={list(globs) if globs else None}, ndim={ndim})"

        def selects(param, name, globs=globs, ndim=ndim):
            if ndim is not None and len(param.shape) != ndim:
                return False
            return globs is None or any(fnmatch.fnmatchcase(name, g) for g in globs)
        out[ParamKey(with_name_predicate=ParamWithNamePredicate(label, selects))] = ParamGroupOverride(**override)
    return out


# --- Muon routing as overrides ----------------------------------------------------------------

def muon_routing_overrides(config) -> Dict[ParamKey, ParamGroupOverride]:
    """Under `type: Muon`, tag each parameter with the update rule it gets (muon | adamw)."""
    patterns = normalize_adamw_include(config_value(config, "adamw_include"))
    to_muon = ParamWithNamePredicate(
        "muon_routing:muon", lambda p, n: routes_to_muon(n, tuple(p.shape), patterns))
    to_adamw = ParamWithNamePredicate(
        "muon_routing:adamw", lambda p, n: not routes_to_muon(n, tuple(p.shape), patterns))
    return {ParamKey(with_name_predicate=to_muon): ParamGroupOverride(optimizer="muon"),
            ParamKey(with_name_predicate=to_adamw): ParamGroupOverride(optimizer="adamw")}


def build_config_overrides(config, model=None, hidden_size: Optional[int] = None
                           ) -> Dict[ParamKey, ParamGroupOverride]:
    """Everything the config asks for: standard + muP + param_overrides + Muon routing."""
    overrides = dict(get_standard_config_overrides(config, model))
    mup_cfg = config_value(config, "mup")
    if mup_cfg is not None:
        if hidden_size is None:
            if model is None:
                raise ValueError("optimizer.mup needs the model's hidden_size: pass a model or hidden_size=.")
            hidden_size = model_hidden_size(model)
        width_mult = mup_width_mult(hidden_size, mup_cfg)
        overrides.update(get_mup_config_overrides(config, width_mult, optimizer_kind(config)))
    overrides.update(param_overrides_from_config(config))
    if optimizer_kind(config) == "muon":
        overrides.update(muon_routing_overrides(config))
    return overrides


def check_config_overrides_consistency(config, config_overrides) -> bool:
    """Overrides are a `{ParamKey: dict}` mapping of known fields with sane values, and every
    `optimizer` kind they name can run under the config's optimizer type (AdamW: adamw;
    Muon: muon or adamw; SGD: sgd; Lion: lion). Returns True; raises TypeError / ValueError."""
    if config_overrides is None:
        return True
    if not isinstance(config_overrides, dict):
        raise TypeError(f"config_overrides must be a dict of ParamKey -> ParamGroupOverride, "
                        f"but got {type(config_overrides).__name__}.")
    allowed = ALLOWED_GROUP_OPTIMIZERS.get(optimizer_kind(config))
    for key, override in config_overrides.items():
        if not isinstance(key, ParamKey):
            raise TypeError(f"config_overrides keys must be ParamKey, but got {type(key).__name__}: {key!r}.")
        check_override_values(key.describe(), override, allowed)
    return True


# --- groups -----------------------------------------------------------------------------------

def _group_settings(merged: dict, base_weight_decay: float) -> Tuple[Tuple[str, object], ...]:
    """Final group settings (defaults filled in) as a canonical, hashable tuple."""
    settings = {"lr_mult": merged.get("lr_mult", 1.0), "wd_mult": merged.get("wd_mult", 1.0)}
    # The optimizers apply weight_decay * wd_mult (Megatron). A no-decay group also carries
    # weight_decay 0.0 so that either field alone says "no decay" (upstream groups do).
    wd = float(merged.get("weight_decay", base_weight_decay))
    settings["weight_decay"] = 0.0 if settings["wd_mult"] == 0.0 else wd
    for fname in ("max_lr", "min_lr", "eps", "betas", "optimizer"):
        if fname in merged:
            settings[fname] = merged[fname]
    return tuple(settings.items())


def _group_name(merged: dict) -> str:
    parts = []
    for fname in OVERRIDE_FIELDS:
        if fname not in merged:
            continue
        value = merged[fname]
        if fname in ("lr_mult", "wd_mult") and value == 1.0:
            continue
        if isinstance(value, float):
            value = f"{value:g}"
        elif isinstance(value, tuple):
            value = "(" + ",".join(f"{v:g}" for v in value) + ")"
        parts.append(f"{fname}={value}")
    return ",".join(parts) or "default"


def _warn_unmatched(config, names: List[str], params_by_name, from_config_overrides) -> None:
    for field_name in ("weight_decay_include", "weight_decay_exclude"):
        for rule in _rule_list(config, field_name):
            if not any(weight_decay_rule_matches(rule, n) for n in names):
                warnings.warn(f"optimizer.{field_name}: pattern {rule!r} matches no trainable parameter.",
                              UserWarning, stacklevel=3)
    for key in from_config_overrides:
        for pred in as_tuple(key.with_name_predicate):
            if pred.name.startswith("param_overrides[") and not any(
                    pred(params_by_name[n], n) for n in names):
                warnings.warn(f"optimizer.{pred.name} matches no trainable parameter.", UserWarning, stacklevel=3)


def get_param_groups(model_or_named_params, config, overrides=None, *, hidden_size: Optional[int] = None
                     ) -> List[dict]:
    """Group the trainable parameters (see the module docstring). `hidden_size` is only needed
    for `optimizer.mup` when a parameter list (no model) is given."""
    named, model = named_trainable_params(model_or_named_params)
    from_config = overrides is None
    if from_config:
        overrides = build_config_overrides(config, model, hidden_size)
    check_config_overrides_consistency(config, overrides)
    base_wd = float(config_value(config, "weight_decay"))
    if from_config:
        params_by_name = {n: p for n, p in named}
        _warn_unmatched(config, [n for n, _ in named], params_by_name, overrides)

    groups: Dict[tuple, dict] = {}
    for name, param in named:
        matched = [(key, override) for key, override in overrides.items() if key.matches(param, name)]
        merged = merge_overrides(name, matched)
        settings = _group_settings(merged, base_wd)
        group = groups.get(settings)
        if group is None:
            group = {"params": [], **dict(settings), "name": _group_name(merged)}
            groups[settings] = group
        group["params"].append(param)
    return list(groups.values())


# --- dumps ------------------------------------------------------------------------------------

def param_group_map(groups: List[dict]) -> Dict[str, int]:
    """Parameter name -> index of its group (Megatron's param-to-param-group dump)."""
    return {p.name: i for i, g in enumerate(groups) for p in g["params"]}


def format_param_group_table(groups: List[dict], file=None) -> str:
    """One row per parameter: name, shape, group index, lr rule, effective weight decay
    (weight_decay * wd_mult), optimizer. `file`: a path or a text stream to write the table to as well."""
    rows = [("name", "shape", "group", "lr", "weight_decay", "optimizer")]
    for index, group in enumerate(groups):
        if "max_lr" in group:
            lr = f"max_lr={group['max_lr']:g}" + (f",min_lr={group['min_lr']:g}" if "min_lr" in group else "")
        else:
            lr = f"lr_mult={group.get('lr_mult', 1.0):g}"
        if "eps" in group:
            lr += f" eps={group['eps']:g}"
        wd = f"{group.get('weight_decay', 0.0) * group.get('wd_mult', 1.0):g}"   # effective
        kind = group.get("optimizer", "-")
        for param in group["params"]:
            rows.append((param.name, "x".join(str(int(s)) for s in param.shape) or "scalar",
                         str(index), lr, wd, kind))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    summary = [f"group {i} ({g.get('name', '')}): {len(g['params'])} params" for i, g in enumerate(groups)]
    text = "\n".join(lines + [""] + summary) + "\n"
    if file is not None:
        if isinstance(file, (str, bytes)) or hasattr(file, "__fspath__"):
            with open(file, "w", encoding="utf-8") as handle:
                handle.write(text)
        else:
            file.write(text)
    return text
