"""``ConfigError`` and the number rules every layer shares (pure Python, imports nothing of the
package).

This module is the bottom of the import order (``docs/architecture.md``): the config layer,
the LR schedules and the optimizers all raise ``ConfigError`` and check numbers with the same
helpers, so none of them has to import another to do so.

Number rules: ``bool`` is never a number; an int is accepted where a float is expected (and
converted); NaN is always refused, +-inf unless the field allows it; an int too large for a
float is refused like inf. Messages start with the dotted path of the field.
"""
from __future__ import annotations

import difflib
import math
from typing import Any, Iterable, Optional, Sequence

__all__ = ["ConfigError", "type_name", "show", "closest", "unknown_key_error", "check",
           "check_range", "range_requirement", "in_range", "checked", "truncate_message", "MAX_MESSAGE_CHARS", "to_float", "as_float", "as_int", "as_choice", "MAX_REPR", "MAX_STEPS"]

#: largest step count: steps and step ratios are resolved in float64, which holds every int
#: up to 2**53 exactly
MAX_STEPS = 2 ** 53

#: longest value representation put into a message (a huge YAML value stays one short line)
MAX_REPR = 80

#: longest message kept; a longer one (a huge value repr()'d into it) is cut in the middle
MAX_MESSAGE_CHARS = 2000


def truncate_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` if it is at most ``limit`` characters, else its head and tail around a
    ``... [N characters cut] ...`` marker (the result stays within ``limit`` + 40)."""
    if len(text) <= limit:
        return text
    head, tail = text[:limit * 3 // 4], text[-(limit // 4):]
    return f"{head} ... [{len(text) - len(head) - len(tail)} characters cut] ... {tail}"


class ConfigError(ValueError):
    """A bad configuration value.

    The message always starts with the full dotted path of the offending key, e.g.
    ``optimizer.betas: expected 2 values in [0, 1), got [0.9]``.
    """

    def __init__(self, path: str, message: str):
        self.path = path
        self.detail = truncate_message(message)
        super().__init__(f"{path}: {self.detail}" if path else self.detail)


def type_name(value: Any) -> str:
    """Short YAML-ish name of a value's type for error messages."""
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list",
            dict: "mapping", tuple: "list"}.get(type(value), type(value).__name__)


def show(value: Any) -> str:
    """``repr(value)``, cut to :data:`MAX_REPR` characters (digits of huge ints counted)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** MAX_REPR:
        digits = len(str(abs(value)))
        return f"{'-' if value < 0 else ''}{str(abs(value))[:12]}... ({digits} digits)"
    text = repr(value)
    return text if len(text) <= MAX_REPR else text[:MAX_REPR - 3] + "..."


def closest(name: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate closest to ``name`` (difflib ratio >= 0.6), or None."""
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_key_error(path: str, key: str, valid: Sequence[str], what: str = "key") -> ConfigError:
    """The error for a key that the section (or type) does not declare."""
    hint = closest(str(key), valid)
    msg = f"unknown {what}; valid keys: {sorted(valid)}"
    if hint:
        msg += f"; did you mean '{hint}'?"
    return ConfigError(f"{path}.{key}" if path else str(key), msg)


def check(condition: bool, path: str, message: str) -> None:
    """Raise ``ConfigError(path, message)`` unless ``condition``."""
    if not condition:
        raise ConfigError(path, message)


def checked(path: str, rule, *args):
    """``rule(*args)`` (a pure rule raising ``ValueError``/``TypeError`` with upstream's
    message), its failure as ``ConfigError(path, message)`` caused by the rule's error."""
    try:
        return rule(*args)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(path, str(exc)) from exc


def _fmt(x) -> str:
    """A bound as written in messages: ``0`` for 0.0, ``repr`` otherwise."""
    return repr(int(x)) if isinstance(x, float) and x.is_integer() and abs(x) < 1e15 else repr(x)


def range_requirement(lo=None, hi=None, lo_open: bool = False, hi_open: bool = False) -> str:
    """The interval ``lo <(=) value <(=) hi`` as messages state it: ``must be >= 0``,
    ``must be in [0, 1)``."""
    if lo is not None and hi is None:
        return f"must be {'>' if lo_open else '>='} {_fmt(lo)}"
    if hi is not None and lo is None:
        return f"must be {'<' if hi_open else '<='} {_fmt(hi)}"
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    return f"must be in {left}{_fmt(lo)}, {_fmt(hi)}{right}"


def in_range(value, lo=None, hi=None, lo_open: bool = False, hi_open: bool = False) -> bool:
    """``lo <(=) value <(=) hi`` (a missing bound passes)."""
    ok = True
    if lo is not None:
        ok = ok and (value > lo if lo_open else value >= lo)
    if hi is not None:
        ok = ok and (value < hi if hi_open else value <= hi)
    return ok


def check_range(value, path: str, lo=None, hi=None, lo_open: bool = False,
                hi_open: bool = False) -> None:
    """Check ``lo <(=) value <(=) hi`` (None passes); the message states the interval."""
    if value is None or in_range(value, lo, hi, lo_open, hi_open):
        return
    raise ConfigError(path, f"{range_requirement(lo, hi, lo_open, hi_open)}, got {show(value)}")


def to_float(value: Any, path: str, allow_inf: bool = False) -> float:
    """``value`` (an int or float, not a bool) as a float: NaN refused, +-inf unless
    ``allow_inf``, an int beyond the float range refused as not finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, f"expected a number, got {type_name(value)} ({show(value)})")
    try:
        value = float(value)
    except OverflowError:  # an int beyond float range (YAML ints are unbounded)
        raise ConfigError(path, f"must be a finite number, got {show(value)}") from None
    if math.isnan(value):
        raise ConfigError(path, "must be a finite number, got nan")
    if math.isinf(value) and not allow_inf:
        raise ConfigError(path, f"must be a finite number, got {value!r}")
    return value


def as_float(value: Any, path: str, *, lo: Optional[float] = 0.0, hi: Optional[float] = None,
             lo_open: bool = False, required: bool = False, what: str = "") -> Optional[float]:
    """``value`` as a finite float in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``).

    ``None`` passes through unless ``required``; ``what`` names the value in the message
    of a missing required one (``"the peak learning rate"``).
    """
    if value is None:
        if required:
            raise ConfigError(path, f"required{(': ' + what) if what else ''}")
        return None
    value = to_float(value, path)
    check_range(value, path, lo=lo, hi=hi, lo_open=lo_open)
    return value


def as_int(value: Any, path: str, *, lo: int = 0, hi: Optional[int] = None,
           required: bool = False, what: str = "") -> Optional[int]:
    """``value`` as an int ``>= lo`` (and ``<= hi``); a float such as ``5.0`` is refused with
    a hint."""
    if value is None:
        if required:
            raise ConfigError(path, f"required{(': ' + what) if what else ''}")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        hint = ""
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            hint = f"; write {int(value)}"
        raise ConfigError(path, f"must be an int >= {lo}, got {type_name(value)} "
                                f"({show(value)}){hint}")
    if value < lo:
        raise ConfigError(path, f"must be an int >= {lo}, got {show(value)}")
    if hi is not None and value > hi:
        raise ConfigError(path, f"must be an int <= {hi}, got {show(value)}")
    return int(value)


def as_choice(value: Any, path: str, choices: tuple) -> str:
    """``value`` as one of the strings ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(path, f"must be one of {list(choices)}, got {show(value)}")
    return value
