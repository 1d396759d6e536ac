"""YAML loading for config files: YAML 1.2 floats (``yaml_io``) and no duplicate keys.

PyYAML keeps the last of two equal keys in one mapping without a word, so a second
``weight_decay:`` further down a file silently replaces the first. Here it is an error naming
the key and both lines. Merge keys (``<<: *base``) still override as YAML defines.
"""
from __future__ import annotations

from typing import Any

import yaml

from .yaml_io import FloatSafeLoader

__all__ = ["StrictLoader", "load_strict_yaml"]

_MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(FloatSafeLoader):
    """FloatSafeLoader that rejects a key written twice in the same mapping."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                    continue
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {key_node.value!r} (first at line "
                        f"{seen[ident].line + 1}); a later value would silently replace the "
                        "earlier one", key_node.start_mark)
                seen[ident] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def load_strict_yaml(text: str) -> Any:
    """Parse one YAML document with :class:`StrictLoader`."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - SafeLoader subclass
