"""Selectors for parameter-group overrides (Megatron `optimizer_config.ParamKey` semantics).

A `ParamKey` says *which* parameters an override applies to; a `ParamGroupOverride` says *what*
changes for them. Keys are hashable so that `{ParamKey: ParamGroupOverride}` dicts work, and
predicates compare by their name only (two predicates with the same name are the same key).

Matching (`ParamKey.matches`): a parameter matches when ANY of these holds
  - its full name matches one of `name` (Unix shell-style `fnmatch`, case-sensitive),
  - one of the attributes in `attr` is truthy on the parameter,
  - one of `predicate(param)` is true,
  - one of `with_name_predicate(param, name)` is true.

Selector objects never reach the group dicts: overrides are plain dicts, merged per parameter
by `merge_overrides`, which reports conflicts naming both keys and the parameter.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, TypedDict, Union

from ..core.optimizer_rules import OVERRIDE_FIELDS, override_value_problem


@dataclass(frozen=True)
class ParamPredicate:
    """A named `fn(param) -> bool`; hash and equality use `name` only."""
    name: str
    fn: Callable[[Any], bool] = field(compare=False, hash=False, repr=False)

    def __call__(self, param) -> bool:
        return bool(self.fn(param))


@dataclass(frozen=True)
class ParamWithNamePredicate:
    """A named `fn(param, name) -> bool`; hash and equality use `name` only."""
    name: str
    fn: Callable[[Any, str], bool] = field(compare=False, hash=False, repr=False)

    def __call__(self, param, name: str) -> bool:
        return bool(self.fn(param, name))


def as_tuple(value) -> tuple:
    if isinstance(value, (str, ParamPredicate, ParamWithNamePredicate)):
        return (value,)
    return tuple(value)


@dataclass(frozen=True)
class ParamKey:
    """Which parameters an override applies to. Any single match counts (logical OR)."""
    name: Union[str, Tuple[str, ...]] = field(default_factory=tuple)
    attr: Union[str, Tuple[str, ...]] = field(default_factory=tuple)
    predicate: Union[ParamPredicate, Tuple[ParamPredicate, ...]] = field(default_factory=tuple)
    with_name_predicate: Union[ParamWithNamePredicate, Tuple[ParamWithNamePredicate, ...]] = field(
        default_factory=tuple)

    def __post_init__(self):
        # Lists are not hashable: normalise every field to a tuple so keys work in dicts.
        for fname in ("name", "attr", "predicate", "with_name_predicate"):
            value = getattr(self, fname)
            if not isinstance(value, (str, ParamPredicate, ParamWithNamePredicate, tuple)):
                object.__setattr__(self, fname, tuple(value))

    def matches(self, param, param_name: str) -> bool:
        """True if `param` (full name `param_name`) matches this key."""
        for pattern in as_tuple(self.name):
            if fnmatch.fnmatchcase(param_name, pattern):
                return True
        for attr in as_tuple(self.attr):
            if getattr(param, attr, False):
                return True
        for pred in as_tuple(self.predicate):
            if pred(param):
                return True
        for pred in as_tuple(self.with_name_predicate):
            if pred(param, param_name):
                return True
        return False

    def describe(self) -> str:
        """Short readable form used in error messages and logs."""
        parts = []
        if as_tuple(self.name):
            parts.append(f"name={list(as_tuple(self.name))}")
        if as_tuple(self.attr):
            parts.append(f"attr={list(as_tuple(self.attr))}")
        if as_tuple(self.predicate):
            parts.append("predicate=[" + ", ".join(p.name for p in as_tuple(self.predicate)) + "]")
        if as_tuple(self.with_name_predicate):
            parts.append("with_name_predicate=["
                         + ", ".join(p.name for p in as_tuple(self.with_name_predicate)) + "]")
        return "ParamKey(" + ", ".join(parts) + ")"

    __str__ = describe


class ParamGroupOverride(TypedDict, total=False):
    """What changes for the parameters of a key. Every field is optional.

    lr_mult:      group lr = schedule lr * lr_mult
    max_lr/min_lr: the group follows the same schedule re-evaluated with this peak / floor
                  (absolute learning rates; decoupled embedding / output LR)
    weight_decay: absolute decay coefficient replacing the config's weight_decay
    wd_mult:      effective decay = (weight_decay or config.weight_decay) * wd_mult
    eps, betas:   Adam-family epsilon and (beta1, beta2)
    optimizer:    'adamw' | 'muon' | 'sgd' | 'lion' (which update rule the group uses)
    """
    lr_mult: float
    max_lr: float
    min_lr: float
    weight_decay: float
    wd_mult: float
    eps: float
    betas: Tuple[float, float]
    optimizer: str




def normalize_override_value(field_name: str, value):
    """Canonical form so equal settings compare and hash equal (ints -> float, lists -> tuple)."""
    if field_name == "betas":
        return tuple(float(b) for b in value)
    if field_name == "optimizer":
        return str(value).lower()
    if isinstance(value, bool):
        return value
    return float(value)


def merge_overrides(param_name: str, matched: List[Tuple[ParamKey, dict]]) -> dict:
    """Merge all overrides whose key matched `param_name`.

    Equal values from several keys are fine; different values for one field are a ValueError
    naming both keys and the parameter. Setting `lr_mult` != 1 together with `max_lr` is also
    a conflict (two different LR rules for one group).
    """
    merged: Dict[str, Any] = {}
    source: Dict[str, ParamKey] = {}
    for key, override in matched:
        for fname, raw in override.items():
            value = normalize_override_value(fname, raw)
            if fname in merged and merged[fname] != value:
                raise ValueError(
                    f"Conflicting overrides for parameter {param_name!r}: {fname}={merged[fname]!r} "
                    f"from {source[fname].describe()} and {fname}={value!r} from {key.describe()}.")
            merged[fname] = value
            source.setdefault(fname, key)
    if "max_lr" in merged and merged.get("lr_mult", 1.0) != 1.0:
        raise ValueError(
            f"Conflicting overrides for parameter {param_name!r}: lr_mult={merged['lr_mult']!r} "
            f"from {source['lr_mult'].describe()} and max_lr={merged['max_lr']!r} from "
            f"{source['max_lr'].describe()} (a group follows either lr_mult or max_lr/min_lr).")
    return merged


def check_override_values(key_desc: str, override: dict, allowed_optimizers: Optional[Iterable[str]] = None):
    """Validate one override dict with ``core.optimizer_rules``; ValueError naming the key and
    the field."""
    if not isinstance(override, dict):
        raise TypeError(f"override for {key_desc} must be a dict, but got {type(override).__name__}.")
    for fname, value in override.items():
        where = f"{key_desc}: {fname}"
        if fname not in OVERRIDE_FIELDS:
            raise ValueError(f"{where} is not an override field; valid fields: {list(OVERRIDE_FIELDS)}.")
        problem = override_value_problem(fname, value, allowed_optimizers)
        if problem:
            raise ValueError(f"{where}={value!r} {problem}.")
    if "min_lr" in override and "max_lr" in override and override["min_lr"] > override["max_lr"]:
        raise ValueError(f"{key_desc}: min_lr={override['min_lr']!r} must be <= max_lr={override['max_lr']!r}.")


# --- reading the optimizer config ------------------------------------------------------------
def _defaults_of(type_name: Any):
    """``OptimizerConfig(type=...)``: every field's one default (``core.optimizer_defaults``,
    type-dependent ``weight_decay``/``eps`` resolved), for a config that does not carry one."""
    from ..config.optimizer import OPTIMIZER_KEYS, OptimizerConfig
    if type_name not in _DEFAULT_CONFIGS:
        known = type_name if type_name in OPTIMIZER_KEYS else "AdamW"
        _DEFAULT_CONFIGS[type_name] = OptimizerConfig(type=known)
    return _DEFAULT_CONFIGS[type_name]


_DEFAULT_CONFIGS: Dict[Any, Any] = {}


def config_value(config, key: str, default=None):
    """`config[key]` for a dict, `config.key` for an object; when absent or None (a field
    explicitly None means 'not set'): ``default``, else the OptimizerConfig default of the
    config's type."""
    if config is None:
        value = None
    elif isinstance(config, dict):
        value = config.get(key)
    else:
        value = getattr(config, key, None)
    if value is not None:
        return value
    if default is not None:
        return default
    if key == "type":
        return _defaults_of(None).type
    return getattr(_defaults_of(config_value(config, "type")), key, None)


def optimizer_kind(config) -> str:
    """Lower-case optimizer type of the config: 'adamw' | 'muon' | 'sgd' | 'lion' | other."""
    kind = str(config_value(config, "type")).lower()
    return "adamw" if kind == "adam" else kind



# Input embedding and output layer (decoupled LR, muP vector-like, Muon's AdamW defaults).
EMBEDDING_OR_OUTPUT_GLOBS = ("*word_embeddings*", "*output_layer*")


def is_embedding_or_output(param, name: str) -> bool:
    """Megatron marks these with `is_embedding_or_output_parameter`; we also match the names."""
    if getattr(param, "is_embedding_or_output_parameter", False):
        return True
    return any(fnmatch.fnmatchcase(name, p) for p in EMBEDDING_OR_OUTPUT_GLOBS)
