"""One rule for upstream keys whose feature does not exist here yet.

Such a key is accepted only with a value that makes the feature do nothing (its no-op value,
e.g. ``context_parallel: 1``, dropout 0.0); any other value is a ConfigError that names the
field and says the feature is not implemented. Nothing is silently ignored.
"""
from __future__ import annotations

from typing import Any, Iterable

from ...errors import ConfigError

__all__ = ["require_noop", "not_implemented"]


def not_implemented(path: str, value: Any, feature: str, accepted: Iterable[Any]) -> ConfigError:
    """The error for a value that needs a feature this module does not implement."""
    accepted = list(accepted)
    if len(accepted) == 1:
        only = f"only the no-op value {accepted[0]!r} is accepted"
    else:
        only = f"only the no-op values {accepted!r} are accepted"
    return ConfigError(path, f"{value!r} needs {feature}, which is not implemented here; {only}")


def require_noop(path: str, value: Any, accepted: Iterable[Any], feature: str) -> None:
    """Raise :func:`not_implemented` unless ``value`` is one of ``accepted`` (bools by identity,
    so ``1`` never passes for ``True``)."""
    accepted = list(accepted)
    for ok in accepted:
        if isinstance(ok, bool) or isinstance(value, bool):
            if value is ok:
                return
        elif value == ok and type(value) is type(ok) or (
                isinstance(ok, float) and isinstance(value, int) and float(value) == ok):
            return
    raise not_implemented(path, value, feature, accepted)
