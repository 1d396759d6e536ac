"""YAML reading with YAML 1.2 floats: ``1e-5`` is a float, not the string PyYAML 1.1 makes of it."""
from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = ["FloatSafeLoader", "load_yaml_text", "parse_yaml_value"]


class FloatSafeLoader(yaml.SafeLoader):
    """SafeLoader whose float resolver also accepts ``1e-5``, ``1E5``, ``-2e+3``."""


# Copy the resolver table so the stock SafeLoader is unchanged.
FloatSafeLoader.yaml_implicit_resolvers = {
    k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
FloatSafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def load_yaml_text(text: str) -> Any:
    """Parse a YAML document with :class:`FloatSafeLoader`."""
    return yaml.load(text, Loader=FloatSafeLoader)  # noqa: S506 - SafeLoader subclass


def parse_yaml_value(text: str) -> Any:
    """Parse the value of a ``--set key=value`` override as YAML (``[0.9,0.999]``, ``null``,
    ``True``, ``1e-5``); an empty string stays an empty string."""
    if text == "":
        return ""
    return load_yaml_text(text)
