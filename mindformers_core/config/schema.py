"""Strict loading of config sections: dataclasses whose annotations are the schema.

Every section of the YAML file is a dataclass deriving from :class:`Section`.
``Section.from_dict(data, path)``:

1. rejects a non-mapping,
2. rejects every key that is not a declared field (the error names the key, lists the valid
   keys and suggests the closest one),
3. checks and converts each value against its annotation (``int``, ``float``, ``bool``,
   ``str``, ``Optional[X]``, ``List[X]``, ``Dict[str, X]``, ``Literal[...]``, ``Any``,
   nested ``Section`` classes and lists of them),
4. calls ``validate(path)`` for the section's own range and cross-field rules.

Numbers: ``bool`` is never accepted for a number; ``int`` is accepted for ``float`` (and
converted); NaN and +-inf are rejected unless the field's metadata says ``allow_inf=True``.
Every error is a :class:`ConfigError` whose message starts with the dotted path of the key.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any, Dict, List, Sequence

from ..errors import (ConfigError, check, check_range, closest, show, to_float, type_name,
                      unknown_key_error)

# check, check_range, closest, type_name, unknown_key_error: the shared rules of
# ``mindformers_core.errors``, importable from here by every section
__all__ = ["Section", "check", "check_range", "closest", "type_name", "convert_value",
           "unknown_key_error"]


def _is_section(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, Section)


def convert_value(tp, value: Any, path: str, allow_inf: bool = False) -> Any:
    """Check ``value`` against annotation ``tp`` and return the converted value."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any or tp is object:
        return value
    if origin is typing.Union:
        non_none = [a for a in args if a is not type(None)]
        if value is None:
            if len(non_none) < len(args):
                return None
            raise ConfigError(path, "must not be null")
        errors = []
        for alt in non_none:
            try:
                return convert_value(alt, value, path, allow_inf)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise ConfigError(path, f"expected {_describe(tp)}, got {type_name(value)} ({show(value)})")
    if value is None:
        raise ConfigError(path, f"must not be null (expected {_describe(tp)})")
    if origin is typing.Literal:
        if value not in args or type(value) is bool and not any(a is value for a in args):
            raise ConfigError(path, f"must be one of {list(args)}, got {show(value)}")
        return value
    if origin in (list, List, tuple, Sequence) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"expected a list, got {type_name(value)} ({show(value)})")
        item_tp = args[0] if args else Any
        return [convert_value(item_tp, v, f"{path}[{i}]", allow_inf) for i, v in enumerate(value)]
    if origin in (dict, Dict) or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {type_name(value)} ({show(value)})")
        val_tp = args[1] if len(args) == 2 else Any
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{path}.{k}", f"keys must be strings, got {type_name(k)}")
            out[k] = convert_value(val_tp, v, f"{path}.{k}", allow_inf)
        return out
    if _is_section(tp):
        return tp.from_dict(value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected a bool (True/False), got {type_name(value)} ({show(value)})")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer() and math.isfinite(value):
                raise ConfigError(path, f"expected an int, got float ({show(value)}); write {int(value)}")
            raise ConfigError(path, f"expected an int, got {type_name(value)} ({show(value)})")
        return int(value)
    if tp is float:
        return to_float(value, path, allow_inf)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {type_name(value)} ({show(value)})")
        return value
    raise TypeError(f"unsupported annotation {tp!r} at {path}")  # a bug in a Section, not user input


def _describe(tp) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:
        return " or ".join(_describe(a) for a in args if a is not type(None))
    if origin in (list, List):
        return f"list of {_describe(args[0])}" if args else "list"
    if origin is typing.Literal:
        return f"one of {list(args)}"
    if _is_section(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _to_plain(value: Any) -> Any:
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


@functools.lru_cache(maxsize=None)
def type_hints(cls) -> Dict[str, Any]:
    """``typing.get_type_hints`` of a section class, evaluated once per class (it compiles every
    annotation string each call: most of a config load's time before this cache)."""
    return typing.get_type_hints(cls)


class Section:
    """Base class of config sections. Subclasses are ``@dataclass``es.

    Override :meth:`validate` for range and cross-field rules; raise ``ConfigError`` with the
    dotted path ``f"{path}.{field}"``.
    """

    @classmethod
    def field_names(cls) -> List[str]:
        return [f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]

    @classmethod
    def mapping_of(cls, data: Any, path: str) -> Dict[str, Any]:
        """The raw section as a dict: None is ``{}``, a section of this class its ``to_dict()``;
        anything else that is not a mapping is a ConfigError."""
        if data is None:
            return {}
        if isinstance(data, cls):
            return data.to_dict()
        if not isinstance(data, dict):
            raise ConfigError(path, f"expected a mapping, got {type_name(data)} ({data!r})")
        return data

    @classmethod
    def from_dict(cls, data: Any, path: str):
        data = cls.mapping_of(data, path)
        hints = type_hints(cls)
        names = cls.field_names()
        for key in data:
            if key not in names:
                raise unknown_key_error(path, key, names)
        kwargs = {}
        fmap = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in data.items():
            allow_inf = bool(fmap[key].metadata.get("allow_inf", False))
            kwargs[key] = convert_value(hints[key], value, f"{path}.{key}", allow_inf)
        obj = cls(**kwargs)
        object.__setattr__(obj, "_explicit", frozenset(data.keys()))
        obj.validate(path)
        return obj

    @property
    def explicit_keys(self) -> frozenset:
        """Keys the user wrote (empty for a section built in code)."""
        return getattr(self, "_explicit", frozenset())

    def validate(self, path: str) -> None:  # pragma: no cover - default: nothing to check
        """Range and cross-field rules; raise ConfigError naming ``path.field``."""

    def to_dict(self) -> Dict[str, Any]:
        """The section as a user would write it, defaults filled in."""
        return {name: _to_plain(getattr(self, name)) for name in self.field_names()}
